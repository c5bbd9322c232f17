import base64
import io

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
    npy_save_header,
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


def test_compact_keeps_vllms_uint16_even_when_the_ids_fit_a_byte():
    """vLLM's capturer picks uint16 from the model's expert count: every answer of the run has
    it, and a multi-turn trace's rows must read back in verifiers' dtype, whatever the ids."""
    arr = np.ones((2, 3, 4), dtype=np.uint16)
    assert compact_routed_experts(arr) is arr


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


# --- decoding into one buffer, .npy header parsed without np.load --------------------------------


def _npy_bytes(arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, arr, version=version, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(7 * 3 * 2, dtype=np.uint8).reshape(7, 3, 2),
        (np.arange(5 * 4 * 2) * 997 % 65536).astype(np.uint16).reshape(5, 4, 2),
        np.arange(24, dtype=">i4").reshape(2, 3, 4),  # big-endian survives
        np.asfortranarray(np.arange(24, dtype=np.int64).reshape(2, 3, 4)),
        np.zeros((0, 48, 8), dtype=np.uint8),
        np.array(7, dtype=np.uint16),  # 0-d
        np.zeros(3, dtype=[("a", "<u2"), ("b", "u1")]),
    ],
    ids=["uint8", "uint16", "big-endian", "fortran", "empty", "scalar", "structured"],
)
@pytest.mark.parametrize("version", [None, (1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("slice_chars", [4, 8, 64, 1 << 20])
def test_npy_decode_equals_np_load(arr, version, slice_chars, monkeypatch):
    monkeypatch.setattr("payloadrun.codec._B64_SLICE", slice_chars)
    raw = _npy_bytes(arr, version)
    decoded = decode_npy_base64(base64.b64encode(raw))
    expected = np.load(io.BytesIO(raw), allow_pickle=False)
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    assert decoded.flags.f_contiguous == expected.flags.f_contiguous
    np.testing.assert_array_equal(decoded, expected)


SAVED = {
    "uint8": np.zeros((311, 48, 8), dtype=np.uint8),
    "uint16": np.zeros((5,), dtype=np.uint16),
    "big-endian": np.zeros((3, 4), dtype=">f4"),
    "fortran": np.asfortranarray(np.zeros((2, 3), dtype=np.int64)),
    "empty": np.zeros((0, 48, 8), dtype=np.uint8),
    "scalar": np.array(7, dtype=np.uint16),
}


@pytest.mark.parametrize("name", SAVED)
def test_a_header_as_np_save_writes_it_is_read_without_ast(name, monkeypatch):
    """numpy reads headers with ast.literal_eval, whose AST state CPython 3.11's threads share
    (the writer's request threads failed with "AST constructor recursion depth mismatch"): a
    header np.save wrote is read without it, to what numpy reads; any other still goes to
    numpy."""
    raw = _npy_bytes(SAVED[name])
    expected = np.load(io.BytesIO(raw), allow_pickle=False)
    head = io.BytesIO(raw)
    np.lib.format.read_magic(head)
    numpy_header = np.lib.format.read_array_header_1_0(head)
    header_len = int.from_bytes(raw[8:10], "little")
    assert npy_save_header(raw[10 : 10 + header_len].decode("latin1")) == numpy_header

    def no_ast(*_args, **_kwargs):
        raise AssertionError("ast.literal_eval called")

    monkeypatch.setattr("ast.literal_eval", no_ast)
    decoded = decode_npy_base64(base64.b64encode(raw))
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    np.testing.assert_array_equal(decoded, expected)
    structured = _npy_bytes(np.zeros(3, dtype=[("a", "<u2"), ("b", "u1")]))
    with pytest.raises(AssertionError, match=r"ast\.literal_eval called"):
        decode_npy_base64(base64.b64encode(structured))


@pytest.mark.parametrize(
    "text",
    [
        "{'descr': '<u2', 'shape': (5,), 'fortran_order': False, }\n",  # another key order
        "{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (3,), }\n",  # structured
        "{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }",  # no newline: cut short
        "{'descr': 'x9', 'fortran_order': False, 'shape': (5,), }\n",  # no such type
    ],
)
def test_any_other_header_is_left_to_numpy(text):
    assert npy_save_header(text) is None


@pytest.mark.parametrize("tail", [0, 1, 2])  # decoded length 3k, 3k+1, 3k+2: '', '==', '='
@pytest.mark.parametrize("form", [str, bytes, bytearray, memoryview])
def test_base64_decode_fills_exactly_the_decoded_bytes(tail, form, monkeypatch):
    from payloadrun.codec import _b64decode

    monkeypatch.setattr("payloadrun.codec._B64_SLICE", 8)
    data = bytes(range(256)) * 3 + bytes(range(tail))
    text = base64.b64encode(data)
    out = _b64decode(text.decode() if form is str else form(text), "x")
    assert out.dtype == np.uint8 and out.tobytes() == data


@pytest.mark.parametrize(
    "bad",
    [
        "QUJDQUJD!UJD",  # a character outside the alphabet in the last slice
        "QU!DQUJDQUJD",  # ... in the first slice
        "QUJDQUJDQUJ",  # length not a multiple of 4
        "QUJDQQ==QUJD",  # padding ending a slice that is not the last
        "QUJDQ===",  # too much padding
        "QUJDQUJDQUJ=QQ==",  # padding in the middle
        "QUJDQUJDéUJD",  # not ASCII
        "QUJD QUJDQUJ",  # whitespace is not skipped
    ],
)
@pytest.mark.parametrize("slice_chars", [4, 8, 1 << 20])
def test_base64_decode_into_buffer_stays_strict(bad, slice_chars, monkeypatch):
    monkeypatch.setattr("payloadrun.codec._B64_SLICE", slice_chars)
    for value in (bad, bad.encode("utf-8"), memoryview(bad.encode("utf-8"))):
        with pytest.raises(CodecError, match="routed_experts is not valid base64"):
            decode_npy_base64(value)


def _b64(raw):
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "EOF"),
        (b"\x93NUM", "EOF"),
        (b"plain bytes, not an array", "the magic string is not correct"),
        (_npy_bytes(np.arange(12, dtype=np.uint16))[:-3], "expected 24 bytes got 21"),
        (_npy_bytes(np.arange(12, dtype=np.uint16), (2, 0))[:-1], "expected 24 bytes got 23"),
        (_npy_bytes(np.zeros(2, np.uint8))[:20], "EOF: reading array header"),
        (b"\x93NUMPY\x01\x00\x10\x00{'descr': 1}    \n", "descr"),
        (b"\x93NUMPY\x09\x00\x10\x00" + b" " * 16, "version"),
    ],
    ids=[
        "empty",
        "short magic",
        "bad magic",
        "data cut",
        "v2 data cut",
        "header cut",
        "bad header",
        "unknown version",
    ],
)
def test_npy_decode_rejects(raw, message):
    with pytest.raises(CodecError, match=r"routed_experts is not a base64 \.npy array") as info:
        decode_npy_base64(_b64(raw))
    assert message in str(info.value)


def test_npy_decode_refuses_object_dtype_with_np_loads_message():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CodecError, match="Object arrays cannot be loaded when allow_pickle=False"):
        decode_npy_base64(_b64(buf.getvalue()))


def test_npy_decode_ignores_bytes_after_the_array_as_np_load_does():
    arr = np.arange(6, dtype=np.uint8).reshape(1, 2, 3)
    np.testing.assert_array_equal(decode_npy_base64(_b64(_npy_bytes(arr) + b"xyz")), arr)


def test_npy_decode_returns_a_view_of_the_decoded_bytes():
    arr = np.arange(48 * 8 * 100, dtype=np.uint8).reshape(100, 48, 8)
    decoded = decode_npy_base64(_b64(_npy_bytes(arr)))
    assert decoded.base is not None, "the data was copied out of the decode buffer"
    np.testing.assert_array_equal(decoded, arr)


def test_prime_rl_and_csr_forms_decode_through_the_buffer(monkeypatch):
    monkeypatch.setattr("payloadrun.codec._B64_SLICE", 8)
    arr = np.arange(60, dtype=np.uint16).reshape(5, 3, 4)
    decoded, start = decode_routed_experts(encode_prime_rl(arr, start=3))
    assert start == 3
    np.testing.assert_array_equal(decoded, arr)
    ids, counts = decode_sampling_mask(encode_sampling_mask_csr(np.arange(9), np.array([4, 0, 5])))
    assert ids.tolist() == list(range(9)) and counts.tolist() == [4, 0, 5]


@pytest.mark.parametrize(
    ("arr", "dtype"),
    [
        (np.full((2, 3, 4), 255, dtype=np.uint8), np.uint8),
        (np.full((2, 3, 4), 255, dtype=np.uint16), np.uint16),
        (np.full((2, 3, 4), 255, dtype=np.uint32), np.uint8),
        (np.full((2, 3, 4), 256, dtype=np.uint16), np.uint16),
        (np.full((2, 3, 4), 65535, dtype=np.uint32), np.uint16),
        (np.full((2, 3, 4), 65535, dtype=np.int64), np.uint16),
    ],
)
def test_compact_keeps_vllms_dtypes_and_narrows_any_other_integer_input(arr, dtype):
    out = compact_routed_experts(arr)
    assert out.dtype == dtype and out.flags.c_contiguous
    np.testing.assert_array_equal(out, arr)


def test_compact_keeps_uint8_input_without_a_copy():
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    assert compact_routed_experts(arr) is arr


@pytest.mark.parametrize(
    ("arr", "message"),
    [
        (np.array([[[65536]]], dtype=np.uint32), "expert id 65536, above the uint16 limit"),
        (np.array([[[2**63]]], dtype=np.uint64), f"expert id {2**63}, above the uint16 limit"),
        (np.array([[[3, -5]]], dtype=np.int8), r"negative expert id \(-5\)"),
        (np.array([[[70000, -1]]], dtype=np.int32), r"negative expert id \(-1\)"),
    ],
)
def test_compact_still_rejects_out_of_range_ids(arr, message):
    with pytest.raises(CodecError, match=message):
        compact_routed_experts(arr)
