"""The operator's one work queue (platform/workqueue.py), with a pass that records what it is
given and when: keys coalesce, a run's passes never overlap, a burst during a pass is one more
pass, runs found at start wait behind the others, ``process`` returns once a pass has acted,
``stop`` ends everything. Real asyncio, real tasks; the pass is the test's."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.workqueue import Again, Work, WorkQueue

A, B = ("ml", "a"), ("ml", "b")


def body(rv: str) -> dict:
    return {"metadata": {"namespace": "ml", "name": "a", "resourceVersion": rv}}


class Recorder:
    """A pass that records (key, work) as it starts, holds until released, and counts how many
    passes of one key ran at once."""

    def __init__(self) -> None:
        self.started: list[tuple[tuple[str, str], Work]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.running: dict[tuple[str, str], int] = {}
        self.most_at_once = 0
        self.most_of_one_key = 0
        self.again: Again | None = None

    async def __call__(self, key: tuple[str, str], work: Work) -> Again | None:
        self.started.append((key, work))
        self.running[key] = self.running.get(key, 0) + 1
        self.most_of_one_key = max(self.most_of_one_key, self.running[key])
        self.most_at_once = max(self.most_at_once, sum(self.running.values()))
        try:
            await self.release.wait()
        finally:
            self.running[key] -= 1
        again, self.again = self.again, None
        return again


async def settle(queue: WorkQueue) -> None:
    for _ in range(200):
        if queue.pending() == 0:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"still pending: {queue.pending()}")


def test_adds_of_one_key_coalesce_into_one_pass_with_the_newest_body_and_the_spec_owed():
    async def main() -> list:
        record = Recorder()
        queue = WorkQueue(record, workers=4, resume_workers=2)
        queue.add(A, Work(body("5"), spec=True))
        queue.add(A, Work())  # a child's event
        queue.add(A, Work(body("7"), spec=True))
        queue.add(A, Work(body("6"), spec=True))  # an older body does not win
        assert queue.pending() == 1
        queue.start()
        await settle(queue)
        await queue.stop()
        return record.started

    (started,) = asyncio.run(main())
    key, work = started
    assert key == A and work.spec and work.body == body("7")


def test_a_burst_during_a_pass_is_one_more_pass_never_two_at_once():
    async def main() -> tuple[list, int]:
        record = Recorder()
        record.release.clear()
        queue = WorkQueue(record, workers=8, resume_workers=2)
        queue.start()
        queue.add(A)
        while not record.started:
            await asyncio.sleep(0)
        for n in range(50):  # fifty child events while the pass runs
            queue.add(A, Work(spec=n == 20))
        await asyncio.sleep(0.01)
        assert len(record.started) == 1  # none started beside it
        record.release.set()
        await settle(queue)
        await queue.stop()
        return record.started, record.most_of_one_key

    started, most = asyncio.run(main())
    assert len(started) == 2 and most == 1
    assert started[1][1].spec  # what the burst asked for is carried into the one more pass


def test_at_most_the_workers_run_and_runs_found_at_start_wait_behind_new_ones():
    async def main() -> tuple[list, int]:
        record = Recorder()
        record.release.clear()
        queue = WorkQueue(record, workers=3, resume_workers=1)
        for n in range(4):
            queue.add(("ml", f"old-{n}"), Work(spec=True, resume=True))
        for n in range(4):
            queue.add(("ml", f"new-{n}"), Work(spec=True))
        queue.start()
        await asyncio.sleep(0.01)
        first = [key[1] for key, _ in record.started]
        record.release.set()
        await settle(queue)
        await queue.stop()
        return first, record.most_at_once, [key[1] for key, _ in record.started]

    first, most, order = asyncio.run(main())
    assert first == ["new-0", "new-1", "new-2"]  # three workers, new runs first
    assert most == 3
    assert order[:4] == ["new-0", "new-1", "new-2", "new-3"]
    assert sorted(order[4:]) == [f"old-{n}" for n in range(4)]


def test_a_new_event_moves_a_resumed_run_to_the_front_lane():
    async def main() -> list:
        record = Recorder()
        record.release.clear()
        queue = WorkQueue(record, workers=1, resume_workers=1)
        queue.add(A, Work(spec=True, resume=True))
        queue.add(B, Work(spec=True, resume=True))
        queue.add(B)  # its child changed: not a resume's any more
        queue.start()
        await asyncio.sleep(0.01)
        record.release.set()
        await settle(queue)
        await queue.stop()
        return [key for key, _ in record.started]

    assert asyncio.run(main()) == [B, A]


def test_a_pass_that_asks_again_is_queued_after_its_delay_and_process_returns_once_it_ended():
    async def main() -> tuple[list, float]:
        record = Recorder()
        queue = WorkQueue(record, workers=2, resume_workers=1)
        queue.start()
        record.again = Again(0.2, Work(spec=True))
        loop = asyncio.get_running_loop()
        began = loop.time()
        await queue.process(A, Work(body("3"), spec=True))
        assert len(record.started) == 1  # returned after the first pass, not the retry
        while len(record.started) < 2:
            await asyncio.sleep(0.01)
        waited = loop.time() - began
        await settle(queue)
        await queue.stop()
        return record.started, waited

    started, waited = asyncio.run(main())
    assert waited >= 0.2
    assert started[1][1] == Work(spec=True)


def test_pending_counts_what_the_workers_still_owe_and_the_metric_reads_it():
    def sample(metrics: OperatorMetrics) -> float:
        text = generate_latest(metrics.registry).decode()
        (line,) = [
            line
            for line in text.splitlines()
            if line.startswith("payloadrun_operator_status_pending_runs ")
        ]
        return float(line.split()[-1])

    async def main() -> None:
        record = Recorder()
        record.release.clear()
        metrics = OperatorMetrics()
        queue = WorkQueue(record, workers=2, resume_workers=1)
        metrics.status_pending.set_function(queue.pending)
        queue.add(A)
        queue.add(A)
        queue.add(B, Work(resume=True))
        assert queue.pending() == 2 and sample(metrics) == 2
        queue.start()
        await asyncio.sleep(0.01)
        assert queue.pending() == 2  # both in a pass now
        record.release.set()
        await settle(queue)
        assert sample(metrics) == 0 and queue.passes == 2
        await queue.stop()

    asyncio.run(main())


def test_stop_ends_running_passes_and_their_waiters_and_starts_no_more():
    async def main() -> tuple[int, int, bool]:
        record = Recorder()
        record.release.clear()
        queue = WorkQueue(record, workers=2, resume_workers=1)
        queue.start()
        waiting = asyncio.create_task(queue.process(A, Work(spec=True)))
        while not record.started:
            await asyncio.sleep(0)
        await queue.stop()
        await asyncio.wait_for(waiting, 1)  # its kopf handler is not left hanging
        queue.add(B)  # a child's event, or a retry's timer, after the stop
        queue.add(B, delay=0.01)
        await asyncio.sleep(0.05)
        return len(record.started), record.running[A], waiting.done()

    assert asyncio.run(main()) == (1, 0, True)


def test_a_discarded_key_is_not_passed_over_and_its_waiter_returns():
    async def main() -> list:
        record = Recorder()
        queue = WorkQueue(record, workers=1, resume_workers=1)
        waiting = asyncio.create_task(queue.process(A, Work(spec=True)))
        await asyncio.sleep(0)
        queue.discard(A)  # deleted before its pass started
        await asyncio.wait_for(waiting, 1)
        queue.start()
        await asyncio.sleep(0.01)
        await queue.stop()
        return record.started

    assert asyncio.run(main()) == []
