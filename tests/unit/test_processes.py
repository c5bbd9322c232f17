"""What every payloadrun process has in common: its version, log format and /metrics basics.

The sidecars run as real processes here; the operator as a process where it needs no cluster
(tests/integration/test_operator.py runs it against one).
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VERSION = metadata.version("payloadrun")


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, env=env, check=False
    )


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (("-m", "payloadrun.cli", "--version"), "payloadrun"),
        (("-m", "payloadrun.cli", "writer", "--version"), "payloadrun writer"),
        (("-m", "payloadrun.cli", "retention", "--version"), "payloadrun retention"),
        (("-m", "payloadrun_operator", "--version"), "payloadrun-operator"),
    ],
)
def test_every_command_prints_the_installed_version(argv, prog):
    result = run(*argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{prog} {VERSION}\n"


def test_one_version_everywhere():
    """pyproject.toml is where the version is written; everything else reads or matches it."""
    import payloadrun
    import payloadrun_operator
    from payloadrun_operator.settings import DEFAULT_SIDECAR_IMAGE

    assert payloadrun.__version__ == payloadrun_operator.__version__ == VERSION
    assert DEFAULT_SIDECAR_IMAGE.endswith(f":{VERSION}")
    chart = yaml.safe_load((REPO / "charts/payloadrun/Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION, "Chart.yaml's appVersion is not the package's version"
