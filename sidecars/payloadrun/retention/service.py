"""The retention service: journaled events, a background deletion queue and the accounting.

Each call validates its request, appends the event to the journal (fsynced), updates the
in-memory :class:`~payloadrun.retention.state.RetentionState` and queues the files it releases,
all under one lock so the journal's order is the state's order; it returns without waiting for a
single unlink. Workers of a bounded thread pool unlink in chunks; just before a chunk runs its
files are checked against the pending batches once more, so nothing a recorded, unconsumed batch
holds is ever deleted, whatever order the events came in.

Run identity decides what happens at start (see :class:`StartMode`). The journal lives in
``<root>/.retention/`` by default, on the shared volume, so it survives the orchestrator pod being
rescheduled to another node, not just a container restart.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from payloadrun.paths import PayloadPathError, PayloadRoot, parse_version_dir_name
from payloadrun.retention import deleter
from payloadrun.retention.journal import (
    FORMAT_VERSION,
    JOURNAL_NAME,
    Journal,
    JournalError,
    read_records,
)
from payloadrun.retention.journal import header as journal_header
from payloadrun.retention.metrics import RetentionMetrics
from payloadrun.retention.policy import Disposition, Reason, backstop_bound, backstop_versions
from payloadrun.retention.state import RetentionState
from payloadrun.store import fsync_dir

log = logging.getLogger("payloadrun.retention")

STATE_DIR = ".retention"
TRASH_DIR = ".retention-trash"


class StartMode(StrEnum):
    """How the service started, from its run id, the resume flag and the journal it found."""

    FRESH = "fresh"  # new run, not resuming: the root is wiped (in the background)
    RESUMED = "resumed"  # new run resuming a checkpoint: files kept, the backstop ages them out
    RESTARTED = "restarted"  # same run id as the journal: replay it, wipe nothing


class RefusedPathError(PayloadPathError):
    """A file in a request is not ``<root>/v<k>/<name>``; ``path`` is the value as sent."""

    def __init__(self, path: object, message: str) -> None:
        super().__init__(message)
        self.path = path


class DiscardConflictError(RuntimeError):
    """A discard named files that recorded, unconsumed batches hold: nothing was deleted."""

    def __init__(self, conflicts: dict[str, int]) -> None:
        shown = ", ".join(f"{f!r} (batch {s})" for f, s in list(conflicts.items())[:5])
        more = f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        super().__init__(
            f"refused to discard {len(conflicts)} file(s) that recorded batches not yet "
            f"consumed will read: {shown}{more}; leave them to the batch (they are deleted when "
            "the policy update consumes it) and discard only files no batch holds"
        )
        self.conflicts = conflicts


@dataclass(frozen=True)
class RetentionConfig:
    """The service's settings; ``cli`` fills them from flags and the environment."""

    root: Path
    run_id: str
    resume: bool = False
    max_off_policy_steps: int = 8
    max_steps: int | None = None
    workers: int = 8
    scan_interval_s: float = 30.0
    state_dir: Path | None = None
    compact_bytes: int = 4 << 20
    chunk_files: int = 256
    retry: deleter.Retry = field(default_factory=deleter.Retry)

    def __post_init__(self) -> None:
        if not self.run_id:
            raise ValueError("run id is empty: pass --run-id (the orchestrator's run name)")
        if self.max_off_policy_steps < 0:
            raise ValueError(f"max_off_policy_steps must be >= 0, got {self.max_off_policy_steps}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"max_steps must be >= 0 or unset, got {self.max_steps}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.scan_interval_s <= 0:
            raise ValueError(f"scan interval must be > 0 seconds, got {self.scan_interval_s}")
        if self.chunk_files < 1:
            raise ValueError(f"chunk_files must be >= 1, got {self.chunk_files}")


@dataclass
class _Job:
    """The deletions one event released; settled when its last task has run."""

    seq: int
    entries: list[tuple[Reason, list[str]]]
    timed: bool
    started: float = field(default_factory=time.monotonic)
    tasks: int = 0


def _reason_of(disposition: Disposition) -> Reason:
    return Reason.CONSUMED if disposition is Disposition.CONSUMED else Reason.DISCARDED


def _check_step(step: object) -> int:
    if type(step) is not int or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    return step


def _as_list(files: Iterable[object]) -> list[object]:
    if isinstance(files, (str, bytes)):
        raise ValueError(f"files must be a list of paths, got a single string {files!r:.200}")
    return list(files)


def _by_dir(keys: Iterable[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for key in keys:
        dir_name, _, name = key.partition("/")
        groups.setdefault(dir_name, []).append(name)
    return groups


def _swept(keys: Iterable[str], bound: int) -> set[str]:
    """The keys in version directories below the backstop bound (the sweep removes them)."""
    out = set()
    for key in keys:
        version = parse_version_dir_name(key.partition("/")[0])
        if version is None or version < bound:
            out.add(key)
    return out


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class RetentionService:
    """Delete-on-consume for one payload root; thread-safe. ``start``, use, ``close``."""

    def __init__(
        self,
        config: RetentionConfig,
        *,
        registry: CollectorRegistry | None = None,
        unlink: Callable[..., None] = os.unlink,
    ) -> None:
        self.config = config
        self.root = PayloadRoot(config.root)
        self.state_dir = Path(config.state_dir or self.root.path / STATE_DIR)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = RetentionMetrics(self.registry)
        self.mode: StartMode | None = None
        self._unlink = unlink
        self._state = RetentionState()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._jobs: dict[int, _Job] = {}
        self._seq = 0
        self._queue_files = 0
        self._dir_bytes = 0
        self._dir_files = 0
        self._version_dirs = 0
        self._scans = 0
        self._deleted = {r: [0, 0] for r in Reason}
        self._given_up: dict[Reason, set[str]] = {r: set() for r in Reason}
        self._compacted_size = 0
        self._closing = False
        self._journal: Journal | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._root_fd = -1
        self._stopping = threading.Event()
        self._scan_thread: threading.Thread | None = None
        self.metrics.bind(
            directory_bytes=lambda: self._dir_bytes,
            directory_files=lambda: self._dir_files,
            version_directories=lambda: self._version_dirs,
            policy_step=lambda: -1 if self._state.policy_step is None else self._state.policy_step,
            pending_batches=lambda: len(self._state.pending),
            pending_files=lambda: self._state.pending_files,
            queue_files=lambda: self._queue_files,
            journal_bytes=lambda: self._journal.size if self._journal else 0,
        )

    # ----------------------------------------------------------------------------- lifecycle

    def start(self, *, scan: bool = True) -> StartMode:
        """Decide the start mode, wipe or replay, and start the workers and the scanner."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._root_fd = os.open(self.root.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        path = self.state_dir / JOURNAL_NAME
        found = journal_header(path)
        records: list[dict[str, Any]] = []
        if found is not None and found.get("run_id") == self.config.run_id:
            self.mode = StartMode.RESTARTED
            records = list(read_records(path))
        elif self.config.resume:
            self.mode = StartMode.RESUMED
        else:
            self.mode = StartMode.FRESH
            self._wipe_to_trash()
        self._journal = Journal(path)
        if self.mode is not StartMode.RESTARTED:
            self._journal.rewrite([self._header()])
        self._journal.open()
        self._compacted_size = self._journal.size
        self._executor = ThreadPoolExecutor(
            self.config.workers, thread_name_prefix="retention-delete"
        )
        with self._lock:
            self._submit_job([], timed=False, trash=True)
            if self.mode is StartMode.RESTARTED:
                for reason, keys in self._replay(records[1:]):  # given-up files included
                    self._submit_job([(reason, keys)], timed=False)
                if self._state.policy_step is not None:
                    self._submit_job([], timed=False, sweep=self._state.policy_step)
                self._compact()
        log.info(
            "retention started: run %s, %s, root %s, policy step %s, %d pending batches",
            self.config.run_id,
            self.mode.value,
            self.root.path,
            self._state.policy_step,
            len(self._state.pending),
        )
        if scan:
            self._scan_thread = threading.Thread(
                target=self._scan_loop, name="retention-scan", daemon=True
            )
            self._scan_thread.start()
        return self.mode

    def close(self, *, drain: bool = False, timeout: float | None = None) -> None:
        """Stop. Queued deletions are dropped unless ``drain``: the journal replays them."""
        if drain:
            self.wait_idle(timeout)
        with self._lock:
            self._closing = True
        self._stopping.set()
        if self._scan_thread is not None:
            self._scan_thread.join()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            if self._journal is not None:
                self._journal.close()
            if self._root_fd >= 0:
                os.close(self._root_fd)
                self._root_fd = -1

    def ready(self) -> bool:
        """Started (the journal replayed) and not closing: calls will be accepted."""
        return self.mode is not None and not self._closing

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every queued deletion has run; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._jobs, timeout)

    # -------------------------------------------------------------------------------- events

    def record_batch(self, step: int, files: Iterable[object], *, empty: bool = False) -> dict:
        """Record the files of batch ``step`` (every selected trace, shipped or pruned)."""
        step = _check_step(step)
        if type(empty) is not bool:
            raise ValueError(f"empty must be true or false, got {empty!r}")
        keys = self._keys(files)
        with self._lock:
            self._check_open()
            disposition = self._state.disposition(
                step, empty=empty, max_steps=self.config.max_steps
            )
            self._append(
                {"op": "record", "step": step, "files": keys, "disposition": disposition.value}
            )
            released = self._state.record(step, keys, disposition)
            if released:
                self._submit_job([(_reason_of(disposition), released)], timed=False)
        return {
            "step": step,
            "files": len(keys),
            "disposition": disposition.value,
            "deleting": len(released),
        }

    def policy_updated(self, step: int) -> dict:
        """The trainer published ``v{step}``: batches ``<= step`` are consumed; run the backstop."""
        step = _check_step(step)
        with self._lock:
            self._check_open()
            previous = self._state.policy_step
            if previous is not None and step <= previous:
                return {"step": step, "policy_step": previous, "settled": [], "deleting": 0}
            self._append({"op": "policy", "step": step})
            settled = self._state.policy_updated(step)
            self._submit_job([(Reason.CONSUMED, list(settled.files))], timed=True, sweep=step)
        return {
            "step": step,
            "policy_step": step,
            "settled": list(settled.steps),
            "deleting": len(settled.files),
            "backstop_below": backstop_bound(step, self.config.max_off_policy_steps),
        }

    def discard(self, files: Iterable[object]) -> dict:
        """Delete files no batch will read; refused whole if a pending batch holds one."""
        given = _as_list(files)
        keys = self._keys(given)
        with self._lock:
            self._check_open()
            conflicts = self._state.conflicts(keys)
            if conflicts:
                self.metrics.refused.labels("discard_conflict").inc()
                as_given = dict(zip(keys, given, strict=True))
                raise DiscardConflictError({str(as_given[k]): s for k, s in conflicts.items()})
            self._append({"op": "discard", "files": keys})
            self._submit_job([(Reason.DISCARDED, keys)], timed=False)
        return {"files": len(keys), "deleting": len(keys)}

    def status(self) -> dict:
        with self._lock:
            return {
                "run_id": self.config.run_id,
                "mode": self.mode.value if self.mode else None,
                "root": str(self.root.path),
                "policy_step": self._state.policy_step,
                "max_off_policy_steps": self.config.max_off_policy_steps,
                "max_steps": self.config.max_steps,
                "pending_batches": len(self._state.pending),
                "pending_steps": sorted(self._state.pending),
                "pending_files": self._state.pending_files,
                "queue_files": self._queue_files,
                "outstanding_jobs": len(self._jobs),
                "directory": {
                    "bytes": self._dir_bytes,
                    "files": self._dir_files,
                    "version_directories": self._version_dirs,
                    "scans": self._scans,
                },
                "deleted": {
                    r.value: {"files": f, "bytes": b} for r, (f, b) in self._deleted.items()
                },
                "journal_bytes": self._journal.size if self._journal else 0,
            }

    def is_protected(self, key: str) -> bool:
        with self._lock:
            return self._state.is_protected(key)

    # ------------------------------------------------------------------------------- helpers

    def _keys(self, files: Iterable[object]) -> list[str]:
        """``v<k>/<name>`` for each file, or :class:`RefusedPathError` naming the first bad one.

        Only the lexical check runs here (no system call per file on the request path); the
        deleter opens every directory with ``O_NOFOLLOW`` below a descriptor of the root, which
        refuses a symlinked ``v<k>`` at the moment it matters.
        """
        keys = []
        for f in _as_list(files):
            try:
                pf = self.root.payload_file(f, follow_check=False)
            except PayloadPathError as exc:
                self.metrics.refused.labels("bad_request").inc()
                raise RefusedPathError(f, str(exc)) from exc
            keys.append(f"{pf.path.parent.name}/{pf.name}")
        return keys

    def _check_open(self) -> None:
        if self._closing or self._journal is None:
            raise RuntimeError("the retention service is not running (start it, or it is closing)")

    def _header(self) -> dict[str, Any]:
        return {
            "op": "run",
            "format": FORMAT_VERSION,
            "run_id": self.config.run_id,
            "max_off_policy_steps": self.config.max_off_policy_steps,
            "created": time.time(),
        }

    def _append(self, record: dict[str, Any]) -> None:
        assert self._journal is not None
        self._journal.append(record)

    def _replay(self, records: list[dict[str, Any]]) -> list[tuple[Reason, list[str]]]:
        """Rebuild the state from journal records; returns every deletion they released."""
        released: list[tuple[Reason, list[str]]] = []
        for number, rec in enumerate(records, 2):
            op = rec["op"]
            if op == "record":
                disposition = Disposition(rec["disposition"])
                files = self._state.record(rec["step"], rec["files"], disposition)
                released.append((_reason_of(disposition), files))
            elif op == "policy":
                settled = self._state.policy_updated(rec["step"])
                released.append((Reason.CONSUMED, list(settled.files)))
            elif op == "discard":
                released.append((Reason.DISCARDED, rec["files"]))
            elif op == "delete":
                released.append((Reason(rec["reason"]), rec["files"]))
            else:
                raise JournalError(
                    f"retention journal line {number} has an unknown op {op!r}: written by a "
                    "newer sidecar? run the matching version"
                )
        return [(r, f) for r, f in released if f]

    def _compact(self) -> None:
        """Rewrite the journal as the current state plus the unsettled deletions (lock held)."""
        assert self._journal is not None
        records = [self._header()]
        if self._state.policy_step is not None:
            records.append({"op": "policy", "step": self._state.policy_step})
        for step in sorted(self._state.pending):
            files = sorted(self._state.pending[step])
            records.append({"op": "record", "step": step, "files": files, "disposition": "pending"})
        for job in self._jobs.values():
            for reason, keys in job.entries:
                if keys and reason is not Reason.WIPE:
                    records.append({"op": "delete", "reason": reason.value, "files": keys})
        for reason, keys in self._given_up.items():
            if self._state.policy_step is not None:  # the backstop owns what it will sweep
                m = self.config.max_off_policy_steps
                keys.difference_update(_swept(keys, backstop_bound(self._state.policy_step, m)))
            if keys and reason is not Reason.WIPE:
                records.append({"op": "delete", "reason": reason.value, "files": sorted(keys)})
        self._journal.rewrite(records)
        self._compacted_size = self._journal.size
        self.metrics.compactions.inc()

    def _maybe_compact(self) -> None:
        with self._lock:
            if self._closing or self._journal is None:
                return
            if self._journal.size > max(self.config.compact_bytes, 2 * self._compacted_size):
                self._compact()

    # ------------------------------------------------------------------------ deletion queue

    def _submit_job(
        self,
        entries: list[tuple[Reason, list[str]]],
        *,
        timed: bool,
        sweep: int | None = None,
        trash: bool = False,
    ) -> None:
        """Queue the deletions of one event (lock held)."""
        self._seq += 1
        job = _Job(self._seq, [(r, list(k)) for r, k in entries if k], timed)
        self._jobs[job.seq] = job
        for reason, keys in job.entries:
            for dir_name, names in _by_dir(keys).items():
                for chunk in _chunks(names, self.config.chunk_files):
                    self._submit_task(job, len(chunk), self._delete_chunk, reason, dir_name, chunk)
        if sweep is not None:
            self._submit_task(job, 0, self._sweep, job, sweep)
        if trash:
            self._submit_task(job, 0, self._empty_trash)
        if job.tasks == 0:
            self._finish(job)

    def _submit_task(self, job: _Job, files: int, fn: Callable[..., None], *args: object) -> None:
        if self._closing or self._executor is None:
            return
        job.tasks += 1
        self._queue_files += files
        self._executor.submit(self._run_task, job, files, fn, args)

    def _run_task(self, job: _Job, files: int, fn: Callable[..., None], args: tuple) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("retention deletion task failed; the journal replays it at restart")
        finally:
            with self._lock:
                self._queue_files -= files
                job.tasks -= 1
                finished = job.tasks == 0
                if finished:
                    self._finish(job)
            if finished:
                self._maybe_compact()

    def _finish(self, job: _Job) -> None:
        del self._jobs[job.seq]
        if job.timed:
            self.metrics.policy_update_delete_seconds.observe(time.monotonic() - job.started)
        if not self._jobs:
            self._idle.notify_all()

    def _delete_chunk(
        self, reason: Reason, dir_name: str, names: list[str], rmdir_after: bool = False
    ) -> None:
        with self._lock:
            names = [n for n in names if not self._state.is_protected(f"{dir_name}/{n}")]
        removed = deleter.unlink_names(
            self._root_fd,
            dir_name,
            names,
            retry=self.config.retry,
            on_error=lambda *error: self._on_error(*error, reason=reason),
            unlink=self._unlink,
            stop=self._stopping,
        )
        gone = rmdir_after and deleter.rmdir_if_empty(self._root_fd, dir_name)
        with self._lock:
            self._count(reason, removed)
            self._dir_bytes = max(0, self._dir_bytes - removed.bytes)
            self._dir_files = max(0, self._dir_files - removed.files)
            if gone:
                self._version_dirs = max(0, self._version_dirs - 1)

    def _sweep(self, job: _Job, policy_step: int) -> None:
        """The backstop: empty and remove ``v<k>`` below the bound, sparing pending files."""
        dirs = self.root.version_dirs()
        for k in backstop_versions(dirs, policy_step, self.config.max_off_policy_steps):
            name = dirs[k].name
            names = deleter.list_names(self._root_fd, name)
            with self._lock:
                if not names:
                    if deleter.rmdir_if_empty(self._root_fd, name):
                        self._version_dirs = max(0, self._version_dirs - 1)
                    continue
                for chunk in _chunks(names, self.config.chunk_files):
                    self._submit_task(
                        job, len(chunk), self._delete_chunk, Reason.BACKSTOP, name, chunk, True
                    )

    def _wipe_to_trash(self) -> None:
        """Move every ``v<k>`` aside at once; the workers delete the trash in the background.

        A rename is one metadata operation however many files a directory holds, and the new
        run's writers may recreate ``v0`` at once without racing the deletion of the old one.
        """
        dirs = self.root.version_dirs()
        if not dirs:
            return
        trash = self.root.path / TRASH_DIR / f"{time.time_ns()}"
        trash.mkdir(parents=True)
        for path in dirs.values():
            os.rename(path, trash / path.name)
        fsync_dir(trash)
        fsync_dir(self.root.path)
        log.info("fresh run: moved %d version directories to %s for deletion", len(dirs), trash)

    def _empty_trash(self) -> None:
        removed = deleter.remove_tree(
            self._root_fd, TRASH_DIR, retry=self.config.retry, on_error=self._on_error
        )
        with self._lock:
            self._count(Reason.WIPE, removed)

    def _count(self, reason: Reason, removed: deleter.Removed) -> None:
        if removed.files:
            self.metrics.deleted_files.labels(reason.value).inc(removed.files)
            self.metrics.deleted_bytes.labels(reason.value).inc(removed.bytes)
            self._deleted[reason][0] += removed.files
            self._deleted[reason][1] += removed.bytes

    def _on_error(
        self,
        label: str,
        where: str,
        exc: OSError,
        attempt: int,
        final: bool,
        reason: Reason = Reason.WIPE,
    ) -> None:
        """Count and log; a file given up stays in the journal (retried at the next start)."""
        self.metrics.delete_errors.labels(label).inc()
        if final:
            self.metrics.delete_given_up.inc()
            if "/" in where and reason is not Reason.WIPE:
                with self._lock:
                    self._given_up[reason].add(where)
            log.warning(
                "could not delete %s after %d attempt(s) (%s): %s; the backstop tries again",
                self.root.path / where,
                attempt,
                label,
                exc,
            )
        else:
            log.debug("deleting %s failed (attempt %d, %s): %s", where, attempt, label, exc)

    # ------------------------------------------------------------------------------- scanning

    def scan(self) -> None:
        """Measure the version directories and reset the accounting to what is on disk."""
        t0 = time.perf_counter()
        files = size = 0
        dirs = self.root.version_dirs()
        for path in dirs.values():
            try:
                with os.scandir(path) as it:
                    for entry in it:
                        if entry.is_file(follow_symlinks=False):
                            try:
                                size += entry.stat(follow_symlinks=False).st_size
                            except FileNotFoundError:
                                continue
                            files += 1
            except FileNotFoundError:
                continue
        with self._lock:
            self._dir_bytes, self._dir_files, self._version_dirs = size, files, len(dirs)
            self._scans += 1
        self.metrics.scan_seconds.observe(time.perf_counter() - t0)

    def _scan_loop(self) -> None:
        while True:
            try:
                self.scan()
            except OSError:
                log.exception("scanning the payload root failed; retrying at the next interval")
            if self._stopping.wait(self.config.scan_interval_s):
                return
