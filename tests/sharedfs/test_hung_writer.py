"""The writer in front of a hung volume: a GlusterFS brick SIGSTOPped (issue 33).

The volume keeps GlusterFS's default ``network.ping-timeout`` (42 s), so for the whole test its
clients' calls hang instead of failing: what an NFS ``hard`` mount does for as long as its server
is away. Through it, every generate request is answered within the writer's deadline plus vLLM's
own time, inline and byte-equal to vLLM's answer, each counted once under its reason; the breaker
opens; the pod stays ready; after SIGCONT answers go by handle again and no file is left on the
server that no answer's segments name.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sharedfs_helpers import (
    GEN,
    Nodes,
    files_on,
    generate_request,
    get,
    make_nodes,
    metric,
    payload_segments,
    post,
    wait_for,
)

from payloadrun.reasons import Fallback
from payloadrun.testing.processes import fake_vllm, writer

pytestmark = pytest.mark.sharedfs
HEADERS = {"x-fake-layers": "48", "x-fake-top-k": "8"}
DEADLINE_S = "1"  # --write-deadline for this test; the checks read it back from /metrics
COOLDOWN_S = "1"
WORK = "payloadrun_writer_response_work_seconds"  # from vLLM's last byte to the client's first
# What the writer's own work on one small answer sent inline (parse, copy, send) and the trip
# through its process may add to its deadline, as a share of the deadline: 16-36 ms here
# (bench/writer_deadline.py: 4 and 23 ms, the latter at a load of 9 on this 2-core machine).
# Half the deadline (0.5 s) is more than ten times that, so a busy machine does not fail it; a
# request kept for a second deadline, or for its hung call (42 s), does.
MARGIN = 0.5
MOST_REQUESTS = 2000  # a bound: the loop stops on a fact long before


@pytest.fixture(scope="module")
def hung(gluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """A volume with GlusterFS's default ping timeout (42 s), three clients of it."""
    made = make_nodes(gluster, tmp_path_factory.mktemp("hung"))
    try:
        yield made
    finally:
        gluster.delete_volume(made.volume.name)


@pytest.fixture(scope="module")
def fake():
    with fake_vllm("--created", "1764460800") as proc:  # byte-stable answers
        yield proc


@pytest.fixture
def run_root(hung: Nodes) -> Path:
    root = hung.root / f"run-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    return root


def _timed(url: str, body: bytes) -> tuple[float, tuple[int, dict[str, str], bytes]]:
    started = time.monotonic()
    reply = post(url + GEN, body, HEADERS, timeout=120)
    return time.monotonic() - started, reply


def _named_files(answer: bytes, run_root: Path) -> set[str]:
    """The payload files a by-handle answer's segments name, relative to the run's root."""
    return {
        str(Path(seg.file).relative_to(run_root))
        for segments in payload_segments(json.loads(answer))
        for seg in segments
    }


def _work(proc) -> float:
    """The writer's own work summed over the answers it sent inline (``response_work_seconds``);
    an answer's is observed before its body is sent, so it is counted once the client has it."""
    return metric(proc.metrics_url, f"{WORK}_sum", mode="inline")


def _fallbacks(proc) -> dict[str, float]:
    return {
        reason.value: metric(
            proc.metrics_url, "payloadrun_writer_fallbacks_total", reason=reason.value
        )
        for reason in Fallback
    }


def test_a_hung_volume_costs_each_request_at_most_the_deadline_then_by_handle_again(
    hung: Nodes, run_root: Path, fake
):
    volume = hung.volume
    args = ("--write-deadline", DEADLINE_S, "--breaker-cooldown", COOLDOWN_S)
    reasons: Counter[str] = Counter()
    named: set[str] = set()
    with writer(
        fake.url, run_root, *args, "--root-probe-interval", "0.2", wrap=hung.on_inference()
    ) as proc:
        deadline = metric(proc.metrics_url, "payloadrun_writer_write_deadline_seconds")
        assert deadline == float(DEADLINE_S)
        body = json.dumps(generate_request(f"{run_root}/v1", prompt_len=200)).encode()
        _, (status, headers, answer) = _timed(proc.url, body)
        assert status == 200 and headers["x-payloadrun-mode"] == "handle"
        named |= _named_files(answer, run_root)

        pid = volume.pause_brick()
        try:
            for _ in range(MOST_REQUESTS):
                body = json.dumps(generate_request(f"{run_root}/v1", prompt_len=200)).encode()
                work = _work(proc)
                took, (status, headers, via) = _timed(proc.url, body)
                work = _work(proc) - work
                vllm_took, (_, _, direct) = _timed(fake.url, body)
                assert status == 200 and headers["x-payloadrun-mode"] == "inline", headers
                assert via == direct, "the inline answer is vLLM's own, byte for byte"
                reason = headers["x-payloadrun-fallback"]
                what = f"{reason}: answered in {took:.3f} s, {work:.3f} s of it the writer's own"
                if reason == "write_timeout":
                    # One of its two volume calls missed the deadline: the check before vLLM
                    # was asked (the write then skipped), or the write after vLLM answered,
                    # which the writer's own measure shows. The other came back from the
                    # client's caches or was never made: a call the brick must answer hangs.
                    assert took >= deadline, what  # a slower machine only adds
                    assert took < deadline * (1 + MARGIN) + vllm_took, what
                    if work >= deadline:
                        assert work < deadline * (1 + MARGIN), what
                else:  # the breaker is open: the volume is not touched at all
                    assert work < deadline * MARGIN, what
                    assert took < deadline * MARGIN + vllm_took, what
                reasons[reason] += 1
                # the first write timed out, the breaker skipped the volume, and after its
                # cooldown one probe went through and timed out too
                if reasons["write_timeout"] >= 2 and reasons["breaker_open"] >= 1:
                    break
            assert reasons["write_timeout"] >= 2 and reasons["breaker_open"] >= 1, reasons
            assert set(reasons) <= {"write_timeout", "breaker_open"}, reasons
            opened = metric(proc.metrics_url, "payloadrun_writer_write_breaker_opened_total")
            assert opened == reasons["write_timeout"], "each timeout opened the breaker once"
            # Each timeout left its call blocked on its thread (started at once: 2 of the
            # 16 threads), and none of them returns while the brick is stopped: the client
            # waits for it up to the ping timeout, 42 s, and the loop above took a few seconds.
            held = metric(proc.metrics_url, "payloadrun_writer_write_threads_held")
            assert held == reasons["write_timeout"], (held, reasons)
            # the pod stays ready; the volume's state is information
            wait_for(
                "the root monitor to see the hang",
                lambda: metric(proc.metrics_url, "payloadrun_writer_payload_root_writable") == 0,
                30,
            )
            status, ready = get(proc.url + "/readyz", timeout=30)
            assert status == 200, ready
            assert json.loads(ready)["payload_root"].startswith("not writable: ")
        finally:
            volume.resume_brick(pid)
        volume.clients_reconnected()

        def by_handle_again() -> bool:
            body = json.dumps(generate_request(f"{run_root}/v1", prompt_len=200)).encode()
            _, (status, headers, answer) = _timed(proc.url, body)
            assert status == 200
            if headers["x-payloadrun-mode"] == "handle":
                named.update(_named_files(answer, run_root))
                return True
            reasons[headers["x-payloadrun-fallback"]] += 1
            return False

        wait_for("an answer by handle again", by_handle_again, 60, interval=0.05)
        wait_for(
            "the hung calls to return",
            lambda: metric(proc.metrics_url, "payloadrun_writer_write_threads_held") == 0,
            60,
        )
        wait_for(
            "the root monitor to see the volume back",
            lambda: metric(proc.metrics_url, "payloadrun_writer_payload_root_writable") == 1,
            30,
        )
        assert _fallbacks(proc) == {r.value: float(reasons[r.value]) for r in Fallback}
        assert metric(
            proc.metrics_url, "payloadrun_writer_requests_total", mode="inline", code="200"
        ) == sum(reasons.values())
        log = Path(proc.log_path).read_text(errors="replace")
    assert log.count("payload root is not writable") == 1, log
    assert log.count("payload root is writable again") == 1, log
    # every late write's file was removed when it returned: the server holds exactly the files
    # the by-handle answers named
    on_server = {str(p) for p in files_on(hung.brick / run_root.name)}
    assert on_server == named
