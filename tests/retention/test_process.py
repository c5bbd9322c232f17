"""Real sidecar processes on loopback: SIGKILL mid-deletion; fresh, resumed, restarted starts."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from retention_helpers import existing, make_files

from payloadrun.retention.client import RetentionClient
from payloadrun.testing.processes import SidecarProcess

# Enough files that a kill lands while they are being deleted (about 0.15 s at 300k files/s).
FILES = 40_000
ARGS = ("--max-off-policy-steps", "2", "--workers", "4", "--scan-interval", "0.5")


def wait_idle(client: RetentionClient, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = client.status()
        if st["queue_files"] == 0 and st["outstanding_jobs"] == 0:
            return st
        assert time.monotonic() < deadline, f"queue not drained: {st}"
        time.sleep(0.01)


@contextmanager
def sidecar_client(root: Path, run_id: str, *args: str) -> Iterator[RetentionClient]:
    with (
        SidecarProcess(root, run_id, args=(*ARGS, *args)) as sidecar,
        RetentionClient(sidecar.url) as client,
    ):
        yield client


def count_files(directory: Path) -> int:
    try:
        return sum(1 for _ in os.scandir(directory))
    except FileNotFoundError:
        return 0


def test_sigkill_while_deleting_a_40k_file_step_ends_with_exactly_the_consumed_files_gone(root):
    rng = random.Random(4)
    sidecar = SidecarProcess(root, "run-kill", args=ARGS)
    sidecar.start()  # fresh run: an empty root
    try:
        consumed = make_files(root, 1, FILES, size=64)
        pending = make_files(root, 2, 500, size=64)
        loose = make_files(root, 2, 200, size=64)
        with RetentionClient(sidecar.url) as client:
            client.record_batch(1, consumed)
            client.record_batch(2, pending)
            client.policy_updated(1)
        kills = []
        for _ in range(3):  # kill at a random point of the deletion, restart, repeat
            left = count_files(root / "v1")
            if left == 0:
                break
            threshold = int(left * rng.uniform(0.2, 0.9))
            deadline = time.monotonic() + 60
            while count_files(root / "v1") > threshold and time.monotonic() < deadline:
                time.sleep(0.002)
            sidecar.kill()
            kills.append(count_files(root / "v1"))
            sidecar.start()  # same run id: replays its journal, wipes nothing
        with RetentionClient(sidecar.url) as client:
            st = wait_idle(client)
            assert st["mode"] == "restarted" and st["pending_steps"] == [2]
        assert any(0 < k < FILES for k in kills), f"no kill landed mid-deletion: {kills}"
        assert existing(consumed) == []
        assert existing(pending) == pending and existing(loose) == loose
    finally:
        sidecar.stop()
        sidecar.__exit__()


def test_fresh_resumed_and_restarted_starts(root):
    old = make_files(root, 0, 30) + make_files(root, 5, 20)
    # resumed: a new run id resuming a checkpoint keeps the files; the backstop ages them out
    with sidecar_client(root, "run-2", "--resume") as client:
        assert client.status()["mode"] == "resumed"
        batch = make_files(root, 5, 4)
        client.record_batch(6, batch)
        wait_idle(client)
        assert existing(old) == old
        client.policy_updated(4)  # backstop below min_fresh_version(5, 2) = 2: v0 goes
        wait_idle(client)
        assert existing(old) == old[30:]
    # restarted: same run id, the journal is replayed and nothing is wiped
    with sidecar_client(root, "run-2") as client:
        st = wait_idle(client)
        assert (st["mode"], st["policy_step"], st["pending_steps"]) == ("restarted", 4, [6])
        assert existing(old[30:] + batch) == old[30:] + batch
    # fresh: a new run id without --resume wipes the root, in the background
    with sidecar_client(root, "run-3") as client:
        st = wait_idle(client)
        assert st["mode"] == "fresh" and st["pending_steps"] == []
        assert st["deleted"]["wipe"]["files"] == 24
    assert existing(old + batch) == []
    assert sorted(p.name for p in root.iterdir()) == [".retention"]


def test_a_missing_root_is_created_and_a_file_is_refused(tmp_path):
    with sidecar_client(tmp_path / "new" / "payloads", "r") as client:
        assert client.status()["mode"] == "fresh"
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(RuntimeError, match="is not a directory"):
        SidecarProcess(tmp_path / "file", "r").start()
