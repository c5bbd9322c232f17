"""The data path across clients of a real network filesystem, with its default caches.

The writer writes through the inference node's client, ``PayloadReader`` reads through the
trainer's, and the retention sidecar records, deletes, sweeps, measures and wipes through the
orchestrator's: three independent GlusterFS FUSE clients, each with its own attribute and entry
caches, the shape of a real multi-node run.
"""

from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sharedfs_helpers import (
    GEN,
    bytes_on,
    check_by_handle_equals_inline,
    files_on,
    generate_request,
    get,
    metric,
    payload_segments,
    post,
    wait_for,
)

from payloadrun.reader import PayloadReader
from payloadrun.retention.client import RetentionClient
from payloadrun.testing.processes import SidecarProcess, fake_vllm, writer

pytestmark = pytest.mark.sharedfs

# (prompt tokens, layers, top_k, experts, choices, prompt start): routing bytes per response
# from about 1 KiB (16 tokens x 8 x 8, uint8) to 32 MiB (32,768 x 128 x 8), uint8 and uint16
SHAPES = [
    (16, 8, 8, 128, 1, 0),
    (40, 8, 8, 512, 3, 5),
    (300, 48, 8, 128, 1, 0),
    (300, 48, 8, 512, 2, 100),
    (2_000, 48, 8, 128, 4, 0),
    (8_000, 48, 8, 256, 1, 0),
    (8_000, 64, 8, 512, 1, 4_000),
    (32_768, 128, 8, 128, 1, 0),
]
ROUNDS = 4  # each shape but the 32 MiB one this many times, 8 requests in flight at once


@pytest.fixture
def run_root(nodes) -> Path:
    root = nodes.root / f"run-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    return root


@pytest.fixture(scope="module")
def fake():
    with fake_vllm("--created", "1764460800") as proc:  # byte-stable answers
        yield proc


def test_concurrent_answers_written_on_one_client_read_back_bitwise_on_another(
    nodes, run_root, fake
):
    """Many requests at once, 1 KiB to 32 MiB, n > 1, both dtypes, prompt starts: every array
    read on the trainer's client equals vLLM's inline answer, with no retry needed.

    The writer closes each file before it answers (close-to-open); a new file is then whole on
    any other client at once. That is the one guarantee the data path relies on.
    """
    jobs = []
    for i, (prompt_len, layers, top_k, experts, n, start) in enumerate(
        SHAPES[:-1] * ROUNDS + SHAPES[-1:]
    ):
        request = generate_request(
            f"{run_root}/v{i % 3}", prompt_len=prompt_len, n=n, prompt_start=start
        )
        headers = {
            "x-fake-layers": str(layers),
            "x-fake-top-k": str(top_k),
            "x-fake-experts": str(experts),
        }
        jobs.append((json.dumps(request).encode(), headers, prompt_len))

    with writer(fake.url, run_root, wrap=nodes.on_inference()) as proc:

        def through_and_direct(job):
            body, headers, _ = job
            via = post(proc.url + GEN, body, headers)
            direct = post(fake.url + GEN, body, headers)
            return via, direct

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(through_and_direct, jobs))
        handled = metric(
            proc.metrics_url, "payloadrun_writer_requests_total", mode="handle", code="200"
        )
        # what tells a 500 of the writer's own from vLLM's relayed: its requests_total series
        # by mode and code, and the two logs (the writer's temporary directory goes with it)
        writer_log, writer_metrics = proc.log(), get(proc.metrics_url)[1].decode()

    sleeps: list[float] = []
    files: set[str] = set()
    with PayloadReader(run_root, sleep=sleeps.append) as reader:
        for (via, direct), (_, _, prompt_len) in zip(answers, jobs, strict=True):
            assert (via[0], direct[0]) == (200, 200), (
                f"through the writer {via[0]} {via[1]} {via[2][:1000]!r}, straight {direct[0]} "
                f"{direct[1]} {direct[2][:1000]!r}; the writer's requests: "
                f"{[line for line in writer_metrics.splitlines() if 'requests_total{' in line]}"
                f"\nthe writer's log:\n{writer_log}\nthe fake vLLM's log:\n{fake.log()}"
            )
            assert via[1]["x-payloadrun-mode"] == "handle", via[1]
            files |= check_by_handle_equals_inline(
                reader, json.loads(via[2]), json.loads(direct[2]), prompt_len
            )
    assert handled == len(jobs)
    assert sleeps == [], "a file closed on the writer's client read short on the trainer's"
    assert len(files) == len(jobs), "one file per response"
    on_server = {str(nodes.root / p) for p in files_on(nodes.brick) if p.parts[0] == run_root.name}
    assert on_server == files, "no stray or partial file on the server"


def _write_batches(proc, run_root: Path, versions: range, per_version: int) -> dict[int, list]:
    """``per_version`` answers by handle into each ``v<k>``; their files by version."""
    out: dict[int, list[str]] = {}
    for k in versions:
        for _ in range(per_version):
            body = json.dumps(generate_request(f"{run_root}/v{k}", prompt_len=64)).encode()
            status, headers, reply = post(proc.url + GEN, body)
            assert status == 200 and headers["x-payloadrun-mode"] == "handle"
            segments = payload_segments(json.loads(reply))
            out.setdefault(k, []).append(segments[0][0].file)
    return out


def test_retention_on_its_own_client_deletes_what_was_consumed_sweeps_and_measures(
    nodes, run_root, fake, tmp_path
):
    """Recorded, consumed, swept and measured through the orchestrator's client, checked on the
    server: exactly the consumed files go, the backstop removes every old ``v<k>`` (files
    written after the sidecar first looked included) and spares what a pending batch holds,
    and the directory metrics converge to the server's true size after a scan."""
    m = 1
    sidecar = SidecarProcess(
        run_root,
        "run-sharedfs",
        args=["--max-off-policy-steps", str(m), "--scan-interval", "0.5"],
        wrap=nodes.on_orchestrator(),
        log_path=tmp_path / "retention.log",
    )
    with writer(fake.url, run_root, wrap=nodes.on_inference()) as proc, sidecar:
        client = RetentionClient(sidecar.url)
        first = _write_batches(proc, run_root, range(0, 2), 6)
        # the sidecar's client looks at everything once (its caches now hold it) ...
        wait_for(
            "a first scan",
            lambda: metric(sidecar.metrics_url, "payloadrun_retention_directory_files") == 12,
            30,
        )
        client.record_batch(1, first[0][:3])
        client.record_batch(2, first[1][:3])
        # ... and more files come from the inference node after it looked
        late = _write_batches(proc, run_root, range(0, 4), 4)
        client.record_batch(3, late[3][:2])  # a pending batch in a fresh version
        client.policy_updated(1)  # batch 1 consumed; backstop bound (2 - 1) - 1 = 0: nothing

        consumed = {Path(f).relative_to(nodes.root) for f in first[0][:3]}
        wait_for("batch 1's files to go", lambda: not (consumed & files_on(nodes.brick)), 30)
        everything = {
            Path(f).relative_to(nodes.root) for v in (first, late) for fs in v.values() for f in fs
        }
        assert files_on(nodes.brick) & everything == everything - consumed, "only batch 1's went"

        client.policy_updated(3)  # batches 2, 3 consumed; bound (4 - 1) - 1 = 2: v0, v1 swept

        def swept() -> bool:
            names = {p.parts[1] for p in files_on(nodes.brick) if p.parts[0] == run_root.name}
            return not (names & {"v0", "v1"}) and not (nodes.brick / run_root.name / "v0").exists()

        wait_for("v0 and v1 to be swept", swept, 30)
        left = {p for p in files_on(nodes.brick) if p.parts[0] == run_root.name}
        batch3 = {Path(f).relative_to(nodes.root) for f in late[3][:2]}
        expected = {Path(f).relative_to(nodes.root) for k in (2, 3) for f in late[k]} - batch3
        assert left == expected

        truth = bytes_on(nodes.brick, run_root.name)
        wait_for(
            "the directory metrics to converge to the server's size",
            lambda: (
                metric(sidecar.metrics_url, "payloadrun_retention_directory_bytes") == truth
                and metric(sidecar.metrics_url, "payloadrun_retention_directory_files") == len(left)
            ),
            30,
        )
        assert (
            metric(
                sidecar.metrics_url, "payloadrun_retention_delete_errors_total", error="volume_gone"
            )
            == 0
        )
        client.close()


def test_a_fresh_run_wipes_the_root_through_the_orchestrator_client(
    nodes, run_root, fake, tmp_path
):
    with writer(fake.url, run_root, wrap=nodes.on_inference()) as proc:
        written = _write_batches(proc, run_root, range(0, 3), 5)
    assert len(files_on(nodes.brick / run_root.name)) == 15
    sidecar = SidecarProcess(
        run_root, "a-new-run", wrap=nodes.on_orchestrator(), log_path=tmp_path / "retention.log"
    )
    with sidecar:
        wait_for(
            "the wipe to empty the root on the server",
            lambda: not files_on(nodes.brick / run_root.name),
            30,
        )
        # the count follows the deletion of the whole trash, a moment after the last file
        wait_for(
            "the wipe's 15 deletions to be counted",
            lambda: (
                metric(
                    sidecar.metrics_url, "payloadrun_retention_deleted_files_total", reason="wipe"
                )
                >= 15
            ),
            10,
        )
        deleted = metric(
            sidecar.metrics_url, "payloadrun_retention_deleted_files_total", reason="wipe"
        )
        assert deleted == 15
    assert not any(os.path.exists(f) for fs in written.values() for f in fs)
