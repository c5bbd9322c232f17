"""prime-rl's admin routes on the fake vLLM, and the stand-ins for prime-rl's orchestrator and
trainer that the end-to-end pods run (payloadrun.testing.roles), over real sockets."""

import json
import os
import subprocess
import sys

import pytest

from payloadrun.testing.processes import free_port

from .conftest import http

ROLES = [sys.executable, "-m", "payloadrun.testing.roles"]


def test_a_weight_update_as_prime_rl_makes_it(fake, tmp_path):
    base = fake.url
    assert http("POST", f"{base}/pause?mode=keep&clear_cache=false").json() == {"status": "paused"}
    missing = http("POST", f"{base}/update_weights", {"weight_dir": str(tmp_path / "nope")})
    assert missing.status == 500
    assert "is not a directory" in missing.json()["error"]["message"]
    step = tmp_path / "broadcasts" / "step_1"
    step.mkdir(parents=True)
    ok = http("POST", f"{base}/update_weights", {"weight_dir": str(step)})
    assert (ok.status, ok.json()) == (200, {"status": "ok"})
    assert http("POST", f"{base}/resume").json() == {"status": "resumed"}
    broadcaster = {"host": "trainer-0", "port": 29501, "timeout": 1200}
    assert http("POST", f"{base}/init_broadcaster", broadcaster).json() == {"status": "ok"}
    assert http("GET", f"{base}/liveness").json() == {"status": "ok"}
    assert http("POST", f"{base}/update_weights", b"[1]").status == 400
    assert http("GET", f"{base}/fake/admin").json() == {
        "paused": False,
        "weight_dir": str(step),
        "weight_updates": 1,
        "broadcaster": broadcaster,
        "events": ["pause:keep", "update_weights", "resume", "init_broadcaster"],
    }


def test_update_weights_fans_out_to_every_replica(fake, tmp_path):
    from payloadrun.testing.fakevllm import FakeConfig
    from payloadrun.testing.fakevllm import build_app as build_fake

    from .conftest import ServerThread

    second = ServerThread(build_fake(FakeConfig())).start()
    try:
        urls = f"{fake.url}/v1 {second.url}/v1"
        done = subprocess.run(
            [*ROLES, "update-weights", str(tmp_path)],
            env={**os.environ, "PAYLOADRUN_INFERENCE_ADMIN_URLS": urls},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert [next(k for k in line if k != "url") for line in lines] == ["pause"] * 2 + [
            "update"
        ] * 2 + ["resume"] * 2
        for server in (fake, second):
            admin = http("GET", f"{server.url}/fake/admin").json()
            assert admin["weight_dir"] == str(tmp_path)
            assert admin["events"] == ["pause:keep", "update_weights", "resume"]
    finally:
        second.stop()


def spawn(*args, env):
    return subprocess.Popen(
        [*ROLES, *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("ending", ["done", "fail"])
def test_trainers_rendezvous_reach_the_orchestrator_and_end(tmp_path, ending):
    master, orchestrator_port = free_port(), free_port()
    orchestrator = spawn("orchestrator", "--port", str(orchestrator_port), env={})
    world = 3
    flags = ["--orchestrator-port", str(orchestrator_port), "--timeout", "30"]
    flags += ["--done-file", str(tmp_path / "done"), "--fail-file", str(tmp_path / "fail")]
    env = {
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master),
        "PAYLOADRUN_ORCHESTRATOR_HOST": "127.0.0.1",
    }
    # the last rank first: the others wait for rank 0 to listen
    ranks = [spawn("trainer", *flags, env={**env, "RANK": str(r)}) for r in reversed(range(world))]
    try:
        # each rank looks at the files only once every rank has rendezvoused
        (tmp_path / ending).touch()
        codes = [p.wait(timeout=30) for p in ranks]
        outputs = [p.stdout.read() for p in ranks]
    finally:
        for p in (*ranks, orchestrator):
            p.kill()
            p.wait()
    assert codes == [0 if ending == "done" else 3] * world, outputs
    for out in outputs:
        events = [json.loads(line) for line in out.splitlines()]
        rendezvous, reached = events[0], events[1]
        assert (rendezvous["event"], rendezvous["world"], rendezvous["ranks"]) == (
            "rendezvous",
            world,
            [0, 1, 2],
        )
        assert reached["event"] == "orchestrator"
        assert reached["answer"].startswith("orchestrator ")
        assert events[-1]["event"] == ("done" if ending == "done" else "failing")
