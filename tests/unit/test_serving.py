"""What both sidecars share: the vLLM error shape, startup errors, SIGTERM, the metrics app."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from payloadrun.testing.processes import SidecarProcess, fake_vllm, free_port, writer
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


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "payloadrun.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PAYLOADRUN_LOG_LEVEL": "WARNING"},
    )


def test_both_sidecars_say_the_same_when_their_port_is_in_use(busy_port, tmp_path):
    writer_run = _cli("writer", "--listen", f"127.0.0.1:{busy_port}", "--metrics-port", "0")
    retention_run = _cli(
        "retention", "--root", str(tmp_path), "--run-id", "r", "--port", str(busy_port)
    )
    for run, flag in ((writer_run, "--listen"), (retention_run, "--port")):
        assert run.returncode == 1, run.stderr
        assert f"cannot listen on port {busy_port}: in use" in run.stderr
        assert flag in run.stderr and "Traceback" not in run.stderr


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
