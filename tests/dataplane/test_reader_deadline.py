"""The reader's deadline: a read the filesystem does not answer raises, and leaves few threads.

The hang is a real one: a payload file that is a FIFO with no writer, whose ``open`` blocks in
the kernel until a writer comes, as an ``open`` or ``read`` on a hung network volume blocks until
its server answers. A test ends the hang by opening the FIFO's other end (the stuck read then
fails on the FIFO, which nobody waits for any more), and only after the call raised: what the
checks read is the reader's own account (the error's fields, ``reader.hung_reads``) and the
call's time against its deadline.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import payloadrun
from payloadrun.codec import PositionedRows
from payloadrun.paths import PayloadRoot
from payloadrun.reader import (
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_HUNG_READS,
    PayloadReader,
    ReadDeadlineError,
    read_field,
)
from payloadrun.segments import ROUTED_EXPERTS, Segment
from payloadrun.store import PayloadStore

DEADLINE_S = 1.0
# How far past the machine's own wake-up a call may report having waited (its ``waited_s``).
# The call's thread wakes when its lock's timeout passes (the stuck guard thread is blocked in
# the kernel and holds no GIL), and how late that is depends on the machine at that moment:
# 1-6 ms here, 17-71 ms with six busy processes on this 2-core machine, 381 ms once and 1.2 s
# twice in make test's unit part (a cpu cgroup weighed a third of the other parts', on a loaded
# machine: 2026-12-06 and -07). So each call is measured against a control thread that waits
# the same deadline on a lock of its own at the same time (the baseline, in the same run): a
# reader that waits twice its deadline is past the control's wake-up by a whole deadline.
MARGIN_S = DEADLINE_S
# A call still not back after this long waits for its stuck read (which returns only when the test
# ends the hang): a hundred deadlines, no machine is that slow at waking a thread.
STUCK_S = 100 * DEADLINE_S
READERS = {
    "pool": {"max_workers": 4, "slow_file_ns": 0},
    "fast files": {"max_workers": 4, "slow_file_ns": 3600 * 10**9},
    "one thread": {"max_workers": 1},
}


@pytest.fixture
def root(tmp_path: Path) -> PayloadRoot:
    path = tmp_path / "payloads"
    path.mkdir()
    return PayloadRoot(path)


class Hang:
    """A payload file whose open blocks until :meth:`end` (a FIFO nobody writes yet)."""

    def __init__(self, root: PayloadRoot, version: int, name: str, pos: int, rows: int) -> None:
        directory = root.path / f"v{version}"
        directory.mkdir(exist_ok=True)
        self.path = directory / name
        os.mkfifo(self.path)
        self.segment = Segment(
            field=ROUTED_EXPERTS,
            file=f"v{version}/{name}",
            offset=4096,
            pos=pos,
            rows=rows,
            dtype="uint8",
            shape=(6, 2),
        )
        self._writer: int | None = None

    def end(self) -> None:
        """Open the writing end: the blocked open returns (its read then fails on the FIFO)."""
        if self._writer is None:
            try:
                self._writer = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:  # ENXIO: nobody has it open for reading, nothing waits
                if exc.errno != errno.ENXIO:
                    raise
                self._writer = -1

    def close(self) -> None:
        if self._writer is not None and self._writer >= 0:
            os.close(self._writer)


@pytest.fixture
def hangs(root):
    made: list[Hang] = []

    def make(version: int = 1, name: str = "hung.bin", pos: int = 0, rows: int = 3) -> Hang:
        made.append(Hang(root, version, name, pos, rows))
        return made[-1]

    yield make
    for hang in made:  # no thread stays blocked after the test
        hang.end()
        hang.close()


def write(root: PayloadRoot, version: int, rows: np.ndarray, pos: int) -> Segment:
    return PayloadStore(root).write(f"v{version}", [PositionedRows(ROUTED_EXPERTS, rows, pos)])[0]


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 200, (n, 6, 2)).astype(np.uint8)


def until(what: str, condition, limit: float = 30.0) -> None:
    """Wait for a fact (polled); fail naming it if it never comes."""
    end = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < end, f"{what} did not happen"
        time.sleep(0.01)


def raised_at_the_deadline(call, hang: Hang) -> ReadDeadlineError:
    """Run ``call`` on a thread of its own while ``hang`` holds its read; the
    :class:`ReadDeadlineError` it raised, checked to have come after the whole deadline and
    within ``MARGIN_S`` of a control thread's wake-up from the same deadline, with the stuck read
    counted (once) by the reader. Fails if the
    call is not back within ``STUCK_S``; a failed check ends the hang first, so that nothing
    (the call's thread, the reader's close) is left waiting for the stuck read."""
    outcome: list = []

    def run() -> None:
        started = time.monotonic()
        try:
            call()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)
        outcome.append(time.monotonic() - started)

    woke: list[float] = []

    def control() -> None:  # the machine's own wake-up from a deadline, at the same moment
        lock = threading.Lock()
        lock.acquire()
        started = time.monotonic()
        lock.acquire(timeout=DEADLINE_S)
        woke.append(time.monotonic() - started)

    baseline = threading.Thread(target=control, name="test-control", daemon=True)
    thread = threading.Thread(target=run, name="test-call", daemon=True)
    baseline.start()
    thread.start()
    thread.join(STUCK_S)
    baseline.join(STUCK_S)
    try:
        assert not thread.is_alive(), f"not back after {STUCK_S} s: it waits for its stuck read"
        err, took = outcome
        assert isinstance(err, ReadDeadlineError), f"the call gave {err!r}"
        assert err.deadline_s == DEADLINE_S and not err.refused
        # the whole deadline, by the reader's clock and by ours (which started before its own)
        assert DEADLINE_S <= err.waited_s <= took, (err.waited_s, took)
        assert err.waited_s < woke[0] + MARGIN_S, (
            f"waited {err.waited_s:.3f} s, where a thread waiting the same deadline woke after "
            f"{woke[0]:.3f} s"
        )
        # the read it gave up on is still blocked in the kernel: the reader counts it as stuck
        assert err.hung_reads == 1
    except BaseException:
        hang.end()
        raise
    return err


def test_a_read_the_volume_does_not_answer_raises_with_the_file_offset_and_bytes(root, hangs):
    hang = hangs()
    with PayloadReader(root, deadline_s=DEADLINE_S) as reader:
        err = raised_at_the_deadline(
            lambda: reader.read([hang.segment], ROUTED_EXPERTS, 0, 3), hang
        )
        assert reader.hung_reads == 1  # still stuck after the call: it did not wait for it
        assert (err.file, err.offset, err.expected) == ("v1/hung.bin", 4096, 3 * 6 * 2)
        assert isinstance(err, TimeoutError) and err.errno == errno.ETIMEDOUT
        assert "'v1/hung.bin'" in str(err) and "36 bytes at offset 4096" in str(err)
        assert "deadline_s" in str(err)  # what to do when reads are merely slow
        hang.end()
        until("the stuck read to return", lambda: reader.hung_reads == 0)
        # the reader goes on: a file that answers is read
        expected = rows(4, 1)
        good = write(root, 2, expected, pos=0)
        np.testing.assert_array_equal(reader.read([good], ROUTED_EXPERTS, 0, 4), expected)


@pytest.mark.parametrize("how", list(READERS))
def test_the_error_names_the_file_the_call_waits_on_among_files_that_answer(root, hangs, how):
    first, last = rows(2, 2), rows(2, 3)
    segs = [write(root, 1, first, pos=0), None, write(root, 1, last, pos=5)]
    hang = hangs(version=1, name="middle.bin", pos=2, rows=3)
    segs[1] = hang.segment
    with PayloadReader(root, deadline_s=DEADLINE_S, **READERS[how]) as reader:
        err = raised_at_the_deadline(lambda: reader.read(segs, ROUTED_EXPERTS, 0, 7), hang)
        assert reader.hung_reads == 1
        assert (err.file, err.offset, err.expected) == ("v1/middle.bin", 4096, 36)
        hang.end()
        until("the stuck read to return", lambda: reader.hung_reads == 0)


def test_at_the_cap_of_stuck_reads_the_next_read_raises_at_once_naming_the_oldest(root, hangs):
    stuck = [hangs(name=f"stuck{i}.bin") for i in range(2)]
    expected = rows(4, 4)
    good = write(root, 2, expected, pos=0)
    with PayloadReader(root, deadline_s=DEADLINE_S, max_hung_reads=2) as reader:
        for hang in stuck:
            with pytest.raises(ReadDeadlineError):
                reader.read([hang.segment], ROUTED_EXPERTS, 0, 3)
        assert reader.hung_reads == 2
        # a deadline of an hour: only a read that is not attempted can raise now
        reader.deadline_s = 3600.0
        never = hangs(name="never.bin")
        with pytest.raises(ReadDeadlineError) as info:
            reader.read([never.segment], ROUTED_EXPERTS, 0, 3)
        err = info.value
        assert err.refused and err.waited_s == 0 and err.hung_reads == 2
        assert (err.file, err.offset, err.expected) == ("v1/never.bin", 4096, 36)
        assert "max_hung_reads=2" in str(err) and "'v1/stuck0.bin'" in str(err)
        # a file that answers is refused too: the cap holds the threads, not the files
        with pytest.raises(ReadDeadlineError) as info:
            reader.read([good], ROUTED_EXPERTS, 0, 4)
        assert info.value.refused
        # once the volume answers, the stuck threads return and reads go on
        stuck[0].end()
        until("one stuck read to return", lambda: reader.hung_reads == 1)
        np.testing.assert_array_equal(reader.read([good], ROUTED_EXPERTS, 0, 4), expected)
        stuck[1].end()
        until("the other stuck read to return", lambda: reader.hung_reads == 0)


def test_the_threads_a_hang_holds_are_bounded(root, hangs):
    """However many calls a hang meets, it holds max_hung_reads threads: the calls past the
    cap are refused before they take one."""
    made = [hangs(name=f"h{i}.bin") for i in range(10)]
    with PayloadReader(root, deadline_s=DEADLINE_S, max_hung_reads=3, max_workers=2) as reader:
        before = threading.active_count()
        refused = 0
        for hang in made:
            with pytest.raises(ReadDeadlineError) as info:
                reader.read([hang.segment], ROUTED_EXPERTS, 0, 3)
            refused += info.value.refused
        assert reader.hung_reads == 3 and refused == 7
        assert threading.active_count() - before == 3  # the stuck guard threads, no more
        for hang in made:
            hang.end()
        until("the stuck reads to return", lambda: reader.hung_reads == 0)


def test_read_field_takes_the_deadline_and_does_not_wait_for_the_stuck_thread(root, hangs):
    hang = hangs()
    # back at the deadline though its reader's close comes after the stuck read, which returns
    # only when the fixture ends the hang
    err = raised_at_the_deadline(
        lambda: read_field(
            [hang.segment], ROUTED_EXPERTS, 0, 3, root=root.path, deadline_s=DEADLINE_S
        ),
        hang,
    )
    assert err.file == "v1/hung.bin"


def test_without_a_deadline_the_call_reads_on_the_callers_thread(root, monkeypatch):
    expected = rows(3, 5)
    seg = write(root, 1, expected, pos=0)
    opened_by = []
    real_open = os.open

    def recording_open(path, *args, **kwargs):
        if str(path).endswith(".bin"):
            opened_by.append(threading.current_thread() is threading.main_thread())
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    with PayloadReader(root, deadline_s=None) as reader:
        np.testing.assert_array_equal(reader.read([seg], ROUTED_EXPERTS, 0, 3), expected)
    with PayloadReader(root) as reader:
        np.testing.assert_array_equal(reader.read([seg], ROUTED_EXPERTS, 0, 3), expected)
    assert opened_by == [True, False]  # the default deadline reads on a guard thread


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"deadline_s": 0}, "deadline_s must be > 0"),
        ({"deadline_s": -1.0}, "deadline_s must be > 0"),
        ({"max_hung_reads": 0}, "max_hung_reads must be >= 1"),
    ],
)
def test_bad_deadline_settings_are_refused(root, options, message):
    with pytest.raises(ValueError, match=message):
        PayloadReader(root, **options)


def test_the_defaults_and_the_export():
    assert DEFAULT_DEADLINE_S == 30.0 and DEFAULT_MAX_HUNG_READS == 4
    assert payloadrun.ReadDeadlineError is ReadDeadlineError
    assert "ReadDeadlineError" in payloadrun.__all__
