"""render's bad-input table against the real API server: each run of
``tests/operator/bad_runs.py`` sent with ``kubectl apply --dry-run=server`` (kubectl's default
strict field validation) is refused by the API server, and ``payloadrun-operator render``
refuses it too, with every line the API server printed among its own; the near misses both
accept. So render's schema check is held to the real thing, not to a copy of its rules.

And the operator's side: a run that an older, looser CRD let in is refused with the same words
in its Validated condition, where it used to crash the reconcile with a traceback."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from payloadrun_devcluster.binaries import pinned_control_plane
from payloadrun_devkit.local_operator import LocalOperator
from payloadrun_operator import render
from payloadrun_operator.api.crd import build_crd
from payloadrun_operator.api.models import GROUP, PLURAL
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.platform.settings import OperatorSettings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NOT_CHECKED_PREFIX = "<nil>: Invalid value: null: "


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


def cel_messages(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", ()):
            found.add(rule["message"])
        for value in node.values():
            found |= cel_messages(value)
    elif isinstance(node, list):
        for value in node:
            found |= cel_messages(value)
    return found


CEL_MESSAGES = cel_messages(build_crd())


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
    code, ours = render_lines(run, tmp_path)
    assert code == 1, ours
    if server.returncode == 0:
        # Kubernetes 1.29 (the oldest control plane) takes a port beyond int32 (it did not check
        # a CRD's int32 format): render refuses it there, and so does the operator's admission
        assert not pinned_control_plane(), f"the API server took {case.id}: {server.stdout}"
        return
    theirs = api_server_lines(server.stderr)
    assert theirs, server.stderr
    # A rule of the CRD's CEL the API server checked beside a non-blocking schema error (a
    # pattern, a bound): render states the rules in the operator's words once the schema
    # passes, as the API server does after a type error.
    theirs = [line for line in theirs if not any(m in line for m in CEL_MESSAGES)]
    missing = [line for line in theirs if not any(line in mine for mine in ours)]
    # render's words are the pinned Kubernetes' (an older API server words some refusals
    # otherwise, e.g. an unchecked rule as `<nil>: Invalid value: "null": ...`): on the oldest
    # control plane (hack/test.py's oldest-control-plane part) both refuse, in their own words
    assert not (missing and pinned_control_plane()), (
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


# The table's runs that crashed the builders before the schema check (issue 33).
CRASHED = ("container port in words", "env as a map", "template labels as a list")


def install_crd(cluster, crd: dict[str, Any]) -> None:
    applied = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd)
    )
    assert applied.returncode == 0, applied.stderr
    cluster.wait_established(f"{PLURAL}.{GROUP}")


def test_the_operator_refuses_what_an_older_crd_let_in_with_renders_words(
    crd, kube_cluster, namespace, tmp_path
):
    full = build_crd()
    loose = json.loads(json.dumps(full))
    (version,) = loose["spec"]["versions"]
    version["schema"]["openAPIV3Schema"]["properties"]["spec"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    cases = {f"crashed-{i}": c for i, c in enumerate(TABLE.BAD) if c.id in CRASHED}
    assert len(cases) == len(CRASHED)
    install_crd(kube_cluster, loose)
    try:
        with LocalOperator(
            kube_cluster.kubeconfig, namespaces=(namespace,), log_path=tmp_path / "operator.log"
        ) as op:
            for name, case in cases.items():
                run = case.run()
                run["metadata"]["name"] = name
                created = kube_cluster.kubectl(
                    "apply", "-n", namespace, "-f", "-", input=json.dumps(run)
                )
                assert created.returncode == 0, f"{case.id}: {created.stderr}"
            rejected = wait_rejected(kube_cluster, namespace, set(cases), op)
            log = (tmp_path / "operator.log").read_text()
    finally:
        install_crd(kube_cluster, full)
    assert "Traceback" not in log, log[-4000:]
    for name, got in rejected.items():
        validated = {c["type"]: c for c in got["status"]["conditions"]}["Validated"]
        assert (validated["status"], validated["reason"]) == ("False", "InvalidSpec")
        expected = admit({**got, "status": {}}, OperatorSettings()).errors
        assert validated["message"] == "; ".join(expected)
        for path, *words in cases[name].errors:
            assert any(
                part.startswith(f"{path}: ") and all(w in part for w in words) for part in expected
            ), (path, words, expected)


def wait_rejected(cluster, namespace: str, names: set[str], op) -> dict[str, Any]:
    """Each run once the operator has set its phase to Rejected (polled: a status fact)."""
    deadline = time.monotonic() + 90
    seen: dict[str, Any] = {}
    while names - set(seen) and time.monotonic() < deadline:
        for name in sorted(names - set(seen)):
            got = cluster.kubectl("get", "payloadrun", name, "-n", namespace, "-o", "json")
            run = json.loads(got.stdout) if got.returncode == 0 else {}
            if run.get("status", {}).get("phase") == "Rejected":
                seen[name] = run
        time.sleep(0.5)
    assert not names - set(seen), f"not rejected: {names - set(seen)}\n{op.log_tail()}"
    return seen
