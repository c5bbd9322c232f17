"""``payloadrun-operator render``: the children of a PayloadRun file, offline, as the operator
builds them, refusing what the operator refuses. Run as the command users run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_kubernetes_schema import assert_valid

from builders import group_spec, run_body
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.platform.settings import OperatorSettings
from payloadrun_operator.render import PLACEHOLDER_UID

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
REFUSED = {"disaggregated-root-rejected.yaml"}


def render(*args, input=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "payloadrun_operator", "render", *args],
        capture_output=True,
        text=True,
        input=input,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def documents(stdout):
    return [d for d in yaml.safe_load_all(stdout) if d]


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.name not in REFUSED], ids=str)
def test_every_example_renders_to_children_kubernetes_accepts(example):
    result = render("-f", str(example))
    assert result.returncode == 0, result.stderr
    children = documents(result.stdout)
    assert children, result.stdout
    for child in children:
        assert_valid(child)
        assert child["metadata"]["ownerReferences"][0]["uid"] == PLACEHOLDER_UID or (
            child["kind"] == "PersistentVolumeClaim"  # a retained claim has no owner
        )
    # in apply order: the claim before the pods that mount it
    kinds = [c["kind"] for c in children]
    (inference,) = [i for i, k in enumerate(kinds) if k in ("StatefulSet", "LeaderWorkerSet")]
    if "PersistentVolumeClaim" in kinds:
        assert kinds.index("PersistentVolumeClaim") < inference


def test_a_run_whose_replicas_span_pods_renders_its_leader_worker_set():
    run = run_body("moe", group_spec(), namespace="ml")
    result = render("-f", "-", input=json.dumps(run))
    assert result.returncode == 0, result.stderr
    assert "&id" not in result.stdout  # no YAML anchors: each template has its own objects
    children = documents(result.stdout)
    kinds = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert ("LeaderWorkerSet", "moe-vllm") in kinds
    assert not any(kind == "StatefulSet" for kind, _ in kinds)
    assert kinds.index(("PersistentVolumeClaim", "moe-payloads")) < kinds.index(
        ("LeaderWorkerSet", "moe-vllm")
    )
    for child in children:
        assert_valid(child)
    operator_builds = admit(
        {**run, "metadata": {**run["metadata"], "uid": PLACEHOLDER_UID}}, OperatorSettings()
    )
    assert children == list(operator_builds.built.children)


def test_a_queued_run_renders_its_kueue_workload_first():
    run = run_body("moe", group_spec(), namespace="ml")
    run["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "rl"}
    result = render("-f", "-", input=json.dumps(run))
    assert result.returncode == 0, result.stderr
    workload, *children = documents(result.stdout)
    assert (workload["kind"], workload["metadata"]["name"]) == ("Workload", "payloadrun-moe")
    assert workload["spec"]["queueName"] == "rl"
    sets = {s["name"]: s for s in workload["spec"]["podSets"]}
    assert sorted(sets) == ["inference", "inference-workers", "orchestrator", "trainer"]
    group = next(c for c in children if c["kind"] == "LeaderWorkerSet")["spec"]
    assert sets["inference-workers"]["template"] == group["leaderWorkerTemplate"]["workerTemplate"]
    assert sets["inference-workers"]["count"] == group["replicas"] * (
        group["leaderWorkerTemplate"]["size"] - 1
    )


def test_the_refused_example_says_why_and_exits_1():
    result = render("-f", str(REPO / "examples" / "disaggregated-root-rejected.yaml"))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "PayloadRun default/pd-with-root is refused:" in result.stderr
    assert (
        "payloads by handle cannot be combined with prefill/decode-disaggregated" in result.stderr
    )


def test_a_template_collision_gets_the_operators_message(spec_dict):
    spec_dict["trainer"]["template"] = {
        "spec": {"containers": [{"name": "trainer", "env": [{"name": "RANK", "value": "0"}]}]}
    }
    run = run_body("r", spec_dict, namespace="ml")
    result = render("-f", "-", input=json.dumps(run))
    assert result.returncode == 1
    operator_says = admit({**run, "metadata": {**run["metadata"], "uid": "u"}}, OperatorSettings())
    assert operator_says.errors and all(e in result.stderr for e in operator_says.errors)
    assert "sets env RANK in the trainer container, which the operator sets itself" in result.stderr


def test_the_operators_settings_and_namespace_flag_apply(spec_dict):
    run = run_body("r", spec_dict)
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}}
    text = yaml.safe_dump_all([other, run])
    result = render(
        "-f", "-", "-n", "team-a", input=text, env={"PAYLOADRUN_SIDECAR_IMAGE": "mine/side:1"}
    )
    assert result.returncode == 0, result.stderr
    assert "# skipped ConfigMap cfg from - (document 1): not a PayloadRun" in result.stderr
    children = documents(result.stdout)
    assert {c["metadata"]["namespace"] for c in children} == {"team-a"}
    (sts,) = [c for c in children if c["kind"] == "StatefulSet"]
    (writer,) = sts["spec"]["template"]["spec"]["initContainers"]
    assert writer["image"] == "mine/side:1"


def test_bad_input_is_said_plainly(tmp_path):
    missing = render("-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read the file" in missing.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    nothing = render("-f", str(empty))
    assert nothing.returncode == 1 and "no PayloadRun in the given files" in nothing.stderr
    bad = render("-f", "-", input="spec: [unclosed\n")
    assert bad.returncode == 2 and "cannot read the file" in bad.stderr
    help_text = render("--help")
    assert help_text.returncode == 0 and "--dry-run=server" in help_text.stdout
