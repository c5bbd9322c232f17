"""Random schedules of record, discard, policy update, restart and crash against the service.

The model tracks what each file is: loose (written, no batch yet), in a pending batch, consumed,
discarded, or swept (loose in a version the backstop has passed). After every step no file of a
pending batch may be missing; after the queue drains, every consumed, discarded or swept file is
gone and every other one is still there.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import tempfile
import threading
import uuid
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from payloadrun.retention.deleter import Retry
from payloadrun.retention.policy import backstop_bound
from payloadrun.retention.service import (
    DiscardRefusedError,
    RetentionConfig,
    RetentionService,
)
from payloadrun.retention.worker import ProcessDeleter

M = 2  # max_off_policy_steps
MAX_STEPS = 9

LOOSE, PENDING, GONE = "loose", "pending", "gone"


class RetentionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="retention-sm-"))
        self.root = self.tmp / "payloads"
        self.root.mkdir()
        self.config = RetentionConfig(
            root=self.root,
            run_id="sm",
            max_off_policy_steps=M,
            max_steps=MAX_STEPS,
            workers=2,
            chunk_files=3,
            compact_bytes=600,
            retry=Retry(attempts=2, backoff_s=0.001),
        )
        self.gate = threading.Event()  # cleared: the volume stalls, unlinks wait (at first)
        self.crashing = False
        self.svc = self._start_service()
        self.files: dict[str, tuple[str, int]] = {}  # path -> (status, batch step or version)
        self.policy: int | None = None
        self.next_step = 1
        self.n = 0

    # How the deletions stall and crash: here in the service's own process (``LocalDeleter``
    # with an unlink that waits on a gate); :class:`OnTheWorkerMachine` runs the production
    # deletion worker process and stops, continues and kills it.

    def _start_service(self) -> RetentionService:
        svc = RetentionService(self.config, unlink=self._unlink)
        svc.start(scan=False)
        return svc

    def _set_stalled(self, stalled: bool) -> None:
        if stalled:
            self.gate.clear()
        else:
            self.gate.set()

    def _crash(self) -> None:
        """Stop the service the way a crash would: what runs now fails, what is queued drops."""
        self.crashing = True
        self.svc.close()
        self.crashing = False

    def _unlink(self, name: str, *, dir_fd: int) -> None:
        while not self.gate.wait(0.005):
            if self.crashing:
                raise OSError(errno.EIO, "the process died")
        os.unlink(name, dir_fd=dir_fd)

    def _version_floor(self) -> int:
        """Writers only write versions a future batch may still read."""
        return 0 if self.policy is None else max(0, backstop_bound(self.policy, M))

    def _of(self, status: str) -> list[str]:
        return sorted(f for f, (s, _) in self.files.items() if s == status)

    def _write(self, count: int, ahead: int) -> list[str]:
        version = max(self._version_floor(), (self.policy or 0) + ahead - 1)
        d = self.root / f"v{version}"
        d.mkdir(exist_ok=True)
        out = []
        for _ in range(count):
            path = d / f"{uuid.uuid4().hex}.bin"
            path.write_bytes(b"p")
            self.files[str(path)] = (LOOSE, version)
            out.append(str(path))
        return out

    @rule(count=st.integers(1, 4), ahead=st.integers(0, 2))
    def write(self, count: int, ahead: int) -> None:
        self._write(count, ahead)

    @rule(
        data=st.data(),
        fresh=st.integers(1, 3),
        empty=st.sampled_from([False, False, False, True]),
        skip=st.sampled_from([0, 0, 1, 2]),
    )
    def record(self, data: st.DataObject, fresh: int, empty: bool, skip: int) -> None:
        loose = [f for f in self._of(LOOSE) if self.files[f][1] >= self._version_floor()]
        chosen = data.draw(st.lists(st.sampled_from(loose), unique=True)) if loose else []
        chosen += self._write(fresh, 1)
        step = self.next_step + skip
        self.next_step = step + 1
        result = self.svc.record_batch(step, chosen, empty=empty)
        if empty or step > MAX_STEPS:
            expected = "discarded"  # no trainer reads it
        elif self.policy is not None and step <= self.policy:
            expected = "consumed"  # late: the trainer already read it
        else:
            expected = "pending"
        assert result["disposition"] == expected
        kept = expected == "pending"
        for f in chosen:
            self.files[f] = (PENDING, step) if kept else (GONE, step)

    @rule(data=st.data())
    def discard(self, data: st.DataObject) -> None:
        loose = self._of(LOOSE)
        if not loose:
            return
        chosen = data.draw(st.lists(st.sampled_from(loose), min_size=1, unique=True))
        self.svc.discard(chosen)
        for f in chosen:
            self.files[f] = (GONE, 0)

    @precondition(lambda self: any(s == PENDING for s, _ in self.files.values()))
    @rule(data=st.data())
    def discard_conflict(self, data: st.DataObject) -> None:
        pending = data.draw(st.sampled_from(self._of(PENDING)))
        others = self._of(LOOSE)[:2]
        try:
            self.svc.discard([*others, pending])
        except DiscardRefusedError as exc:
            assert exc.conflicts == {pending: self.files[pending][1]}
        else:
            raise AssertionError("discarding a file of a pending batch was not refused")

    @rule(advance=st.sampled_from([1, 1, 1, 0, 2, 3]))
    def policy_updated(self, advance: int) -> None:
        self._policy_updated((self.policy or 0) + advance)

    @precondition(lambda self: any(s == PENDING for s, _ in self.files.values()))
    @rule()
    def consume_oldest_batch(self) -> None:
        """A policy update exactly at the oldest pending batch (the boundary that matters)."""
        self._policy_updated(min(tag for s, tag in self.files.values() if s == PENDING))

    def _policy_updated(self, step: int) -> None:
        self.svc.policy_updated(step)
        if self.policy is not None and step <= self.policy:
            return
        self.policy = step
        bound = backstop_bound(step, M)
        for f, (status, tag) in list(self.files.items()):
            if status == PENDING and tag <= step:
                self.files[f] = (GONE, tag)
            elif status == LOOSE and tag < bound:
                self.files[f] = (GONE, tag)  # swept by the backstop

    @rule()
    def stall(self) -> None:
        """The volume stops answering: deletions queue up behind blocked unlinks."""
        self._set_stalled(True)

    @rule()
    def unstall(self) -> None:
        """The volume answers again: deletions run while the next events arrive."""
        self._set_stalled(False)

    @rule(torn=st.booleans(), then_drain=st.booleans())
    def crash_and_restart(self, torn: bool, then_drain: bool) -> None:
        """Drop every queued deletion (and maybe leave a torn, unacknowledged append)."""
        self._crash()
        if torn:
            with open(self.svc.state_dir / "journal.jsonl", "ab") as f:
                f.write(b'{"op":"policy","st')
        self.svc = self._start_service()
        status = self.svc.status()
        assert status["mode"] == "restarted"
        assert status["policy_step"] == self.policy
        assert status["pending_steps"] == self._pending_steps()
        if then_drain:  # what was acknowledged before the crash is done after the restart
            self.drain()
            self._set_stalled(True)

    @rule()
    def drain(self) -> None:
        """The volume recovers and the queue drains."""
        self._set_stalled(False)
        assert self.svc.wait_idle(30)
        for f, (status, _) in self.files.items():
            assert Path(f).exists() == (status != GONE), (f, status)

    def _pending_steps(self) -> list[int]:
        return sorted({tag for s, tag in self.files.values() if s == PENDING})

    @invariant()
    def pending_steps_are_the_models(self) -> None:
        assert self.svc.status()["pending_steps"] == self._pending_steps()

    @invariant()
    def pending_files_exist(self) -> None:
        for f in self._of(PENDING):
            assert Path(f).exists(), f"file of pending batch {self.files[f][1]} deleted: {f}"

    def teardown(self) -> None:
        try:
            self.drain()
        finally:
            self.svc.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


class OnTheWorkerMachine(RetentionMachine):
    """The same schedules on the production deletion worker (:class:`ProcessDeleter`): a stalled
    volume is the worker stopped (SIGSTOP: every call waits), a crash kills it (SIGKILL: the
    calls it was sent fail as ``worker_gone`` and stay journaled) before the service closes."""

    def _start_service(self) -> RetentionService:
        svc = RetentionService(self.config)  # no unlink hook: the worker process deletes
        svc.start(scan=False)
        assert isinstance(svc.queue._deleter, ProcessDeleter)
        self.stalled = False
        self.svc = svc
        self._set_stalled(not self.gate.is_set())
        return svc

    def _worker_pid(self) -> int:
        pid = self.svc.queue._deleter.pid
        assert pid is not None
        return pid

    def _set_stalled(self, stalled: bool) -> None:
        if stalled:
            self.gate.clear()
        else:
            self.gate.set()
        if stalled != self.stalled:
            os.kill(self._worker_pid(), signal.SIGSTOP if stalled else signal.SIGCONT)
            self.stalled = stalled

    def _crash(self) -> None:
        os.kill(self._worker_pid(), signal.SIGKILL)  # stopped or not
        self.stalled = False  # a worker started after the kill runs
        self.svc.close()


SETTINGS = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
RetentionMachine.TestCase.settings = SETTINGS
# fewer on the worker: a worker process per service start, several starts an example
OnTheWorkerMachine.TestCase.settings = settings(SETTINGS, max_examples=25)
test_retention_state_machine = RetentionMachine.TestCase
test_retention_state_machine_on_the_deletion_worker = OnTheWorkerMachine.TestCase
