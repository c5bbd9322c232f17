"""The retention journal: every event is on disk before it is acknowledged.

One JSON object per line. The first line names the run (``{"op": "run", "run_id": ...}``), so a
container restart inside a run finds its own journal and a new run does not replay an old one.
The records after it are the events (:func:`record_op`, :func:`policy_op`, :func:`discard_op`) and
the deletions a compaction carried over (:func:`delete_op`); :func:`replay` rebuilds a
:class:`~payloadrun.retention.state.RetentionState` from them.
``append`` writes a line and fsyncs before returning; a crash can only leave a torn last line,
which was never acknowledged, so replay drops it (any other unreadable line is an error: the
file was damaged, and guessing would risk deleting unconsumed data). A compaction writes the new
content to a temporary file and fsyncs it (``stage``, which may run while appends go on to the
old journal), appends the records journaled meanwhile, renames it over the journal and fsyncs the
directory (``install``), so a crash leaves either the old or the new journal, whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from payloadrun.reasons import Deletion
from payloadrun.retention.policy import Disposition
from payloadrun.retention.state import RetentionState
from payloadrun.store import fsync_dir, write_all

JOURNAL_NAME = "journal.jsonl"
FORMAT_VERSION = 1

Record = dict[str, Any]
Released = list[tuple[Deletion, list[str]]]  # deletions, by reason, in the order they were released


class JournalError(RuntimeError):
    """The journal cannot be read or written."""


# --- the record format ---------------------------------------------------------------------------


def run_op(run_id: str, max_off_policy_steps: int) -> Record:
    """The header: whose journal this is."""
    return {
        "op": "run",
        "format": FORMAT_VERSION,
        "run_id": run_id,
        "max_off_policy_steps": max_off_policy_steps,
        "created": time.time(),
    }


def record_op(step: int, files: list[str], disposition: Disposition) -> Record:
    return {"op": "record", "step": step, "files": files, "disposition": disposition.value}


def policy_op(step: int) -> Record:
    return {"op": "policy", "step": step}


def discard_op(files: list[str]) -> Record:
    return {"op": "discard", "files": files}


def delete_op(reason: Deletion, files: list[str]) -> Record:
    """Deletions released before a compaction and not finished: replayed as they are."""
    return {"op": "delete", "reason": reason.value, "files": files}


def reason_of(disposition: Disposition) -> Deletion:
    return Deletion.CONSUMED if disposition is Disposition.CONSUMED else Deletion.DISCARDED


def replay(records: Iterable[Record], state: RetentionState) -> Released:
    """Apply the records after the header to ``state``; every deletion they released.

    Every record is idempotent on the state, so an event journaled twice (an append that timed
    out, landed late, and the client's retry of it) replays to the state it gives once: a batch
    recorded again adds no file (a file keeps the latest batch that named it), a policy step at
    or below the current one changes nothing, a discard releases no file a pending batch holds
    (the service refuses it first) and deleting a file already gone is not an error.
    ``tests/retention/test_deadlines.py`` checks this for every kind of record.
    """
    released: Released = []
    for number, rec in enumerate(records, 2):
        op = rec["op"]
        if op == "record":
            disposition = Disposition(rec["disposition"])
            files = state.record(rec["step"], rec["files"], disposition)
            released.append((reason_of(disposition), files))
        elif op == "policy":
            settled = state.policy_updated(rec["step"])
            released.append((Deletion.CONSUMED, list(settled.files)))
        elif op == "discard":
            released.append((Deletion.DISCARDED, rec["files"]))
        elif op == "delete":
            released.append((Deletion(rec["reason"]), rec["files"]))
        else:
            raise JournalError(
                f"retention journal line {number} has an unknown op {op!r}: written by a "
                "newer sidecar? run the matching version"
            )
    return [(r, f) for r, f in released if f]


def same_state(a: RetentionState, b: RetentionState) -> bool:
    """Whether two states hold the same facts: the policy step and the pending batches.

    ``recorded_step`` is left out: a compacted journal keeps only the pending batches, so a
    replay of one cannot know a later batch that was deleted at once.
    """
    return a.policy_step == b.policy_step and a.pending == b.pending and a.owner == b.owner


def snapshot(header: Record, state: RetentionState, unsettled: Released) -> list[Record]:
    """The records a compacted journal holds: the state, then the deletions not yet done.

    Cheap enough to take under the service's lock: each batch's files are copied in the order
    they were recorded (the order they are best deleted in), encoding comes later.
    """
    records = [header]
    if state.policy_step is not None:
        records.append(policy_op(state.policy_step))
    for step in sorted(state.pending):
        records.append(record_op(step, list(state.pending[step]), Disposition.PENDING))
    records += [delete_op(reason, keys) for reason, keys in unsettled if keys]
    return records


# --- the file ------------------------------------------------------------------------------------


def encode(record: Record) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def read_records(path: Path) -> Iterator[Record]:
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


def header(path: Path) -> Record | None:
    """The journal's first record when it is a run header, else None."""
    for record in read_records(path):
        return record if record.get("op") == "run" else None
    return None


@dataclass(frozen=True, slots=True)
class Staged:
    """A compacted journal written and fsynced beside the journal, not yet in its place."""

    path: Path
    size: int


class Journal:
    """An append-only, fsynced journal file; not thread-safe (the service serialises calls),
    except :meth:`stage`, which touches nothing but its temporary file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.size = 0
        self._reopen = False  # a rewrite replaced the file but could not reopen it

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

    def append(self, record: Record) -> None:
        """Write one record and fsync it: the caller may acknowledge the event afterwards.

        A failed append (``OSError``: volume full, gone) is cut off again, so the next append
        starts a clean line rather than gluing a record to a torn one, which replay would
        refuse as a damaged middle line.
        """
        if self._fd is None and self._reopen:
            self.open()
            self._reopen = False
        if self._fd is None:
            raise JournalError(f"retention journal {str(self.path)!r} is not open")
        data = encode(record)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
            os.fdatasync(self._fd)  # the data and the new size; not the timestamps
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.size)
                os.lseek(self._fd, self.size, os.SEEK_SET)
            raise
        self.size += len(data)

    def rewrite(self, records: Iterable[Record]) -> None:
        """Replace the journal by ``records`` atomically (temporary file, fsync, rename)."""
        self.install(self.stage(records))

    def stage(self, records: Iterable[Record]) -> Staged:
        """Write ``records`` to the temporary file beside the journal and fsync it.

        The open journal is not touched: appends may go on meanwhile, and :meth:`install` then
        carries them over. The service stages a compaction without its lock, so the large write
        never holds up a call.
        """
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = b"".join(encode(r) for r in records)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return Staged(tmp, len(data))

    def install(self, staged: Staged, since: Sequence[Record] = ()) -> None:
        """Append ``since`` (the records journaled after ``staged`` was taken) to the staged
        file, then put it in the journal's place: rename, directory fsync, reopen."""
        size = staged.size
        if since:
            data = b"".join(encode(r) for r in since)
            fd = os.open(staged.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                write_all(fd, data)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            size += len(data)
        os.replace(staged.path, self.path)
        was_open = self._fd is not None
        try:
            fsync_dir(self.path.parent)
        finally:
            # the path names the new file now: appends must go there, even if the fsync failed
            self.close()
            if was_open:
                self._reopen = True
                self.open()
                self._reopen = False
            else:
                self.size = size

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
