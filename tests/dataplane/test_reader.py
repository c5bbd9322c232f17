import os
import threading
import time

import numpy as np
import pytest

from payloadrun.codec import PositionedRows, mask_rows_from_csr
from payloadrun.paths import PayloadPathError, PayloadRoot
from payloadrun.reader import (
    DEFAULT_RETRY_DELAYS,
    PayloadReader,
    SegmentOverlapError,
    ShortReadError,
    read_field,
)
from payloadrun.segments import Segment
from payloadrun.store import PayloadStore
from payloadrun_devkit.required import skip_or_fail


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "payloads"
    path.mkdir()
    return PayloadRoot(path)


# How a call of several files is read: handed to the pool after its first file ("pool"), on the
# caller's thread while files come fast ("fast files": the page cache never takes an hour), or by
# a reader of one thread. A call of one segment is always read on the caller's thread
# (PayloadReader._read_one). Tests that take `reader` run all three; the path-safety and
# short-read tests also with the bad segment alone and beside a good one in another file, so that
# every way a file is opened is covered.
READERS = {
    "pool": {"max_workers": 4, "slow_file_ns": 0},
    "fast files": {"max_workers": 4, "slow_file_ns": 3600 * 10**9},
    "one thread": {"max_workers": 1},
}


@pytest.fixture(params=list(READERS))
def reader(request, root):
    with PayloadReader(root, sleep=lambda _: None, **READERS[request.param]) as r:
        yield r


@pytest.fixture(params=["alone", "beside another file"])
def read_with(request, root):
    """Read ``routed_experts`` from ``seg`` (4 uint8 per row, at 0) alone, or followed by a good
    row of another file (a file of one segment that matches the output: the pass without a plan
    target); the rows ``[0, seg.end)`` of the result are ``seg``'s."""
    beside = request.param != "alone"
    other = write(root, 7, "routed_experts", np.ones((1, 4), np.uint8), pos=0) if beside else None

    def read(reader, seg):
        if other is None:
            return reader.read([seg], "routed_experts", 0, seg.end)
        return reader.read([seg, other.shift(seg.end)], "routed_experts", 0, seg.end + 1)

    return read


def write(root, version, field, rows, pos):
    return PayloadStore(root).write(f"v{version}", [PositionedRows(field, rows, pos)])[0]


def test_read_exact_range_of_one_segment(root, reader):
    rows = np.arange(10 * 3 * 2, dtype=np.uint8).reshape(10, 3, 2)
    seg = write(root, 1, "routed_experts", rows, pos=5)
    out = reader.read([seg], "routed_experts", 5, 15)
    assert out.dtype == np.uint8 and out.shape == (10, 3, 2)
    np.testing.assert_array_equal(out, rows)


def test_read_many_files_with_gaps_and_fill(root, reader):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 200, (4, 2, 2)).astype(np.uint8)
    b = rng.integers(0, 200, (3, 2, 2)).astype(np.uint8)
    sa = write(root, 1, "routed_experts", a, pos=0)
    sb = write(root, 2, "routed_experts", b, pos=6)
    out = reader.read([sb, sa], "routed_experts", 0, 10)
    expected = np.zeros((10, 2, 2), np.uint8)
    expected[0:4] = a
    expected[6:9] = b
    np.testing.assert_array_equal(out, expected)


def test_mask_rows_of_different_widths_are_padded_to_the_widest(root, reader):
    narrow = mask_rows_from_csr(np.array([1, 2]), np.array([1, 1]))  # width 1
    wide = mask_rows_from_csr(np.array([3, 4, 5]), np.array([3]))  # width 3
    s1 = write(root, 1, "sampling_mask", narrow, pos=10)
    s2 = write(root, 1, "sampling_mask", wide, pos=12)
    out = reader.read([s1, s2], "sampling_mask", 9, 14)
    assert out.tolist() == [[-1, -1, -1], [1, -1, -1], [2, -1, -1], [3, 4, 5], [-1, -1, -1]]


def test_mixed_uint8_uint16_promotes(root, reader):
    s1 = write(root, 1, "routed_experts", np.full((2, 1, 1), 7, np.uint8), pos=0)
    s2 = write(root, 1, "routed_experts", np.full((2, 1, 1), 300, np.uint16), pos=2)
    out = reader.read([s1, s2], "routed_experts", 0, 4)
    assert out.dtype == np.uint16 and out.ravel().tolist() == [7, 7, 300, 300]


def test_other_fields_are_ignored_and_final_token_row_is_repeated(root, reader):
    rows = np.arange(6, dtype=np.uint8).reshape(3, 2, 1)
    seg = write(root, 1, "routed_experts", rows, pos=0)
    mask = write(root, 1, "sampling_mask", np.zeros((1, 1), np.int32), pos=3)
    out = reader.read([seg, seg.final_token(), mask], "routed_experts", 0, 4)
    np.testing.assert_array_equal(out[3], rows[2])


def test_empty_segments_are_ignored(root, reader):
    """A segment of no rows covers nothing: not read (its file may be gone), never overlapping."""
    rows = np.arange(8, dtype=np.uint8).reshape(4, 2)
    seg = write(root, 1, "routed_experts", rows, pos=0)
    empty = Segment("routed_experts", "v1/gone.bin", 0, 2, 0, "uint8", (2,))
    np.testing.assert_array_equal(reader.read([empty, seg], "routed_experts", 0, 4), rows)
    with pytest.raises(ValueError, match="no segment of field 'routed_experts' covers"):
        reader.read([empty], "routed_experts", 0, 4)


def test_no_segment_needs_shape_and_dtype(reader):
    with pytest.raises(ValueError, match="no segment of field 'routed_experts' covers"):
        reader.read([], "routed_experts", 0, 3)
    out = reader.read([], "sampling_mask", 0, 3, row_shape=(2,), dtype=np.int32)
    assert out.tolist() == [[-1, -1]] * 3


def test_overlapping_segments_are_refused(root, reader):
    seg = write(root, 1, "routed_experts", np.zeros((4, 1, 1), np.uint8), pos=0)
    with pytest.raises(SegmentOverlapError, match=r"covers \[0, 4\).*covers \[2, 4\)"):
        reader.read([seg, seg.clip(2, 4)], "routed_experts", 0, 4)


def test_bad_ranges_and_fills(root, reader):
    seg = write(root, 1, "routed_experts", np.zeros((4, 1, 1), np.uint8), pos=0)
    with pytest.raises(ValueError, match="reversed"):
        reader.read([seg], "routed_experts", 3, 1)
    with pytest.raises(ValueError, match="fill -1 does not fit the output dtype uint8"):
        reader.read([seg], "routed_experts", 0, 8, fill=-1)
    with pytest.raises(ValueError, match=r"row_shape \[1\] cannot hold rows of shape \[1, 1\]"):
        reader.read([seg], "routed_experts", 0, 4, row_shape=(1,))


def test_segment_outside_the_root_is_refused(tmp_path, root, reader, read_with):
    outside = tmp_path / "v1"
    outside.mkdir()
    (outside / "x.bin").write_bytes(b"\0" * 16)
    seg = Segment("routed_experts", str(outside / "x.bin"), 0, 0, 1, "uint8", (4,))
    with pytest.raises(PayloadPathError, match="not inside the payload root"):
        read_with(reader, seg)


@pytest.mark.parametrize(
    "file",
    ["v1/../../secret", "../secret/v1/x.bin", "v1/../v1/x.bin", "/etc/v1/passwd", "v1/x.bin/.."],
)
def test_segment_escaping_the_root_is_refused(tmp_path, root, reader, read_with, file):
    """``..`` and absolute paths outside the root, alone, beside another file, and as one bad
    file among a micro-batch of good ones in one version directory (the one-pass check)."""
    (tmp_path / "secret").write_bytes(b"s" * 16)
    (root.path / "v1").mkdir()
    (root.path / "v1" / "x.bin").write_bytes(b"\0" * 16)
    seg = Segment("routed_experts", file, 0, 0, 1, "uint8", (4,))
    with pytest.raises(PayloadPathError):
        read_with(reader, seg)
    good = [write(root, 1, "routed_experts", np.ones((1, 4), np.uint8), pos=i) for i in range(8)]
    with pytest.raises(PayloadPathError):
        reader.read([*good, seg.shift(8)], "routed_experts", 0, 9)


def test_micro_batch_of_two_versions_refuses_a_symlink_swapped_in_between_calls(
    tmp_path, root, reader
):
    """Files of several version directories in one call: each directory is opened (and
    refused as a symlink) on every call."""
    rows = np.arange(6 * 4, dtype=np.uint8).reshape(6, 4)
    segs = [write(root, 1 + i % 2, "routed_experts", rows[i : i + 1], pos=i) for i in range(6)]
    np.testing.assert_array_equal(reader.read(segs, "routed_experts", 0, 6), rows)
    (root.path / "v2").rename(tmp_path / "moved")
    (root.path / "v2").symlink_to(tmp_path / "moved")
    with pytest.raises(PayloadPathError, match="symlink"):
        reader.read(segs, "routed_experts", 0, 6)


def test_symlinked_file_is_not_followed(tmp_path, root, reader, read_with):
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 16)
    (root.path / "v1").mkdir()
    (root.path / "v1" / "x.bin").symlink_to(secret)
    seg = Segment("routed_experts", "v1/x.bin", 0, 0, 1, "uint8", (4,))
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        read_with(reader, seg)


def test_symlinked_version_dir_is_refused(tmp_path, root, reader, read_with):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.bin").write_bytes(b"s" * 16)
    (root.path / "v1").symlink_to(tmp_path / "elsewhere")
    seg = Segment("routed_experts", "v1/x.bin", 0, 0, 1, "uint8", (4,))
    with pytest.raises(PayloadPathError, match="symlink"):
        read_with(reader, seg)


def test_symlinked_version_dir_is_refused_on_every_call(tmp_path, root, reader, read_with):
    """A version directory that was real at one call and a symlink at the next is refused:
    nothing of the first call's checks is kept."""
    rows = np.full((1, 4), 3, np.uint8)
    seg = write(root, 1, "routed_experts", rows, pos=0)
    assert read_with(reader, seg)[0].tolist() == [3] * 4
    (root.path / "v1").rename(tmp_path / "moved")
    (root.path / "v1").symlink_to(tmp_path / "moved")
    with pytest.raises(PayloadPathError, match="symlink"):
        read_with(reader, seg)


@pytest.mark.parametrize("how", list(READERS))
def test_file_that_stays_short_raises_with_the_numbers(root, read_with, how):
    (root.path / "v1").mkdir()
    path = root.path / "v1" / "short.bin"
    path.write_bytes(b"\1" * 10)
    seg = Segment("routed_experts", str(path), 4, 0, 2, "uint8", (4,))
    sleeps = []
    with (
        PayloadReader(root, sleep=sleeps.append, **READERS[how]) as reader,
        pytest.raises(ShortReadError) as info,
    ):
        read_with(reader, seg)
    err = info.value
    assert (err.file, err.offset, err.expected, err.received) == (str(path), 4, 8, 6)
    assert "offset 4 expected 8 bytes" in str(err) and "gave 6 bytes" in str(err)
    assert sleeps == [0.1, 0.2, 0.4, 0.8]


def test_missing_file_raises_after_retries(root, reader, read_with):
    seg = Segment("routed_experts", "v1/gone.bin", 0, 0, 2, "uint8", (4,))
    with pytest.raises(ShortReadError) as info:
        read_with(reader, seg)
    assert "was missing" in str(info.value) and info.value.received == 0
    assert "after 5 attempts" in str(info.value)


@pytest.mark.parametrize("how", list(READERS))
def test_short_read_completed_by_another_thread_while_retrying(root, read_with, how):
    """A writer on another node finishes the file while the reader backs off."""
    rows = np.arange(64 * 4, dtype=np.uint8).reshape(64, 4)
    data = rows.tobytes()
    (root.path / "v1").mkdir()
    path = root.path / "v1" / "late.bin"
    path.write_bytes(data[:100])
    seg = Segment("routed_experts", str(path), 0, 0, 64, "uint8", (4,))
    finished = threading.Event()

    def complete_later():
        with open(path, "ab") as f:
            f.write(data[100:])
        finished.set()

    def sleep(seconds):
        # the first backoff lets the "remote writer" finish, in its own thread
        if not finished.is_set():
            t = threading.Thread(target=complete_later)
            t.start()
            t.join()

    with PayloadReader(root, sleep=sleep, **READERS[how]) as reader:
        out = read_with(reader, seg)
    assert finished.is_set()
    np.testing.assert_array_equal(out[:64], rows)


def test_short_read_real_backoff_with_concurrent_writer(root):
    """The same with the real sleep: the writer finishes the file while the reader backs off."""
    rows = np.arange(1000 * 8, dtype=np.uint16).reshape(1000, 8)
    data = rows.tobytes()
    (root.path / "v2").mkdir()
    path = root.path / "v2" / "racing.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data[: len(data) // 3])
    backing_off = threading.Event()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the reader's real backoff, recorded
        sleeps.append(seconds)
        backing_off.set()
        time.sleep(seconds)

    def finish() -> None:  # once the reader has seen the file short, while it sleeps
        backing_off.wait()
        os.write(fd, data[len(data) // 3 :])
        os.close(fd)

    writer = threading.Thread(target=finish)
    writer.start()
    seg = Segment("routed_experts", str(path), 0, 0, 1000, "uint16", (8,))
    try:
        with PayloadReader(root, sleep=sleep) as reader:
            out = reader.read([seg], "routed_experts", 0, 1000)
    finally:
        backing_off.set()  # a reader that never backed off must not leave the writer waiting
        writer.join()
    np.testing.assert_array_equal(out, rows)
    # it retried, on the default schedule (a second backoff only if the writer was slower)
    assert sleeps and sleeps == list(DEFAULT_RETRY_DELAYS[: len(sleeps)])


def test_read_field_one_off(root):
    seg = write(root, 1, "routed_experts", np.ones((2, 1, 1), np.uint8), pos=0)
    assert read_field([seg], "routed_experts", 0, 2, root=root.path).sum() == 2


@pytest.mark.parametrize(("slow_file_ns", "on_pool"), [(0, 299), (3600 * 10**9, 0)])
def test_many_files_on_the_pool_once_one_is_slow(root, monkeypatch, slow_file_ns, on_pool):
    """Files go to the pool after the first run of files slower than slow_file_ns a file (any
    file is slower than 0 ns, none takes an hour); before, on the thread that runs the call (the
    deadline's guard thread: a read may block on a hung mount, so the caller never reads)."""
    rng = np.random.default_rng(5)
    expected = rng.integers(0, 256, (300, 6, 2)).astype(np.uint8)
    segs = [write(root, i % 3, "routed_experts", expected[i : i + 1], pos=i) for i in range(300)]
    opened_by = []
    real_open = os.open

    def recording_open(path, *args, **kwargs):
        if str(path).endswith(".bin"):
            name = threading.current_thread().name
            assert name.startswith("payload-read"), f"a read on {name}, not the reader's threads"
            opened_by.append(name.startswith("payload-read-guard"))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    with PayloadReader(root, max_workers=8, slow_file_ns=slow_file_ns) as reader:
        out = reader.read(segs[::-1], "routed_experts", 0, 300)
    np.testing.assert_array_equal(out, expected)
    assert len(opened_by) == 300 and opened_by.count(False) == on_pool


@pytest.mark.torch
def test_torch_output_shares_memory(root):
    try:
        import torch
    except ImportError:
        skip_or_fail("torch is not installed (pip install 'payloadrun[torch]')")
    rows = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
    seg = write(root, 1, "routed_experts", rows, pos=0)
    buf = np.zeros((3, 2, 2), np.uint8)
    with PayloadReader(root) as reader:
        out = reader.read([seg], "routed_experts", 0, 3, out=buf, as_torch=True)
        fresh = reader.read([seg], "routed_experts", 0, 3, as_torch=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.uint8
    assert out.tolist() == rows.tolist() and fresh.tolist() == rows.tolist()
    # the tensor is the array the rows were read into, not a copy of it
    assert out.data_ptr() == buf.ctypes.data
    buf[0, 0, 0] = 99  # written through the numpy array...
    assert out[0, 0, 0].item() == 99  # ...seen through the tensor
    out[2, 1, 1] = 77  # and the other way
    assert buf[2, 1, 1] == 77


def test_read_into_a_reused_buffer(root, reader):
    a = write(root, 1, "routed_experts", np.full((2, 1, 1), 5, np.uint8), pos=0)
    buf = np.full((4, 1, 1), 9, np.uint8)
    got = reader.read([a], "routed_experts", 0, 4, out=buf)
    assert got is buf
    assert buf.ravel().tolist() == [5, 5, 0, 0]  # uncovered rows are filled, not left stale
    wanted = r"out must be a C-contiguous uint8 array of shape \(4, 1, 1\)"
    with pytest.raises(ValueError, match=wanted):
        reader.read([a], "routed_experts", 0, 4, out=np.empty((4, 1, 2), np.uint8)[:, :, :1])
    with pytest.raises(ValueError, match="got int32"):
        reader.read([a], "routed_experts", 0, 4, out=np.empty((4, 1, 1), np.int32))
