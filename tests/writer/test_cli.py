"""``payloadrun writer`` and the fake vLLM as processes: flags, environment, metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from payloadrun.testing.processes import FAKE_VLLM_MODULE

from .conftest import fake_process, free_port, http


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "payloadrun.cli", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_help_names_every_flag_and_its_variable():
    for command, words in (
        (
            ["payloadrun.cli", "writer"],
            [
                *("--upstream", "--host", "--port", "--listen", "--payload-root", "--metrics-port"),
                *("PAYLOAD_ROOT", "PAYLOADRUN_WRITER_PORT", "deprecated: use --host and --port"),
            ],
        ),
        ([FAKE_VLLM_MODULE], ["--experts", "x-fake-status", "0.33.0"]),
    ):
        out = subprocess.run(
            [sys.executable, "-m", *command, "--help"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for word in words:
            assert word in out


def test_bad_listen_address_is_a_clear_error():
    proc = _cli("writer", "--listen", "nowhere")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "'nowhere' is not HOST:PORT" in out


def _wait(url: str, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            http("GET", url, timeout=1)
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stdout.read()) from None
            time.sleep(0.05)
    raise TimeoutError(url)


def test_writer_from_environment_serves_and_exports_metrics(tmp_path):
    fake = fake_process()
    port, metrics_port = free_port(), free_port()
    proc = _cli(
        "writer",
        env={
            "PAYLOADRUN_WRITER_UPSTREAM": fake.url,
            "PAYLOADRUN_WRITER_HOST": "127.0.0.1",
            "PAYLOADRUN_WRITER_PORT": str(port),
            "PAYLOADRUN_WRITER_METRICS_PORT": str(metrics_port),
            "PAYLOAD_ROOT": str(tmp_path),
        },
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(url + "/healthz", proc)
        assert http("GET", url + "/readyz").status == 200
        body = {
            "token_ids": [1, 2, 3, 4],
            "sampling_params": {"max_tokens": 4, "extra_args": {"payload_dir": f"{tmp_path}/v0"}},
        }
        reply = http("POST", url + "/inference/v1/generate", json.dumps(body).encode())
        assert reply.status == 200 and reply.headers["x-payloadrun-mode"] == "handle"
        assert len(list((tmp_path / "v0").iterdir())) == 1
        text = http("GET", f"http://127.0.0.1:{metrics_port}/metrics").body.decode()
        for line in (
            'payloadrun_writer_requests_total{code="200",mode="handle"} 1.0',
            'payloadrun_writer_fallbacks_total{reason="no_space"} 0.0',
            "payloadrun_writer_payload_write_seconds_count 1.0",
            # (4 prompt + 4 completion - 1) rows of 4 layers x top-2 uint8 ids
            'payloadrun_writer_payload_written_bytes_total{field="routed_experts"} 56.0',
        ):
            assert line in text
        assert "payloadrun_writer_response_reduction_bytes_total" in text
        assert 'payloadrun_writer_response_bytes_total{mode="handle"}' in text
        # vLLM's own /metrics path on the proxy port still reaches vLLM.
        assert http("GET", url + "/metrics").status == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        fake.stop()
