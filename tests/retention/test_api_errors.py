"""Who is at fault: a request the service refuses is 4xx, the service's own failure 5xx.

The API app runs in this process on loopback with a real, started service (started by the app's
lifecycle, as in the sidecar); the fault in the service is injected where it would be a bug.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import aiohttp

from payloadrun import serving
from payloadrun.retention.app import build_api_app
from payloadrun.serving import Listener


async def _post(service, path: str, body: object) -> tuple[int, dict]:
    runner, url = await serving.start_site(
        Listener("api", build_api_app(service), "127.0.0.1", 0, "--port")
    )
    try:
        async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
            return resp.status, await resp.json()
    finally:
        await runner.cleanup()


def _bad_requests(service) -> float:
    value = service.registry.get_sample_value(
        "payloadrun_retention_refused_requests_total", {"reason": "bad_request"}
    )
    return value or 0.0


def test_a_bad_request_is_400(service_factory):
    service = service_factory(start=False)
    status, body = asyncio.run(_post(service, "/v1/batches", {"step": "one", "files": []}))
    assert status == 400
    assert "step must be an integer >= 0, got 'one'" in body["error"]
    assert _bad_requests(service) == 1


def test_a_failure_inside_the_service_is_500_not_400(service_factory, caplog):
    service = service_factory(start=False)

    def broken(*_args, **_kwargs):
        raise ValueError("a bug in the service, not in the request")

    service._state.disposition = broken  # a ValueError from the service's own code
    status, body = asyncio.run(_post(service, "/v1/batches", {"step": 1, "files": []}))
    assert status == 500
    assert "ValueError: a bug in the service, not in the request" in body["error"]
    assert _bad_requests(service) == 0, "not counted as the client's mistake"
    assert any(r.exc_info for r in caplog.records if r.name == "payloadrun.retention")


def test_a_service_that_cannot_start_is_one_line_and_status_1(tmp_path):
    state = tmp_path / "state"
    state.write_text("a file where the journal's directory should be")
    run = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "payloadrun.cli",
                "retention",
                "--root",
                str(tmp_path / "root"),
            ),
            *("--run-id", "r", "--state-dir", str(state), "--port", "0", "--metrics-port", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PAYLOADRUN_LOG_LEVEL": "WARNING"},
    )
    assert run.returncode == 1, run.stderr
    assert "the retention service cannot start" in run.stderr
    assert "Traceback" not in run.stderr
