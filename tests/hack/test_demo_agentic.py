"""make demo's agentic rollout, its pod scripts run as local processes with a pod's environment.

``make demo`` runs ``hack/demo_agentic.py``'s scripts in the run's orchestrator and trainer pods
(``kubectl exec``); here each runs as ``python -c`` with the variables the operator sets in those
pods, against a real writer in front of the fake vLLM and a real retention sidecar. The branches
the "trainer" reads must equal verifiers' own inline branches, and the rollout's files must be
consumed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from payloadrun.retention.client import RetentionClient
from payloadrun.testing.processes import SidecarProcess, fake_vllm, writer
from payloadrun_devkit.required import skip_or_fail

HACK = Path(__file__).resolve().parents[2] / "hack"


def test_the_demos_agentic_rollout_reads_back_equal_to_verifiers(tmp_path: Path):
    if importlib.util.find_spec("verifiers") is None:
        skip_or_fail("verifiers is not installed (pip install -e '.[verifiers]'; make test does)")
    sys.path.insert(0, str(HACK))
    try:
        import demo_agentic
    finally:
        sys.path.remove(str(HACK))
    root = tmp_path / "payloads"
    root.mkdir()
    lines: list[str] = []
    with (
        fake_vllm() as vllm,
        writer(vllm.url, root) as front,
        SidecarProcess(root, "demo-agentic") as retention,
    ):
        env = {
            **os.environ,
            "PAYLOAD_ROOT": str(root),
            "PAYLOADRUN_INFERENCE_URL": front.url,
            "PAYLOADRUN_RETENTION_URL": retention.url,
        }

        def in_pod(component: str, script: str, *args: str) -> str:
            assert component in ("orchestrator", "trainer")
            done = subprocess.run(
                [sys.executable, "-c", script, *args],
                env=env, capture_output=True, text=True, timeout=120, check=True,
            )  # fmt: skip
            return done.stdout.strip()

        demo_agentic.run(in_pod, lines.append)
        with RetentionClient(retention.url) as client:
            deadline = time.monotonic() + 30
            while client.status()["queue_files"] or list(root.rglob("*.bin")):
                assert time.monotonic() < deadline, list(root.rglob("*.bin"))
                time.sleep(0.05)
            assert client.status()["deleted"]["consumed"]["files"] == 3
    text = "\n".join(lines)
    assert "2 branches, 3 files" in text, text
    assert text.count("equal to verifiers' inline branch") == 2 and "NOT" not in text, text
