"""The deletion worker process: real processes over real pipes, on a real file system."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import random
import select
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from retention_helpers import existing, make_files, wait_for

from payloadrun.retention.deleter import LocalDeleter, Retry
from payloadrun.retention.worker import (
    WORKER_NICE,
    DirectoryLanes,
    ProcessDeleter,
    WorkerGoneError,
)

FAST = Retry(attempts=3, backoff_s=0.001)


@pytest.fixture
def worker(root: Path):
    restarts: list[int] = []
    made = ProcessDeleter(root, threads=2, retry=FAST, on_restart=lambda: restarts.append(1))
    made.restarts = restarts  # type: ignore[attr-defined]
    yield made
    made.close()


def names_of(files: list[str]) -> list[str]:
    return [Path(f).name for f in files]


def nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_unlink_counts_known_sizes_and_measures_the_rest(worker, root):
    files = make_files(root, 3, 6, size=700)
    names = names_of(files)
    sizes = [700, 700, 700, -1, -1, -1]  # the last three were never measured
    out = worker.unlink("v3", names, sizes)
    assert (out.removed.files, out.removed.bytes, out.failures) == (6, 6 * 700, [])
    assert existing(files) == []
    again = worker.unlink("v3", names, sizes)  # gone already: done, not counted
    assert (again.removed.files, again.failures) == (0, [])


def test_one_directory_gets_two_lanes_and_other_directories_are_not_held_up():
    """At most two of a directory's tasks run at once, in order, on the same two threads."""
    gate = threading.Event()
    lock = threading.Lock()
    running = peak = 0
    started: list[int] = []
    threads: set[int] = set()
    other_ran = threading.Event()

    def task(i: int) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            started.append(i)
            threads.add(threading.get_ident())
        gate.wait(10)
        with lock:
            running -= 1

    class CountingPool(ThreadPoolExecutor):
        submitted = 0

        def submit(self, *args, **kwargs):
            self.submitted += 1
            return super().submit(*args, **kwargs)

    with CountingPool(6) as pool:
        lanes = DirectoryLanes(pool, per_directory=2)
        for i in range(5):
            lanes.submit("v1", lambda i=i: task(i))
        lanes.submit("v2", other_ran.set)
        assert other_ran.wait(5), "a busy directory held up another one"
        # the lanes decide at submit: v1's first two and v2's one went to the pool, the rest wait
        assert pool.submitted == 3
        wait_for(lambda: running == 2)
        with lock:
            assert (running, started) == (2, [0, 1])
        gate.set()
    assert (peak, started, len(threads)) == (2, [0, 1, 2, 3, 4], 2)
    assert pool.submitted == 3  # each of v1's later tasks ran on a thread that finished one


def test_measure_gives_regular_files_their_size_and_everything_else_minus_one(
    worker, root, tmp_path
):
    [kept] = make_files(root, 1, 1, size=321)
    (root / "v1" / "sub").mkdir()
    (tmp_path / "outside.bin").write_bytes(b"x" * 99)
    (root / "v1" / "link.bin").symlink_to(tmp_path / "outside.bin")
    names = [Path(kept).name, "sub", "link.bin", "missing.bin"]
    assert worker.measure("v1", names) == [321, -1, -1, -1]
    assert worker.measure("v9", ["a.bin"]) == [-1]  # no such directory


def test_a_directory_named_as_a_file_is_reported_at_once_and_left(worker, root):
    [f] = make_files(root, 2, 1)
    (root / "v2" / "dir.bin").mkdir()
    out = worker.unlink("v2", [Path(f).name, "dir.bin"], [100, 5])  # a stale size, even
    assert out.removed.files == 1 and (root / "v2" / "dir.bin").is_dir()
    [failure] = out.failures
    assert (failure.label, failure.where, failure.attempt, failure.final) == (
        "is_a_directory",
        "v2/dir.bin",
        1,
        True,
    )


def test_a_symlinked_version_directory_is_refused_in_the_worker(worker, root, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.bin").write_bytes(b"keep")
    (root / "v5").symlink_to(victim)
    out = worker.unlink("v5", ["precious.bin"], [4])
    assert out.removed.files == 0 and (victim / "precious.bin").exists()
    assert [f.label for f in out.failures] == ["not_a_directory"]
    assert worker.measure("v5", ["precious.bin"]) == [-1]


def test_remove_tree_and_scan(worker, root):
    make_files(root, 0, 4, size=10)
    make_files(root, 7, 3, size=1000)
    census = worker.scan()
    assert (census.files, census.bytes, census.dirs) == (7, 3 * 1000 + 4 * 10, 2)
    trash = root / ".retention-trash" / "1"
    trash.mkdir(parents=True)
    os.rename(root / "v0", trash / "v0")
    out = worker.remove_tree(".retention-trash")
    assert (out.removed.files, out.removed.bytes) == (4, 40)
    assert not (root / ".retention-trash").exists()
    assert worker.scan().dirs == 1


def test_the_worker_runs_below_the_sidecars_priority_and_ignores_its_signals(worker, root):
    pid = worker.pid
    worker.scan()  # answered: the worker has set itself up
    assert pid != os.getpid()
    assert nice_of(pid) == min(19, nice_of(os.getpid()) + WORKER_NICE)
    os.kill(pid, signal.SIGTERM)  # meant for the sidecar's process group: the worker carries on
    files = make_files(root, 1, 3)
    assert worker.unlink("v1", names_of(files), [100] * 3).removed.files == 3
    assert worker.pid == pid and worker.restarts == []


def wait_exited(pid: int) -> None:
    """Until process ``pid`` has exited (its descriptors closed), reaped or not."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # reaped already
    try:
        assert select.select([pidfd], [], [], 30)[0], f"process {pid} did not exit"
    finally:
        os.close(pidfd)


def wait_unanswered(deleter: ProcessDeleter, calls: int) -> None:
    """Until ``calls`` calls have been written to the worker and are waiting for its answer."""
    wait_for(lambda: deleter.unanswered == calls)


def test_a_worker_that_dies_fails_its_calls_and_the_next_call_starts_another(worker, root):
    files = make_files(root, 1, 2)
    first = worker.pid
    os.kill(first, signal.SIGKILL)
    wait_exited(first)  # its input pipe is broken now, whether or not anything noticed yet
    out = worker.unlink("v1", names_of(files), [100, 100])
    assert out.removed.files == 2 and worker.pid != first and worker.restarts == [1]


def test_a_call_that_finds_its_worker_gone_before_it_took_the_call_goes_to_a_new_one(worker, root):
    """The race the test above met one run in 1,461: the worker has exited, but ``poll`` cannot
    tell while the reply reader reaps it (``wait`` holds the lock ``poll`` needs), so the call is
    written to a pipe nothing reads. It goes to a new worker instead of failing."""
    files = make_files(root, 1, 2)
    first = worker.pid
    dead = worker._worker.proc  # the Popen the reply reader reaps
    with dead._waitpid_lock:  # as the reply reader holds it inside wait()
        os.kill(first, signal.SIGKILL)
        wait_exited(first)
        assert dead.poll() is None  # what the call sees: "alive"
        out = worker.unlink("v1", names_of(files), [100, 100])
    assert (out.removed.files, existing(files)) == (2, [])
    assert worker.pid != first and worker.restarts == [1]
    assert worker.scan().files == 0 and worker.restarts == [1]  # the new one stays


def test_a_call_its_worker_died_on_is_sent_once_more_to_a_new_one(root):
    """A call the worker may have begun (sent, not answered) goes to a new worker: every
    operation is idempotent."""
    files = make_files(root, 2, 3)
    slow = ProcessDeleter(root, threads=1, retry=FAST)
    try:
        pid = slow.pid
        os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(slow.scan)
            wait_unanswered(slow, 1)  # sent: the worker may take it whenever it runs
            assert not call.done()  # waiting for an answer
            os.kill(pid, signal.SIGKILL)
            assert call.result(10).files == 3  # answered, by the new worker
        assert slow.pid != pid and slow.unanswered == 0
        assert existing(files) == files
    finally:
        slow.close()


def hung_workers(deleter: ProcessDeleter) -> None:
    """From the next start on, ``deleter``'s workers read nothing and never answer (a worker
    that hangs), so each call waits until the test kills the worker holding it."""
    deleter._command = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_call_whose_second_worker_dies_too_fails_saying_so(root):
    deleter = ProcessDeleter(root, threads=1, retry=FAST)
    try:
        hung_workers(deleter)
        os.kill(deleter.pid, signal.SIGKILL)  # the next call starts a hung worker
        wait_exited(deleter.pid)
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(deleter.measure, "v0", ["a.bin"])
            for _ in range(2):  # the first worker, then the one the call is sent again to
                wait_unanswered(deleter, 1)
                holder = deleter.pid
                os.kill(holder, signal.SIGKILL)
                wait_for(lambda holder=holder: deleter.pid != holder or call.done())
            with pytest.raises(WorkerGoneError, match="and so did the one it was sent to again"):
                call.result(10)
    finally:
        deleter.close()


def blocked_writing(pid: int) -> bool:
    """Whether a thread of ``pid`` sleeps in a write to a pipe (its reader not reading)."""
    return any("pipe_write" in Path(f).read_text() for f in glob.glob(f"/proc/{pid}/task/*/wchan"))


def test_a_worker_killed_while_writing_a_reply_ends_every_call(root):
    """The worker dies in the middle of a reply larger than the pipe's buffer: the reader gets
    a partial line (asserted: a kill before the write would give a clean end of file), every
    call waiting on that worker ends, answered by the next one, and its answer is whole."""
    names = [f"missing-{i:06d}.bin" for i in range(60_000)]  # measure: about 180 KB of reply
    make_files(root, 0, 1)
    deleter = ProcessDeleter(root, threads=1, retry=FAST)
    try:
        pid = deleter.pid
        os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(2) as pool:
            small = pool.submit(deleter.scan)
            wait_unanswered(deleter, 1)
            big = pool.submit(deleter.measure, "v0", names)
            # its line is larger than the pipe's buffer: written in part, it waits for the
            # stopped worker to read (not counted unanswered until it is written whole)
            wait_for(lambda: blocked_writing(os.getpid()))
            # the reply reader takes this lock for each whole line it read: held, it stops
            # reading after the first reply, so the second blocks the worker in its write
            with deleter._lock:
                os.kill(pid, signal.SIGCONT)
                wait_for(lambda: blocked_writing(pid))
                os.kill(pid, signal.SIGKILL)
                wait_exited(pid)
            assert small.result(10).files == 1
            assert big.result(10) == [-1] * len(names)  # sent again, answered whole
        assert deleter.replies_cut_short == 1
        assert deleter.unanswered == 0 and deleter.pid != pid
    finally:
        deleter.close()


def test_after_close_calls_are_refused(root):
    closed = ProcessDeleter(root, threads=1, retry=FAST)
    pid = closed.pid
    closed.close()
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    with pytest.raises(WorkerGoneError, match="closed"):
        closed.scan()
    closed.close()  # twice is harmless


@pytest.mark.parametrize("known", [True, False], ids=["size-known", "size-unknown"])
def test_retries_count_the_same_whether_the_size_was_known(root, known):
    attempts: dict[str, int] = {}

    def flaky(name, *, dir_fd):
        attempts[name] = attempts.get(name, 0) + 1
        if name == "stuck.bin" or attempts[name] <= 1:
            raise OSError(errno.EBUSY, "injected busy error")
        os.unlink(name, dir_fd=dir_fd)

    (root / "v0").mkdir()
    for name in ("ok.bin", "stuck.bin"):
        (root / "v0" / name).write_bytes(b"12")
    local = LocalDeleter(root, FAST, unlink=flaky)
    try:
        sizes = [2, 2] if known else [-1, -1]
        out = local.unlink("v0", ["ok.bin", "stuck.bin"], sizes)
    finally:
        local.close()
    assert attempts == {"ok.bin": 2, "stuck.bin": 3}
    assert (out.removed.files, out.removed.bytes) == (1, 2)
    stuck = [(f.where, f.attempt, f.final) for f in out.failures if "stuck" in f.where]
    assert stuck == [("v0/stuck.bin", n, n == 3) for n in (1, 2, 3)]
    assert all(f.label == "io_error" for f in out.failures)


def test_a_killed_workers_chunks_go_to_a_new_one_and_are_counted_once(service_factory, root):
    svc = service_factory(chunk_files=50, retry=Retry(later_s=3600))
    files = make_files(root, 0, 400, size=250)
    svc.record_batch(1, files)
    # measured: the chunks below are the worker's only calls
    wait_for(lambda: svc.status()["sizing_files"] == 0)
    deleter = svc.queue._deleter  # the sidecar's own worker
    pid = deleter.pid
    os.kill(pid, signal.SIGSTOP)  # every chunk waits on it
    svc.policy_updated(1)
    # 8 chunks of 50; the queue's 4 threads each send one and wait for it; the other 4 wait
    wait_unanswered(deleter, 4)
    os.kill(pid, signal.SIGKILL)
    assert svc.wait_idle(20)
    assert existing(files) == []  # the four calls were sent again, the rest went on
    assert svc.metrics.delete_errors.labels("worker_gone")._value.get() == 0
    assert svc.metrics.worker_restarts._value.get() == 1
    assert svc.status()["deleted"]["consumed"] == {"files": 400, "bytes": 400 * 250}


def test_a_chunk_two_workers_died_on_is_journaled_in_doubt_and_counted_once(service_factory, root):
    """Both the worker that took a chunk and the one it was sent to again die: the chunk is
    deferred (journaled) with its sizes, and the round that deletes it counts what the dead
    workers removed too."""
    svc = service_factory(chunk_files=50, retry=Retry(attempts=1, backoff_s=0.001, later_s=0.1))
    files = make_files(root, 0, 50, size=300)
    svc.record_batch(1, files)
    wait_for(lambda: svc.status()["sizing_files"] == 0)
    deleter = svc.queue._deleter
    working = deleter._command
    os.unlink(files[0])  # as if the first dead worker had removed it before dying
    hung_workers(deleter)
    os.kill(deleter.pid, signal.SIGKILL)
    wait_exited(deleter.pid)
    svc.policy_updated(1)
    wait_unanswered(deleter, 1)  # the chunk, on a worker that never answers
    first = deleter.pid
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: deleter.pid != first and deleter.unanswered == 1)  # sent again
    deleter._command = working  # the workers after this one work
    os.kill(deleter.pid, signal.SIGKILL)
    assert svc.wait_idle(20)
    # a later round: its files are gone before its chunk is counted, so not "files gone and
    # nothing deferred" (a cold run on 2026-12-07 read the status in between: 0 consumed)
    wait_for(lambda: svc.queue.at_rest() and not existing(files))
    assert svc.metrics.delete_errors.labels("worker_gone")._value.get() == 1
    assert svc.status()["deleted"]["consumed"] == {"files": 50, "bytes": 50 * 300}


def test_random_worker_kills_under_concurrent_calls_lose_nothing(service_factory, root):
    """The worker SIGKILLed at random moments (bounded: at most 20 kills, over at most 20 s)
    while batches are recorded, consumed and discarded from several threads and their files
    deleted: no call hangs, every consumed and discarded file is gone, and the counters equal
    the files and bytes that went, whichever worker removed them."""
    rng = random.Random(7)
    retry = Retry(attempts=2, backoff_s=0.001, later_s=0.1)
    svc = service_factory(chunk_files=16, max_off_policy_steps=100, retry=retry)
    batches = [make_files(root, step % 3, 160, size=100 + step) for step in range(1, 13)]
    loose = [make_files(root, 3, 96, size=77 + n) for n in range(4)]
    sizes = {f: Path(f).stat().st_size for group in [*batches, *loose] for f in group}
    gone = list(sizes)

    def done() -> bool:  # at rest at one instant, as a round's files go before it counts them
        return svc.queue.at_rest() and not existing(gone)

    kills = 0
    stop = threading.Event()

    def killer() -> None:
        nonlocal kills
        deadline = time.monotonic() + 20
        while kills < 20 and time.monotonic() < deadline and not stop.is_set():
            stop.wait(rng.uniform(0.002, 0.05))
            if done():
                return
            pid = svc.queue._deleter.pid
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGKILL)
                kills += 1

    def orchestrate(steps: range) -> None:
        for step in steps:
            svc.record_batch(step, batches[step - 1])
            svc.policy_updated(step)
            time.sleep(rng.uniform(0, 0.02))  # a trainer step, shortened

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        with ThreadPoolExecutor(3) as pool:
            calls = [pool.submit(orchestrate, range(1, 7)), pool.submit(orchestrate, range(7, 13))]
            calls += [pool.submit(svc.discard, group) for group in loose]
            for call in calls:
                call.result(timeout=20)  # no call hangs
        wait_for(done, timeout=40)  # nothing hangs: every deletion ends, deferred ones too
    finally:
        stop.set()
        thread.join(5)
    print(f"{kills} kills, deleted {svc.status()['deleted']}")
    assert kills >= 3, f"only {kills} kills landed: nothing was tested"
    deleted = svc.status()["deleted"]
    assert deleted["consumed"]["files"] + deleted["discarded"]["files"] == len(gone)
    assert deleted["consumed"]["bytes"] == sum(sizes[f] for group in batches for f in group)
    assert deleted["discarded"]["bytes"] == sum(sizes[f] for group in loose for f in group)


def test_a_settled_call_does_not_keep_the_reader_from_the_others():
    """A worker's reply reader fails every call its worker left unanswered; one of them already
    settled (an attempt failed before it was sent again) must not stop it there, or the calls
    after it wait forever (the random-kill test above found that, about 1 run in 15)."""
    from concurrent.futures import Future

    from payloadrun.retention.worker import _settle

    settled, waiting = Future(), Future()
    settled.set_exception(WorkerGoneError("the first worker exited"))
    for answer in (settled, waiting):
        _settle(answer, WorkerGoneError("the second worker exited"))
    assert str(waiting.exception()) == "the second worker exited"
    assert str(settled.exception()) == "the first worker exited"  # its first outcome stays
    _settle(waiting, {"id": 1, "ok": []})  # a late reply for it changes nothing either
    assert str(waiting.exception()) == "the second worker exited"
