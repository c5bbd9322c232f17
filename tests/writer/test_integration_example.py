"""examples/orchestrator_trainer.py runs against a writer and a retention sidecar, as documented."""

import os
import subprocess
import sys
import time
from pathlib import Path

from payloadrun.retention.client import RetentionClient
from payloadrun.testing.processes import SidecarProcess

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orchestrator_trainer.py"


def test_the_integration_example(writer, root: Path):
    with SidecarProcess(root, "example-run") as retention:
        env = {
            **os.environ,
            "PAYLOAD_ROOT": str(root),
            "PAYLOADRUN_INFERENCE_URL": writer.url,
            "PAYLOADRUN_RETENTION_URL": retention.url,
        }
        result = subprocess.run(
            [sys.executable, str(EXAMPLE)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("sample of") == 4
        assert "recorded, read, and released" in result.stdout
        # the consumed batch's files are deleted in the background
        with RetentionClient(retention.url) as client:
            deadline = time.monotonic() + 30
            while client.status()["queue_files"] or list(root.rglob("*.bin")):
                assert time.monotonic() < deadline, list(root.rglob("*.bin"))
                time.sleep(0.05)
