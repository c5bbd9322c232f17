"""An example that captures sampling masks says how its vLLM is told to (issue 34: the multi-node
example captured masks without --return-sampling-mask)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MASK_FLAG = re.compile(r"return[-_]sampling[-_]mask")
FAKE_VLLM = "payloadrun.testing.fakevllm"  # the test double returns masks unasked


def runs(path: Path) -> list[dict]:
    docs = yaml.safe_load_all(path.read_text())
    return [d for d in docs if d and d.get("kind") == "PayloadRun"]


CAPTURING = [
    path.name
    for path in sorted(EXAMPLES.glob("*.yaml"))
    if any(r["spec"].get("samplingMaskCapture") for r in runs(path))
    and FAKE_VLLM not in path.read_text()
]


def test_some_example_captures_masks_on_a_real_vllm():
    assert "multinode-by-handle.yaml" in CAPTURING


@pytest.mark.parametrize("name", CAPTURING)
def test_an_example_that_captures_masks_turns_them_on_in_vllm(name):
    assert MASK_FLAG.search((EXAMPLES / name).read_text()), (
        f"examples/{name} sets samplingMaskCapture but never asks vLLM for masks "
        "(--return-sampling-mask, or prime-rl's enable_return_sampling_mask)"
    )


def test_the_reference_names_the_mask_flag():
    reference = (EXAMPLES.parent / "docs" / "payloadrun-reference.md").read_text()
    (row,) = [line for line in reference.splitlines() if line.startswith("| `spec.inference.args`")]
    assert "--return-sampling-mask" in row and "--enable-return-routed-experts" in row
