"""The operator's one work queue, keyed by run, as controller-runtime's workqueue is.

Everything that concerns a run only adds its key: kopf's create, update and resume handlers
(with the run's full body, which the pass reads), a child's or a Workload's watch event, a
retry's or a recheck's timer, the follower's periodic resync. A key is queued once however
often it is added; what the adds asked for is merged into one :class:`Work` (the latest body,
whether the spec side is owed). A run's passes never overlap: a key added while its pass runs is
queued again when that pass ends, so a burst of events during a pass coalesces into one more
pass. At most ``workers`` passes run at once, and of those at most ``resume_workers`` for runs
found at start (kopf's resume), which wait behind every other queued run: the API server's time
goes to runs created meanwhile first, instead of to hundreds of unchanged children.

The queue knows nothing of what a pass does: ``handle(key, work)`` is the pass, and what it
returns (:class:`Again`) is queued again after its delay.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger("payloadrun.workqueue")
RunKey = tuple[str, str]  # (namespace, name)


def resource_version(body: Mapping[str, Any] | None) -> int:
    """``body``'s resourceVersion as a number (etcd's only grow); -1 when it has none."""
    rv = ((body or {}).get("metadata") or {}).get("resourceVersion", "")
    return int(rv) if isinstance(rv, str) and rv.isdigit() else -1


@dataclass(frozen=True)
class Work:
    """What the adds of one key asked of its next pass: ``body``, the run as kopf's latest event
    gave it (None: the pass reads the follower's copy, or the API server's when it needs the
    pod templates); ``spec``: admit, build and apply (kopf saw a change of the spec, a child
    was deleted, a Workload's admission changed, a retry); ``resume``: the run was found at
    start and nothing newer asked for it (it waits behind the others)."""

    body: Mapping[str, Any] | None = None
    spec: bool = False
    resume: bool = False

    def merge(self, other: Work) -> Work:
        """Both asks in one: the newer body, the spec side if either owes it, a resume only if
        both are (a new event puts a resumed run in the front lane)."""
        body = self.body
        if other.body is not None and (
            body is None or resource_version(other.body) >= resource_version(body)
        ):
            body = other.body
        return Work(body, self.spec or other.spec, self.resume and other.resume)


@dataclass(frozen=True)
class Again:
    """A pass's ask to be queued again after ``delay`` seconds, with ``work``."""

    delay: float
    work: Work = Work()


Handle = Callable[[RunKey, Work], Awaitable["Again | None"]]


class WorkQueue:
    """Keys waiting (two lanes: new work, then runs found at start), keys in a pass, and the
    workers that take them; see the module's docstring."""

    def __init__(self, handle: Handle, *, workers: int, resume_workers: int) -> None:
        self._handle = handle
        self._workers = workers
        self._resume_workers = resume_workers
        self._waiting: OrderedDict[RunKey, Work] = OrderedDict()  # front lane, in order
        self._resuming: OrderedDict[RunKey, Work] = OrderedDict()  # behind it
        self._busy: dict[RunKey, bool] = {}  # key -> its pass is a resume's
        self._again: dict[RunKey, Work] = {}  # added while its pass runs
        self._timers: set[asyncio.TimerHandle] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        # key -> futures ended by its next pass to start (:meth:`process`)
        self._waiters: dict[RunKey, list[asyncio.Future[None]]] = {}
        self._stopped = False
        self.passes = 0  # passes ended, for tests and the metrics

    def pending(self) -> int:
        """Runs queued or in a pass (a delayed one counts once it is due)."""
        return len(self._waiting.keys() | self._resuming.keys() | self._busy.keys())

    def add(self, key: RunKey, work: Work = Work(), delay: float = 0.0) -> None:
        """Queue ``key`` (after ``delay`` seconds) for a pass that does ``work``; merged with
        what it is queued for already."""
        if self._stopped:  # a retry's timer, or an event, after the operator stopped
            return
        if delay > 0:
            timer: asyncio.TimerHandle | None = None

            def due() -> None:
                self._timers.discard(timer)  # type: ignore[arg-type]
                self.add(key, work)

            timer = asyncio.get_running_loop().call_later(delay, due)
            self._timers.add(timer)
            return
        if key in self._busy:
            self._again[key] = self._again[key].merge(work) if key in self._again else work
            return
        if key in self._waiting:
            self._waiting[key] = self._waiting[key].merge(work)
        elif key in self._resuming:
            merged = self._resuming.pop(key).merge(work)
            lane = self._resuming if merged.resume else self._waiting
            lane[key] = merged
        else:
            (self._resuming if work.resume else self._waiting)[key] = work
        self._wake.set()

    async def process(self, key: RunKey, work: Work) -> None:
        """:meth:`add`, then wait until a pass of ``key`` that starts from now on has ended (a
        kopf handler returns once its event was acted on, so its "processed" log line means
        that; a pass that asks to be queued again has ended too)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(waiter)
        self.add(key, work)
        if self._stopped:
            waiter.cancel()
        await waiter

    def discard(self, key: RunKey) -> None:
        """Forget what ``key`` was queued for (the run was deleted); a pass under way ends as
        it would."""
        self._waiting.pop(key, None)
        self._resuming.pop(key, None)
        self._again.pop(key, None)
        if key not in self._busy:
            _end(self._waiters.pop(key, []))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]

    async def stop(self) -> None:
        """End every pass under way, and start none from now on."""
        self._stopped = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.cancel()
        self._waiters.clear()

    def _next(self) -> tuple[RunKey, Work, bool] | None:
        if self._waiting:
            key, work = self._waiting.popitem(last=False)
            return key, work, False
        resuming = sum(self._busy.values())
        if self._resuming and resuming < self._resume_workers:
            key, work = self._resuming.popitem(last=False)
            return key, work, True
        return None

    async def _work(self) -> None:
        while True:
            taken = self._next()
            if taken is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            key, work, resume = taken
            self._busy[key] = resume
            waiters = self._waiters.pop(key, [])
            again: Again | None = None
            try:
                again = await self._handle(key, work)
            except Exception:  # a bug must not stop the worker: every other run would stall
                log.exception("%s/%s: the pass failed", *key)
                again = Again(5.0, work)
            finally:
                del self._busy[key]
                self.passes += 1
                _end(waiters)
                if key in self._again:
                    self.add(key, self._again.pop(key))
                self._wake.set()  # a resume's slot may be free now
            if again is not None:
                self.add(key, replace(again.work, resume=False), again.delay)


def _end(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
