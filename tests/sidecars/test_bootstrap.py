"""The test kit's NCCL bootstrap pattern (``python -m payloadrun.testing.bootstrap``), as real
processes on loopback: what the pod test (tests/integration/test_policy_enforcement.py) runs
across three pods under the run's NetworkPolicies."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from payloadrun.testing.processes import free_port

MODULE = ["-m", "payloadrun.testing.bootstrap"]
LOOPBACK = ["--bind", "127.0.0.1", "--advertise", "127.0.0.1", "--store-host", "127.0.0.1"]


class Ranks:
    """Rank processes, each read line by line from its stdout; stopped (SIGTERM) at the end."""

    def __init__(self) -> None:
        self.processes: dict[int, subprocess.Popen[str]] = {}
        self.lines: dict[int, list[dict[str, Any]]] = {}

    def start(self, rank: int, world: int, store_port: int, timeout: float, *extra: str) -> None:
        argv = ["rank", "--rank", str(rank), "--world", str(world), "--timeout", str(timeout)]
        argv += extra
        self.processes[rank] = subprocess.Popen(
            [sys.executable, *MODULE, *argv, *LOOPBACK, "--store-port", str(store_port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines[rank] = []

    def until(self, rank: int, *events: str) -> dict[str, Any]:
        """The rank's first line of one of ``events``, read as it comes."""
        stdout = self.processes[rank].stdout
        assert stdout is not None
        for line in stdout:
            event = json.loads(line)
            self.lines[rank].append(event)
            if event["event"] in events:
                return event
        raise AssertionError(f"rank {rank} exited before {events}: {self.lines[rank]}")

    def until_outcome(self, rank: int) -> dict[str, Any]:
        """The rank's ``complete`` or ``failed`` line (its own ``--timeout`` bounds the wait)."""
        return self.until(rank, "complete", "failed")

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            # SIGTERM ends a rank at once (it waits in sigwait)
            assert process.wait(timeout=10) == 0


@pytest.fixture
def ranks():
    group = Ranks()
    try:
        yield group
    finally:
        group.stop()


def reach(targets: list[list[Any]]) -> dict[str, str]:
    result = subprocess.run(
        [sys.executable, *MODULE, "reach", json.dumps(targets)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def test_three_ranks_complete_the_pattern_and_keep_their_listeners_open(ranks):
    store_port = free_port()
    for rank in (2, 1, 0):  # the workers first: they retry the store until rank 0 serves it
        ranks.start(rank, 3, store_port, timeout=60)
    outcomes = {rank: ranks.until_outcome(rank) for rank in (0, 1, 2)}
    assert {r: o["event"] for r, o in outcomes.items()} == dict.fromkeys((0, 1, 2), "complete")
    done = outcomes[0]
    assert [r["rank"] for r in done["ranks"]] == [0, 1, 2]
    by_rank = {r["rank"]: r for r in done["ranks"]}
    for rank, record in by_rank.items():
        # the ring: each rank connected to the next one's ring listener, and the previous one
        # connected to it; the all-gather went round
        following = (rank + 1) % 3
        assert record["next_rank"] == following
        assert record["next"] == by_rank[following]["ring_listener"]
        assert record["prev_rank"] == (rank - 1) % 3
        assert record["gathered"] == 3
    # the root connected back to every rank's own root listener
    assert done["root_connected_back"] == [by_rank[r]["root_listener"] for r in (0, 1, 2)]
    assert done["store"] == f"127.0.0.1:{store_port}"

    # every address the pattern used still answers, TCP and UDP alike
    targets = [
        ["store", "tcp", "127.0.0.1", store_port],
        ["store-udp", "udp", "127.0.0.1", store_port],
    ]
    for rank, record in by_rank.items():
        names = ["root_listener", "ring_listener", *(["root"] if rank == 0 else [])]
        for name in names:
            host, port = address(record[name])
            targets.append([f"{rank}-{name}", "tcp", host, port])
            targets.append([f"{rank}-{name}-udp", "udp", host, record["udp"][str(port)]])
    seen = reach(targets)
    assert seen == {t[0]: ("echoed" if t[1] == "udp" else "connected") for t in targets}, seen


def test_a_rank_that_never_comes_fails_the_step_that_waits_for_it(ranks):
    """Rank 2 never starts: rank 0's root waits for its hello, rank 1 for the root to connect
    back; each names the step it failed and stays up (a pod test then reads why)."""
    store_port = free_port()
    for rank in (0, 1):
        ranks.start(rank, 3, store_port, timeout=3)
    outcomes = {rank: ranks.until_outcome(rank) for rank in (0, 1)}
    assert {r: (o["event"], o["step"]) for r, o in outcomes.items()} == {
        0: ("failed", "the root connects back"),
        1: ("failed", "the root connects back"),
    }, outcomes
    assert all(p.poll() is None for p in ranks.processes.values())


def test_ranks_start_when_told_and_rank_0_serves_the_store_before(ranks, tmp_path):
    """With --after FILE the ranks wait (rank 0 already serving the store) until FILE exists;
    SIGTERM ends a waiting rank at once."""
    store_port, go = free_port(), tmp_path / "go"
    for rank in (0, 1):
        ranks.start(rank, 2, store_port, 30, "--after", str(go))
    assert ranks.until(0, "serving the store")["port"] == store_port
    for rank in (0, 1):
        assert ranks.until(rank, "waiting", "joined the store")["event"] == "waiting"
    assert reach([["store", "tcp", "127.0.0.1", store_port]]) == {"store": "connected"}
    go.touch()
    assert [ranks.until_outcome(rank)["event"] for rank in (0, 1)] == ["complete", "complete"]


def test_a_waiting_rank_stops_at_sigterm(ranks, tmp_path):
    ranks.start(1, 2, free_port(), 30, "--after", str(tmp_path / "never"))
    assert ranks.until(1, "waiting")["event"] == "waiting"
    ranks.processes[1].terminate()
    assert ranks.processes[1].wait(timeout=10) == 0


def test_a_refused_target_is_named():
    port = free_port()  # nothing listens there
    seen = reach([["tcp", "tcp", "127.0.0.1", port], ["udp", "udp", "127.0.0.1", port]])
    assert seen == {"tcp": "ConnectionRefusedError", "udp": "ConnectionRefusedError"}
