"""The retention service in-process, on real files in a tmp dir."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
from pathlib import Path

import pytest
from retention_helpers import existing, immutable, make_files, mutable, wait_for

from payloadrun.retention import journal as journal_module
from payloadrun.retention.deleter import Retry
from payloadrun.retention.journal import read_records
from payloadrun.retention.service import (
    DiscardRefusedError,
    RefusedPathError,
    StartMode,
)
from payloadrun.retention.worker import ProcessDeleter
from payloadrun_devkit.mounts import fill, tmpfs


class StalledVolume:
    """Deletions that wait until released, on either deleter: in the service's own process (an
    unlink that waits, ``LocalDeleter``), or in the production deletion worker process
    (``ProcessDeleter``, stopped with SIGSTOP: every call it is sent waits)."""

    def __init__(self, kind: str, service_factory) -> None:
        self.kind = kind
        self._factory = service_factory
        self._released = threading.Event()
        self._crashing = False
        self._lock = threading.Lock()
        self.entered = 0  # in-process unlinks waiting or done
        self.svc = None

    def _unlink(self, name, *, dir_fd):
        with self._lock:
            self.entered += 1
        while not self._released.wait(0.005):
            if self._crashing:
                raise OSError(errno.EIO, "the process died")
        os.unlink(name, dir_fd=dir_fd)

    def service(self, **overrides):
        """A started service whose deletions are stalled from now on."""
        if self.kind == "in-process":
            self.svc = self._factory(unlink=self._unlink, **overrides)
        else:
            self.svc = self._factory(**overrides)
            assert isinstance(self.svc.queue._deleter, ProcessDeleter)
            assert self.svc.wait_idle(10)  # the start's own job (the trash) is done
            os.kill(self.svc.queue._deleter.pid, signal.SIGSTOP)
        return self.svc

    def held(self) -> int:
        """Deletion calls the stall holds now: unlinks entered, or calls sent to the worker."""
        if self.kind == "in-process":
            return self.entered
        return self.svc.queue._deleter.unanswered

    def release(self) -> None:
        self._released.set()
        pid = self.svc.queue._deleter.pid if self.kind == "worker" and self.svc else None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def crash(self) -> None:
        """Close the service as a crash would: the deletions it holds fail, the queue drops.

        A worker's death alone fails nothing (its calls are sent again to a new worker); the
        sidecar's death takes its worker along. So the worker is killed once the deleter stops
        (``stop``: no call is sent again), as if the sidecar's process had gone with it."""
        if self.kind == "worker":
            self.svc.queue._deleter.stop()
            os.kill(self.svc.queue._deleter.pid, signal.SIGKILL)
        self._crashing = True
        self.svc.close()
        self._crashing = False


@pytest.fixture(params=["in-process", "worker"])
def stalled(request, service_factory):
    volume = StalledVolume(request.param, service_factory)
    yield volume
    volume.release()  # a test that failed still closes its service


def test_batches_are_kept_until_consumed_then_deleted(service_factory, root):
    svc = service_factory()
    b1, b2 = make_files(root, 0, 20), make_files(root, 1, 5)
    unclaimed = make_files(root, 1, 3)
    assert svc.record_batch(1, b1)["disposition"] == "pending"
    assert svc.record_batch(2, b2)["disposition"] == "pending"
    result = svc.policy_updated(1)
    assert result["settled"] == [1] and result["deleting"] == 20
    assert svc.wait_idle(10)
    assert existing(b1) == []
    assert existing(b2) == b2 and existing(unclaimed) == unclaimed
    st = svc.status()
    assert st["policy_step"] == 1 and st["pending_steps"] == [2] and st["pending_files"] == 5
    assert st["deleted"]["consumed"] == {"files": 20, "bytes": 2000}
    svc.policy_updated(2)
    assert svc.wait_idle(10)
    assert existing(b2) == [] and existing(unclaimed) == unclaimed


def test_empty_past_max_steps_and_late_batches_go_at_once(service_factory, root):
    svc = service_factory(max_steps=5)
    # all in v3: policy_updated(3)'s backstop (v<k> for k < 1) must not race the discards
    empty, past, late = make_files(root, 3, 3), make_files(root, 3, 4), make_files(root, 3, 2)
    assert svc.record_batch(1, empty, empty=True)["disposition"] == "discarded"
    assert svc.record_batch(6, past)["disposition"] == "discarded"
    svc.policy_updated(3)
    assert svc.record_batch(3, late)["disposition"] == "consumed"
    assert svc.wait_idle(10)
    assert existing(empty + past + late) == []
    deleted = svc.status()["deleted"]
    assert deleted["discarded"]["files"] == 7 and deleted["consumed"]["files"] == 2


def test_discard_of_a_pending_file_is_refused_whole(service_factory, root):
    svc = service_factory()
    batch, loose = make_files(root, 0, 2), make_files(root, 0, 2)
    svc.record_batch(4, batch)
    with pytest.raises(DiscardRefusedError, match=r"batch 4") as info:
        svc.discard([loose[0], batch[1]])
    assert info.value.conflicts == {batch[1]: 4}
    assert svc.wait_idle(10)
    assert existing(batch + loose) == batch + loose  # nothing at all was deleted
    svc.discard(loose)
    assert svc.wait_idle(10)
    assert existing(loose) == [] and existing(batch) == batch


def test_backstop_sweeps_old_versions_but_spares_pending_files(service_factory, root):
    svc = service_factory(max_off_policy_steps=2)
    old = make_files(root, 0, 5) + make_files(root, 1, 5)
    protected = make_files(root, 1, 1)  # a (buggy) batch that holds an old file
    keep = make_files(root, 2, 3) + make_files(root, 3, 3)
    svc.record_batch(9, protected)
    result = svc.policy_updated(4)  # bound min_fresh_version(5, 2) = 2: v0 and v1 go
    assert result["backstop_below"] == 2
    assert svc.wait_idle(10)
    assert existing(old) == [] and existing(keep) == keep and existing(protected) == protected
    assert not (root / "v0").exists() and (root / "v1").exists() and (root / "v2").exists()
    assert svc.status()["deleted"]["backstop"]["files"] == 10


def test_a_directory_still_being_swept_is_listed_again_after_not_queued_twice(stalled, root):
    """Policy updates that come while the backstop is still deleting a directory do not queue
    its files again; what was written there meanwhile goes once the first sweep is done."""
    svc = stalled.service(max_off_policy_steps=2)
    loose = make_files(root, 0, 6)
    svc.policy_updated(4)  # bound 2: v0 goes, and its unlinks wait for the volume
    wait_for(lambda: svc.status()["queue_files"] == 6)
    straggler = make_files(root, 0, 1)  # a slow writer's file, after the sweep listed v0
    for step in (5, 6, 7):
        svc.policy_updated(step)
    # until their sweeps have run: they find v0 busy and are done
    wait_for(lambda: svc.status()["outstanding_jobs"] == 1)
    st = svc.status()
    assert (st["outstanding_jobs"], st["queue_files"]) == (1, 6)  # not 6 + 3 x 7
    stalled.release()
    assert svc.wait_idle(10)
    assert existing(loose + straggler) == [] and not (root / "v0").exists()
    assert svc.status()["deleted"]["backstop"]["files"] == 7


def test_paths_outside_the_root_are_refused_with_the_path(service_factory, root, tmp_path):
    svc = service_factory()
    outside = tmp_path / "elsewhere" / "v1" / "x.bin"
    for bad in (str(outside), f"{root}/v1/../../x.bin", f"{root}/x1/a.bin", "v1/a/b.bin"):
        with pytest.raises(RefusedPathError) as info:
            svc.record_batch(1, [f"{root}/v0/ok.bin", bad])
        assert info.value.path == bad and repr(bad) in str(info.value)
    with pytest.raises(ValueError, match="step must be an integer >= 0"):
        svc.policy_updated(-1)
    with pytest.raises(ValueError, match="a single string"):
        svc.discard(f"{root}/v0/ok.bin")
    assert svc.status()["pending_batches"] == 0
    assert [r["op"] for r in read_records(svc.state_dir / "journal.jsonl")] == ["run"]


def test_a_symlinked_version_dir_is_never_followed(service_factory, root, tmp_path):
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    (victim_dir / "precious.bin").write_bytes(b"keep me")
    (root / "v3").symlink_to(victim_dir)
    svc = service_factory(max_off_policy_steps=0)
    svc.discard([f"{root}/v3/precious.bin"])
    svc.policy_updated(10)  # the backstop ignores symlinks too
    assert svc.wait_idle(10)
    assert (victim_dir / "precious.bin").read_bytes() == b"keep me"
    errors = svc.metrics.delete_errors.labels("not_a_directory")._value.get()
    assert errors == 1


def test_failed_unlinks_are_retried_counted_and_deferred_until_done(service_factory, root):
    """A file whose unlink keeps failing (a server away) is never dropped: later rounds go on."""
    attempts: dict[str, int] = {}
    server_back = threading.Event()

    def flaky(name, *, dir_fd):
        attempts[name] = attempts.get(name, 0) + 1
        if name.startswith("stuck") and attempts[name] > 10:
            server_back.wait(30)  # the third round's first attempt waits for the server
        if (name.startswith("stuck") and not server_back.is_set()) or attempts[name] <= 2:
            raise OSError(errno.ENOTCONN, "injected: transport endpoint is not connected")
        os.unlink(name, dir_fd=dir_fd)

    svc = service_factory(unlink=flaky, retry=Retry(later_s=0.2, later_max_s=0.4))
    (root / "v0").mkdir()
    (root / "v0" / "ok.bin").write_bytes(b"1")
    (root / "v0" / "stuck.bin").write_bytes(b"2")
    svc.discard([f"{root}/v0/ok.bin", f"{root}/v0/stuck.bin"])
    wait_for(lambda: attempts.get("stuck.bin", 0) == 11)  # two rounds of 5 failed, a third waits
    assert not (root / "v0" / "ok.bin").exists() and (root / "v0" / "stuck.bin").exists()
    assert attempts["ok.bin"] == 3
    # every failed attempt counted: ok.bin's 2, stuck.bin's 10; a file given up once a round
    assert svc.metrics.delete_errors.labels("volume_gone")._value.get() == 2 + 10
    assert svc.metrics.delete_given_up._value.get() == 2
    server_back.set()
    wait_for(lambda: not (root / "v0" / "stuck.bin").exists())
    wait_for(lambda: svc.queue.deferred_files == 0 and svc.wait_idle(0))
    assert svc.status()["deleted"]["discarded"]["files"] == 2


def test_a_file_the_worker_cannot_unlink_is_retried_counted_and_deferred_until_done(
    service_factory, root
):
    """The same on the production deletion worker (a process of its own, where no unlink can be
    injected): a file made immutable fails every attempt for real (EPERM), round after round,
    until it is mutable again."""
    retry = Retry(attempts=3, backoff_s=0.001, later_s=0.2, later_max_s=0.4)
    svc = service_factory(retry=retry)
    assert isinstance(svc.queue._deleter, ProcessDeleter)
    ok, stuck = make_files(root, 0, 1, size=7), make_files(root, 0, 1, size=11)
    errors = svc.metrics.delete_errors.labels("permission")
    with immutable(stuck):
        svc.discard(ok + stuck)
        wait_for(lambda: svc.metrics.delete_given_up._value.get() >= 2)  # two rounds given up
        given_up = svc.metrics.delete_given_up._value.get()
        failed = errors._value.get()
        # every attempt of every round counted, each round given up once: a round may be
        # between its attempts and its giving up when read
        assert retry.attempts * given_up <= failed <= retry.attempts * (given_up + 1)
        assert existing(ok + stuck) == stuck
        assert svc.queue.deferred_files <= 1
        mutable(stuck)
        wait_for(lambda: not existing(stuck) and svc.queue.deferred_files == 0)
    assert svc.wait_idle(10)
    assert svc.status()["deleted"]["discarded"] == {"files": 2, "bytes": 18}


def test_calls_return_while_unlinks_are_blocked(stalled, root):
    svc = stalled.service(workers=2, chunk_files=10)  # a fresh start: made after it
    files = make_files(root, 0, 100)
    svc.record_batch(1, files)
    svc.policy_updated(1)
    svc.record_batch(2, make_files(root, 1, 3))
    svc.policy_updated(2)
    # the calls above returned; the deletions they released are held, none has finished:
    # each of the queue's 2 threads holds one call (a chunk, or a batch's sizes on the worker)
    wait_for(lambda: stalled.held() == 2)
    st = svc.status()
    assert (st["queue_files"], st["outstanding_jobs"]) == (100 + 3, 2)
    assert existing(files) == files
    stalled.release()
    assert svc.wait_idle(20)
    assert existing(files) == []
    assert svc.status()["deleted"]["consumed"]["files"] == 103


def test_accounting_follows_deletions_and_scans_correct_it(service_factory, root):
    make_files(root, 0, 10, size=1000)
    files = make_files(root, 1, 10, size=500)
    svc = service_factory(resume=True)
    svc.scan()
    st = svc.status()["directory"]
    assert (st["bytes"], st["files"], st["version_directories"]) == (15000, 20, 2)
    svc.discard(files[:4])
    assert svc.wait_idle(10)
    st = svc.status()["directory"]
    assert (st["bytes"], st["files"]) == (13000, 16)  # by accounting, no scan
    make_files(root, 2, 1, size=7)  # written behind its back: seen at the next scan
    svc.scan()
    st = svc.status()["directory"]
    assert (st["bytes"], st["files"], st["version_directories"]) == (13007, 17, 3)


def test_fresh_run_wipes_resumed_keeps(service_factory, root):
    old = make_files(root, 0, 5) + make_files(root, 7, 5)
    svc = service_factory(run_id="run-1", resume=True)
    assert svc.mode is StartMode.RESUMED
    assert svc.wait_idle(10) and existing(old) == old
    svc.close()
    fresh = service_factory(run_id="run-2")
    assert fresh.mode is StartMode.FRESH
    assert not (root / "v0").exists()  # moved aside at start, before any call
    assert fresh.wait_idle(10)
    assert existing(old) == [] and not (root / ".retention-trash").exists()
    assert fresh.status()["deleted"]["wipe"]["files"] == 10


def test_restart_in_the_same_run_replays_and_wipes_nothing(stalled, service_factory, root):
    # never deletes before the "crash": more threads than tasks, so that every task is held
    # (none still queued, to run on a worker started after the kill), and no later round
    svc = stalled.service(workers=8, retry=Retry(later_s=3600))
    consumed, pending, loose = (
        make_files(root, 0, 6),
        make_files(root, 1, 4),
        make_files(root, 1, 2),
    )
    svc.record_batch(1, consumed)
    svc.record_batch(2, pending)
    svc.discard(loose[:1])
    svc.policy_updated(1)
    # held: the discarded and the consumed chunk; on the worker, both batches' sizes too
    wait_for(lambda: stalled.held() == (4 if stalled.kind == "worker" else 2))
    stalled.crash()  # the deletions held fail
    assert existing(consumed) == consumed and existing(loose) == loose
    with open(svc.state_dir / "journal.jsonl", "ab") as f:
        f.write(b'{"op":"discard","files":["v1/')  # an unacknowledged, torn append
    again = service_factory()
    assert again.mode is StartMode.RESTARTED
    assert again.wait_idle(10)
    assert existing(consumed) == [] and existing(loose) == loose[1:]
    assert existing(pending) == pending
    st = again.status()
    assert st["policy_step"] == 1 and st["pending_steps"] == [2]
    assert st["deleted"]["consumed"]["files"] == 6 and st["deleted"]["discarded"]["files"] == 1
    again.policy_updated(2)
    assert again.wait_idle(10) and existing(pending) == []


def test_journal_is_compacted_as_batches_settle(service_factory, root):
    svc = service_factory(compact_bytes=4096, max_off_policy_steps=1)
    for step in range(1, 30):
        svc.record_batch(step, make_files(root, step, 10))
        if step > 1:
            svc.policy_updated(step - 1)
        svc.wait_idle(10)
    svc.record_batch(30, make_files(root, 29, 3))
    assert svc.wait_idle(10)
    # each step journals about 550 bytes (a batch of 10 names, a policy update), and a
    # compaction comes once the journal passes 4,096 bytes and twice its last compacted size
    # (a snapshot of a batch or two): one every 7-8 steps, each at the first settled job after
    # the threshold (a job settling while a call holds the journal waits for the next): 3 or 4
    # over the 29 steps; without compaction the journal would hold about 16 kB, above the bound
    compactions = svc.metrics.compactions._value.get()
    assert 2 <= compactions <= 5, compactions
    size = (svc.state_dir / "journal.jsonl").stat().st_size
    assert size < 3 * 4096
    svc.close()
    again = service_factory()
    st = again.status()
    assert st["policy_step"] == 28 and st["pending_steps"] == [29, 30]
    assert st["pending_files"] == 13


def test_calls_go_on_while_a_compaction_is_written_and_what_they_journal_is_kept(
    service_factory, root, monkeypatch
):
    """The compaction's write runs without the service's lock; the events journaled meanwhile
    are carried over into the compacted journal."""
    staging, release, staged_first = threading.Event(), threading.Event(), threading.Event()
    real_stage = journal_module.Journal.stage

    def stage_slowly(self, records):
        staged = real_stage(self, records)
        if not staging.is_set():  # the first compaction only: it waits for the calls below
            staging.set()
            release.wait(10)
            staged_first.set()
        return staged

    svc = service_factory(compact_bytes=1)
    monkeypatch.setattr(journal_module.Journal, "stage", stage_slowly)  # after the start's own
    b1, b2, b3 = make_files(root, 1, 4), make_files(root, 2, 4), make_files(root, 3, 4)
    svc.record_batch(1, b1)
    svc.record_batch(2, b2)
    svc.policy_updated(1)  # a job settles (this one, or the start's), and a compaction starts
    assert staging.wait(10)
    svc.record_batch(3, b3)
    svc.policy_updated(2)  # settles too: no second compaction while the first is written
    assert svc.status()["pending_steps"] == [3]
    # the calls returned while the compaction's write was still held (had they waited for it,
    # it would have given up waiting first)
    assert not staged_first.is_set(), "calls waited for the compaction's write"
    release.set()
    assert svc.wait_idle(10)
    svc.close()  # after the compaction, which runs on a deletion thread
    assert svc.metrics.compactions._value.get() == 1
    records = list(read_records(svc.state_dir / "journal.jsonl"))
    # the snapshot (taken at the first job to settle), then the events journaled meanwhile
    assert [(r["op"], r["step"]) for r in records[-2:]] == [("record", 3), ("policy", 2)]
    monkeypatch.undo()
    again = service_factory()
    st = again.status()
    assert st["policy_step"] == 2 and st["pending_steps"] == [3] and st["pending_files"] == 4
    assert existing(b1) == existing(b2) == [] and existing(b3) == b3


def assert_compacted_to_deletions(state_dir: Path, files: list[str]) -> None:
    """The journal compacted to the run, the policy step and the deletions still owed: of
    exactly ``files``."""
    records = list(read_records(state_dir / "journal.jsonl"))
    assert [r["op"] for r in records[:2]] == ["run", "policy"]
    assert {r["op"] for r in records[2:]} == {"delete"}
    kept = {f for r in records[2:] for f in r["files"]}
    assert kept == {f"v0/{Path(f).name}" for f in files}


def test_unfinished_deletions_survive_compaction_and_a_second_crash(service_factory, root):
    volume_up = threading.Event()

    def unlink(name, *, dir_fd):
        if not volume_up.is_set():
            raise OSError(errno.EIO, "volume stalled")
        os.unlink(name, dir_fd=dir_fd)

    fast = Retry(attempts=1, backoff_s=0.001)
    svc = service_factory(unlink=unlink, retry=fast, compact_bytes=1)
    consumed, loose = make_files(root, 0, 5), make_files(root, 0, 3)
    svc.record_batch(1, consumed)
    svc.discard(loose)
    svc.policy_updated(1)
    svc.close()
    again = service_factory(unlink=unlink, retry=fast, compact_bytes=1)  # compacts at start
    again.close()
    assert_compacted_to_deletions(again.state_dir, consumed + loose)
    assert existing(consumed + loose) == consumed + loose
    volume_up.set()
    third = service_factory(unlink=unlink)
    assert third.wait_idle(10)
    assert existing(consumed + loose) == []


def test_unfinished_deletions_survive_compaction_and_a_second_crash_on_the_worker(
    service_factory, root
):
    """The same on the production deletion worker: the files cannot be unlinked (immutable),
    the service is closed twice (the second compacting at start), and a third start deletes
    them once they can be."""
    fast = Retry(attempts=1, backoff_s=0.001, later_s=3600)
    svc = service_factory(retry=fast, compact_bytes=1)  # a fresh start: the files come after
    assert isinstance(svc.queue._deleter, ProcessDeleter)
    consumed, loose = make_files(root, 0, 5), make_files(root, 0, 3)
    with immutable(consumed + loose):
        svc.record_batch(1, consumed)
        svc.discard(loose)
        svc.policy_updated(1)
        wait_for(lambda: svc.queue.deferred_files == len(consumed + loose))  # tried, failed
        svc.close()
        again = service_factory(retry=fast, compact_bytes=1)  # compacts at start
        wait_for(lambda: again.queue.deferred_files == len(consumed + loose))
        again.close()
        assert_compacted_to_deletions(again.state_dir, consumed + loose)
        assert existing(consumed + loose) == consumed + loose
    third = service_factory()
    assert third.wait_idle(10)
    assert existing(consumed + loose) == []
    deleted = third.status()["deleted"]
    assert (deleted["consumed"]["files"], deleted["discarded"]["files"]) == (5, 3)


def gauge(svc, name: str) -> float | None:
    return svc.registry.get_sample_value(f"payloadrun_retention_{name}")


def test_step_gauges_show_how_far_behind_the_oldest_pending_batch_is(service_factory, root):
    svc = service_factory(max_off_policy_steps=3)
    assert gauge(svc, "max_off_policy_steps") == 3
    assert gauge(svc, "recorded_step") == -1 and gauge(svc, "oldest_pending_step") == -1
    for step in (1, 2, 3):
        svc.record_batch(step, make_files(root, step - 1, 2))
    svc.policy_updated(1)
    svc.record_batch(7, [], empty=True)  # orchestrator progress, though nothing is pending
    assert gauge(svc, "recorded_step") == 7
    assert gauge(svc, "oldest_pending_step") == 2
    assert gauge(svc, "policy_step") == 1
    # the alert's comparison: 7 - 2 = 5 steps behind, more than the window of 3
    assert gauge(svc, "recorded_step") - gauge(svc, "oldest_pending_step") > 3
    assert svc.wait_idle(10)
    svc.close()
    again = service_factory(max_off_policy_steps=3)  # the journal replays the steps
    assert gauge(again, "recorded_step") == 7 and gauge(again, "oldest_pending_step") == 2
    again.policy_updated(3)
    assert gauge(again, "oldest_pending_step") == -1 and gauge(again, "pending_batches") == 0


def test_a_failed_journal_append_is_counted_and_not_recorded(service_factory, root, tmp_path):
    """The journal on a real volume that fills up: the append meets ENOSPC from the kernel."""
    with tmpfs(tmp_path / "state", "size=64k") as state:
        svc = service_factory(state_dir=state)
        kept = make_files(root, 0, 2)
        svc.record_batch(1, kept)
        assert svc.wait_idle(10)
        fill(state)  # only what is left of the journal's last page is free
        with pytest.raises(OSError, match="No space"):  # 100 names: more than a page
            svc.record_batch(2, make_files(root, 0, 100))
        errors = svc.metrics.journal_errors
        assert errors.labels("no_space")._value.get() == 1
        assert errors.labels("io_error")._value.get() == 0
        svc.record_batch(3, make_files(root, 1, 1))  # a small one fits where the cut left room
        svc.close()
        (state / ".filler").unlink()  # room again: the restart compacts
        again = service_factory(state_dir=state)
        assert again.status()["pending_steps"] == [1, 3]  # the refused event was never recorded
        again.close()


def test_a_failed_compaction_is_counted_and_the_journal_goes_on(service_factory, root, monkeypatch):
    def fsync_fails(path):
        raise OSError(errno.EROFS, "Read-only file system")

    svc = service_factory(compact_bytes=1)
    monkeypatch.setattr(journal_module, "fsync_dir", fsync_fails)  # after the rename
    failed = svc.metrics.journal_errors.labels("permission")._value.get
    for step in range(1, 6):
        svc.record_batch(step, make_files(root, step, 3))
        if step > 1:
            svc.policy_updated(step - 1)
            # compact_bytes 1: the update's settled job tries a compaction, which fails after
            # its rename, on the journal's thread, and is counted. Waited for: a compaction
            # tried while the one before is still being put in place is skipped (the next
            # settled job tries again), so only this makes each update's attempt its own. At
            # least: another settled job (a sweep's) may try one more.
            wait_for(lambda step=step: failed() >= step - 1)
        assert svc.wait_idle(10)
    # a failure for each of the 4 updates at least, and none counts as done
    assert failed() >= 4
    assert svc.metrics.compactions._value.get() == 0
    svc.record_batch(6, make_files(root, 6, 1))
    svc.close()
    monkeypatch.undo()
    again = service_factory()
    st = again.status()
    assert st["policy_step"] == 4 and st["pending_steps"] == [5, 6]
