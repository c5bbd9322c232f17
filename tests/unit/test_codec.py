import base64

import numpy as np
import pytest

from payloadrun.codec import (
    CodecError,
    compact_routed_experts,
    csr_from_mask_rows,
    decode_npy_base64,
    decode_routed_experts,
    decode_sampling_mask,
    encode_npy_base64,
    encode_prime_rl,
    encode_sampling_mask_csr,
    mask_rows,
    mask_rows_from_csr,
    routing_pos,
    routing_rows,
)


def test_compact_to_uint8_when_ids_fit():
    out = compact_routed_experts(np.array([[[0, 255]]], dtype=np.int64))
    assert out.dtype == np.uint8
    assert out.tolist() == [[[0, 255]]]


def test_compact_to_uint16_above_255():
    out = compact_routed_experts(np.array([[[256, 3]]], dtype=np.int32))
    assert out.dtype == np.uint16
    assert out.tolist() == [[[256, 3]]]


def test_compact_keeps_uint16_input_with_small_ids_small():
    assert compact_routed_experts(np.ones((2, 3, 4), dtype=np.uint16)).dtype == np.uint8


def test_compact_makes_contiguous():
    arr = np.arange(2 * 3 * 4, dtype=np.int64).reshape(2, 3, 4)[:, :, ::2]
    out = compact_routed_experts(arr)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, arr)


def test_compact_empty():
    assert compact_routed_experts(np.zeros((0, 48, 8), dtype=np.int64)).dtype == np.uint8


@pytest.mark.parametrize(
    ("arr", "message"),
    [
        (np.zeros((4, 8)), r"must be 3-D \[tokens, layers, top_k\], got shape \(4, 8\)"),
        (np.zeros((1, 2, 3), dtype=np.float32), "integer expert ids, got dtype float32"),
        (np.array([[[65536]]]), "expert id 65536, above the uint16 limit 65535"),
        (np.array([[[-1]]]), r"negative expert id \(-1\)"),
    ],
)
def test_compact_rejects(arr, message):
    with pytest.raises(CodecError, match=message):
        compact_routed_experts(arr)


def test_routing_is_end_anchored():
    # 100 prompt + 20 completion tokens: 119 forwarded, so 119 rows start at 0.
    assert routing_pos(100, 20, 119) == 0
    # routed_experts_prompt_start=30 skips 30 prompt tokens: 89 rows start at 30.
    assert routing_pos(100, 20, 89) == 30
    # a decode instance reporting rows from its first forward (prompt_len - 1)
    assert routing_pos(100, 20, 20) == 99
    with pytest.raises(CodecError, match="120 routing rows do not fit"):
        routing_pos(100, 20, 120)


def test_routing_rows():
    part = routing_rows(np.zeros((9, 2, 2), dtype=np.int64), prompt_len=5, completion_len=5)
    assert (part.field, part.pos, part.rows.dtype) == ("routed_experts", 0, np.uint8)


def test_mask_rows_from_csr_pads_with_minus_one():
    rows = mask_rows_from_csr(np.array([5, 6, 7, 9]), np.array([2, 0, 1, 1]))
    assert rows.dtype == np.int32
    assert rows.tolist() == [[5, 6], [-1, -1], [7, -1], [9, -1]]


def test_mask_rows_all_empty_are_one_column_of_minus_one():
    assert mask_rows_from_csr(np.array([], dtype=np.int32), np.array([0, 0])).tolist() == [
        [-1],
        [-1],
    ]
    assert mask_rows_from_csr(np.array([]), np.array([])).shape == (0, 1)


def test_mask_rows_position_is_prompt_len():
    part = mask_rows(np.array([1]), np.array([1]), prompt_len=42)
    assert (part.field, part.pos) == ("sampling_mask", 42)


@pytest.mark.parametrize(
    ("ids", "counts", "message"),
    [
        ([1, 2], [1], "counts add up to 1 but there are 2 ids"),
        ([1], [2, -1], r"negative count \(-1\)"),
        ([[1]], [1], "must be 1-D"),
        ([-3], [1], r"token ids in \[0, 2\*\*31\)"),
    ],
)
def test_mask_rows_reject(ids, counts, message):
    with pytest.raises(CodecError, match=message):
        mask_rows_from_csr(np.array(ids), np.array(counts))


def test_csr_round_trip():
    ids, counts = np.array([3, 4, 5], dtype=np.int32), np.array([0, 3, 0], dtype=np.int32)
    back = csr_from_mask_rows(mask_rows_from_csr(ids, counts))
    np.testing.assert_array_equal(back[0], ids)
    np.testing.assert_array_equal(back[1], counts)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_vllm_npy_base64_round_trip(dtype):
    arr = (np.arange(3 * 4 * 2) * 37 % 300).astype(dtype).reshape(3, 4, 2)
    text = encode_npy_base64(arr)
    decoded, start = decode_routed_experts(text)
    assert start is None
    assert decoded.dtype == dtype
    np.testing.assert_array_equal(decoded, arr)


def test_prime_rl_form_round_trip():
    arr = np.arange(24, dtype=np.uint16).reshape(2, 3, 4)
    decoded, start = decode_routed_experts(encode_prime_rl(arr, start=7))
    assert start == 7
    np.testing.assert_array_equal(decoded, arr)


def test_nested_list_form():
    decoded, start = decode_routed_experts([[[1, 2]], [[3, 4]]])
    assert start is None and decoded.shape == (2, 1, 2)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not base64!", "routed_experts is not valid base64"),
        (base64.b64encode(b"plain bytes").decode(), "not a base64 .npy array"),
        ({"data": "AA==", "shape": [2], "dtype": "uint8"}, "has 1 bytes but shape"),
        ({"data": "AA==", "shape": [1]}, "lacks dtype"),
        ({"data": "AA==", "shape": [1], "dtype": "nope"}, "unknown dtype 'nope'"),
        (42, "got int"),
    ],
)
def test_decode_routed_experts_rejects(value, message):
    with pytest.raises(CodecError, match=message):
        decode_routed_experts(value)


def test_npy_refuses_pickled_objects():
    import io

    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CodecError):
        decode_npy_base64(base64.b64encode(buf.getvalue()).decode())


def test_decode_sampling_mask_forms():
    ids, counts = np.array([4, 5, 6]), np.array([2, 0, 1])
    for form in (
        {"ids": [4, 5, 6], "counts": [2, 0, 1]},
        encode_sampling_mask_csr(ids, counts),
        [[4, 5], [], [6]],
    ):
        got_ids, got_counts = decode_sampling_mask(form)
        np.testing.assert_array_equal(got_ids, ids)
        np.testing.assert_array_equal(got_counts, counts)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"ids": []}, r"needs ids and counts, got keys \['ids'\]"),
        ({"ids": "AAA=", "counts": ""}, "not a whole number of int32 values"),
        ("x", "got str"),
    ],
)
def test_decode_sampling_mask_rejects(value, message):
    with pytest.raises(CodecError, match=message):
        decode_sampling_mask(value)


@pytest.mark.parametrize("form", [str, bytes, memoryview])
def test_npy_base64_from_str_or_bytes_spanning_many_slices(form, monkeypatch):
    monkeypatch.setattr("payloadrun.codec._B64_SLICE", 8)
    arr = (np.arange(5 * 3 * 2) * 7 % 256).astype(np.uint8).reshape(5, 3, 2)
    text = encode_npy_base64(arr)
    value = text if form is str else form(text.encode())
    decoded, start = decode_routed_experts(value)
    assert start is None
    np.testing.assert_array_equal(decoded, arr)


@pytest.mark.parametrize("bad", ["QUJD=QUJD", "QUJDRA=AQUJD", "QU\nJD"])
def test_sliced_base64_is_as_strict_as_whole(bad, monkeypatch):
    with pytest.raises(CodecError, match="not valid base64"):
        decode_npy_base64(bad)
    monkeypatch.setattr("payloadrun.codec._B64_SLICE", 4)
    with pytest.raises(CodecError, match="not valid base64"):
        decode_npy_base64(bad)
