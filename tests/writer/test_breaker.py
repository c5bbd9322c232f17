"""The write breaker and the write threads: pure transitions, and threads that really block.

The hung volume itself is in tests/sharedfs/test_hung_writer.py (a GlusterFS brick SIGSTOPped).
"""

from __future__ import annotations

import threading
import weakref

import pytest

from payloadrun.reasons import Fallback
from payloadrun.writer.breaker import (
    Admission,
    Breaker,
    BreakerState,
    admit_write,
    deadline_left,
)
from payloadrun.writer.write_threads import HeldThreads, WriteThreads

COOLDOWN = 5.0


def test_closed_lets_every_write_through_and_returns_change_nothing():
    b = Breaker(COOLDOWN)
    assert [b.admit(t) for t in (0.0, 0.1, 0.2)] == [Admission.WRITE] * 3
    b.returned(Admission.WRITE)
    assert b.state is BreakerState.CLOSED and b.opened == 0


def test_a_missed_deadline_opens_it_and_requests_skip_until_the_cooldown_ends():
    b = Breaker(COOLDOWN)
    b.missed(Admission.WRITE, now=10.0)
    assert b.state is BreakerState.OPEN and b.opened == 1
    assert b.admit(10.0) is Admission.SKIP
    assert b.admit(10.0 + COOLDOWN - 1e-6) is Admission.SKIP
    assert b.admit(10.0 + COOLDOWN) is Admission.PROBE
    assert b.state is BreakerState.HALF_OPEN


def test_half_open_lets_one_probe_through_at_a_time():
    b = Breaker(COOLDOWN, state=BreakerState.OPEN, opened_at=0.0)
    assert b.admit(COOLDOWN) is Admission.PROBE
    assert b.admit(COOLDOWN + 1) is Admission.SKIP  # the probe is still out
    assert b.admit(COOLDOWN + 100) is Admission.SKIP


def test_a_probe_back_in_time_closes_it():
    b = Breaker(COOLDOWN, state=BreakerState.OPEN, opened_at=0.0)
    probe = b.admit(COOLDOWN)
    b.returned(probe)
    assert b.state is BreakerState.CLOSED and not b.probing
    assert b.admit(COOLDOWN + 1) is Admission.WRITE


def test_a_probe_that_misses_its_deadline_opens_it_again_from_then():
    b = Breaker(COOLDOWN, state=BreakerState.OPEN, opened_at=0.0, opened=1)
    probe = b.admit(COOLDOWN)
    b.missed(probe, now=COOLDOWN + 2)
    assert b.state is BreakerState.OPEN and b.opened == 2 and not b.probing
    assert b.admit(2 * COOLDOWN + 1) is Admission.SKIP  # the cooldown restarted at +2
    assert b.admit(2 * COOLDOWN + 2) is Admission.PROBE


def test_several_writes_missing_while_open_count_one_opening():
    b = Breaker(COOLDOWN)
    for now in (1.0, 1.1, 1.2):  # writes admitted while closed, all stuck
        b.missed(Admission.WRITE, now)
    assert b.opened == 1 and b.opened_at == 1.2


def test_a_write_admitted_while_closed_returning_late_does_not_close_a_half_open_breaker():
    b = Breaker(COOLDOWN, state=BreakerState.OPEN, opened_at=0.0)
    probe = b.admit(COOLDOWN)
    b.returned(Admission.WRITE)  # an older write, admitted before the breaker opened
    assert b.state is BreakerState.HALF_OPEN and b.probing
    b.returned(probe)
    assert b.state is BreakerState.CLOSED


def test_an_abandoned_probe_frees_the_slot_for_the_next_request():
    b = Breaker(COOLDOWN, state=BreakerState.OPEN, opened_at=0.0)
    probe = b.admit(COOLDOWN)
    b.abandoned(probe)
    assert b.admit(COOLDOWN) is Admission.PROBE


def test_admission_at_the_thread_cap_skips_without_spending_the_probe():
    b = Breaker(COOLDOWN, state=BreakerState.OPEN, opened_at=0.0)
    assert admit_write(b, held=4, cap=4, now=COOLDOWN) is Fallback.WRITE_THREADS_FULL
    assert b.state is BreakerState.OPEN  # not half-opened by a request that could not probe
    assert admit_write(b, held=3, cap=4, now=COOLDOWN) is Admission.PROBE
    assert admit_write(b, held=3, cap=4, now=COOLDOWN) is Fallback.BREAKER_OPEN
    assert admit_write(Breaker(COOLDOWN), held=0, cap=4, now=0) is Admission.WRITE


@pytest.mark.parametrize(
    ("started", "now", "left"), [(0.0, 0.0, 2.0), (0.0, 1.5, 0.5), (0.0, 2.0, 0.0), (0.0, 9, 0.0)]
)
def test_the_deadline_counts_from_the_submission(started, now, left):
    assert deadline_left(started, 2.0, now) == pytest.approx(left)


# --- the write threads: real threads, really blocked ---


def test_calls_beyond_the_cap_wait_for_a_thread_and_a_cancelled_one_never_runs():
    threads = WriteThreads(cap=2, name="test-write")
    release = threading.Event()
    ran: list[str] = []

    def blocked(tag: str) -> str:
        ran.append(tag)
        release.wait()
        return tag

    try:
        first, second = threads.submit(blocked, "a"), threads.submit(blocked, "b")
        third = threads.submit(blocked, "c")  # no thread is free: it waits
        fourth = threads.submit(blocked, "d")
        assert third.cancel(), "a call not started yet can be given up"
        names = {t.name for t in threading.enumerate() if t.name.startswith("test-write")}
        assert len(names) == 2, f"at most cap threads: {names}"
        assert all(t.daemon for t in threading.enumerate() if t.name.startswith("test-write"))
    finally:
        release.set()
    assert {first.result(10), second.result(10), fourth.result(10)} == {"a", "b", "d"}
    assert "c" not in ran
    threads.shutdown()


class _Answer:
    """Stands for a by-handle answer handed to a write (its body and arrays): weakly referable."""


def test_a_thread_lets_go_of_a_call_and_its_arguments_before_its_result_is_out():
    # A write thread idling with the last answer it wrote still referenced would hold that
    # answer's tens of MB after its in-flight budget was given back: one answer per idle thread,
    # which took the bench's peak case from about 830 MiB to 1,250 MiB on a 1 GiB budget.
    threads = WriteThreads(cap=2, name="test-let-go")
    answers = [_Answer() for _ in range(3)]
    refs = [weakref.ref(a) for a in answers]
    jobs = [threads.submit(id, a) for a in answers]
    ids = [id(a) for a in answers]
    del answers
    assert [job.result(10) for job in jobs] == ids
    alive = [i for i, ref in enumerate(refs) if ref() is not None]
    assert alive == [], f"answers {alive} are still referenced after their calls returned"
    threads.shutdown()


def test_held_threads_count_until_the_late_call_returns_and_its_cleanup_ran_first():
    threads = WriteThreads(cap=1, name="test-held")
    seen: list[int] = []
    back_to_zero = threading.Event()

    def changed(count: int) -> None:
        seen.append(count)
        if count == 0:
            back_to_zero.set()

    held = HeldThreads(changed)
    release, cleaned = threading.Event(), []
    job = threads.submit(release.wait)
    held.hold(job, lambda done: cleaned.append(held.held))
    assert held.held == 1
    release.set()
    assert back_to_zero.wait(10)
    # the cleanup ran (on the call's own thread) while the thread still counted as held
    assert cleaned == [1] and seen == [1, 0] and held.held == 0
    threads.shutdown()
