"""Real faults of a network filesystem, each ending with nothing lost and the service still up.

The brick (the volume's server process) is killed and started again, or stopped with SIGSTOP for
longer than the clients' ping timeout (``network.ping-timeout``), while the writer writes, the
reader reads and the retention sidecar deletes; and a volume fills up while the writer writes.
While the brick is away every client call fails with ``ENOTCONN`` (after hanging for the ping
timeout when the brick is stopped rather than dead).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from sharedfs_helpers import (
    GEN,
    check_by_handle_equals_inline,
    files_on,
    generate_request,
    get,
    make_nodes,
    metric,
    payload_segments,
    post,
    wait_for,
)

from payloadrun.codec import decode_npy_base64
from payloadrun.reader import PayloadReader, ShortReadError
from payloadrun.retention.client import RetentionClient
from payloadrun.segments import ROUTED_EXPERTS
from payloadrun.testing.processes import SidecarProcess, fake_vllm, writer

pytestmark = pytest.mark.sharedfs
FAULTS = ["killed", "stopped"]
HEADERS = {"x-fake-layers": "48", "x-fake-top-k": "8"}


class BrickFault:
    """The brick away, then back: killed and started again, or stopped and continued."""

    def __init__(self, nodes, kind: str) -> None:
        self.volume = nodes.volume
        self.kind = kind
        self._pid: int | None = None

    def begin(self) -> None:
        if self.kind == "killed":
            self.volume.kill_brick()
        else:
            self._pid = self.volume.pause_brick()

    def end(self) -> None:
        if self.kind == "killed":
            self.volume.start_brick()
        else:
            assert self._pid is not None
            self.volume.resume_brick(self._pid)
        self.volume.clients_reconnected()


@pytest.fixture(scope="module")
def fake():
    with fake_vllm("--created", "1764460800") as proc:  # byte-stable answers
        yield proc


@pytest.fixture
def run_root(faulty) -> Path:
    root = faulty.root / f"run-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    return root


def _ask(proc, fake, run_root: Path, version: int = 1, prompt_len: int = 200):
    body = json.dumps(generate_request(f"{run_root}/v{version}", prompt_len=prompt_len)).encode()
    via = post(proc.url + GEN, body, HEADERS, timeout=120)
    direct = post(fake.url + GEN, body, HEADERS)
    assert via[0] == 200 and direct[0] == 200, f"{via}\nthe writer's log:\n{proc.log()}"
    return via, direct, prompt_len


def _extents(via) -> dict[str, int]:
    """Each payload file a by-handle answer names -> the bytes its segments span (a whole file
    is exactly that long)."""
    out: dict[str, int] = {}
    for segments in payload_segments(json.loads(via[2])):
        for seg in segments:
            out[seg.file] = max(out.get(seg.file, 0), seg.offset + seg.nbytes)
    return out


def _by_handle_again(proc, fake, run_root: Path, timeout: float = 60):
    """The first answer by handle after a fault (asked every half second)."""

    def attempt():
        via, direct, prompt_len = _ask(proc, fake, run_root)
        if via[1]["x-payloadrun-mode"] != "handle":
            time.sleep(0.5)
            return None
        return via, direct, prompt_len

    return wait_for("the writer to write by handle again", attempt, timeout)


@pytest.mark.parametrize("kind", FAULTS)
def test_the_writer_answers_inline_while_the_brick_is_away_then_by_handle_again(
    faulty, run_root, fake, kind
):
    fault = BrickFault(faulty, kind)
    with writer(fake.url, run_root, wrap=faulty.on_inference()) as proc:
        via, _, _ = _ask(proc, fake, run_root)
        assert via[1]["x-payloadrun-mode"] == "handle"
        named = _extents(via)  # every file an answer named, and the bytes it spans
        fault.begin()
        try:
            for _ in range(3):
                via, direct, _ = _ask(proc, fake, run_root)
                assert via[1]["x-payloadrun-mode"] == "inline"
                assert via[1]["x-payloadrun-fallback"] == "volume_gone"
                assert via[2] == direct[2], "the inline answer is vLLM's own, nothing lost"
            status, body = get(proc.url + "/readyz", timeout=60)
            assert status == 200, f"readiness never depends on the volume (issue 33): {body!r}"
        finally:
            fault.end()
        via, direct, prompt_len = _by_handle_again(proc, fake, run_root)
        named.update(_extents(via))
        with PayloadReader(run_root) as reader:
            files = check_by_handle_equals_inline(
                reader, json.loads(via[2]), json.loads(direct[2]), prompt_len
            )
        fallbacks = metric(
            proc.metrics_url, "payloadrun_writer_fallbacks_total", reason="volume_gone"
        )
        assert fallbacks >= 3
        wait_for("the writer to be ready again", lambda: get(proc.url + "/readyz")[0] == 200, 30)
    on_server = files_on(faulty.brick / run_root.name)
    assert files <= named.keys()
    # every file on the server is a whole one some answer named: the failed writes left none
    assert sorted(str(run_root / p) for p in on_server) == sorted(named)
    for path in on_server:
        size = (faulty.brick / run_root.name / path).stat().st_size
        assert size == named[str(run_root / path)], path


@pytest.mark.parametrize("kind", FAULTS)
def test_the_reader_retries_through_the_fault_and_fails_with_the_numbers_if_it_lasts(
    faulty, run_root, fake, kind
):
    with writer(fake.url, run_root, wrap=faulty.on_inference()) as proc:
        via, direct, _ = _ask(proc, fake, run_root)
    (segments,) = payload_segments(json.loads(via[2]))
    routing = next(s for s in segments if s.field == ROUTED_EXPERTS)
    fault = BrickFault(faulty, kind)

    back: dict[str, object] = {}
    backoffs: list[float] = []
    backing_off = threading.Event()

    def sleep(seconds: float) -> None:  # the patient reader's real backoff, recorded
        backoffs.append(seconds)
        backing_off.set()
        time.sleep(seconds)

    # a trainer's, at start
    patient = PayloadReader(run_root, retry_delays=(0.5, 1, 2, 4, 8, 8), sleep=sleep)

    def read() -> None:
        try:
            back["rows"] = patient.read(segments, ROUTED_EXPERTS, routing.pos, routing.end)
        except Exception as exc:  # surfaced below
            back["error"] = exc

    with PayloadReader(run_root) as reader:
        fault.begin()
        try:
            # the brick stays away through every retry: the error names the file, offset, bytes
            with pytest.raises(ShortReadError) as info:
                reader.read(segments, ROUTED_EXPERTS, routing.pos, routing.end)
            # a reader that backs off longer is still reading when the brick comes back
            reading = threading.Thread(target=read)
            reading.start()
            # once its first read has failed against the fault, it backs off: the brick returns
            assert backing_off.wait(60), "the patient reader never backed off"
        finally:
            fault.end()
    reading.join(60)
    patient.close()
    err = info.value
    assert (err.file, err.offset, err.expected, err.received) == (
        routing.file,
        routing.offset,
        routing.nbytes,
        0,
    )
    assert "Transport endpoint is not connected" in str(err) and "after 5 attempts" in str(err)
    # ... and returns vLLM's exact bytes, read after at least one retry
    assert "error" not in back, back.get("error")
    assert backoffs and backoffs == [0.5, 1, 2, 4, 8, 8][: len(backoffs)]
    inline = decode_npy_base64(json.loads(direct[2])["choices"][0]["routed_experts"])
    assert np.asarray(back["rows"]).tobytes() == inline.tobytes()


@pytest.mark.parametrize("kind", FAULTS)
def test_retention_defers_deletions_while_the_brick_is_away_and_finishes_them(
    faulty, run_root, fake, kind, tmp_path
):
    """Journaled deletions that fail are counted, deferred and retried until done, never dropped.

    The journal is on the orchestrator's local disk here (``--state-dir``), so the calls are
    acknowledged while the volume is away; on the volume itself they would be refused (503,
    not recorded) and the orchestrator's client would retry them.
    """
    sidecar = SidecarProcess(
        run_root,
        "run-faults",
        args=["--state-dir", str(tmp_path / "journal"), "--scan-interval", "1"],
        wrap=faulty.on_orchestrator(),
        log_path=tmp_path / "retention.log",
    )
    fault = BrickFault(faulty, kind)
    with sidecar:  # first: a fresh run's wipe finds the root empty
        with writer(fake.url, run_root, wrap=faulty.on_inference()) as proc:
            answers = [_ask(proc, fake, run_root, prompt_len=50)[0] for _ in range(12)]
        files = [payload_segments(json.loads(via[2]))[0][0].file for via in answers]
        client = RetentionClient(sidecar.url)
        client.record_batch(1, files)
        fault.begin()
        try:
            client.policy_updated(1)
            wait_for(
                "deletions to fail and be deferred",
                lambda: (
                    metric(sidecar.metrics_url, "payloadrun_retention_delete_deferred_files")
                    == len(files)
                ),
                60,
            )

            def errors() -> float:
                return metric(
                    sidecar.metrics_url,
                    "payloadrun_retention_delete_errors_total",
                    error="volume_gone",
                )

            first = errors()
            assert first >= 1, get(sidecar.metrics_url)[1].decode() + sidecar.log()
            # a further round fails too (its errors counted): nothing is dropped meanwhile
            wait_for("a further round to fail", lambda: errors() > first, 60)
            assert len(files_on(faulty.brick / run_root.name)) == len(files)
            deferred = "payloadrun_retention_delete_deferred_files"
            assert metric(sidecar.metrics_url, deferred) == len(files)
        finally:
            fault.end()
        try:
            wait_for(
                "the deferred deletions to be done",
                lambda: not files_on(faulty.brick / run_root.name),
                60,
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\nthe sidecar's log:\n{sidecar.log()}") from None
        wait_for(
            "nothing deferred any more",
            lambda: metric(sidecar.metrics_url, "payloadrun_retention_delete_deferred_files") == 0,
            30,
        )
        # the last round left the deferred files when it was queued, and its files are gone
        # before its chunks are counted: its job ends after them
        wait_for("the last round's job to end", lambda: not client.status()["outstanding_jobs"], 30)
        deleted = metric(
            sidecar.metrics_url, "payloadrun_retention_deleted_files_total", reason="consumed"
        )
        assert deleted == len(files)
        assert client.status()["pending_batches"] == 0
        client.close()


def test_the_writer_answers_inline_when_the_volume_is_full_then_by_handle_again(
    gluster, fake, tmp_path
):
    full = make_nodes(gluster, tmp_path, size_bytes=16 << 20)
    try:
        run_root = full.root / "run"
        run_root.mkdir()
        filler = full.inference.path / "filler"
        with open(filler, "wb") as f:  # leave about 2 MiB free
            f.write(b"\0" * (13 << 20))
        with writer(fake.url, run_root, wrap=full.on_inference()) as proc:
            # 3,000 tokens x 48 layers x 8 = 1.1 MiB, x 4 choices: 4.4 MiB for one file
            body = json.dumps(generate_request(f"{run_root}/v1", prompt_len=3_000, n=4)).encode()
            via = post(proc.url + GEN, body, HEADERS)
            direct = post(fake.url + GEN, body, HEADERS)
            assert via[0] == 200 and via[1]["x-payloadrun-mode"] == "inline"
            assert via[1]["x-payloadrun-fallback"] == "no_space"
            assert via[2] == direct[2], "the inline answer is vLLM's own, nothing lost"
            assert files_on(full.brick) == set(), "a failed write leaves no file behind"
            filler.unlink()
            via, direct, prompt_len = _by_handle_again(proc, fake, run_root)
        with PayloadReader(run_root) as reader:
            check_by_handle_equals_inline(
                reader, json.loads(via[2]), json.loads(direct[2]), prompt_len
            )
    finally:
        gluster.delete_volume(full.volume.name)
