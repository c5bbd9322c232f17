"""What both sidecars share: the vLLM error shape, startup errors, SIGTERM, the metrics app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

from payloadrun.serving import HEALTH_PATH, READY_PATH, health_body, ready_body
from payloadrun.testing.processes import (
    FAKE_VLLM_MODULE,
    SidecarProcess,
    fake_vllm,
    free_port,
    writer,
)
from payloadrun.vllm import dumps, error_body, error_type


def test_error_body_is_vllms_shape():
    assert error_type(400) == "BadRequestError"
    assert error_type(500) == "InternalServerError"
    assert error_type(502) == "BadGatewayError"
    assert error_type(504) == "GatewayTimeoutError"
    body = json.loads(error_body(400, "no", param="payload_dir"))
    assert body == {
        "error": {"message": "no", "type": "BadRequestError", "param": "payload_dir", "code": 400}
    }
    assert dumps({"a": "é", "b": [1, 2]}) == '{"a":"é","b":[1,2]}'.encode()


def _cli(*args: str, module: str = "payloadrun.cli") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PAYLOADRUN_LOG_LEVEL": "WARNING"},
    )


def test_every_server_says_the_same_when_its_port_is_in_use(busy_port, tmp_path):
    """The same flag moves the port of every server the project runs, and each says so."""
    port = ["--host", "127.0.0.1", "--port", str(busy_port)]
    runs = (
        _cli("writer", *port, "--metrics-port", "0"),
        _cli("retention", "--root", str(tmp_path), "--run-id", "r", *port),
        _cli(*port, module=FAKE_VLLM_MODULE),
    )
    for run in runs:
        assert run.returncode == 1, run.stderr
        assert f"cannot listen on port {busy_port}: in use" in run.stderr
        assert "--port" in run.stderr and "Traceback" not in run.stderr


def test_the_writers_deprecated_listen_flag_still_serves_and_warns(busy_port):
    run = _cli("writer", "--listen", f"127.0.0.1:{busy_port}", "--metrics-port", "0")
    assert run.returncode == 1, run.stderr
    assert "--listen is deprecated: use --host and --port" in run.stderr
    assert f"cannot listen on port {busy_port}: in use" in run.stderr


def test_the_fake_vllm_checks_its_flags_as_a_usage_error():
    run = _cli("--experts", "70000", module=FAKE_VLLM_MODULE)
    assert run.returncode == 2
    assert "--experts: must be in [1, 65536], got 70000" in run.stderr


def test_the_probes_answer_the_same_bodies_in_every_sidecar(tmp_path):
    """``/healthz`` is ``{"ok": true, ...}`` and ``/readyz`` ``{"ready": ..., ...}`` everywhere."""
    (tmp_path / "w").mkdir()
    with fake_vllm() as fake, writer(fake.url, tmp_path / "w") as proxy:
        health, ready = _get(proxy.url + HEALTH_PATH), _get(proxy.url + READY_PATH)
        assert health == (200, health_body())
        assert ready == (200, ready_body(True, upstream="ok", payload_root="ok"))
    (tmp_path / "r").mkdir()
    with SidecarProcess(tmp_path / "r", "r") as retention:
        probes = retention.metrics_url.removesuffix("/metrics")
        assert _get(probes + HEALTH_PATH) == (200, health_body())
        assert _get(probes + READY_PATH) == (200, ready_body(True))
        assert _get(retention.url + HEALTH_PATH) == (200, health_body(mode="fresh"))


def _get(url: str) -> tuple[int, object]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


def test_both_sidecars_stop_cleanly_on_sigterm(tmp_path):
    with fake_vllm() as fake, writer(fake.url, tmp_path) as proxy:
        assert proxy.stop() == 0
    with SidecarProcess(tmp_path, "r") as retention:
        assert retention.stop() == 0


def test_a_bad_variable_is_a_usage_error_in_both(tmp_path):
    port = str(free_port())
    env = {**os.environ, "PAYLOADRUN_LOG_LEVEL": "LOUD", "PAYLOADRUN_RETENTION_PORT": port}
    for args in (["writer"], ["retention", "--root", str(tmp_path), "--run-id", "r"]):
        run = subprocess.run(
            [sys.executable, "-m", "payloadrun.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
        assert run.returncode == 2
        assert "PAYLOADRUN_LOG_LEVEL) must be one of DEBUG, INFO, WARNING, ERROR" in run.stderr
