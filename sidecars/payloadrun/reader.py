"""Reading one field over a token range from payload segments, on the trainer side.

The reader turns the segments of a sample (or a whole micro-batch) into one array with a row per
token position in ``[lo, hi)``. Segments can point into any number of files; files that come
slowly (from a server rather than the page cache) are read concurrently, and rows whose shape and
dtype already match the output are read straight into it (``preadv`` into the output's memory, no
intermediate buffer).

A shared filesystem may show a file shorter than it is for a moment after another node wrote it
(attribute caches, close-to-open visibility), and fails calls while its server is away
(``ENOTCONN`` from a GlusterFS client whose brick restarts, ``ESTALE``, ``EIO`` or ``ETIMEDOUT``
from NFS). A short read or such an error therefore closes the file, waits, reopens it and reads
again, 4 times with backoff 0.1, 0.2, 0.4, 0.8 s, before it raises :class:`ShortReadError` with the
file, the offset, the byte counts and the last error. Bytes are never returned from a read that
failed: a segment counts as read only once every one of its bytes came back.

A server that stops answering does not fail calls: it hangs them (an NFS ``hard`` mount for as
long as the server is away, a GlusterFS client until its ``network.ping-timeout``, 42 s by
default), and a blocked system call cannot be cancelled. So a call's reads run on a thread of a
small guard pool and the caller waits for them at most ``deadline_s`` (30 s by default); past it
the call raises :class:`ReadDeadlineError` with the file, offset and bytes it was reading, and the
stuck thread is left to return whenever the volume does. At most ``max_hung_reads`` calls may be
left stuck so: at the cap, the next call raises :class:`ReadDeadlineError` at once, naming the
oldest hang, instead of queueing behind them (the threads a hang can hold are bounded by
``max_hung_reads`` guard threads plus the ``max_workers`` of the reader pool).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from operator import attrgetter
from stat import S_ISLNK
from typing import Any

import numpy as np

from payloadrun.paths import PayloadRoot
from payloadrun.segments import ALLOWED_DTYPES, FIELD_FILL, Segment

DEFAULT_RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8)
DEFAULT_WORKERS = 16
# A healthy call takes milliseconds to a second (a micro-batch from the page cache or the
# server); 30 s is far past that, and short of GlusterFS's default ping-timeout (42 s), so a hung
# brick is reported before the client gives up on it. The retries' backoff counts in it.
DEFAULT_DEADLINE_S = 30.0
# calls that may be left stuck on a hung volume before the next one raises at once
DEFAULT_MAX_HUNG_READS = 4
# guard threads beyond max_hung_reads: calls made at once from several threads of a trainer
_GUARD_SPARE = 8
# A file that takes longer than this to open and read is not in the page cache: hand the rest
# of the call to the pool (a 1 MiB copy from the page cache takes about 50 us).
DEFAULT_SLOW_FILE_NS = 200_000
_FILL_CACHE_SIZE = 256
_BY_POS = attrgetter("pos")
_DTYPES = {name: np.dtype(name) for name in ALLOWED_DTYPES}  # np.dtype(str) costs a microsecond

# What a network file system answers while its server is away or a handle went stale: tried
# again like a short read (on a local disk these do not come back, and cost 1.5 s to report).
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.ENOTCONN,
        errno.ESTALE,
        errno.ETIMEDOUT,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
    }
)

_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_DIRECTORY


class ShortReadError(OSError):
    """A payload file held fewer bytes than a segment needs, after every retry."""

    def __init__(
        self,
        file: str,
        offset: int,
        expected: int,
        received: int,
        attempts: int,
        error: OSError | None = None,
    ):
        if error is not None:
            what = f"could not be read ({error.strerror or error})"
            hint = "the shared volume's server may be away (check its mount on this node)"
        else:
            what = "was missing" if received < 0 else f"gave {received} bytes"
            hint = (
                "the writer may have failed, or the file was deleted before the trainer read it "
                "(check the retention sidecar's log)"
            )
        super().__init__(
            error.errno if error is not None else None,
            f"short read of payload file {file!r}: at offset {offset} expected {expected} bytes, "
            f"the file {what} after {attempts} attempts; {hint}",
        )
        self.file = file
        self.offset = offset
        self.expected = expected
        self.received = max(received, 0)
        self.error = error


class ReadDeadlineError(TimeoutError):
    """A read was not done within the reader's deadline: the shared volume hangs.

    ``file``, ``offset`` and ``expected`` name the segment being read when the deadline passed
    (the first of the call's when it was refused at once), ``waited_s`` how long the call
    waited, ``deadline_s`` the reader's deadline and ``hung_reads`` how many calls are still
    stuck on the volume. ``refused`` is True when the call was not attempted because
    ``max_hung_reads`` calls were already stuck. The stuck read may still write into the call's
    ``out`` array when the volume answers: do not reuse that buffer.
    """

    def __init__(
        self,
        file: str,
        offset: int,
        expected: int,
        *,
        deadline_s: float,
        waited_s: float,
        hung_reads: int,
        refused: str | None = None,
    ):
        if refused is None:
            what = (
                f"was not read within the reader's deadline of {deadline_s:g} s (waited "
                f"{waited_s:.2f} s): the shared volume is not answering; {hung_reads} read(s) "
                "are left waiting on it"
            )
        else:
            what = f"was not attempted: {refused}"
        super().__init__(
            errno.ETIMEDOUT,
            f"payload file {file!r}: {expected} bytes at offset {offset} {what}; check the "
            "shared volume's mount on this node (a hard NFS mount or a GlusterFS brick that "
            "stopped answering), or raise the deadline (PayloadReader(deadline_s=...)) if reads "
            "are merely slow",
        )
        self.file = file
        self.offset = offset
        self.expected = expected
        self.deadline_s = deadline_s
        self.waited_s = waited_s
        self.hung_reads = hung_reads
        self.refused = refused is not None


class SegmentOverlapError(ValueError):
    """Two segments of one field claim the same token positions."""


def _pread_rest(fd: int, view: memoryview, offset: int, got: int) -> int:
    """After a first ``preadv`` gave ``got`` bytes of ``view``: the rest, to the file's end."""
    while 0 < got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    """Read into ``view`` from ``offset`` until it is full or the file ends; bytes read."""
    # all of it in one call, but at the end of a file or on a signal
    return _pread_rest(fd, view, offset, os.preadv(fd, [view], offset))


def _out_dtype(chosen: Sequence[Segment], dtype: Any) -> np.dtype:
    if dtype is not None:
        return np.dtype(dtype)
    return np.result_type(*{np.dtype(s.dtype) for s in chosen})


def _out_row_shape(chosen: Sequence[Segment], row_shape: Sequence[int] | None) -> tuple[int, ...]:
    ndims = {len(s.shape) for s in chosen}
    if len(ndims) > 1:
        raise ValueError(
            f"segments of one field must have rows of one rank, got shapes "
            f"{sorted({s.shape for s in chosen})}"
        )
    widest = tuple(max(dims) for dims in zip(*(s.shape for s in chosen), strict=True))
    if row_shape is None:
        return widest
    row_shape = tuple(row_shape)
    if len(row_shape) != len(widest) or any(w > r for w, r in zip(widest, row_shape, strict=True)):
        raise ValueError(f"row_shape {list(row_shape)} cannot hold rows of shape {list(widest)}")
    return row_shape


def _uniform(kinds: set[tuple[str, tuple[int, ...]]], out_dtype: np.dtype, shape: tuple) -> bool:
    """Whether the one kind of row in ``kinds`` is the output's dtype and row shape."""
    ((seg_dtype, seg_shape),) = kinds
    return seg_shape == shape and _DTYPES[seg_dtype] == out_dtype


def _check_no_overlap(chosen: Sequence[Segment], lo: int, hi: int) -> bool:
    """Raise if two segments cover one position; True when they tile ``[lo, hi)`` exactly."""
    ordered = sorted(chosen, key=_BY_POS)
    tiled = ordered[0].pos == lo
    prev = ordered[0]
    prev_end = prev.pos + prev.rows
    for seg in ordered[1:]:
        if seg.pos < prev_end:
            raise SegmentOverlapError(
                f"segments of {prev.field!r} overlap: {prev.file!r} covers [{prev.pos}, "
                f"{prev_end}) and {seg.file!r} covers [{seg.pos}, {seg.end}); clip them to "
                "disjoint ranges first"
            )
        tiled = tiled and seg.pos == prev_end
        prev, prev_end = seg, seg.pos + seg.rows
    return tiled and prev_end == hi


def _choose(
    segments: Iterable[Segment], field: str, lo: int, hi: int
) -> tuple[list[Segment], bool, int, str | None, tuple[int, ...] | None]:
    """The segments of ``field`` inside ``[lo, hi)`` (clipped), whether they cover it all, how
    many kinds of row (dtype and shape) they have, and the last kind seen. Raises on overlap.

    One pass picks them and learns what the common micro-batch needs no more work for:
    segments in position order without overlap (``expect`` is where the previous one ended),
    tiling the range, all of one kind of row; only others are sorted and checked again.
    """
    chosen = []
    expect, ordered, tiled = lo, True, True
    kinds, seg_dtype, seg_shape = 0, None, None
    for s in segments:
        if s.field != field:
            continue
        pos = s.pos
        end = pos + s.rows
        if not (lo <= pos and end <= hi and pos != end):  # most are inside already
            if (s := s.clip(lo, hi)) is None:
                continue
            pos, end = s.pos, s.pos + s.rows
        if pos != expect:
            tiled = False
            if pos < expect:
                ordered = False
        expect = end
        if s.dtype != seg_dtype or s.shape != seg_shape:
            kinds += 1
            seg_dtype, seg_shape = s.dtype, s.shape
        chosen.append(s)
    if ordered:
        covered = bool(chosen) and tiled and expect == hi
    else:
        covered = _check_no_overlap(chosen, lo, hi)  # raises on an overlap
    if kinds > 1:
        kinds = len({(s.dtype, s.shape) for s in chosen})
    return chosen, covered, kinds, seg_dtype, seg_shape


class PayloadReader:
    """Reads payload fields from files under one root, with a pool of reader threads.

    A call within one file is read on one thread, where a further hand-off would cost more
    than it could save; so is a call of several files while they come fast (see
    :meth:`_read_while_fast`). The pool takes the rest once a file is slower than
    ``slow_file_ns``: on the shared filesystem every open is a round trip to the server, and
    only concurrency hides those.

    ``deadline_s`` bounds each call (see the module): the call's reads run on a guard thread
    and the caller waits at most that long before :class:`ReadDeadlineError`; with None the
    reads run on the caller's thread and a hung volume hangs the call. ``max_hung_reads`` calls
    may be left stuck past their deadline; at the cap, calls raise at once.
    """

    def __init__(
        self,
        root: PayloadRoot | str | os.PathLike[str],
        *,
        max_workers: int = DEFAULT_WORKERS,
        retry_delays: Sequence[float] = DEFAULT_RETRY_DELAYS,
        sleep: Callable[[float], None] = time.sleep,
        slow_file_ns: int = DEFAULT_SLOW_FILE_NS,
        deadline_s: float | None = DEFAULT_DEADLINE_S,
        max_hung_reads: int = DEFAULT_MAX_HUNG_READS,
    ) -> None:
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds or None, got {deadline_s!r}")
        if max_hung_reads < 1:
            raise ValueError(f"max_hung_reads must be >= 1, got {max_hung_reads!r}")
        self.root = root if isinstance(root, PayloadRoot) else PayloadRoot(root)
        self._root = os.fspath(self.root.path)
        self.max_workers = max_workers
        self.retry_delays = tuple(retry_delays)
        self.slow_file_ns = slow_file_ns
        self._sleep = sleep
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="payload-read")
        self.deadline_s = deadline_s
        self.max_hung_reads = max_hung_reads
        self._guard = ThreadPoolExecutor(
            max_hung_reads + _GUARD_SPARE, thread_name_prefix="payload-read-guard"
        )
        self._guard_lock = threading.Lock()
        # calls past their deadline still running: their first segment and since when
        self._hung: dict[Future, tuple[Segment, float]] = {}
        # (type(fill), fill, dtype) -> fill fits dtype: numpy's cast check costs a microsecond,
        # and a trainer asks the same few questions on every call.
        self._fill_fits: dict[tuple[type, int | float, np.dtype], bool] = {}

    def close(self) -> None:
        """Stop the pools: wait for the calls running, but not for those stuck past their
        deadline on a hung volume (their threads return, and end, when the volume does)."""
        wait_for_all = not self._hung
        self._guard.shutdown(wait=wait_for_all)
        self._pool.shutdown(wait=wait_for_all)

    @property
    def hung_reads(self) -> int:
        """Calls past their deadline whose reads have not returned yet."""
        return len(self._hung)

    def __enter__(self) -> PayloadReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(
        self,
        segments: Iterable[Segment],
        field: str,
        lo: int,
        hi: int,
        *,
        fill: int | float | None = None,
        row_shape: Sequence[int] | None = None,
        dtype: Any = None,
        out: np.ndarray | None = None,
        as_torch: bool = False,
    ) -> Any:
        """Rows of ``field`` for token positions ``[lo, hi)``: ``out[i]`` is position ``lo + i``.

        The row shape is the widest of the segments' (or ``row_shape``), the dtype theirs (or
        ``dtype``); cells no segment covers hold ``fill`` (by default 0 for routing, -1 for
        masks). ``out`` is a C-contiguous array of that shape and dtype to read into (a buffer
        reused across micro-batches saves the page faults of a new one). With ``as_torch`` the
        result is a torch tensor sharing the array's memory.
        """
        if hi < lo:
            raise ValueError(f"read range [{lo}, {hi}) is reversed")
        chosen, covered, kinds, seg_dtype, seg_shape = _choose(segments, field, lo, hi)
        if kinds == 1 and dtype is None and row_shape is None:
            # the common case, one dtype and one row shape: no promotion, no widening
            out_dtype, shape = _DTYPES[seg_dtype], seg_shape
            uniform = True
        elif not chosen and (row_shape is None or dtype is None):
            raise ValueError(
                f"no segment of field {field!r} covers [{lo}, {hi}); pass row_shape and dtype "
                "to get an all-fill array"
            )
        else:
            out_dtype = _out_dtype(chosen, dtype)
            shape = _out_row_shape(chosen, row_shape) if chosen else tuple(row_shape or ())
            uniform = kinds == 1 and _uniform({(seg_dtype, seg_shape)}, out_dtype, shape)
        fill = FIELD_FILL.get(field, 0) if fill is None else fill
        if not self._fill_fits.get((type(fill), fill, out_dtype)):
            self._check_fill(fill, out_dtype)

        if out is None:
            out = np.empty((hi - lo, *shape), dtype=out_dtype)
        elif out.shape != (hi - lo, *shape) or out.dtype != out_dtype or not out.flags.c_contiguous:
            raise ValueError(
                f"out must be a C-contiguous {out_dtype} array of shape {(hi - lo, *shape)}, got "
                f"{out.dtype} {out.shape}{'' if out.flags.c_contiguous else ' (not contiguous)'}"
            )
        if not (covered and uniform):
            out.fill(fill)
        if chosen:
            if self.deadline_s is None:
                self._read_chosen(out, chosen, lo, uniform, {})
            else:
                self._read_guarded(out, chosen, lo, uniform)
        if as_torch:
            import torch

            return torch.from_numpy(out)
        return out

    def _check_fill(self, fill: int | float, out_dtype: np.dtype) -> None:
        key = (type(fill), fill, out_dtype)
        fits = self._fill_fits.get(key)
        if fits is None:
            fits = bool(np.can_cast(np.min_scalar_type(fill), out_dtype, casting="safe"))
            if len(self._fill_fits) < _FILL_CACHE_SIZE:
                self._fill_fits[key] = fits
        if not fits:
            raise ValueError(f"fill {fill!r} does not fit the output dtype {out_dtype}")

    def _read_chosen(
        self,
        out: np.ndarray,
        chosen: list[Segment],
        lo: int,
        uniform: bool,
        active: dict[int, Segment],
    ) -> None:
        """Read ``chosen`` into ``out``; ``active`` learns which segment each thread reads."""
        if len(chosen) == 1 and uniform:
            active[threading.get_ident()] = chosen[0]
            self._read_one(out, chosen[0], lo)
        else:
            self._read_into(out, chosen, lo, uniform, active)

    def _read_guarded(self, out: np.ndarray, chosen: list[Segment], lo: int, uniform: bool) -> None:
        """The call's reads on a guard thread; raise :class:`ReadDeadlineError` past the deadline
        (the thread stays stuck, counted against ``max_hung_reads``, until the volume answers).

        The caller waits on a lock the guard thread releases when done: waking from a lock is
        a few times cheaper than from a future's condition, and a call of one small segment
        takes tens of microseconds.
        """
        deadline = self.deadline_s
        assert deadline is not None
        t0 = time.monotonic()
        active: dict[int, Segment] = {}
        finished = threading.Lock()
        finished.acquire()
        failed: list[BaseException] = []
        with self._guard_lock:
            if len(self._hung) >= self.max_hung_reads:
                raise self._refused(chosen[0], t0)
            done = self._guard.submit(
                self._guarded_call, finished, failed, out, chosen, lo, uniform, active
            )
        if not finished.acquire(timeout=deadline):
            with self._guard_lock:
                if done.cancel():  # queued behind busy guard threads: never started
                    seg = chosen[0]
                elif not finished.acquire(blocking=False):
                    seg = _reading(active, chosen[0])
                    self._hung[done] = (seg, t0)
                    done.add_done_callback(self._unhung)
                else:
                    seg = None  # it finished just now
            if seg is not None:
                raise ReadDeadlineError(
                    seg.file,
                    seg.offset,
                    seg.nbytes,
                    deadline_s=deadline,
                    waited_s=time.monotonic() - t0,
                    hung_reads=len(self._hung),
                )
        if failed:
            raise failed[0]

    def _guarded_call(
        self,
        finished: threading.Lock,
        failed: list[BaseException],
        out: np.ndarray,
        chosen: list[Segment],
        lo: int,
        uniform: bool,
        active: dict[int, Segment],
    ) -> None:
        active[threading.get_ident()] = chosen[0]  # first: the guard thread's entry
        try:
            self._read_chosen(out, chosen, lo, uniform, active)
        except BaseException as exc:
            failed.append(exc)
        finally:
            finished.release()

    def _unhung(self, done: Future) -> None:
        with self._guard_lock:
            self._hung.pop(done, None)

    def _refused(self, first: Segment, now: float) -> ReadDeadlineError:
        seg, since = min(self._hung.values(), key=lambda hung: hung[1])
        return ReadDeadlineError(
            first.file,
            first.offset,
            first.nbytes,
            deadline_s=self.deadline_s or 0.0,
            waited_s=0.0,
            hung_reads=len(self._hung),
            refused=(
                f"{len(self._hung)} earlier read(s) are still stuck on the shared volume (the cap, "
                f"max_hung_reads={self.max_hung_reads}), the oldest on payload file "
                f"{seg.file!r} ({seg.nbytes} bytes at offset {seg.offset}) for "
                f"{now - since:.1f} s"
            ),
        )

    def _read_one(self, out: np.ndarray, seg: Segment, lo: int) -> None:
        """Read one segment whose rows are ``out``'s, straight through on the caller's thread.

        The general path's grouping, plan and hand-off cost little, but a call that copies a
        MiB has just evicted the caches they run in: every object and function it touches costs
        a cache miss, so this one touches as few as it can.
        """
        parent, path = self.root.payload_file_strs(seg.file)
        self._check_version_dir(parent, seg.file)
        row_bytes = out.nbytes // len(out)
        start = (seg.pos - lo) * row_bytes
        view = memoryview(out).cast("B")[start : start + seg.rows * row_bytes]
        pending, short = _read_once(path, None, [(seg, view, None)])
        if pending:
            self._retry(path, None, pending, short)

    def _check_version_dir(self, parent: str, file: str) -> None:
        try:
            is_link = S_ISLNK(os.lstat(parent).st_mode)
        except FileNotFoundError:
            return  # the file's open will say it is missing, and retry
        except OSError as e:
            if e.errno in TRANSIENT_ERRNOS:
                return  # so will its failing open, which is retried
            raise
        if is_link:
            self.root.check_version_dir(parent, file)  # raises, naming the symlink

    def _read_into(
        self,
        out: np.ndarray,
        chosen: list[Segment],
        lo: int,
        uniform: bool,
        active: dict[int, Segment],
    ) -> None:
        """Read every segment into ``out``; ``uniform``: every segment's rows are ``out``'s."""
        active[threading.get_ident()] = chosen[0]  # the directories are opened first
        files = list(dict.fromkeys([s.file for s in chosen]))
        singles = len(files) == len(chosen)  # a file per segment, as a micro-batch has
        if singles:
            items: list[Any] = chosen
        else:
            by_file: dict[str, list[Segment]] = {}
            for seg in chosen:
                by_file.setdefault(seg.file, []).append(seg)
            items = list(by_file.values())
        vdirs, names = self.root.payload_file_names(files)  # every name checked, in one pass
        dir_fds: dict[str, int | None] = {}
        try:
            for vdir, given in zip(vdirs, files, strict=True):  # the directories of the call
                if vdir not in dir_fds:
                    dir_fds[vdir] = self._open_version_dir(vdir, given)
                    if len(dir_fds) == 1 and vdirs.count(vdir) == len(vdirs):
                        break  # a micro-batch of one version, as most are
            if len(dir_fds) == 1:
                fds = [*dir_fds.values()] * len(vdirs)
            else:
                fds = [dir_fds[vdir] for vdir in vdirs]
            if None in dir_fds.values():  # a directory not there (yet): its files by full path
                names = [
                    f"{self._root}/{vdir}/{name}" if dfd is None else name
                    for vdir, name, dfd in zip(vdirs, names, fds, strict=True)
                ]
            jobs = list(zip(items, names, fds, strict=True))
            plan = _Plan(out, lo, uniform, singles, active)
            if len(jobs) <= 1 or self.max_workers <= 1:
                self._read_files(plan, jobs)
                return
            jobs = self._read_while_fast(plan, jobs)
            if not jobs:
                return
            chunk = math.ceil(len(jobs) / self.max_workers)
            futures = [
                self._pool.submit(self._read_files_pooled, plan, jobs[i : i + chunk])
                for i in range(0, len(jobs), chunk)
            ]
            wait(futures)  # every thread has stopped writing into `out` before anything is raised
            for fut in futures:
                fut.result()
        finally:
            for dfd in dir_fds.values():
                if dfd is not None:
                    os.close(dfd)

    def _open_version_dir(self, vdir: str, given: str) -> int | None:
        """A descriptor of ``<root>/<vdir>`` for this call only; None if it does not exist.

        Its files are then opened relative to it (``openat``), which is what makes this as safe
        as the lstat of the directory it replaces, and safer: ``O_NOFOLLOW`` refuses a symlink
        in place of the directory at the open itself, and every file is looked up in the
        directory the descriptor holds, so a symlink swapped in after the check is never walked
        (between an lstat and an open by path it would be). The file names hold no "/" and are
        opened ``O_NOFOLLOW`` too. The descriptors are closed when the call returns: nothing is
        kept for the next call. The kernel also walks one name per file instead of a full path.
        """
        path = f"{self._root}/{vdir}"
        try:
            return os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            return None  # its files are missing: their opens say so, and are retried
        except OSError as e:
            if e.errno in TRANSIENT_ERRNOS:
                return None  # its files are opened by path, and their failures retried
            if e.errno not in (errno.ELOOP, errno.ENOTDIR) or not os.path.islink(path):
                raise
            raise PayloadRoot.symlink_refused(path, given, "payload file") from None

    def _read_while_fast(self, plan: _Plan, jobs: list[_Job]) -> list[_Job]:
        """Read files on this thread while they come fast; the ones left for the pool.

        Files in the page cache take microseconds each, less than handing them to threads
        that then take turns on the GIL; files from a server take a round trip each, which
        only concurrency hides. So files are read here in runs of 1, 2, 4, ... up to 64, and
        the first run slower than ``slow_file_ns`` a file sends the rest to the pool.
        """
        clock = time.perf_counter_ns
        done, run = 0, 1
        while done < len(jobs):
            t0 = clock()
            self._read_files(plan, jobs[done : done + run])
            done += run
            if clock() - t0 > self.slow_file_ns * run:
                break
            run = min(2 * run, 64)
        return jobs[done:]

    def _read_files_pooled(self, plan: _Plan, jobs: list[_Job]) -> None:
        """:meth:`_read_files` on a pool thread, which leaves ``plan.active`` once it is done
        (only a thread still reading is named by a :class:`ReadDeadlineError`)."""
        try:
            self._read_files(plan, jobs)
        finally:
            plan.active.pop(threading.get_ident(), None)

    def _read_files(self, plan: _Plan, jobs: list[_Job]) -> None:
        """One open-read-close pass per file; the retries only for a file that came up short."""
        flat, lo, row_bytes = plan.flat, plan.lo, plan.row_bytes
        active, me = plan.active, threading.get_ident()
        if flat is not None and plan.singles:
            # The common shape of a call (a file per sample, rows that are the output's) read
            # with nothing between the system calls: the first of the attempts.
            open_, preadv, close = os.open, os.preadv, os.close
            for seg, name, dfd in jobs:
                active[me] = seg
                start = (seg.pos - lo) * row_bytes
                nbytes = seg.rows * row_bytes
                view = flat[start : start + nbytes]
                try:
                    fd = open_(name, _OPEN_FLAGS, dir_fd=dfd)
                    try:
                        got = preadv(fd, [view], seg.offset)
                        if got < nbytes:
                            got = _pread_rest(fd, view, seg.offset, got)
                    finally:
                        close(fd)
                except FileNotFoundError:
                    self._retry(name, dfd, [(seg, view, None)], (seg, -1, None))
                    continue
                except OSError as e:
                    if e.errno not in TRANSIENT_ERRNOS:
                        raise
                    self._retry(name, dfd, [(seg, view, None)], (seg, -1, e))
                    continue
                if got < nbytes:
                    self._retry(name, dfd, [(seg, view, None)], (seg, got, None))
            return
        target = plan.target
        for item, name, dfd in jobs:
            active[me] = item if plan.singles else item[0]
            targets = [target(item)] if plan.singles else [target(seg) for seg in item]
            pending, short = _read_once(name, dfd, targets)
            if pending:
                self._retry(name, dfd, pending, short)

    def _retry(self, name: str, dfd: int | None, pending: list[_Target], short: _Short) -> None:
        """After a first pass left ``pending`` short: back off, reopen, read again; then raise."""
        for delay in self.retry_delays:
            self._sleep(delay)
            pending, short = _read_once(name, dfd, pending)
            if not pending:
                return
        seg, received, error = short
        attempts = len(self.retry_delays) + 1
        raise ShortReadError(seg.file, seg.offset, seg.nbytes, received, attempts, error)


class _Plan:
    """Where each segment's bytes go in one call's output array."""

    __slots__ = ("active", "flat", "lo", "out", "row_bytes", "singles", "uniform")

    def __init__(
        self,
        out: np.ndarray,
        lo: int,
        uniform: bool,
        singles: bool,
        active: dict[int, Segment],
    ) -> None:
        self.out = out
        self.active = active  # thread id -> the segment it is reading (for ReadDeadlineError)
        self.singles = singles  # jobs hold a segment each, else a list of a file's segments
        self.lo = lo
        self.uniform = uniform
        # A uniform call reads each segment into a byte range of `out`: slicing one flat view is
        # cheaper than an array slice and a memoryview per segment.
        self.flat = memoryview(out).cast("B") if uniform else None
        self.row_bytes = out.itemsize * math.prod(out.shape[1:])

    def target(self, seg: Segment) -> _Target:
        """Where to read ``seg``: straight into ``out``, or into a staging array whose rows are
        then copied into their cells of ``out`` when their shape or dtype differ from it."""
        if self.uniform:
            start = (seg.pos - self.lo) * self.row_bytes
            return seg, self.flat[start : start + seg.rows * self.row_bytes], None
        dest = self.out[seg.pos - self.lo : seg.end - self.lo]
        if seg.shape == dest.shape[1:] and _DTYPES[seg.dtype] == dest.dtype:
            return seg, memoryview(dest).cast("B"), None
        buf = np.empty((seg.rows, *seg.shape), dtype=seg.dtype)
        return seg, memoryview(buf).cast("B"), (dest[(slice(None), *map(slice, seg.shape))], buf)


def _reading(active: dict[int, Segment], first: Segment) -> Segment:
    """The segment a stuck call is waiting on: a pool thread's (the guard thread, whose entry
    comes first, waits for those) before the guard thread's own, else the call's first."""
    entries = list(active.values())  # a copy: the call's threads may still be writing it
    return entries[1] if len(entries) > 1 else entries[0] if entries else first


# (the file's segment, or its list of segments; its name, relative to the version directory's
# descriptor, or its full checked path when the descriptor is None)
_Job = tuple[Any, str, int | None]
# (segment, the bytes to read it into, and for staged rows (cells of the output, staging array))
_Target = tuple[Segment, memoryview, tuple[np.ndarray, np.ndarray] | None]
# (the first segment left short, the bytes it got (-1: not opened), the transient error if any)
_Short = tuple[Segment, int, OSError | None]


def _read_once(path: str, dfd: int | None, targets: list[_Target]) -> tuple[list[_Target], _Short]:
    """One open-read-close pass; the targets still short, and the first short one.

    A transient error (:data:`TRANSIENT_ERRNOS`) leaves the target it struck and every one
    after it pending: the retry reads them again, whatever bytes came in before the error.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        return targets, (targets[0][0], -1, None)
    except OSError as e:
        if e.errno not in TRANSIENT_ERRNOS:
            raise
        return targets, (targets[0][0], -1, e)
    short: _Short | None = None
    left = []
    try:
        for i, target in enumerate(targets):
            seg, view, staged = target
            try:
                got = _pread_into(fd, view, seg.offset)
            except OSError as e:
                if e.errno not in TRANSIENT_ERRNOS:
                    raise
                left += targets[i:]
                short = short or (seg, -1, e)
                break
            if got < len(view):
                left.append(target)
                short = short or (seg, got, None)
            elif staged is not None:
                cells, buf = staged
                cells[...] = buf
    finally:
        with contextlib.suppress(OSError):  # a read-only close has nothing left to report
            os.close(fd)
    return left, short  # type: ignore[return-value]  # short is set whenever left is not empty


def read_field(
    segments: Iterable[Segment],
    field: str,
    lo: int,
    hi: int,
    *,
    root: PayloadRoot | str | os.PathLike[str],
    deadline_s: float | None = DEFAULT_DEADLINE_S,
    **kwargs: Any,
) -> Any:
    """One-off :meth:`PayloadReader.read` with a reader of its own (``deadline_s`` as the
    reader's: 30 s by default, :class:`ReadDeadlineError` past it)."""
    with PayloadReader(root, deadline_s=deadline_s) as reader:
        return reader.read(segments, field, lo, hi, **kwargs)
