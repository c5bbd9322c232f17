"""docs/integration.md's Python blocks run as written, against real sidecar processes.

The page's "End to end" section is one program (an orchestrator's rollouts by handle, its batches
to the trainers with the segments as JSON, the trainer's reads, the retention calls, the OpenAI
client): this test joins every ```python block of the page, in order, and runs it in a fresh
interpreter with the operator's environment pointing at a ``payloadrun writer`` process in front
of the fake vLLM and a ``payloadrun retention`` process. A snippet that names something undefined,
or calls the API as it no longer is, fails here. The page's off-policy timeline (what each
retention call leaves on the volume) is replayed call by call against a retention process too.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from payloadrun.retention.client import RetentionClient
from payloadrun.testing.processes import SidecarProcess, fake_vllm, writer
from payloadrun_devkit.required import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "integration.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
STEPS = 3  # the page's loop
KEPT, DROPPED = 3, 1  # rollouts a step keeps in its batch, and discards
OPENAI_ANSWERS = 2  # a completion and a chat completion, discarded
MULTI_TURN_FILES = 3  # the multi-turn section's rollout: one file a turn, consumed at step 4


def page_program() -> str:
    return "\n\n".join(match.group(1) for match in BLOCK.finditer(PAGE.read_text()))


def test_the_page_is_one_program_of_several_blocks():
    program = page_program()
    assert len(BLOCK.findall(PAGE.read_text())) >= 5
    for name in ("segments_to_json", "segments_from_json", "record_batch", "policy_updated",
                 "discard", "extra_body", "PayloadReader", "TracePayload", "bridged_on",
                 "X-Session-ID"):  # fmt: skip
        assert name in program, name


def _wait_deleted(retention_url: str, root: Path) -> dict:
    """The retention status once its queue is empty and no payload file is left."""
    with RetentionClient(retention_url) as client:
        deadline = time.monotonic() + 60
        while True:
            status = client.status()
            if not status["queue_files"] and not list(root.rglob("*.bin")):
                return status
            assert time.monotonic() < deadline, (status, list(root.rglob("*.bin")))
            time.sleep(0.05)


@pytest.mark.torch  # the trainer's block reads into torch tensors
def test_the_integration_page_runs(tmp_path: Path):
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("openai") is None:
        skip_or_fail("the page's trainer needs torch and its client openai (the dev extras)")
    run_directory = tmp_path / "run"
    root = run_directory / "payloads"
    root.mkdir(parents=True)
    model = ("--model", "Qwen/Qwen3-30B-A3B", "--layers", "48", "--top-k", "8", "--experts", "128")
    with (
        fake_vllm(*model) as vllm,
        writer(vllm.url, root) as front,
        SidecarProcess(root, "integration-page") as retention,
    ):
        env = {
            **os.environ,
            "PAYLOAD_ROOT": str(root),
            "PAYLOADRUN_RUN_DIRECTORY": str(run_directory),
            "PAYLOADRUN_INFERENCE_URL": front.url,
            "PAYLOADRUN_RETENTION_URL": retention.url,
        }
        result = subprocess.run(
            [sys.executable, "-c", page_program()],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        for step in range(1, STEPS + 1):
            assert f"step {step}: {KEPT} files recorded" in result.stdout, result.stdout
        # every batch went to the trainers as JSON, through the run directory
        assert sorted(p.name for p in (run_directory / "batches").iterdir()) == [
            f"step_{s}.json" for s in range(1, STEPS + 1)
        ]
        # what each call deleted: the consumed batches, the dropped rollouts and the OpenAI
        # answers; nothing is left
        status = _wait_deleted(retention.url, root)
        assert f"multi-turn: 2 branches read, {MULTI_TURN_FILES} files recorded" in result.stdout
        assert status["deleted"]["consumed"]["files"] == STEPS * KEPT + MULTI_TURN_FILES, status
        assert status["deleted"]["discarded"]["files"] == STEPS * DROPPED + OPENAI_ANSWERS, status


def _volume(root: Path) -> list[str]:
    """What the payload root holds: ``v<k>/`` directories and ``v<k>/<name>`` files."""
    out = []
    for version in sorted(root.glob("v*")):
        out.append(f"{version.name}/")
        out += [f"{version.name}/{f.stem}" for f in sorted(version.iterdir())]
    return out


def _settles_to(client: RetentionClient, root: Path, expected: list[str]) -> None:
    """Wait until the sidecar's background deletions are done and the volume is ``expected``."""
    deadline = time.monotonic() + 30
    while True:
        status = client.status()
        idle = not status["queue_files"] and not status["outstanding_jobs"]
        if idle and _volume(root) == expected:
            return
        assert time.monotonic() < deadline, (_volume(root), expected, status)
        time.sleep(0.02)


def test_the_pages_off_policy_timeline(tmp_path: Path):
    """The page's timeline with maxOffPolicySteps 1, call by call, as the volume shows it."""
    root = tmp_path / "payloads"
    root.mkdir()

    def write(version: int, name: str) -> Path:
        path = root / f"v{version}" / f"{name}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"\0" * 384)
        return path

    with (
        SidecarProcess(root, "timeline", args=["--max-off-policy-steps", "1"]) as sidecar,
        RetentionClient(sidecar.url) as client,
    ):
        a, b, c = write(0, "A"), write(0, "B"), write(0, "C")
        client.record_batch(1, [a, b])
        _settles_to(client, root, ["v0/", "v0/A", "v0/B", "v0/C"])
        client.policy_updated(1)
        _settles_to(client, root, ["v0/", "v0/C"])
        client.discard([c])
        _settles_to(client, root, ["v0/"])
        d, e, _ = write(0, "D"), write(1, "E"), write(1, "F")
        client.record_batch(2, [d, e])
        _settles_to(client, root, ["v0/", "v0/D", "v1/", "v1/E", "v1/F"])
        client.policy_updated(2)
        _settles_to(client, root, ["v1/", "v1/F"])
        client.policy_updated(3)
        _settles_to(client, root, [])
