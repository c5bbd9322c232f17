"""docs/integration.md's Python blocks run as written, against real sidecar processes.

The page's "End to end" section is one program (an orchestrator's rollouts by handle, its batches
to the trainers with the segments as JSON, the trainer's reads, the retention calls, the OpenAI
client): this test joins every ```python block of the page, in order, and runs it in a fresh
interpreter with the operator's environment pointing at a ``payloadrun writer`` process in front
of the fake vLLM and a ``payloadrun retention`` process. A snippet that names something undefined,
or calls the API as it no longer is, fails here.
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


def page_program() -> str:
    return "\n\n".join(match.group(1) for match in BLOCK.finditer(PAGE.read_text()))


def test_the_page_is_one_program_of_several_blocks():
    program = page_program()
    assert len(BLOCK.findall(PAGE.read_text())) >= 5
    for name in ("segments_to_json", "segments_from_json", "record_batch", "policy_updated",
                 "discard", "extra_body", "PayloadReader"):  # fmt: skip
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
        assert status["deleted"]["consumed"]["files"] == STEPS * KEPT, status
        assert status["deleted"]["discarded"]["files"] == STEPS * DROPPED + OPENAI_ANSWERS, status
