"""The example PayloadRuns, as the tests load them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_run(name: str) -> dict[str, Any]:
    """The PayloadRun of ``examples/<name>`` (a file may hold a ConfigMap of configs beside it)."""
    docs = yaml.safe_load_all((EXAMPLES / name).read_text())
    (run,) = [d for d in docs if d and d.get("kind") == "PayloadRun"]
    return run
