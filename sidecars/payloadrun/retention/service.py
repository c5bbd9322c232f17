"""The retention service: run identity, journaled events and status.

Each call validates its request, appends the event to the journal (fsynced), updates the
in-memory :class:`~payloadrun.retention.state.RetentionState` and hands the files it releases to
the :class:`~payloadrun.retention.queue.DeletionQueue`; it returns without waiting for a single
unlink. Events are serialised by one lock (``_calls``) so the journal's order is the state's
order; the state's own lock (``_lock``, shared with the queue) is never held across a system call
on the volume, so ``status``, the metrics and the deletion threads never wait on the journal.

Deadlines: the journal is written by one thread of its own, and a call waits for its append at
most ``call_deadline_s``. Past it the call raises :class:`VolumeHungError` (503) and the journal
is *fenced*: the append may still land when the volume comes back, so no further event is
accepted (each is answered 503 at once) until the journal thread has read the journal back and
rebuilt the state from it (:meth:`RetentionService._recover`). A retried event then replays
safely: every event is idempotent on the state (see :func:`payloadrun.retention.journal.replay`).

Run identity decides what happens at start (see :class:`StartMode`). The journal lives in
``<root>/.retention/`` by default, on the shared volume, so it survives the orchestrator pod being
rescheduled to another node, not just a container restart (docs/retention.md, "Where the
journal lives").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from prometheus_client import CollectorRegistry

from payloadrun.failures import failure_reason
from payloadrun.paths import PayloadPathError, PayloadRoot
from payloadrun.reasons import Deletion, Refusal
from payloadrun.retention import client, journal
from payloadrun.retention.config import STATE_DIR, RetentionConfig
from payloadrun.retention.deleter import Deleter, LocalDeleter
from payloadrun.retention.journal import JOURNAL_NAME, Journal, JournalError
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


class BadRequestError(ValueError):
    """A request the service refuses as sent (a step that is not an integer, files that are not
    a list, a path outside the root): the client's to fix, answered 400 by the HTTP API.

    Only this type is a client error; any other exception from the service is the service's
    own failure (500, or 503 when it is not running or cannot journal).
    """


class ServiceUnavailableError(RuntimeError):
    """The service is not running (not started yet, or closing): answered 503, retry later."""


# what a 503 for a hung volume says in its body's "reason": the clients raise
# RetentionVolumeHungError on it (the client module keeps its own copy: it imports no service)
VOLUME_HUNG = client.VOLUME_HUNG


@dataclass(frozen=True, slots=True)
class Fence:
    """Why the journal takes no appends: an append (or compaction) outlived its deadline.

    ``record`` is the event whose append timed out and may still land (None when the stuck
    work was not that call's append); the journal thread reads the journal back once the stuck
    system call returns and lifts the fence.
    """

    since: float  # time.monotonic() when the deadline passed
    what: str  # the journal path and the operation that hung
    record: journal.Record | None


class VolumeHungError(ServiceUnavailableError):
    """A call was not answered within ``call_deadline_s`` because the journal's volume hangs,
    or the journal is fenced after such a call: answered 503 with ``reason: volume_hung``."""

    def __init__(self, message: str, *, waited_s: float, deadline_s: float, fenced: bool) -> None:
        super().__init__(message)
        self.waited_s = waited_s
        self.deadline_s = deadline_s
        self.fenced = fenced

    def body(self) -> dict:
        return {
            "reason": VOLUME_HUNG,
            "waited_s": round(self.waited_s, 3),
            "deadline_s": self.deadline_s,
            "fenced": self.fenced,
        }


class RefusedPathError(BadRequestError, PayloadPathError):
    """A file in a request is not ``<root>/v<k>/<name>``; ``path`` is the value as sent."""

    def __init__(self, path: object, message: str) -> None:
        super().__init__(message)
        self.path = path


class DiscardRefusedError(RuntimeError):
    """A discard named files that recorded, unconsumed batches hold: nothing was deleted.

    The HTTP API answers it with 409, which the client raises as ``DiscardConflictError``.
    """

    def __init__(self, conflicts: dict[str, int]) -> None:
        shown = ", ".join(f"{f!r} (batch {s})" for f, s in list(conflicts.items())[:5])
        more = f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        super().__init__(
            f"refused to discard {len(conflicts)} file(s) that recorded batches not yet "
            f"consumed will read: {shown}{more}; leave them to the batch (they are deleted when "
            "the policy update consumes it) and discard only files no batch holds"
        )
        self.conflicts = conflicts


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
        # held by one event at a time, from its check to its state change (never with _lock
        # waiting on it: _calls is always taken first); a call waits for it within its deadline
        self._calls = threading.Lock()
        self._journal_thread: ThreadPoolExecutor | None = None
        self._fence: Fence | None = None
        self._compacted_size = 0
        # while a compaction is being staged: the records journaled since its snapshot
        self._since_snapshot: list[journal.Record] | None = None
        self._closing = False
        self._journal: Journal | None = None
        self._scan_thread: threading.Thread | None = None
        self.queue = DeletionQueue(
            self.root,
            self._lock,
            self.metrics,
            workers=config.workers,
            chunk_files=config.chunk_files,
            max_off_policy_steps=config.max_off_policy_steps,
            protected=self._state.protected,  # the same object for good: a replay sets its fields
            settled=self._maybe_compact,
            make_deleter=lambda: self._make_deleter(unlink),
            retry=config.retry,
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
            journal_bytes=lambda: self._journal.size if self._journal else 0,
            journal_fenced=lambda: self._fence is not None,
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
        self._journal = Journal(path)
        if self.mode is not StartMode.RESTARTED:
            self._journal.rewrite([self._header()])
        self._journal.open()
        self._compacted_size = self._journal.size
        self._journal_thread = ThreadPoolExecutor(1, thread_name_prefix="retention-journal")
        with self._lock:
            self.queue.submit([], timed=False, trash=True)
            if self.mode is StartMode.RESTARTED:
                # deferred files included: the journal keeps them until they are gone
                for reason, keys in journal.replay(records[1:], self._state):
                    self.queue.submit([(reason, keys)], timed=False)
                if self._state.policy_step is not None:
                    self.queue.submit([], timed=False, sweep=self._state.policy_step)
                self.queue.measure(self._state.owner)
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
        self.queue.stopping.set()
        if self._scan_thread is not None:
            self._scan_thread.join()
        self.queue.close()
        with self._lock:
            thread, self._journal_thread = self._journal_thread, None
        if thread is not None:
            # after the appends (and a replay) it runs; a volume still hung holds this up
            if self._journal is not None:
                thread.submit(self._journal.close)
            thread.shutdown(wait=True)
        elif self._journal is not None:
            self._journal.close()

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

        return self._event("record_batch", prepare)

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

        return self._event("policy_updated", prepare)

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

        return self._event("discard", prepare)

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
                "journal_bytes": self._journal.size if self._journal else 0,
                "journal_fenced": self._fence is not None,
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

    def _check_open(self) -> None:
        if self._closing or self._journal is None or self._journal_thread is None:
            raise ServiceUnavailableError(
                "the retention service is not running (start it, or it is closing)"
            )

    def _header(self) -> journal.Record:
        return journal.run_op(self.config.run_id, self.config.max_off_policy_steps)

    # ---------------------------------------------------------------- events under a deadline

    def _event(
        self,
        call: str,
        prepare: Callable[[], tuple[journal.Record | None, Callable[[], dict]]],
    ) -> dict:
        """Run one event: ``prepare`` (lock held) decides its record and how to apply it; the
        record is journaled on the journal thread within the call's deadline, then applied.

        The state changes only once the record is on disk, so a call that fails or times out
        has changed nothing in memory; a timed-out append fences the journal (see the module).
        """
        deadline_s = self.config.call_deadline_s
        t0 = time.monotonic()
        if not self._calls.acquire(timeout=deadline_s):
            raise self._hung(call, t0, "another call's journal append is still waiting on it")
        try:
            with self._lock:
                self._check_open()
                if self._fence is not None:
                    raise self._hung(call, t0, None)
                record, apply = prepare()
                thread = self._journal_thread
            if record is None:
                with self._lock:
                    return apply()
            assert thread is not None
            try:
                done = thread.submit(self._append, record)
            except RuntimeError:  # shut down since the check: closing
                raise ServiceUnavailableError("the retention service is closing") from None
            futures.wait([done], timeout=max(0.0, t0 + deadline_s - time.monotonic()))
            if not done.done():
                # a job queued behind a stuck one is cancelled and never lands; a running
                # append may still land, and the replay will tell
                self._fence_journal(None if done.cancel() else record, "append")
                raise self._hung(call, t0, "its journal append did not return")
            done.result()  # the append's own failure (OSError: 503, not recorded)
            with self._lock:
                return apply()
        finally:
            self._calls.release()

    def _hung(self, call: str, t0: float, why: str | None) -> VolumeHungError:
        """The 503 of a call the volume held up (``why``) or the fence refused (``why`` None)."""
        waited = time.monotonic() - t0
        deadline = self.config.call_deadline_s
        path = self.state_dir / JOURNAL_NAME
        fence = self._fence
        self.metrics.volume_hung.labels(call).inc()
        if why is None and fence is not None:
            message = (
                f"{call} was not recorded: the retention journal {str(path)!r} is fenced since "
                f"its {fence.what} hung {time.monotonic() - fence.since:.1f} s ago (deadline "
                f"{deadline:g} s); the volume under it is not answering. No event is accepted "
                "until the volume answers and the journal has been read back: retry the call "
                "later (it is idempotent), and check the shared volume's mount on this node"
            )
        else:
            message = (
                f"{call} was not recorded within its deadline of {deadline:g} s (waited "
                f"{waited:.2f} s): {why}; the volume under the retention journal {str(path)!r} "
                "is not answering. Retry the call later (it is idempotent), and check the shared "
                "volume's mount on this node"
            )
        return VolumeHungError(
            message, waited_s=waited, deadline_s=deadline, fenced=self._fence is not None
        )

    def _fence_journal(self, record: journal.Record | None, what: str) -> None:
        """No appends until the journal is read back; queue that read behind the stuck job."""
        path = self.state_dir / JOURNAL_NAME
        with self._lock:
            if self._fence is not None:
                return
            self._fence = Fence(time.monotonic(), f"{what} to {str(path)!r}", record)
        log.error(
            "retention journal %s: %s did not return within %g s; the journal is fenced (calls "
            "are answered 503) until the volume answers and the journal is read back",
            path,
            what,
            self.config.call_deadline_s,
        )
        thread = self._journal_thread
        if thread is not None:
            with contextlib.suppress(RuntimeError):  # closing: the next start replays it
                thread.submit(self._recover)

    # ------------------------------------------------------- the journal thread's own work

    def _append(self, record: journal.Record) -> None:
        """Journal ``record`` (journal thread); a failure is counted and raised: the call is not
        acknowledged."""
        assert self._journal is not None
        try:
            self._journal.append(record)
        except OSError as exc:
            self.metrics.journal_errors.labels(failure_reason(exc).value).inc()
            raise
        if self._since_snapshot is not None:
            self._since_snapshot.append(record)

    def _recover(self) -> None:
        """Lift the fence (journal thread, after the stuck job returned): read the journal back,
        rebuild the state from it, and hand the deletions of an event that landed to the queue.

        Tried again with backoff while the volume still fails, until it answers or the service
        closes; calls keep being answered 503 meanwhile.
        """
        delay = 0.05
        while not self._closing:
            try:
                self._rebuild()
                return
            except (OSError, JournalError) as exc:
                log.warning("reading the retention journal back failed (%s); retrying", exc)
            if self.queue.stopping.wait(delay):
                return
            delay = min(2 * delay, 5.0)

    def _rebuild(self) -> None:
        assert self._journal is not None
        path = self._journal.path
        self._journal.close()
        records = list(journal.read_records(path))
        if not records or records[0].get("run_id") != self.config.run_id:
            raise JournalError(
                f"retention journal {str(path)!r} no longer starts with run {self.config.run_id!r}"
            )
        rebuilt = RetentionState()
        everything = journal.replay(records[1:], rebuilt)
        self._journal.open()  # cuts a torn last line: new appends start clean
        with self._lock:
            fence = self._fence
            assert fence is not None
            released: journal.Released = []
            # Whether the timed-out event landed is read off the journal's tail (nothing is
            # appended while fenced), not off the state: a discard, or a batch deleted at once,
            # changes no state and still releases files.
            landed = fence.record is not None and records[-1] == as_read(fence.record)
            if landed:
                released = journal.replay([fence.record], self._state)
            if not journal.same_state(rebuilt, self._state):
                # the journal says something memory does not: it is the truth; hand every
                # deletion it holds to the queue, as a restart would (gone files are fine)
                log.warning(
                    "the retention journal %s disagrees with memory after a fence; taking "
                    "the journal's state (as a restart would)",
                    path,
                )
                for f in dataclasses.fields(RetentionState):
                    setattr(self._state, f.name, getattr(rebuilt, f.name))
                released = everything
            if released:
                self.queue.submit(released, timed=False, sweep=self._state.policy_step)
            self._fence = None
            self.metrics.journal_replays.inc()
        log.info(
            "retention journal %s read back after %.1f s fenced (the event that timed out %s); "
            "calls are accepted again",
            path,
            time.monotonic() - fence.since,
            "landed" if landed else "did not land",
        )

    # ------------------------------------------------------------------------- compaction

    def _snapshot(self) -> list[journal.Record]:
        """The current state plus the unsettled deletions, as journal records (lock held)."""
        unsettled = self.queue.unsettled(self._state.policy_step)
        return journal.snapshot(self._header(), self._state, unsettled)

    def _compact(self) -> None:
        """Rewrite the journal from a snapshot, all under the lock (at start, before any call)."""
        assert self._journal is not None
        self._journal.rewrite(self._snapshot())
        self._compacted_size = self._journal.size
        self.metrics.compactions.inc()

    def _maybe_compact(self) -> None:
        """Compact once the journal has outgrown its limit and twice its last compacted size.

        Only the snapshot is taken under the locks (no event in flight, so it is the journal's
        content). Its encoding, write and fsync, which take milliseconds and more as the journal
        grows, run while calls go on; the events those calls journal meanwhile are appended to
        the new journal before the journal thread puts it in the old one's place.
        """
        if not self._calls.acquire(timeout=self.config.call_deadline_s):
            return  # a call is waiting on the volume: the next settled job tries again
        try:
            with self._lock:
                if self._closing or self._journal is None or self._journal_thread is None:
                    return
                if self._fence is not None or self._since_snapshot is not None:
                    return
                if self._journal.size <= max(self.config.compact_bytes, 2 * self._compacted_size):
                    return
                records = self._snapshot()
                self._since_snapshot = []
        finally:
            self._calls.release()
        try:
            staged = self._journal.stage(records)
        except OSError as exc:
            self._compaction_failed(exc)
            self._since_snapshot = None
            return
        thread = self._journal_thread
        try:
            if thread is None:
                raise RuntimeError("closed")
            thread.submit(self._install, staged)  # it reports its own failure
        except RuntimeError:  # closing: the staged file is left, the next compaction replaces it
            self._since_snapshot = None

    def _install(self, staged: journal.Staged) -> None:
        """Put a staged compaction in place (journal thread: ordered with the appends)."""
        assert self._journal is not None
        try:
            self._journal.install(staged, self._since_snapshot or ())
            self._compacted_size = self._journal.size
            self.metrics.compactions.inc()
        except OSError as exc:
            self._compaction_failed(exc)
        finally:
            self._since_snapshot = None

    def _compaction_failed(self, exc: OSError) -> None:
        # a whole journal stays in use (the old one, or the new one once renamed); the next
        # settled job tries again
        failure = failure_reason(exc)
        self.metrics.journal_errors.labels(failure.value).inc()
        log.warning(
            "retention journal compaction failed (%s): %s; the journal keeps growing until "
            "a compaction succeeds",
            failure.value,
            exc,
        )


__all__ = [
    "BadRequestError",
    "DiscardRefusedError",
    "RefusedPathError",
    "RetentionConfig",
    "RetentionService",
    "ServiceUnavailableError",
    "StartMode",
    "VolumeHungError",
]


def as_read(record: journal.Record) -> journal.Record:
    """A record as the journal reads it back (JSON's lists for tuples, say)."""
    return json.loads(journal.encode(record))
