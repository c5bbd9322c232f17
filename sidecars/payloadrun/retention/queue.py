"""The retention service's deletion queue and the directory accounting it keeps.

Each event's deletions are one :class:`Job`: its files, grouped by ``v<k>`` directory and cut into
chunks, run on a bounded thread pool whose threads hand each chunk to the deleter (the deletion
worker process, :mod:`worker`, in the sidecar; :class:`~deleter.LocalDeleter` in-process when a
test injects failures) and wait for its answer. Just before a chunk goes its files are checked
against the pending batches once more, so nothing a recorded, unconsumed batch holds is ever
deleted, whatever order the events came in.

Files are measured when their batch is recorded (:meth:`DeletionQueue.measure`, in the
background): a step later, when they are deleted, their sizes are known and the unlink needs no
``stat`` before it. The queue also keeps the directory figures the metrics show: a periodic
:meth:`scan` sets them, each deletion subtracts what it removed.

A file whose unlink still fails after the deleter's attempts (a network file system whose server
is away answers ``ENOTCONN``, ``ESTALE`` or ``EIO`` for as long as it is away) is deferred, never
dropped: it stays in the journal, and a round of every deferred file runs again after
:meth:`~deleter.Retry.later` until each is gone. Methods marked "lock held" run
under the service's lock, which the queue shares so that the journal's order is the queue's order.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from payloadrun.paths import PayloadRoot, parse_version_dir_name
from payloadrun.reasons import DeleteError, Deletion
from payloadrun.retention import deleter
from payloadrun.retention.config import TRASH_DIR
from payloadrun.retention.journal import Released
from payloadrun.retention.metrics import RetentionMetrics
from payloadrun.retention.policy import backstop_bound, backstop_versions
from payloadrun.retention.worker import WorkerGoneError
from payloadrun.store import fsync_dir

log = logging.getLogger("payloadrun.retention")


@dataclass
class Job:
    """The deletions one event released; settled when its last task has run."""

    seq: int
    entries: Released
    timed: bool
    started: float = field(default_factory=time.monotonic)
    tasks: int = 0
    # The backstop's step, swept once the event's own deletions have run: a file both would
    # delete is then counted once, under the event's reason, and the emptied v<k> goes.
    sweep: int | None = None


@contextlib.contextmanager
def _suppress_worker_gone(dir_name: str) -> Iterator[None]:
    try:
        yield
    except (WorkerGoneError, RuntimeError) as exc:
        log.debug("measuring files in %s before deleting them failed: %s", dir_name, exc)


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


class DeletionQueue:
    """Deletions in the background, one :class:`Job` per event; ``open``, ``submit``, ``close``."""

    def __init__(
        self,
        root: PayloadRoot,
        lock: threading.Lock,
        metrics: RetentionMetrics,
        *,
        workers: int,
        chunk_files: int,
        max_off_policy_steps: int,
        protected: Callable[[Iterable[str]], set[str]],
        settled: Callable[[], None],
        make_deleter: Callable[[], deleter.Deleter],
        retry: deleter.Retry | None = None,
    ) -> None:
        self.root = root
        self.metrics = metrics
        self._lock = lock
        self._idle = threading.Condition(lock)
        self._workers = workers
        self._chunk_files = chunk_files
        self._make_deleter = make_deleter
        self._deleter: deleter.Deleter | None = None
        self._m = max_off_policy_steps
        self._protected = protected  # called with the lock held
        self._settled = settled  # called without the lock when a job settles
        self.jobs: dict[int, Job] = {}
        self._seq = 0
        self.queue_files = 0
        self.sizing_files = 0
        self._sizes: dict[str, int] = {}  # pending files' sizes, measured at record time
        # files a deletion worker may have removed before it died unanswered: counted as removed
        # when found gone (their sizes are kept in _sizes until then)
        self._in_doubt: set[str] = set()
        self.dir_bytes = 0
        self.dir_files = 0
        self.version_dirs = 0
        self.scans = 0
        self.deleted = {r: [0, 0] for r in Deletion}
        # files whose deletion failed after every attempt, tried again in later rounds
        self._deferred: dict[Deletion, set[str]] = {r: set() for r in Deletion}
        self._retry = retry or deleter.Retry()
        self._failed_rounds = 0
        self._trash_left = False  # emptying the trash failed: a later round empties it again
        self._retrier: threading.Thread | None = None
        # directories a sweep is listing or deleting (its listing and chunks not yet done, each
        # counted), and those a later sweep found so and wants listed again once they are
        self._sweeping: dict[str, int] = {}
        self._sweep_again: set[str] = set()
        self._closing = False
        self._executor: ThreadPoolExecutor | None = None
        self._root_fd = -1
        self.stopping = threading.Event()

    # ----------------------------------------------------------------------------- lifecycle

    def open(self) -> None:
        self._root_fd = os.open(self.root.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._deleter = self._make_deleter()
        self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="retention-delete")
        self._retrier = threading.Thread(
            target=self._retry_deferred, name="retention-retry", daemon=True
        )
        self._retrier.start()

    def close(self) -> None:
        """Drop what is queued (the journal replays it); wait for the tasks running now."""
        with self._lock:
            self._closing = True
        self.stopping.set()
        if self._retrier is not None:
            self._retrier.join()
        if self._deleter is not None:
            self._deleter.stop()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        if self._deleter is not None:
            self._deleter.close()
        with self._lock:
            if self._root_fd >= 0:
                os.close(self._root_fd)
                self._root_fd = -1

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every queued deletion has run; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self.jobs, timeout)

    def unsettled(self, policy_step: int | None) -> Released:
        """Deletions released and not done, for a compacted journal (lock held).

        Deferred files stay in it (retried in later rounds, and at the next start), except those
        the backstop will sweep anyway; a wipe is never journaled (the trash directory is emptied
        at every start).
        """
        out: Released = []
        for job in self.jobs.values():
            out += [(r, keys) for r, keys in job.entries if keys and r is not Deletion.WIPE]
        for reason, keys in self._deferred.items():
            if policy_step is not None:
                keys.difference_update(_swept(keys, backstop_bound(policy_step, self._m)))
            if keys and reason is not Deletion.WIPE:
                out.append((reason, sorted(keys)))
        return out

    # ------------------------------------------------------------------------------ the queue

    def submit(
        self, entries: Released, *, timed: bool, sweep: int | None = None, trash: bool = False
    ) -> None:
        """Queue the deletions of one event (lock held)."""
        self._seq += 1
        job = Job(self._seq, [(r, list(k)) for r, k in entries if k], timed)
        self.jobs[job.seq] = job
        for reason, keys in job.entries:
            for dir_name, names in _by_dir(keys).items():
                for chunk in _chunks(names, self._chunk_files):
                    self._task(job, len(chunk), self._delete_chunk, reason, dir_name, chunk)
        if sweep is not None:
            if job.tasks:
                job.sweep = sweep  # after the event's deletions (_run)
            else:
                self._task(job, 0, self._sweep, job, sweep)
        if trash:
            self._task(job, 0, self._empty_trash)
        if job.tasks == 0:
            self._finish(job)

    def _task(self, job: Job, files: int, fn: Callable[..., None], *args: object) -> bool:
        """Queue ``fn(*args)`` as one of ``job``'s tasks (lock held); False when closing."""
        if self._closing or self._executor is None:
            return False
        job.tasks += 1
        self.queue_files += files
        self._executor.submit(self._run, job, files, fn, args)
        return True

    def _run(self, job: Job, files: int, fn: Callable[..., None], args: tuple) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("retention deletion task failed; the journal replays it at restart")
        finally:
            with self._lock:
                self.queue_files -= files
                job.tasks -= 1
                if job.tasks == 0 and job.sweep is not None:
                    sweep, job.sweep = job.sweep, None
                    self._task(job, 0, self._sweep, job, sweep)
                finished = job.tasks == 0
                if finished:
                    self._finish(job)
            if finished:
                self._settled()

    def at_rest(self) -> bool:
        """No deletion queued or running, and none deferred, at one instant: every file
        released so far is either gone and counted, or was never there to delete."""
        with self._lock:
            return not self.jobs and not self.deferred_files

    @property
    def deferred_files(self) -> int:
        """Files whose deletion failed after every attempt, waiting for their next round."""
        return sum(map(len, self._deferred.values()))

    def _retry_deferred(self) -> None:
        """Submit the deferred files again after :meth:`~deleter.Retry.later`, until closed.

        The files of a round leave the deferred set when it is submitted: a failure in it puts
        them back, and the wait before the next round doubles; a round that finds nothing
        deferred resets it.
        """
        while not self.stopping.wait(self._retry.later(max(1, self._failed_rounds))):
            with self._lock:
                entries = [(r, sorted(keys)) for r, keys in self._deferred.items() if keys]
                trash, self._trash_left = self._trash_left, False
                if not entries and not trash:
                    self._failed_rounds = 0
                    continue
                for keys in self._deferred.values():
                    keys.clear()
                self._failed_rounds += 1
                files = sum(len(keys) for _, keys in entries)
                self.submit(entries, timed=False, trash=trash)
            log.info(
                "deleting %d deferred file(s)%s again (round %d)",
                files,
                f" and {TRASH_DIR}" if trash else "",
                self._failed_rounds,
            )

    def _defer(self, reason: Deletion, keys: Iterable[str]) -> None:
        if reason is not Deletion.WIPE:  # a wipe's trash is emptied again at every start
            with self._lock:
                self._deferred[reason].update(keys)

    def _finish(self, job: Job) -> None:
        del self.jobs[job.seq]
        if job.timed:
            self.metrics.policy_update_delete_seconds.observe(time.monotonic() - job.started)
        if not self.jobs:
            self._idle.notify_all()

    # -------------------------------------------------------------------------------- the tasks

    def _delete_chunk(
        self, reason: Deletion, dir_name: str, names: list[str], rmdir_after: bool = False
    ) -> None:
        keys = [f"{dir_name}/{name}" for name in names]
        with self._lock:  # set operations in C: the API's calls wait for this lock
            held = self._protected(keys)
            if held:
                names = [n for n, k in zip(names, keys, strict=True) if k not in held]
                keys = [k for k in keys if k not in held]
            sizes = list(map(self._sizes.pop, keys, itertools.repeat(-1)))
            ours = {n for n, k in zip(names, keys, strict=True) if k in self._in_doubt}
        removed = self._unlink(reason, dir_name, names, sizes, ours) if names else deleter.Removed()
        try:
            gone = rmdir_after and deleter.rmdir_if_empty(self._root_fd, dir_name)
        except OSError as exc:  # the directory goes with a later sweep
            log.debug("removing %s failed: %s", dir_name, exc)
            gone = False
        with self._lock:
            self._count(reason, removed)
            self.dir_bytes = max(0, self.dir_bytes - removed.bytes)
            self.dir_files = max(0, self.dir_files - removed.files)
            if gone:
                self.version_dirs = max(0, self.version_dirs - 1)

    def _unlink(
        self, reason: Deletion, dir_name: str, names: list[str], sizes: list[int], ours: set[str]
    ) -> deleter.Removed:
        """The deleter's unlink of one chunk, its files' sizes known first (measured now when
        they were not at record time: a worker that dies after removing some leaves the sizes
        to count them by). A worker gone keeps the chunk for the next round, in doubt."""
        assert self._deleter is not None
        unknown = [i for i, size in enumerate(sizes) if size < 0]
        if unknown:
            with _suppress_worker_gone(dir_name):  # unmeasured: they are stat-ed as they go
                measured = self._deleter.measure(dir_name, [names[i] for i in unknown])
                for i, size in zip(unknown, measured, strict=True):
                    sizes[i] = size
        try:
            out = self._deleter.unlink(dir_name, names, sizes, ours)
        except WorkerGoneError as exc:
            keys = [f"{dir_name}/{n}" for n in names]
            with self._lock:
                self._sizes.update(
                    (k, size) for k, size in zip(keys, sizes, strict=True) if size >= 0
                )
                self._in_doubt.update(keys)
            self._chunk_deferred(reason, dir_name, names, exc)
            return deleter.Removed()
        dir_failed = False
        for failure in out.failures:
            if failure.final and failure.where == dir_name:  # the directory itself failed
                dir_failed = True
                self._chunk_deferred(reason, dir_name, names, failure.error(), failure.label)
            else:
                failure.report(lambda *error: self._on_error(*error, reason=reason))
        if ours and not dir_failed:  # found gone or removed now: counted, no longer in doubt
            with self._lock:
                self._in_doubt.difference_update(f"{dir_name}/{n}" for n in ours)
        return out.removed

    def _chunk_deferred(
        self,
        reason: Deletion,
        dir_name: str,
        names: list[str],
        exc: Exception,
        label: DeleteError = DeleteError.WORKER_GONE,
    ) -> None:
        self.metrics.delete_errors.labels(label.value).inc()
        self.metrics.delete_given_up.inc(len(names))
        self._defer(reason, (f"{dir_name}/{n}" for n in names))
        log.warning(
            "could not delete %d file(s) in %s: %s; they stay journaled and are tried again",
            len(names),
            self.root.path / dir_name,
            exc,
        )

    def _sweep(self, job: Job, policy_step: int) -> None:
        """The backstop: empty and remove ``v<k>`` below the bound, sparing pending files.

        A directory an earlier sweep is still deleting is not listed again now (its files would
        be queued twice, and on a network file system a listing of thousands of entries is not
        cheap): that sweep lists it once more when its last chunk is done, for anything written
        there since it looked.
        """
        try:
            dirs = self.root.version_dirs()
        except OSError as exc:  # the volume's server away: the next policy update sweeps again
            log.warning(
                "the backstop sweep at step %d could not list %s: %s",
                policy_step,
                self.root.path,
                exc,
            )
            return
        for k in backstop_versions(dirs, policy_step, self._m):
            name = dirs[k].name
            with self._lock:
                if name in self._sweeping:
                    self._sweep_again.add(name)
                    continue
                self._sweeping[name] = 1  # held while it is listed: no second listing meanwhile
            self._sweep_dir(job, name)

    def _sweep_dir(self, job: Job, name: str) -> None:
        """List ``name`` and queue its files; releases the count its caller holds."""
        try:
            names = deleter.list_names(self._root_fd, name)
            if not names:
                # not under the lock: while unlinks run, an rmdir can wait tens of milliseconds
                # for the file system's journal, and the API's calls would wait with it
                if deleter.rmdir_if_empty(self._root_fd, name):
                    with self._lock:
                        self.version_dirs = max(0, self.version_dirs - 1)
                return
            with self._lock:
                for chunk in _chunks(names, self._chunk_files):
                    if self._task(job, len(chunk), self._delete_swept, job, name, chunk):
                        self._sweeping[name] += 1
        finally:
            self._release_sweep(job, name)

    def _delete_swept(self, job: Job, name: str, names: list[str]) -> None:
        """One chunk of a sweep."""
        try:
            self._delete_chunk(Deletion.BACKSTOP, name, names, rmdir_after=True)
        finally:
            self._release_sweep(job, name)

    def _release_sweep(self, job: Job, name: str) -> None:
        """A listing or a chunk of ``name`` is done; after the last, list it again if asked."""
        with self._lock:
            again = self._sweeping[name] == 1 and name in self._sweep_again
            if again:
                self._sweep_again.discard(name)  # the count stays, held by the listing below
            else:
                self._sweeping[name] -= 1
                if not self._sweeping[name]:
                    del self._sweeping[name]
        if again:
            self._sweep_dir(job, name)  # this task still runs: the job stays open for it

    def wipe_to_trash(self) -> None:
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
        assert self._deleter is not None
        try:
            out = self._deleter.remove_tree(TRASH_DIR)
        except WorkerGoneError as exc:
            log.warning("emptying %s stopped: %s; a later round goes on", TRASH_DIR, exc)
            with self._lock:
                self._trash_left = True
            return
        for failure in out.failures:
            failure.report(self._on_error)
        with self._lock:
            self._count(Deletion.WIPE, out.removed)
            if any(f.final for f in out.failures):
                self._trash_left = True

    # ------------------------------------------------------------------------------ measuring

    def measure(self, keys: Iterable[str]) -> None:
        """Learn the sizes of pending files in the background (lock held); see the module."""
        if self._closing or self._executor is None:
            return
        for dir_name, names in _by_dir(keys).items():
            for chunk in _chunks(names, self._chunk_files):
                self.sizing_files += len(chunk)
                self._executor.submit(self._measure, dir_name, chunk)

    def _measure(self, dir_name: str, names: list[str]) -> None:
        assert self._deleter is not None
        try:
            sizes = self._deleter.measure(dir_name, names)
        except (WorkerGoneError, RuntimeError) as exc:
            # unmeasured files are measured when they are deleted instead
            log.debug("measuring files in %s failed: %s", dir_name, exc)
            sizes = []
        known = {
            f"{dir_name}/{n}": size for n, size in zip(names, sizes, strict=False) if size >= 0
        }
        with self._lock:
            self.sizing_files -= len(names)
            # a file no batch holds any more is being deleted: its size is no use
            for key in self._protected(known):
                self._sizes[key] = known[key]

    def _count(self, reason: Deletion, removed: deleter.Removed) -> None:
        if removed.files:
            self.metrics.deleted_files.labels(reason.value).inc(removed.files)
            self.metrics.deleted_bytes.labels(reason.value).inc(removed.bytes)
            self.deleted[reason][0] += removed.files
            self.deleted[reason][1] += removed.bytes

    def _on_error(
        self,
        label: DeleteError,
        where: str,
        exc: OSError,
        attempt: int,
        final: bool,
        reason: Deletion = Deletion.WIPE,
    ) -> None:
        """Count and log; a file still there after its attempts is deferred (tried again)."""
        self.metrics.delete_errors.labels(label.value).inc()
        if final:
            self.metrics.delete_given_up.inc()
            if "/" in where:
                self._defer(reason, (where,))
            log.warning(
                "could not delete %s after %d attempt(s) (%s): %s; it stays journaled and is "
                "tried again",
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
        assert self._deleter is not None
        t0 = time.perf_counter()
        census = self._deleter.scan()
        with self._lock:
            self.dir_bytes, self.dir_files = census.bytes, census.files
            self.version_dirs = census.dirs
            self.scans += 1
        self.metrics.scan_seconds.observe(time.perf_counter() - t0)

    def scan_every(self, interval: float) -> None:
        """Scan until :meth:`close` (run on a thread of its own)."""
        while True:
            try:
                self.scan()
            except (OSError, RuntimeError):
                log.exception("scanning the payload root failed; retrying at the next interval")
            if self.stopping.wait(interval):
                return
