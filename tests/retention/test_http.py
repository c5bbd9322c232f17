"""The HTTP API, the clients and /metrics against a real sidecar process on loopback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from retention_helpers import existing, make_files, wait_for

from payloadrun.retention.client import (
    AsyncRetentionClient,
    DiscardConflictError,
    RetentionClient,
    RetentionError,
    RetentionUnavailableError,
)
from payloadrun.testing.processes import SidecarProcess


@pytest.fixture
def sidecar(root):
    with SidecarProcess(
        root, "http-run", args=("--max-off-policy-steps", "1", "--scan-interval", "0.1")
    ) as proc:
        yield proc


def scrape(url: str) -> dict[str, float]:
    """Sample name (with labels) -> value, from the text exposition format."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def idle(status: dict) -> bool:
    """No deletion queued or running: no file waiting (``queue_files``) and no event's job
    unfinished (``outstanding_jobs``: a backstop sweep queues no file until it has listed its
    directories, so the files alone can read 0 while a sweep is still to run)."""
    return status["queue_files"] == 0 and status["outstanding_jobs"] == 0


def test_sync_client_round_trip_and_refusals(sidecar, root, tmp_path):
    with RetentionClient(sidecar.url, timeout=5) as client:
        batch, loose = make_files(root, 0, 10), make_files(root, 0, 3)
        assert client.record_batch(1, batch)["disposition"] == "pending"
        with pytest.raises(DiscardConflictError) as info:
            client.discard([loose[0], batch[0]])
        assert info.value.status == 409 and info.value.conflicts == {batch[0]: 1}
        outside = str(tmp_path / "v0" / "x.bin")
        with pytest.raises(RetentionError) as info:
            client.record_batch(2, [outside])
        assert info.value.status == 400 and info.value.body["path"] == outside
        assert outside in str(info.value)
        client.discard(loose)
        assert client.policy_updated(1)["settled"] == [1]
        st = wait_for(lambda: idle(s := client.status()) and s)
        assert existing(batch + loose) == []
        assert st["policy_step"] == 1 and st["pending_batches"] == 0
        assert st["deleted"]["consumed"]["files"] == 10
        assert st["deleted"]["discarded"]["files"] == 3


def test_malformed_requests_are_400_with_a_message(sidecar, root):
    cases = [
        (b"not json", "not JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"files": []}', "lacks ['step']"),
        (b'{"step": "3", "files": []}', "step must be an integer"),
        (b'{"step": 1, "files": "v0/a.bin"}', "files must be a JSON list"),
        (b'{"step": 1, "files": ["../etc/passwd"]}', "contains '..'"),
    ]
    for body, message in cases:
        status, reply = post(f"{sidecar.url}/v1/batches", body)
        assert status == 400 and message in reply["error"], (body, reply)


def test_async_client(sidecar, root):
    files = make_files(root, 3, 4)

    async def main():
        async with AsyncRetentionClient(sidecar.url, timeout=5) as client:
            await client.record_batch(5, files)
            with pytest.raises(DiscardConflictError):
                await client.discard(files[:1])
            assert (await client.status())["pending_files"] == 4
            await client.policy_updated(5)
            while not idle(await client.status()):  # every job done, the sweep's too
                await asyncio.sleep(0.01)

    asyncio.run(main())
    assert existing(files) == []


def test_clients_report_an_unreachable_sidecar():
    with pytest.raises(RetentionUnavailableError, match="unreachable for status"):
        RetentionClient("http://127.0.0.1:9", retries=1, backoff=0.01).status()

    async def main():
        async with AsyncRetentionClient("http://127.0.0.1:9", retries=0) as client:
            await client.policy_updated(1)

    with pytest.raises(RetentionUnavailableError, match="unreachable for policy_updated"):
        asyncio.run(main())


def disk(root: Path) -> tuple[int, int, int]:
    dirs = [d for d in root.iterdir() if d.name.startswith("v")]
    files = [f for d in dirs for f in d.iterdir()]
    return sum(f.stat().st_size for f in files), len(files), len(dirs)


def test_metrics_match_the_directory_after_the_periodic_scan(sidecar, root):
    make_files(root, 0, 7, size=300)
    consumed = make_files(root, 2, 5, size=1000)
    make_files(root, 3, 2, size=50)
    with RetentionClient(sidecar.url) as client:
        client.record_batch(4, consumed)
        client.policy_updated(4)  # consumes batch 4; backstop below v3 (v0 goes, v2 emptied)
        wait_for(lambda: idle(client.status()))
        scans = client.status()["directory"]["scans"]
        wait_for(lambda: client.status()["directory"]["scans"] >= scans + 2)
    m = scrape(sidecar.metrics_url)
    size, files, dirs = disk(root)
    assert (size, files) == (100, 2)
    assert m["payloadrun_retention_directory_bytes"] == size
    assert m["payloadrun_retention_directory_files"] == files
    assert m["payloadrun_retention_version_directories"] == dirs == 1
    assert m["payloadrun_retention_policy_step"] == 4
    assert m["payloadrun_retention_pending_batches"] == 0
    assert m["payloadrun_retention_recorded_step"] == 4
    assert m["payloadrun_retention_oldest_pending_step"] == -1
    assert m["payloadrun_retention_max_off_policy_steps"] == 1
    assert m['payloadrun_retention_journal_errors_total{error="no_space"}'] == 0
    assert m['payloadrun_retention_deleted_files_total{reason="consumed"}'] == 5
    assert m['payloadrun_retention_deleted_bytes_total{reason="consumed"}'] == 5000
    assert m['payloadrun_retention_deleted_files_total{reason="backstop"}'] == 7
    assert m["payloadrun_retention_policy_update_delete_seconds_count"] == 1
    assert m["payloadrun_retention_scan_duration_seconds_count"] >= 2
    assert m['payloadrun_retention_delete_errors_total{error="io_error"}'] == 0
    probes = sidecar.metrics_url.removesuffix("/metrics")
    for probe in ("/healthz", "/readyz"):
        with urllib.request.urlopen(probes + probe, timeout=5) as resp:
            assert resp.status == 200


def test_help_lists_flags_and_environment():
    out = subprocess.run(
        [sys.executable, "-m", "payloadrun.cli", "retention", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for flag in ("--root", "--run-id", "--resume", "--max-off-policy-steps", "--max-steps"):
        assert flag in out
    for flag in ("--port", "--metrics-port", "--workers", "--scan-interval", "PAYLOAD_ROOT"):
        assert flag in out


def test_missing_run_id_is_a_clear_error(root):
    proc = subprocess.run(
        [sys.executable, "-m", "payloadrun.cli", "retention", "--root", str(root)],
        check=False,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode != 0 and "no run id" in proc.stderr
