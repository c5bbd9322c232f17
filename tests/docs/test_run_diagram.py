"""docs/run-diagram.md is what hack/run_diagram.py draws from `payloadrun-operator render`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_run_diagram_is_current():
    result = subprocess.run(
        [sys.executable, str(REPO / "hack" / "run_diagram.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_diagram_shows_the_rendered_ports_and_flows():
    page = (REPO / "docs" / "run-diagram.md").read_text()
    # the writer in front of vLLM, the retention sidecar on the orchestrator's loopback, the
    # scrapers' ports: as the operator renders them for the example
    for shown in (
        'inference_payload_writer["sidecar payload-writer<br/>writer:8001 writer-metrics:9401"]',
        '"PAYLOADRUN_RETENTION_URL<br/>127.0.0.1:8002" --> orchestrator_payload_retention',
        '"PAYLOADRUN_WRITER_UPSTREAM<br/>127.0.0.1:8100" --> inference_vllm',
        '-. "9402/TCP" .-> orchestrator',
        "| trainer | every pod of the run | every port |",
    ):
        assert shown in page, shown
