"""The retention journal under deadlines: one thread writes it, no call waits on it for long.

The journal is written by one thread of its own, and a call waits for its append at most
``call_deadline_s``. Past it the call raises :class:`~payloadrun.retention.errors.VolumeHungError`
(503) and the journal is *fenced*: the append may still land when the volume comes back, so no
further event is accepted (each is answered 503 at once) until the journal thread has read the
journal back and rebuilt the state from it (:meth:`GuardedJournal._recover`). A retried event
then replays safely: every event is idempotent on the state (see
:func:`payloadrun.retention.journal.replay`). Compaction runs here too: the snapshot under the
service's locks, its write beside the calls, its installation on the journal thread (ordered
with the appends).

The service (:mod:`~payloadrun.retention.service`) owns the state, the deletion queue and the
lock they share; this class takes them, and the events' order is the journal's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from payloadrun.failures import failure_reason
from payloadrun.retention import journal
from payloadrun.retention.config import RetentionConfig
from payloadrun.retention.errors import ServiceUnavailableError, VolumeHungError
from payloadrun.retention.journal import Journal, JournalError
from payloadrun.retention.metrics import RetentionMetrics
from payloadrun.retention.queue import DeletionQueue
from payloadrun.retention.state import RetentionState

log = logging.getLogger("payloadrun.retention")

# What an event's ``prepare`` returns: its record (None: nothing to journal) and how to apply it
Prepared = tuple[journal.Record | None, Callable[[], dict]]


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


class GuardedJournal:
    """The journal of one retention service, its thread, its fence and its compaction."""

    def __init__(
        self,
        path: Path,
        config: RetentionConfig,
        metrics: RetentionMetrics,
        *,
        lock: threading.Lock,
        state: RetentionState,
        queue: DeletionQueue,
        header: Callable[[], journal.Record],
    ) -> None:
        self.path = path
        self.config = config
        self.metrics = metrics
        self._lock = lock  # the service's (and the queue's): never held across a system call
        self._state = state
        self._queue = queue
        self._header = header
        # held by one event at a time, from its check to its state change (never with _lock
        # waiting on it: _calls is always taken first); a call waits for it within its deadline
        self._calls = threading.Lock()
        self._journal = Journal(path)
        self._thread: ThreadPoolExecutor | None = None
        self.fence: Fence | None = None
        self._compacted_size = 0
        # while a compaction is being staged: the records journaled since its snapshot
        self._since_snapshot: list[journal.Record] | None = None
        self._closing = False

    @property
    def size(self) -> int:
        return self._journal.size

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._closing

    def open(self, *, fresh: bool) -> None:
        """Open the journal (a fresh one starts with the header alone) and start its thread."""
        if fresh:
            self._journal.rewrite([self._header()])
        self._journal.open()
        self._compacted_size = self._journal.size
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="retention-journal")

    def refuse_calls(self) -> None:
        """From now on every event is answered 503 (the service is closing; lock held)."""
        self._closing = True

    def close(self) -> None:
        """After the appends (and a replay) the thread runs; a volume still hung holds this up."""
        with self._lock:
            self._closing = True
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.submit(self._journal.close)
            thread.shutdown(wait=True)
        else:
            self._journal.close()

    # ---------------------------------------------------------------- events under a deadline

    def event(self, call: str, prepare: Callable[[], Prepared]) -> dict:
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
                if not self.running:
                    raise ServiceUnavailableError(
                        "the retention service is not running (start it, or it is closing)"
                    )
                if self.fence is not None:
                    raise self._hung(call, t0, None)
                record, apply = prepare()
                thread = self._thread
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
        fence = self.fence
        self.metrics.volume_hung.labels(call).inc()
        if why is None and fence is not None:
            message = (
                f"{call} was not recorded: the retention journal {str(self.path)!r} is fenced "
                f"since its {fence.what} hung {time.monotonic() - fence.since:.1f} s ago "
                f"(deadline {deadline:g} s); the volume under it is not answering. No event is "
                "accepted until the volume answers and the journal has been read back: retry "
                "the call later (it is idempotent), and check the shared volume's mount on this "
                "node"
            )
        else:
            message = (
                f"{call} was not recorded within its deadline of {deadline:g} s (waited "
                f"{waited:.2f} s): {why}; the volume under the retention journal "
                f"{str(self.path)!r} is not answering. Retry the call later (it is idempotent), "
                "and check the shared volume's mount on this node"
            )
        return VolumeHungError(
            message, waited_s=waited, deadline_s=deadline, fenced=self.fence is not None
        )

    def _fence_journal(self, record: journal.Record | None, what: str) -> None:
        """No appends until the journal is read back; queue that read behind the stuck job."""
        with self._lock:
            if self.fence is not None:
                return
            self.fence = Fence(time.monotonic(), f"{what} to {str(self.path)!r}", record)
        log.error(
            "retention journal %s: %s did not return within %g s; the journal is fenced (calls "
            "are answered 503) until the volume answers and the journal is read back",
            self.path,
            what,
            self.config.call_deadline_s,
        )
        thread = self._thread
        if thread is not None:
            with contextlib.suppress(RuntimeError):  # closing: the next start replays it
                thread.submit(self._recover)

    # ------------------------------------------------------- the journal thread's own work

    def _append(self, record: journal.Record) -> None:
        """Journal ``record`` (journal thread); a failure is counted and raised: the call is not
        acknowledged."""
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
            if self._queue.stopping.wait(delay):
                return
            delay = min(2 * delay, 5.0)

    def _rebuild(self) -> None:
        self._journal.close()
        records = list(journal.read_records(self.path))
        if not records or records[0].get("run_id") != self.config.run_id:
            raise JournalError(
                f"retention journal {str(self.path)!r} no longer starts with run "
                f"{self.config.run_id!r}"
            )
        rebuilt = RetentionState()
        everything = journal.replay(records[1:], rebuilt)
        self._journal.open()  # cuts a torn last line: new appends start clean
        with self._lock:
            fence = self.fence
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
                    self.path,
                )
                for f in dataclasses.fields(RetentionState):
                    setattr(self._state, f.name, getattr(rebuilt, f.name))
                released = everything
            if released:
                self._queue.submit(released, timed=False, sweep=self._state.policy_step)
            self.fence = None
            self.metrics.journal_replays.inc()
        log.info(
            "retention journal %s read back after %.1f s fenced (the event that timed out %s); "
            "calls are accepted again",
            self.path,
            time.monotonic() - fence.since,
            "landed" if landed else "did not land",
        )

    # ------------------------------------------------------------------------- compaction

    def _snapshot(self) -> list[journal.Record]:
        """The current state plus the unsettled deletions, as journal records (lock held)."""
        unsettled = self._queue.unsettled(self._state.policy_step)
        return journal.snapshot(self._header(), self._state, unsettled)

    def compact(self) -> None:
        """Rewrite the journal from a snapshot, all under the lock (at start, before any call)."""
        self._journal.rewrite(self._snapshot())
        self._compacted_size = self._journal.size
        self.metrics.compactions.inc()

    def maybe_compact(self) -> None:
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
                if not self.running:
                    return
                if self.fence is not None or self._since_snapshot is not None:
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
            self._since_snapshot = None  # first: once it is counted, the next one may run
            self._compaction_failed(exc)
            return
        thread = self._thread
        try:
            if thread is None:
                raise RuntimeError("closed")
            thread.submit(self._install, staged)  # it reports its own failure
        except RuntimeError:  # closing: the staged file is left, the next compaction replaces it
            self._since_snapshot = None

    def _install(self, staged: journal.Staged) -> None:
        """Put a staged compaction in place (journal thread: ordered with the appends). The
        compaction is over (the next one may start) before it is counted, done or failed, so
        whoever reads the count may rely on it."""
        try:
            self._journal.install(staged, self._since_snapshot or ())
            self._compacted_size = self._journal.size
        except OSError as exc:
            self._since_snapshot = None
            self._compaction_failed(exc)
            return
        self._since_snapshot = None
        self.metrics.compactions.inc()

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


def as_read(record: journal.Record) -> journal.Record:
    """A record as the journal reads it back (JSON's lists for tuples, say)."""
    return json.loads(journal.encode(record))
