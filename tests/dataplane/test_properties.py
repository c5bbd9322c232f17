"""Property tests: the segment algebra and the store/reader round trip, over random inputs."""

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from payloadrun.codec import PositionedRows
from payloadrun.paths import PayloadRoot
from payloadrun.reader import PayloadReader
from payloadrun.segments import Segment, clip_all
from payloadrun.store import PayloadStore

DTYPES = ["uint8", "uint16", "int32", "int64", "float32"]


@st.composite
def segments(draw):
    return Segment(
        field="routed_experts",
        file="v1/f.bin",
        offset=draw(st.integers(0, 10_000)),
        pos=draw(st.integers(0, 500)),
        rows=draw(st.integers(0, 300)),
        dtype=draw(st.sampled_from(DTYPES)),
        shape=tuple(draw(st.lists(st.integers(0, 6), max_size=3))),
    )


ranges = st.tuples(st.integers(0, 900), st.integers(0, 900))


@given(segments(), ranges, ranges)
def test_clip_twice_equals_clip_to_intersection(seg, r1, r2):
    once = seg.clip(*r1)
    twice = once.clip(*r2) if once is not None else None
    direct = seg.clip(max(r1[0], r2[0]), min(r1[1], r2[1]))
    assert twice == direct


@given(segments(), ranges)
def test_clip_keeps_bytes_aligned_with_positions(seg, r):
    clipped = seg.clip(*r)
    if clipped is None:
        return
    assert seg.pos <= clipped.pos and clipped.end <= seg.end
    assert clipped.offset - seg.offset == (clipped.pos - seg.pos) * seg.row_bytes


@given(segments(), st.integers(-200, 200), ranges)
def test_shift_commutes_with_clip(seg, delta, r):
    if seg.pos + delta < 0 or r[0] + delta < 0:
        return
    lhs = seg.shift(delta).clip(r[0] + delta, r[1] + delta)
    rhs = seg.clip(*r)
    assert lhs == (rhs.shift(delta) if rhs is not None else None)


@st.composite
def request_arrays(draw):
    """One request's arrays: random dtype, row shape and position for each part."""
    n_parts = draw(st.integers(1, 3))
    parts = []
    for i in range(n_parts):
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=2)))
        rows = draw(st.integers(0, 40))
        seed = draw(st.integers(0, 2**32 - 1))
        data = np.random.default_rng(seed).integers(0, 250, size=(rows, *shape)).astype(dtype)
        parts.append(PositionedRows(f"field{i}", data, draw(st.integers(0, 100))))
    return parts


@pytest.fixture(scope="module")
def payload_root(tmp_path_factory):
    return PayloadRoot(tmp_path_factory.mktemp("payloads"))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request_arrays(), st.integers(0, 5))
def test_write_then_read_is_bitwise_equal(payload_root, parts, version):
    store = PayloadStore(payload_root)
    segs = store.write(f"v{version}", parts)
    with PayloadReader(payload_root, max_workers=2) as reader:
        for part, seg in zip(parts, segs, strict=True):
            if seg.rows == 0:
                continue
            out = reader.read(segs, part.field, seg.pos, seg.end)
            assert out.dtype == part.rows.dtype and out.shape == part.rows.shape
            assert out.tobytes() == part.rows.tobytes()


@st.composite
def tiled_request(draw):
    """Rows [pos, pos+n) split over several files, plus a clip range and a shift."""
    n = draw(st.integers(1, 60))
    pos = draw(st.integers(0, 50))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=4))) if n > 1 else []
    lo = draw(st.integers(0, pos + n + 5))
    hi = draw(st.integers(lo, pos + n + 10))
    delta = draw(st.integers(0, 30))
    return n, pos, [0, *cuts, n], lo, hi, delta


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tiled_request(), st.integers(0, 2**32 - 1))
def test_reading_clipped_and_shifted_segments_equals_slicing(payload_root, request, seed):
    n, pos, bounds, lo, hi, delta = request
    rows = np.random.default_rng(seed).integers(0, 256, (n, 3, 2)).astype(np.uint8)
    store = PayloadStore(payload_root)
    segs = [
        store.write("v9", [PositionedRows("routed_experts", rows[a:b], pos + a)])[0]
        for a, b in pairwise(bounds)
    ]
    span_lo, span_hi = min(pos, lo), max(pos + n, hi)
    with PayloadReader(payload_root, max_workers=3) as reader:
        full = reader.read(segs, "routed_experts", span_lo, span_hi)
        moved = [s.shift(delta) for s in clip_all(segs, lo, hi)]
        if not moved:
            return
        part = reader.read(moved, "routed_experts", lo + delta, hi + delta)
    np.testing.assert_array_equal(part, full[lo - span_lo : hi - span_lo])
