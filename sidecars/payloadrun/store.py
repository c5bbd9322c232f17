"""Writing one request's payload arrays into one new file under the payload root.

The file is complete, fsynced and closed before the segments that point into it are returned:
the response that carries them may be read on another node at once, and NFS only promises that a
file closed on one client is whole when opened on another (close-to-open consistency). A write
that fails leaves no file behind.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from payloadrun.codec import PositionedRows
from payloadrun.failures import failure_reason
from payloadrun.paths import PayloadRoot
from payloadrun.reasons import WriteFailure
from payloadrun.segments import Segment

FILE_SUFFIX = ".bin"


class PayloadWriteError(OSError):
    """The payload could not be written; ``reason`` is a bounded label for metrics."""

    def __init__(self, reason: WriteFailure, path: Path, cause: OSError) -> None:
        super().__init__(
            cause.errno, f"writing payload file {str(path)!r} failed ({reason.value}): {cause}"
        )
        self.reason = reason
        self.path = path


def write_all(fd: int, data: memoryview | bytes) -> None:
    """``os.write`` until every byte is written (a write may be partial)."""
    data = memoryview(data)
    while data:
        written = os.write(fd, data)
        data = data[written:]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def layout_segments(file: str, parts: Iterable[PositionedRows]) -> list[Segment]:
    """The segments of arrays written back to back into ``file``, in order, from offset 0."""
    segments = []
    offset = 0
    for part in parts:
        rows = part.rows
        seg = Segment(
            field=part.field,
            file=file,
            offset=offset,
            pos=part.pos,
            rows=rows.shape[0],
            dtype=rows.dtype.name,
            shape=tuple(rows.shape[1:]),
        )
        segments.append(seg)
        offset += seg.nbytes
    return segments


class PayloadStore:
    """Writes payload files under one root; safe to share between threads."""

    def __init__(self, root: PayloadRoot | str | os.PathLike[str]) -> None:
        self.root = root if isinstance(root, PayloadRoot) else PayloadRoot(root)

    def write(self, payload_dir: str, parts: Iterable[PositionedRows]) -> list[Segment]:
        """Write ``parts`` into a new ``<payload_dir>/<uuid>.bin`` and return their segments.

        ``payload_dir`` comes from a request and is checked first
        (:class:`~payloadrun.paths.PayloadPathError` when it is not ``<root>/v<k>``). The segments
        name the file by its absolute path under the root.
        """
        directory = self.root.version_dir(payload_dir)
        arrays = [PositionedRows(p.field, np.ascontiguousarray(p.rows), p.pos) for p in parts]
        path = directory / f"{uuid.uuid4().hex}{FILE_SUFFIX}"
        try:
            created = _ensure_dir(directory)
            self._write_file(path, arrays)
            if created:
                fsync_dir(directory)
                fsync_dir(directory.parent)
        except OSError as exc:
            raise PayloadWriteError(failure_reason(exc), path, exc) from exc
        return layout_segments(str(path), arrays)

    @staticmethod
    def _write_file(path: Path, arrays: list[PositionedRows]) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                for part in arrays:
                    if part.rows.nbytes:
                        write_all(fd, memoryview(part.rows).cast("B"))
                os.fsync(fd)
            finally:
                os.close(fd)  # on NFS, close reports write-back errors too
        except BaseException:
            _unlink_quietly(path)
            raise


def _ensure_dir(directory: Path) -> bool:
    """Create ``directory`` if missing; True when this call created it."""
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        if not directory.is_dir():
            raise
        return False
    return True


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
