import json

import numpy as np
import pytest

from payloadrun.segments import (
    PAYLOAD_FIELD,
    Segment,
    SegmentError,
    choice_segments,
    clip_all,
    files_of,
    final_token_row,
    sample_segments,
    segments_from_json,
    segments_to_json,
)


def routing(pos=10, rows=5, offset=100, file="/root/v1/a.bin"):
    return Segment("routed_experts", file, offset, pos, rows, "uint8", (48, 8))


def test_end_and_row_bytes():
    seg = routing()
    assert seg.end == 15
    assert seg.row_bytes == 48 * 8
    assert seg.nbytes == 5 * 48 * 8
    mask = Segment("sampling_mask", "f", 0, 0, 3, "int32", (7,))
    assert mask.row_bytes == 28


def test_clip_moves_offset_by_rows_skipped():
    seg = routing()
    clipped = seg.clip(12, 14)
    assert (clipped.pos, clipped.rows, clipped.offset) == (12, 2, 100 + 2 * 384)
    assert clipped.file == seg.file and clipped.shape == seg.shape


def test_clip_wider_than_segment_returns_the_same_segment():
    seg = routing()
    assert seg.clip(0, 1000) is seg


@pytest.mark.parametrize(("lo", "hi"), [(0, 10), (15, 20), (12, 12), (14, 11)])
def test_clip_outside_is_none(lo, hi):
    assert routing().clip(lo, hi) is None


def test_shift_moves_pos_only():
    seg = routing().shift(-10)
    assert (seg.pos, seg.offset, seg.rows) == (0, 100, 5)
    with pytest.raises(SegmentError, match="negative"):
        routing().shift(-11)


def test_final_token_points_at_previous_row():
    seg = routing()
    final = seg.final_token()
    assert (final.pos, final.rows) == (15, 1)
    assert final.offset == 100 + 4 * 384
    with pytest.raises(SegmentError, match="empty segment"):
        Segment("routed_experts", "f", 0, 3, 0, "uint8", (1,)).final_token()


def test_json_round_trip_uses_prime_rl_names():
    seg = routing()
    obj = seg.to_json()
    assert list(obj) == ["field", "file", "offset", "pos", "rows", "dtype", "shape"]
    assert obj["shape"] == [48, 8]
    again = segments_from_json(json.loads(json.dumps(segments_to_json([seg]))))
    assert again == [seg]


def test_numpy_integers_are_accepted_as_python_ints():
    seg = Segment("routed_experts", "f", np.int64(3), np.int32(4), np.uint8(2), "uint8", [1, 2])
    assert type(seg.offset) is int and seg.shape == (1, 2)
    assert hash(seg) == hash(Segment("routed_experts", "f", 3, 4, 2, "uint8", (1, 2)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "complex64"}, "dtype 'complex64' is not supported"),
        ({"offset": -1}, "offset must be an integer >= 0, got -1"),
        ({"rows": 1.5}, "rows must be an integer >= 0, got 1.5"),
        ({"pos": True}, "pos must be an integer >= 0, got True"),
        ({"shape": (48, -8)}, r"shape must be non-negative integers, got \[48, -8\]"),
        ({"field": ""}, "field is empty"),
    ],
)
def test_bad_fields_are_named(kwargs, message):
    args = {
        "field": "routed_experts",
        "file": "f",
        "offset": 0,
        "pos": 0,
        "rows": 1,
        "dtype": "uint8",
        "shape": (2,),
    }
    args.update(kwargs)
    with pytest.raises(SegmentError, match=message):
        Segment(**args)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ("x", "must be a JSON object"),
        ({"field": "r"}, "lacks file, offset, pos, rows, dtype, shape"),
        (
            {
                "field": "r",
                "file": 3,
                "offset": 0,
                "pos": 0,
                "rows": 1,
                "dtype": "uint8",
                "shape": [],
            },
            "file must be a string, got 3",
        ),
        (
            {
                "field": "r",
                "file": "f",
                "offset": 0,
                "pos": 0,
                "rows": 1,
                "dtype": "uint8",
                "shape": 3,
            },
            "shape must be a list",
        ),
        (
            {
                "field": "r",
                "file": "f",
                "offset": 0,
                "pos": 0,
                "rows": 1,
                "dtype": "uint8",
                "shape": ["8"],
            },
            "shape must be non-negative integers",
        ),
    ],
)
def test_bad_json_is_named(obj, message):
    with pytest.raises(SegmentError, match=message):
        Segment.from_json(obj)


def test_segments_from_json_needs_a_list():
    with pytest.raises(SegmentError, match="payload must be a list"):
        segments_from_json({"field": "x"})


def test_clip_all_and_files_of():
    a = routing(pos=0, rows=4, file="a")
    b = routing(pos=4, rows=4, file="b")
    c = routing(pos=8, rows=4, file="a")
    assert [s.pos for s in clip_all([a, b, c], 3, 9)] == [3, 4, 8]
    assert clip_all([a, b, c], 20, 30) == []
    assert files_of([a, b, c]) == ["a", "b"]


def mask(pos=40, rows=32, file="/root/v1/a.bin"):
    return Segment("sampling_mask", file, 0, pos, rows, "int32", (4,))


def test_choice_segments_reads_the_payload_field_or_says_inline():
    segs = [routing(), mask()]
    choice = {"token_ids": [1, 2], PAYLOAD_FIELD: segments_to_json(segs)}
    assert choice_segments(choice) == segs
    # answered inline (a fallback, or no payload_dir): no segments, the arrays are in the choice
    assert choice_segments({"token_ids": [1, 2], "routed_experts": "..."}) is None
    assert choice_segments({PAYLOAD_FIELD: None}) is None
    with pytest.raises(SegmentError, match="a choice must be a JSON object, got list"):
        choice_segments([])
    with pytest.raises(SegmentError, match="payload must be a list"):
        choice_segments({PAYLOAD_FIELD: {}})


def test_final_token_row_repeats_the_row_before_the_final_token():
    # a sample of 40 + 32 tokens: routing rows end at the last forwarded token, 71
    last = routing(pos=0, rows=71, offset=0)
    final = final_token_row([mask(), last], 72)
    assert final == last.final_token()
    assert (final.pos, final.rows, final.offset) == (71, 1, 70 * last.row_bytes)


def test_final_token_row_takes_the_routing_segment_that_ends_last():
    first, second = routing(pos=0, rows=30, offset=0), routing(pos=30, rows=41, offset=0)
    assert final_token_row([second, first], 72) == second.final_token()


@pytest.mark.parametrize(
    "segments",
    [
        [],  # nothing captured
        [mask()],  # masks only: one row per completion token already
        [routing(pos=0, rows=72, offset=0)],  # a row covers the final token already
        [routing(pos=0, rows=50, offset=0)],  # routing ends elsewhere: a gap, not the final token
        [Segment("routed_experts", "f", 0, 71, 0, "uint8", (1,))],  # empty: no row to repeat
    ],
)
def test_final_token_row_is_none_without_a_routing_row_ending_before_it(segments):
    assert final_token_row(segments, 72) is None


def test_sample_segments_clips_to_the_sample_and_adds_the_final_row():
    # the request's routing covers a longer trace; the sample is its first 40 + 20 tokens
    trace = routing(pos=0, rows=90, offset=0)
    masks = mask(pos=40, rows=51)
    got = sample_segments([trace, masks], 40, 20)
    clipped = trace.clip(0, 60)
    assert got == [clipped, masks.clip(0, 60)]  # routing already covers token 59: no extra row
    end_anchored = routing(pos=0, rows=59, offset=0)
    got = sample_segments([end_anchored, masks], 40, 20)
    assert got == [end_anchored, masks.clip(0, 60), end_anchored.final_token()]
    assert sum(s.rows for s in got if s.field == "routed_experts") == 60


def test_sample_segments_refuses_negative_lengths():
    with pytest.raises(SegmentError, match="prompt_len 4, completion_len -1"):
        sample_segments([routing()], 4, -1)
