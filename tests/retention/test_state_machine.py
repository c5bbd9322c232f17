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
        self.svc = RetentionService(self.config, unlink=self._unlink)
        self.svc.start(scan=False)
        self.files: dict[str, tuple[str, int]] = {}  # path -> (status, batch step or version)
        self.policy: int | None = None
        self.next_step = 1
        self.n = 0

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
        kept = not empty and step <= MAX_STEPS and (self.policy is None or step > self.policy)
        assert result["disposition"] == ("pending" if kept else result["disposition"])
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
        self.gate.clear()

    @rule()
    def unstall(self) -> None:
        """The volume answers again: deletions run while the next events arrive."""
        self.gate.set()

    @rule(torn=st.booleans(), then_drain=st.booleans())
    def crash_and_restart(self, torn: bool, then_drain: bool) -> None:
        """Drop every queued deletion (and maybe leave a torn, unacknowledged append)."""
        self.crashing = True
        self.svc.close()
        self.crashing = False
        if torn:
            with open(self.svc.state_dir / "journal.jsonl", "ab") as f:
                f.write(b'{"op":"policy","st')
        self.svc = RetentionService(self.config, unlink=self._unlink)
        self.svc.start(scan=False)
        status = self.svc.status()
        assert status["mode"] == "restarted"
        assert status["policy_step"] == self.policy
        want = sorted({tag for s, tag in self.files.values() if s == PENDING})
        assert [s for s in status["pending_steps"] if s in want] == want
        if then_drain:  # what was acknowledged before the crash is done after the restart
            self.drain()
            self.gate.clear()

    @rule()
    def drain(self) -> None:
        """The volume recovers and the queue drains."""
        self.gate.set()
        assert self.svc.wait_idle(30)
        for f, (status, _) in self.files.items():
            assert Path(f).exists() == (status != GONE), (f, status)

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


RetentionMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_retention_state_machine = RetentionMachine.TestCase
