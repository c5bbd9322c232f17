"""The retention journal: every event is on disk before it is acknowledged.

One JSON object per line. The first line names the run (``{"op": "run", "run_id": ...}``), so a
container restart inside a run finds its own journal and a new run does not replay an old one.
``append`` writes a line and fsyncs before returning; a crash can only leave a torn last line,
which was never acknowledged, so replay drops it (any other unreadable line is an error: the
file was damaged, and guessing would risk deleting unconsumed data). ``rewrite`` compacts: it
writes the new content to a temporary file, fsyncs it, renames it over the journal and fsyncs the
directory, so a crash leaves either the old or the new journal, whole.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from payloadrun.store import fsync_dir, write_all

JOURNAL_NAME = "journal.jsonl"
FORMAT_VERSION = 1


class JournalError(RuntimeError):
    """The journal cannot be read or written."""


def encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of the journal at ``path``, without a torn last line; nothing if absent."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    lines = data.split(b"\n")
    torn_tail = lines.pop()  # b"" when the file ends in a newline, as every whole append does
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise JournalError(
                f"retention journal {str(path)!r} line {number} is not JSON ({exc}): the file was "
                "damaged outside the sidecar; move it away to start this run's journal afresh "
                "(the version-sweep backstop still bounds the directory)"
            ) from exc
        if not isinstance(record, dict) or "op" not in record:
            raise JournalError(
                f"retention journal {str(path)!r} line {number} is not a record: {line[:80]!r}"
            )
        yield record
    del torn_tail  # an unacknowledged, partly written event


def header(path: Path) -> dict[str, Any] | None:
    """The journal's first record when it is a run header, else None."""
    for record in read_records(path):
        return record if record.get("op") == "run" else None
    return None


class Journal:
    """An append-only, fsynced journal file; not thread-safe (the service serialises calls)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.size = 0

    def open(self) -> None:
        """Open for appending; a torn last line is cut off first so new lines start clean."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        size = os.fstat(fd).st_size
        if size:
            keep = os.pread(fd, size, 0).rfind(b"\n") + 1
            if keep != size:
                os.ftruncate(fd, keep)
                os.fsync(fd)
                size = keep
        os.lseek(fd, size, os.SEEK_SET)
        self._fd = fd
        self.size = size

    def append(self, record: dict[str, Any]) -> None:
        """Write one record and fsync it: the caller may acknowledge the event afterwards."""
        if self._fd is None:
            raise JournalError(f"retention journal {str(self.path)!r} is not open")
        data = encode(record)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fdatasync(self._fd)  # the data and the new size; not the timestamps
        self.size += len(data)

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replace the journal by ``records`` atomically (temporary file, fsync, rename)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = b"".join(encode(r) for r in records)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        was_open = self._fd is not None
        self.close()
        if was_open:
            self.open()
        else:
            self.size = len(data)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
