"""The retention service: run identity, journaled events and status.

Each call validates its request, appends the event to the journal (fsynced), updates the
in-memory :class:`~payloadrun.retention.state.RetentionState` and hands the files it releases to
the :class:`~payloadrun.retention.queue.DeletionQueue`; it returns without waiting for a single
unlink. Events are serialised (:meth:`GuardedJournal.event`) so the journal's order is the
state's order; the state's own lock (``_lock``, shared with the queue) is never held across a
system call on the volume, so ``status``, the metrics and the deletion threads never wait on the
journal.

Deadlines: a call waits for its journal append at most ``call_deadline_s``, and a hung append
fences the journal until it is read back (:mod:`~payloadrun.retention.guarded`, which also
compacts it). What the service refuses is :mod:`~payloadrun.retention.errors`.

Run identity decides what happens at start (see :class:`StartMode`). The journal lives in
``<root>/.retention/`` by default, on the shared volume, so it survives the orchestrator pod being
rescheduled to another node, not just a container restart (docs/retention.md, "Where the
journal lives").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from enum import StrEnum
from pathlib import Path

from prometheus_client import CollectorRegistry

from payloadrun.paths import PayloadPathError, PayloadRoot
from payloadrun.reasons import Deletion, Refusal
from payloadrun.retention import journal
from payloadrun.retention.config import STATE_DIR, RetentionConfig
from payloadrun.retention.deleter import Deleter, LocalDeleter
from payloadrun.retention.errors import (
    VOLUME_HUNG,
    BadRequestError,
    DiscardRefusedError,
    RefusedPathError,
    ServiceUnavailableError,
    VolumeHungError,
)
from payloadrun.retention.guarded import GuardedJournal
from payloadrun.retention.journal import JOURNAL_NAME
from payloadrun.retention.metrics import RetentionMetrics
from payloadrun.retention.policy import Disposition, backstop_bound
from payloadrun.retention.queue import DeletionQueue
from payloadrun.retention.state import RetentionState
from payloadrun.retention.worker import ProcessDeleter

log = logging.getLogger("payloadrun.retention")


class StartMode(StrEnum):
    """How the service started, from its run id, the resume flag and the journal it found."""

    FRESH = "fresh"  # new run, not resuming: the root is wiped (in the background)
    RESUMED = "resumed"  # new run resuming a checkpoint: files kept, the backstop ages them out
    RESTARTED = "restarted"  # same run id as the journal: replay it, wipe nothing


def _check_step(step: object) -> int:
    if type(step) is not int or step < 0:
        raise BadRequestError(f"step must be an integer >= 0, got {step!r}")
    return step


def _step_or_minus_one(step: int | None) -> int:
    return -1 if step is None else step


def _as_list(files: Iterable[object]) -> list[object]:
    if isinstance(files, (str, bytes)):
        raise BadRequestError(f"files must be a list of paths, got a single string {files!r:.200}")
    try:
        return list(files)
    except TypeError:
        raise BadRequestError(
            f"files must be a list of paths, got {type(files).__name__}"
        ) from None


class RetentionService:
    """Delete-on-consume for one payload root; thread-safe. ``start``, use, ``close``."""

    def __init__(
        self,
        config: RetentionConfig,
        *,
        registry: CollectorRegistry | None = None,
        unlink: Callable[..., None] | None = None,
    ) -> None:
        """``unlink`` replaces ``os.unlink`` to inject failures; the deletions then run in this
        process instead of the deletion worker process (:mod:`~payloadrun.retention.worker`)."""
        self.config = config
        self.root = PayloadRoot(config.root)
        self.state_dir = Path(config.state_dir or self.root.path / STATE_DIR)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = RetentionMetrics(self.registry)
        self.mode: StartMode | None = None
        self._state = RetentionState()
        self._lock = threading.Lock()
        self._closing = False
        self._scan_thread: threading.Thread | None = None
        self.queue = DeletionQueue(
            self.root,
            self._lock,
            self.metrics,
            workers=config.workers,
            chunk_files=config.chunk_files,
            max_off_policy_steps=config.max_off_policy_steps,
            protected=self._state.protected,  # the same object for good: a replay sets its fields
            settled=lambda: self.journal.maybe_compact(),  # noqa: PLW0108 (made just below)
            make_deleter=lambda: self._make_deleter(unlink),
            retry=config.retry,
        )
        self.journal = GuardedJournal(
            self.state_dir / JOURNAL_NAME,
            config,
            self.metrics,
            lock=self._lock,
            state=self._state,
            queue=self.queue,
            header=self._header,
        )
        q = self.queue
        self.metrics.bind(
            directory_bytes=lambda: q.dir_bytes,
            directory_files=lambda: q.dir_files,
            version_directories=lambda: q.version_dirs,
            policy_step=lambda: _step_or_minus_one(self._state.policy_step),
            recorded_step=lambda: _step_or_minus_one(self._state.recorded_step),
            oldest_pending_step=lambda: _step_or_minus_one(self._state.oldest_pending_step),
            pending_batches=lambda: len(self._state.pending),
            pending_files=lambda: self._state.pending_files,
            queue_files=lambda: q.queue_files,
            deferred_files=lambda: q.deferred_files,
            journal_bytes=lambda: self.journal.size,
            journal_fenced=lambda: self.journal.fence is not None,
        )
        self.metrics.max_off_policy_steps.set(config.max_off_policy_steps)

    # ----------------------------------------------------------------------------- lifecycle

    def _make_deleter(self, unlink: Callable[..., None] | None) -> Deleter:
        if unlink is not None:
            return LocalDeleter(self.root.path, self.config.retry, unlink)
        return ProcessDeleter(
            self.root.path,
            threads=self.config.workers,
            retry=self.config.retry,
            on_restart=self.metrics.worker_restarts.inc,
        )

    def start(self, *, scan: bool = True) -> StartMode:
        """Decide the start mode, wipe or replay, and start the workers and the scanner."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.queue.open()
        path = self.state_dir / JOURNAL_NAME
        found = journal.header(path)
        records: list[journal.Record] = []
        if found is not None and found.get("run_id") == self.config.run_id:
            self.mode = StartMode.RESTARTED
            records = list(journal.read_records(path))
        elif self.config.resume:
            self.mode = StartMode.RESUMED
        else:
            self.mode = StartMode.FRESH
            self.queue.wipe_to_trash()
        self.journal.open(fresh=self.mode is not StartMode.RESTARTED)
        with self._lock:
            self.queue.submit([], timed=False, trash=True)
            if self.mode is StartMode.RESTARTED:
                # deferred files included: the journal keeps them until they are gone
                for reason, keys in journal.replay(records[1:], self._state):
                    self.queue.submit([(reason, keys)], timed=False)
                if self._state.policy_step is not None:
                    self.queue.submit([], timed=False, sweep=self._state.policy_step)
                self.queue.measure(self._state.owner)
                self.journal.compact()
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
                target=self.queue.scan_every,
                args=(self.config.scan_interval_s,),
                name="retention-scan",
                daemon=True,
            )
            self._scan_thread.start()
        return self.mode

    def close(self, *, drain: bool = False, timeout: float | None = None) -> None:
        """Stop. Queued deletions are dropped unless ``drain``: the journal replays them."""
        if drain:
            self.wait_idle(timeout)
        with self._lock:
            self._closing = True
            self.journal.refuse_calls()
        self.queue.stopping.set()
        if self._scan_thread is not None:
            self._scan_thread.join()
        self.queue.close()
        self.journal.close()

    def ready(self) -> bool:
        """Started (the journal replayed) and not closing: calls will be accepted.

        A fenced journal does not make the sidecar unready: readiness never depends on the
        shared volume (each call says why it was refused, and the metric shows the fence).
        """
        return self.mode is not None and not self._closing

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every queued deletion has run; False on timeout."""
        return self.queue.wait_idle(timeout)

    def scan(self) -> None:
        """Measure the version directories and reset the accounting to what is on disk."""
        self.queue.scan()

    # -------------------------------------------------------------------------------- events

    def record_batch(self, step: int, files: Iterable[object], *, empty: bool = False) -> dict:
        """Record the files of batch ``step`` (every selected trace, shipped or pruned)."""
        step = _check_step(step)
        if type(empty) is not bool:
            raise BadRequestError(f"empty must be true or false, got {empty!r}")
        keys = self._keys(files)

        def prepare() -> tuple[journal.Record, Callable[[], dict]]:
            disposition = self._state.disposition(
                step, empty=empty, max_steps=self.config.max_steps
            )

            def apply() -> dict:
                released = self._state.record(step, keys, disposition)
                if released:
                    self.queue.submit([(journal.reason_of(disposition), released)], timed=False)
                if disposition is Disposition.PENDING:
                    self.queue.measure(keys)
                return {
                    "step": step,
                    "files": len(keys),
                    "disposition": disposition.value,
                    "deleting": len(released),
                }

            return journal.record_op(step, keys, disposition), apply

        return self.journal.event("record_batch", prepare)

    def policy_updated(self, step: int) -> dict:
        """The trainer published ``v{step}``: batches ``<= step`` are consumed; run the backstop."""
        step = _check_step(step)

        def prepare() -> tuple[journal.Record | None, Callable[[], dict]]:
            previous = self._state.policy_step
            if previous is not None and step <= previous:
                # nothing to journal: answered without touching the volume
                return None, lambda: {
                    "step": step,
                    "policy_step": previous,
                    "settled": [],
                    "deleting": 0,
                }

            def apply() -> dict:
                settled = self._state.policy_updated(step)
                released = [(Deletion.CONSUMED, list(settled.files))]
                self.queue.submit(released, timed=True, sweep=step)
                return {
                    "step": step,
                    "policy_step": step,
                    "settled": list(settled.steps),
                    "deleting": len(settled.files),
                    "backstop_below": backstop_bound(step, self.config.max_off_policy_steps),
                }

            return journal.policy_op(step), apply

        return self.journal.event("policy_updated", prepare)

    def discard(self, files: Iterable[object]) -> dict:
        """Delete files no batch will read; refused whole if a pending batch holds one."""
        given = _as_list(files)
        keys = self._keys(given)

        def prepare() -> tuple[journal.Record, Callable[[], dict]]:
            conflicts = self._state.conflicts(keys)
            if conflicts:
                self.metrics.refused.labels(Refusal.DISCARD_CONFLICT.value).inc()
                as_given = dict(zip(keys, given, strict=True))
                raise DiscardRefusedError({str(as_given[k]): s for k, s in conflicts.items()})

            def apply() -> dict:
                self.queue.submit([(Deletion.DISCARDED, keys)], timed=False)
                return {"files": len(keys), "deleting": len(keys)}

            return journal.discard_op(keys), apply

        return self.journal.event("discard", prepare)

    def status(self) -> dict:
        q = self.queue
        with self._lock:
            return {
                "run_id": self.config.run_id,
                "mode": self.mode.value if self.mode else None,
                "root": str(self.root.path),
                "policy_step": self._state.policy_step,
                "recorded_step": self._state.recorded_step,
                "max_off_policy_steps": self.config.max_off_policy_steps,
                "max_steps": self.config.max_steps,
                "pending_batches": len(self._state.pending),
                "pending_steps": sorted(self._state.pending),
                "pending_files": self._state.pending_files,
                "queue_files": q.queue_files,
                "sizing_files": q.sizing_files,
                "outstanding_jobs": len(q.jobs),
                "directory": {
                    "bytes": q.dir_bytes,
                    "files": q.dir_files,
                    "version_directories": q.version_dirs,
                    "scans": q.scans,
                },
                "deleted": {r.value: {"files": f, "bytes": b} for r, (f, b) in q.deleted.items()},
                "journal_bytes": self.journal.size,
                "journal_fenced": self.journal.fence is not None,
                "call_deadline_s": self.config.call_deadline_s,
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
                self.metrics.refused.labels(Refusal.BAD_REQUEST.value).inc()
                raise RefusedPathError(f, str(exc)) from exc
            keys.append(f"{pf.path.parent.name}/{pf.name}")
        return keys

    def _header(self) -> journal.Record:
        return journal.run_op(self.config.run_id, self.config.max_off_policy_steps)


__all__ = [
    "VOLUME_HUNG",
    "BadRequestError",
    "DiscardRefusedError",
    "RefusedPathError",
    "RetentionConfig",
    "RetentionService",
    "ServiceUnavailableError",
    "StartMode",
    "VolumeHungError",
]
