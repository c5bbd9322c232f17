"""The in-flight budget: how many bytes of upstream responses the writer holds at once.

A by-handle response is held whole: its raw body, the arrays decoded from it and the body sent
back all live until the answer is out. When many large generations finish at the same moment
(a batch of rollouts), holding all of them at once is what runs a pod out of memory. So every
by-handle response first reserves its cost from a budget; when the budget is used up the writer
does not read that response from vLLM at all until enough is released. Its bytes stay in vLLM's
socket buffers and in vLLM (TCP backpressure), not in the writer.

Admission is first come, first served: a response waits behind every earlier one, so a large
one is not starved by a stream of small ones. A response that costs more than the whole budget
is admitted alone, when nothing else is in flight, rather than never.

:func:`response_cost` says what a response costs; :class:`InFlightBudget` holds the count. Both
run on the event loop only (no locks).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass

# A by-handle response held in the writer, per byte of its body, measured on the fake vLLM's
# 32 MiB answers (docs/writer.md, "In-flight budget"): the body (1x), the arrays decoded from
# its base64 (0.75x), the small rest parsed as JSON, and the answer sent (a few hundred bytes, or
# a copy of the body when it goes back inline). Charged as 2x.
COST_PER_BODY_BYTE = 2


def response_cost(content_length: int | None, content_coded: bool, budget: int) -> int:
    """The bytes a by-handle response reserves from a ``budget``-byte budget.

    A body of unknown length (no ``Content-Length``, or chunked), or in a content coding (its
    decoded size is unknown until it is decoded), reserves the whole budget: it is read alone.
    vLLM sends ``Content-Length`` on every non-streaming answer, uncompressed.
    """
    if content_length is None or content_coded:
        return budget
    return max(1, COST_PER_BODY_BYTE * content_length)


@dataclass
class _Waiter:
    cost: int
    future: asyncio.Future[None]


class InFlightBudget:
    """A byte budget with first-come-first-served admission (see the module docstring).

    ``on_change(in_flight, waiting)`` is called after every change, for the metrics.
    """

    def __init__(self, budget: int, on_change: Callable[[int, int], None] | None = None) -> None:
        if budget < 1:
            raise ValueError(f"the in-flight budget must be at least 1 byte, got {budget}")
        self.budget = budget
        self.in_flight = 0
        self.peak = 0
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._on_change = on_change

    def _fits(self, cost: int) -> bool:
        return self.in_flight == 0 or self.in_flight + cost <= self.budget

    def _take(self, cost: int) -> None:
        self.in_flight += cost
        self.peak = max(self.peak, self.in_flight)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.in_flight, len(self._waiters))

    async def acquire(self, cost: int) -> bool:
        """Reserve ``cost`` bytes, waiting for them when they are not free; True when it waited.

        Cancelled while waiting, it reserves nothing (and lets the next waiter in if it fits).
        """
        if not self._waiters and self._fits(cost):
            self._take(cost)
            self._changed()
            return False
        waiter = _Waiter(cost, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._changed()
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(cost)  # admitted just as it was cancelled: give it back
            else:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                self._admit()  # the next one may fit now that this one no longer blocks it
                self._changed()
            raise
        return True

    def release(self, cost: int) -> None:
        """Give back what :meth:`acquire` reserved."""
        self.in_flight -= cost
        if self.in_flight < 0:  # a bug, not a condition to live with
            raise RuntimeError(f"released {cost} bytes more than were reserved")
        self._admit()
        self._changed()

    def _admit(self) -> None:
        """Let waiters in, in order, while the first one fits."""
        while self._waiters:
            waiter = self._waiters[0]
            if waiter.future.cancelled():  # its task is on its way out of acquire
                self._waiters.popleft()
                continue
            if not self._fits(waiter.cost):
                return
            self._waiters.popleft()
            self._take(waiter.cost)
            waiter.future.set_result(None)


# --- the default -------------------------------------------------------------------------------

GIB = 1 << 30
DEFAULT_BUDGET = GIB
# cgroup v2, then v1: the memory limit of the container the writer runs in.
MEMORY_LIMIT_FILES = (
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)


def default_budget(memory_limit: int | None) -> int:
    """1 GiB, or half the container's memory limit when that is less.

    The other half is the writer itself (about 100 MB) and headroom for what the budget does not
    count: memory the allocator keeps after a response is freed, and vLLM's answers for which
    only the socket buffers are held.
    """
    if memory_limit is None:
        return DEFAULT_BUDGET
    return max(1, min(DEFAULT_BUDGET, memory_limit // 2))


def container_memory_limit(files: tuple[str, ...] = MEMORY_LIMIT_FILES) -> int | None:
    """The cgroup memory limit in bytes, None when there is none (``max``, or no cgroup file).

    cgroup v1 reports "no limit" as a huge number (a page-rounded 2**63 - 1): anything at or
    above 2**60 counts as none.
    """
    for path in files:
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw == "max":
            return None
        try:
            value = int(raw)
        except ValueError:
            continue
        return value if value < 1 << 60 else None
    return None
