"""render's bad-input table against the real API server: each run of
``tests/operator/bad_runs.py`` sent with ``kubectl apply --dry-run=server`` (kubectl's default
strict field validation) is refused by the API server, and ``payloadrun-operator render``
refuses it too, with every line the API server printed among its own; the near misses both
accept. So render's schema check is held to the real thing, not to a copy of its rules."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from payloadrun_operator import render

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NOT_CHECKED_PREFIX = '<nil>: Invalid value: "null": '


def load_table() -> Any:
    """tests/operator/bad_runs.py, loaded by path (that folder may not be on sys.path)."""
    name = "payloadrun_render_bad_runs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tests/operator/bad_runs.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


TABLE = load_table()


def api_server_lines(stderr: str) -> list[str]:
    """The errors in kubectl's report of a refusal: a field error per line, or each unknown
    field of a strict decoding error."""
    if "strict decoding error:" in stderr:
        return re.findall(r'unknown field "[^"]+"', stderr)
    (_, _, errors) = stderr.partition(" is invalid: ")
    assert errors, stderr
    lines = [line.removeprefix("* ") for line in errors.strip().splitlines()]
    return [line.removeprefix(NOT_CHECKED_PREFIX) for line in lines if line.strip()]


def render_lines(run: dict[str, Any], tmp_path: Path) -> tuple[int, list[str]]:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    stdout, stderr = io.StringIO(), io.StringIO()
    args = argparse.Namespace(filename=[str(path)], namespace="default")
    code = render.run(args, stdout, stderr)
    lines = [line[4:] for line in stderr.getvalue().splitlines() if line.startswith("  - ")]
    return code, lines


def dry_run(cluster, namespace: str, run: dict[str, Any]):
    return cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(run)
    )


@pytest.mark.parametrize("case", TABLE.BAD, ids=lambda c: c.id)
def test_render_refuses_what_the_api_server_refuses_in_its_words(
    crd, kube_cluster, namespace, case, tmp_path
):
    run = case.run()
    server = dry_run(kube_cluster, namespace, run)
    assert server.returncode != 0, f"the API server took {case.id}: {server.stdout}"
    code, ours = render_lines(run, tmp_path)
    assert code == 1, ours
    theirs = api_server_lines(server.stderr)
    assert theirs, server.stderr
    missing = [line for line in theirs if not any(line in mine for mine in ours)]
    assert not missing, (
        "the API server says what render does not:\n  "
        + "\n  ".join(missing)
        + "\nrender says:\n  "
        + "\n  ".join(ours)
    )


@pytest.mark.parametrize("case", TABLE.GOOD, ids=lambda c: c.id)
def test_render_takes_what_the_api_server_takes(crd, kube_cluster, namespace, case, tmp_path):
    run = case.run()
    server = dry_run(kube_cluster, namespace, run)
    assert server.returncode == 0, server.stderr
    code, ours = render_lines(run, tmp_path)
    assert code == 0, ours
