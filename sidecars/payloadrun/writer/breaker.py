"""When the writer touches the payload volume at all: a circuit breaker over hung writes.

A write to a hung mount (NFS ``hard``, GlusterFS within ``network.ping-timeout``) blocks in a
system call that nothing can cancel; the writer answers such a request inline at its deadline
(:mod:`payloadrun.writer.server`), but every further write would block a thread and make its
request wait the whole deadline too. So after a write misses its deadline the breaker **opens**:
requests skip the volume and go inline at once. After ``cooldown`` seconds it is **half open**:
one request at a time is let through as a probe; a probe that returns in time (written, or failed
quickly with an error: the volume answers again) **closes** it, one that misses its deadline opens
it again. A write that returns in time while closed changes nothing.

Besides the breaker, the threads a hang can hold are capped (``--write-threads``): a write that
missed its deadline still holds its thread until the kernel lets go. While every one of them is
held, a request skips the volume even when the breaker would let it through
(``write_threads_full``).

Everything here is pure: time comes in as an argument, no I/O, no threads. The server calls it
from the event loop only.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from payloadrun.reasons import Fallback


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Admission(StrEnum):
    """What one request may do with the volume."""

    WRITE = "write"  # closed: write as usual
    PROBE = "probe"  # half open: this request's write is the one probe
    SKIP = "skip"  # open, a probe is out, or every write thread is held: answer inline


@dataclass(slots=True)
class Breaker:
    """The breaker's state; ``admit`` / ``returned`` / ``missed`` are its only transitions."""

    cooldown: float
    state: BreakerState = BreakerState.CLOSED
    opened_at: float = 0.0
    probing: bool = False  # a half-open probe is in flight
    opened: int = 0  # times it opened (closed or half open -> open)

    def admit(self, now: float) -> Admission:
        """Whether a request may touch the volume now; half-opens after the cooldown."""
        if self.state is BreakerState.OPEN:
            if now - self.opened_at < self.cooldown:
                return Admission.SKIP
            self.state = BreakerState.HALF_OPEN
        if self.state is BreakerState.HALF_OPEN:
            if self.probing:
                return Admission.SKIP
            self.probing = True
            return Admission.PROBE
        return Admission.WRITE

    def returned(self, admission: Admission) -> None:
        """A call admitted as ``admission`` returned within its deadline (success or error)."""
        if admission is Admission.PROBE:
            self.state = BreakerState.CLOSED
            self.probing = False

    def missed(self, admission: Admission, now: float) -> None:
        """A call admitted as ``admission`` missed its deadline: open (again) from ``now``."""
        if admission is Admission.PROBE:
            self.probing = False
        if self.state is not BreakerState.OPEN:
            self.opened += 1
        self.state = BreakerState.OPEN
        self.opened_at = now

    def abandoned(self, admission: Admission) -> None:
        """A call's request went away before its outcome was known: a probe frees its slot."""
        if admission is Admission.PROBE and self.state is BreakerState.HALF_OPEN:
            self.probing = False


def admit_write(breaker: Breaker, held: int, cap: int, now: float) -> Admission | Fallback:
    """The admission of one request's volume call, or the fallback reason it skips with.

    ``held``: write threads still blocked past their deadline; ``cap``: how many threads writes
    may hold at most. At the cap nothing more is started (it would block too): the request goes
    inline, and the breaker is not consulted, so a half-open probe is not spent on it.
    """
    if held >= cap:
        return Fallback.WRITE_THREADS_FULL
    admission = breaker.admit(now)
    return Fallback.BREAKER_OPEN if admission is Admission.SKIP else admission


def deadline_left(started: float, deadline: float, now: float) -> float:
    """Seconds a call started at ``started`` may still wait (0 when its deadline passed)."""
    return max(0.0, started + deadline - now)
