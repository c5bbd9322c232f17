"""The fake vLLM's API servers and its multi-node group (leader and workers), as real processes.

A group's leader is not ready until every worker has joined, and not ready again once a worker
dies (it misses its heartbeats); workers retry until their leader answers. Tests wait on facts
(``/health`` answers, ``/fake/group``, a file); heartbeats are fast (0.05 s) and the loss
timeout long enough (2 s) that a loaded machine does not lose a live worker.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from payloadrun.testing.fakegroup import GROUP_PATH, group_status, split_leader_address
from payloadrun.testing.fakevllm import SERVER_HEADER, build_parser
from payloadrun.testing.fakevllm import main as fake_main
from payloadrun.testing.processes import FakeWorker, fake_vllm, free_port

from .conftest import http

FAST = ("--heartbeat-interval", "0.05", "--heartbeat-timeout", "2")


def wait_for(what, check, timeout: float = 30.0):
    """``check()`` until it returns something true; that value (a fact, not a sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def health(url: str):
    return http("GET", url + "/health")


def leader_address(leader) -> str:
    return leader.url.removeprefix("http://")


# --- pure ----------------------------------------------------------------------------------------


def test_group_status_joined_missing_lost():
    status = group_status(4, {1: 10.0, 3: 5.0}, now=10.5, timeout=2.0)
    assert (status.joined, status.missing, status.lost) == ((1,), (2,), (3,))
    assert not status.ready
    assert status.body()["message"] == "1 of 3 workers joined; lost (no heartbeat in time): 3"
    whole = group_status(3, {1: 10.0, 2: 9.0}, now=10.5, timeout=2.0)
    assert whole.ready and whole.body()["message"] == "all 2 workers joined"
    assert group_status(1, {}, now=0.0, timeout=1.0).ready  # alone: no workers to wait for


def test_leader_address_forms():
    assert split_leader_address("run-vllm-0.run-vllm", 8000) == ("run-vllm-0.run-vllm", 8000)
    assert split_leader_address("10.0.0.5:8100", 8000) == ("10.0.0.5", 8100)
    assert split_leader_address("[fd00::1]:8100", 8000) == ("fd00::1", 8100)
    assert split_leader_address("fd00::1", 8000) == ("fd00::1", 8000)
    with pytest.raises(ValueError, match="not HOST or HOST:PORT"):
        split_leader_address("host:port", 8000)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--api-servers", "2", "--port", "0"], "consecutive ports"),
        (["--worker-index", "1", "--group-size", "2"], "no leader address"),
        (["--worker-index", "2", "--group-size", "2", "--leader-address", "h"], "outside the"),
        (["--no-http"], "--no-http is for a worker"),
    ],
)
def test_usage_errors_say_what_is_wrong(argv, error, capsys, monkeypatch):
    for name in ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"):
        monkeypatch.delenv(name, raising=False)
    assert fake_main(argv) == 2
    assert error in capsys.readouterr().err


def test_the_flags_default_to_leaderworkersets_variables(monkeypatch):
    monkeypatch.setenv("LWS_LEADER_ADDRESS", "run-vllm-0.run-vllm.ns")
    monkeypatch.setenv("LWS_GROUP_SIZE", "4")
    monkeypatch.setenv("LWS_WORKER_INDEX", "3")
    args = build_parser().parse_args([])
    assert (args.leader_address, args.group_size, args.worker_index) == (
        "run-vllm-0.run-vllm.ns",
        4,
        3,
    )


# --- real processes ------------------------------------------------------------------------------


def test_each_api_server_answers_with_its_port_and_counts_its_own():
    with fake_vllm(api_servers=3) as fake:
        for n, url in enumerate(fake.urls):
            for _ in range(n + 1):
                reply = http("POST", url + "/v1/completions", {"prompt": "x", "max_tokens": 1})
                assert reply.headers[SERVER_HEADER] == url.rsplit(":", 1)[1]
        counts = [http("GET", u + "/fake/stats").json().get("/v1/completions") for u in fake.urls]
        assert counts == [1, 2, 3]
        assert health(fake.urls[2]).headers[SERVER_HEADER] == fake.urls[2].rsplit(":", 1)[1]


def test_the_leader_is_unready_until_every_worker_joined(tmp_path: Path):
    joined_file = tmp_path / "worker-2.joined"
    with fake_vllm("--group-size", "3", *FAST, api_servers=2, ready_path=GROUP_PATH) as leader:
        for url in leader.urls:  # every API server of the leader
            reply = health(url)
            assert reply.status == 503
            assert reply.json()["message"] == "0 of 2 workers joined"
        # worker 1 serves its own API servers (every pod serving); worker 2 serves none
        with fake_vllm(
            "--group-size", "3", "--worker-index", "1", "--leader-address",
            leader_address(leader), *FAST, ready_path=GROUP_PATH,
        ) as serving_worker:  # fmt: skip
            wait_for("worker 1 joined", lambda: health(serving_worker.url).status == 200)
            reply = health(leader.url)
            assert reply.status == 503 and reply.json()["joined"] == [1]
            assert reply.json()["message"] == "1 of 2 workers joined"
            with FakeWorker(leader_address(leader), 2, 3, *FAST, "--joined-file", str(joined_file)):
                wait_for("the leader ready", lambda: health(leader.url).status == 200)
                assert health(leader.urls[1]).status == 200
                assert health(leader.url).body == b""  # vLLM's empty 200
                wait_for("worker 2's file", joined_file.exists)
                group = http("GET", leader.url + GROUP_PATH).json()
                assert group["joined"] == [1, 2] and group["ready"] is True


def test_a_killed_worker_makes_the_leader_unready(tmp_path: Path):
    with fake_vllm("--group-size", "2", *FAST, ready_path=GROUP_PATH) as leader:
        worker = FakeWorker(leader_address(leader), 1, 2, *FAST).start()
        try:
            wait_for("the leader ready", lambda: health(leader.url).status == 200)
            worker.kill()  # SIGKILL: no goodbye, as a crashed pod
            reply = wait_for(
                "the leader unready", lambda: (r := health(leader.url)).status == 503 and r
            )
            assert reply.json()["lost"] == [1]
            assert "lost (no heartbeat in time): 1" in reply.json()["message"]
            assert "leader: 0 of 1 workers joined; lost (no heartbeat in time): 1" in leader.log()
            # a new worker 1 (the group recreated) makes it whole again
            with FakeWorker(leader_address(leader), 1, 2, *FAST):
                wait_for("the leader ready again", lambda: health(leader.url).status == 200)
        finally:
            worker.stop()


def test_a_worker_retries_until_its_leader_answers(tmp_path: Path):
    port = free_port()
    joined_file = tmp_path / "joined"
    with FakeWorker(f"127.0.0.1:{port}", 1, 2, *FAST, "--joined-file", str(joined_file)) as w:
        with fake_vllm("--group-size", "2", *FAST, port=port, ready_path=GROUP_PATH) as leader:
            wait_for("the leader ready", lambda: health(leader.url).status == 200)
            wait_for("the worker's file", joined_file.exists)
        # the leader gone, the worker says so by removing its file, and stays alive
        wait_for("the file removed", lambda: not joined_file.exists())
        assert w.proc is not None and w.proc.poll() is None


def test_a_worker_of_another_group_size_is_refused(tmp_path: Path):
    with fake_vllm("--group-size", "2", *FAST, ready_path=GROUP_PATH) as leader:
        reply = http("POST", leader.url + "/fake/join", {"index": 1, "group_size": 3})
        assert reply.status == 409
        assert "group of 3 cannot join a leader of a group of 2" in reply.json()["error"]
        assert health(leader.url).status == 503
