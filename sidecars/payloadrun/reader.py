"""Reading one field over a token range from payload segments, on the trainer side.

The reader turns the segments of a sample (or a whole micro-batch) into one array with a row per
token position in ``[lo, hi)``. Segments can point into any number of files; files are read
concurrently, and rows whose shape and dtype already match the output are read straight into it
(``preadv`` into the output's memory, no intermediate buffer).

A shared filesystem may show a file shorter than it is for a moment after another node wrote it
(attribute caches, close-to-open visibility). A short read therefore closes the file, waits,
reopens it and reads again, 4 times with backoff 0.1, 0.2, 0.4, 0.8 s, before it raises
:class:`ShortReadError` with the file, the offset and the byte counts.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from itertools import pairwise
from typing import Any

import numpy as np

from payloadrun.paths import PayloadRoot
from payloadrun.segments import FIELD_FILL, Segment

DEFAULT_RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8)
DEFAULT_WORKERS = 16

_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW


class ShortReadError(OSError):
    """A payload file held fewer bytes than a segment needs, after every retry."""

    def __init__(self, file: str, offset: int, expected: int, received: int, attempts: int):
        what = "was missing" if received < 0 else f"gave {received} bytes"
        super().__init__(
            f"short read of payload file {file!r}: at offset {offset} expected {expected} bytes, "
            f"the file {what} after {attempts} attempts; the writer may have failed, or the "
            "file was deleted before the trainer read it (check the retention sidecar's log)"
        )
        self.file = file
        self.offset = offset
        self.expected = expected
        self.received = max(received, 0)


class SegmentOverlapError(ValueError):
    """Two segments of one field claim the same token positions."""


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    """Read into ``view`` from ``offset`` until it is full or the file ends; bytes read."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


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


def _check_no_overlap(chosen: Sequence[Segment]) -> bool:
    """Raise if two segments cover one position; True when they tile their span with no gap."""
    ordered = sorted(chosen, key=lambda s: s.pos)
    for a, b in pairwise(ordered):
        if b.pos < a.end:
            raise SegmentOverlapError(
                f"segments of {a.field!r} overlap: {a.file!r} covers [{a.pos}, {a.end}) and "
                f"{b.file!r} covers [{b.pos}, {b.end}); clip them to disjoint ranges first"
            )
    return all(a.end == b.pos for a, b in pairwise(ordered))


class PayloadReader:
    """Reads payload fields from files under one root, with a pool of reader threads."""

    def __init__(
        self,
        root: PayloadRoot | str | os.PathLike[str],
        *,
        max_workers: int = DEFAULT_WORKERS,
        retry_delays: Sequence[float] = DEFAULT_RETRY_DELAYS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.root = root if isinstance(root, PayloadRoot) else PayloadRoot(root)
        self.max_workers = max_workers
        self.retry_delays = tuple(retry_delays)
        self._sleep = sleep
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="payload-read")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

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
        chosen = [c for s in segments if s.field == field and (c := s.clip(lo, hi)) is not None]
        if not chosen and (row_shape is None or dtype is None):
            raise ValueError(
                f"no segment of field {field!r} covers [{lo}, {hi}); pass row_shape and dtype "
                "to get an all-fill array"
            )
        out_dtype = _out_dtype(chosen, dtype)
        shape = _out_row_shape(chosen, row_shape) if chosen else tuple(row_shape or ())
        fill = FIELD_FILL.get(field, 0) if fill is None else fill
        if not np.can_cast(np.min_scalar_type(fill), out_dtype, casting="safe"):
            raise ValueError(f"fill {fill!r} does not fit the output dtype {out_dtype}")

        tiled = _check_no_overlap(chosen)
        covered = sum(s.rows for s in chosen) == hi - lo and tiled
        uniform = all(s.shape == shape for s in chosen)
        if out is None:
            out = np.empty((hi - lo, *shape), dtype=out_dtype)
        elif out.shape != (hi - lo, *shape) or out.dtype != out_dtype or not out.flags.c_contiguous:
            raise ValueError(
                f"out must be a C-contiguous {out_dtype} array of shape {(hi - lo, *shape)}, got "
                f"{out.dtype} {out.shape}{'' if out.flags.c_contiguous else ' (not contiguous)'}"
            )
        if not (covered and uniform):
            out.fill(fill)
        self._read_into(out, chosen, lo)
        if as_torch:
            import torch

            return torch.from_numpy(out)
        return out

    def _read_into(self, out: np.ndarray, chosen: list[Segment], lo: int) -> None:
        by_file: dict[str, list[Segment]] = {}
        for seg in chosen:
            by_file.setdefault(seg.file, []).append(seg)
        jobs = self._resolve(by_file)
        if len(jobs) <= 1 or self.max_workers <= 1:
            self._read_files(out, jobs, lo)
            return
        chunk = math.ceil(len(jobs) / self.max_workers)
        futures = [
            self._pool.submit(self._read_files, out, jobs[i : i + chunk], lo)
            for i in range(0, len(jobs), chunk)
        ]
        wait(futures)  # every thread has stopped writing into `out` before anything is raised
        for fut in futures:
            fut.result()

    def _resolve(self, by_file: dict[str, list[Segment]]) -> list[tuple[str, str, list[Segment]]]:
        """Check every file name once and every version directory once."""
        jobs = []
        dirs_checked: set[str] = set()
        for file, segs in by_file.items():
            checked = self.root.payload_file(file, follow_check=False)
            parent = checked.dir_str
            if parent not in dirs_checked:
                self.root.check_version_dir(parent, file)
                dirs_checked.add(parent)
            jobs.append((file, checked.path_str, segs))
        return jobs

    def _read_files(
        self, out: np.ndarray, jobs: list[tuple[str, str, list[Segment]]], lo: int
    ) -> None:
        for file, path, segs in jobs:
            self._read_file(out, file, path, segs, lo)

    def _read_file(
        self, out: np.ndarray, file: str, path: str, segs: list[Segment], lo: int
    ) -> None:
        targets = []
        for seg in segs:
            dest = out[seg.pos - lo : seg.end - lo]
            if seg.shape == out.shape[1:] and np.dtype(seg.dtype) == out.dtype:
                targets.append((seg, dest, None))
            else:
                targets.append((seg, dest, np.empty((seg.rows, *seg.shape), dtype=seg.dtype)))
        pending = targets
        attempts = 0
        while True:
            attempts += 1
            pending, short = self._read_once(path, pending)
            if not pending:
                return
            if attempts > len(self.retry_delays):
                seg, received = short
                raise ShortReadError(file, seg.offset, seg.nbytes, received, attempts)
            self._sleep(self.retry_delays[attempts - 1])

    @staticmethod
    def _read_once(path: str, targets: list) -> tuple[list, tuple[Segment, int] | None]:
        """One open-read-close pass; the targets still short, and the first short one."""
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            return targets, (targets[0][0], -1)
        short: tuple[Segment, int] | None = None
        left = []
        try:
            for seg, dest, buf in targets:
                view = memoryview(dest if buf is None else buf).cast("B")
                got = _pread_into(fd, view, seg.offset)
                if got < seg.nbytes:
                    left.append((seg, dest, buf))
                    short = short or (seg, got)
                    continue
                if buf is not None:
                    dest[(slice(None), *(slice(0, d) for d in seg.shape))] = buf
        finally:
            os.close(fd)
        return left, short


def read_field(
    segments: Iterable[Segment],
    field: str,
    lo: int,
    hi: int,
    *,
    root: PayloadRoot | str | os.PathLike[str],
    **kwargs: Any,
) -> Any:
    """One-off :meth:`PayloadReader.read` with a reader of its own."""
    with PayloadReader(root) as reader:
        return reader.read(segments, field, lo, hi, **kwargs)
