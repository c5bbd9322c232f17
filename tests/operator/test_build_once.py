"""Children built once per pass: admission composes each role's pod template once, and what
checks, applies and prints the run (validation, network policies, ``render``, the reconcile,
the trainers' Job a restart creates again) takes what admission built instead of composing
again. Counted at the composing function itself (the real one runs; the test only counts).

The reconcile's own pass, against the real API server, is counted in
tests/integration/test_one_pass.py."""

import pytest

from builders import group_spec
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.platform.settings import OperatorSettings
from payloadrun_operator.render import render_run

SETTINGS = OperatorSettings(sidecar_image="registry.example/payloadrun:test")
ONCE_EACH = {"inference": 1, "orchestrator": 1, "trainer": 1}


def run_doc(spec_dict, name="run1"):
    return {
        "apiVersion": "payloadrun.dev/v1alpha1",
        "kind": "PayloadRun",
        "metadata": {"name": name, "namespace": "ml", "uid": "uid-1"},
        "spec": spec_dict,
    }


@pytest.mark.parametrize("by_handle", [True, False], ids=["by-handle", "inline"])
def test_render_composes_each_pod_template_once(spec_dict, compositions, by_handle):
    spec_dict["routerReplay"] = by_handle
    children, errors = render_run(run_doc(spec_dict), "ml", SETTINGS)
    assert errors == [] and children
    assert compositions == ONCE_EACH
    # what it printed is what the builders build, network policies and all
    compositions.clear()
    assert children == build_children(admit(run_doc(spec_dict), SETTINGS).ctx)
    assert {c["kind"] for c in children} >= {"NetworkPolicy", "StatefulSet", "Job"}


def test_admission_builds_the_children_it_checked(spec_dict, compositions):
    verdict = admit(run_doc(spec_dict), SETTINGS)
    assert verdict.built is not None and verdict.errors == []
    assert compositions == ONCE_EACH
    built = verdict.built
    # each workload carries the pod template admission composed, not a copy built again
    for component in ("inference", "orchestrator", "trainer"):
        assert built.workload(component)["spec"]["template"] is built.pods[component]
    policies = [c for c in built.children if c["kind"] == "NetworkPolicy"]
    assert policies == list(built.network_policies) and len(policies) == 3
    assert compositions == ONCE_EACH


def test_a_refused_run_is_composed_once_and_has_every_roles_errors(spec_dict, compositions):
    for role, env in (("trainer", "RANK"), ("orchestrator", "PAYLOADRUN_RUN")):
        spec_dict[role]["template"] = {
            "spec": {"containers": [{"name": role, "env": [{"name": env, "value": "0"}]}]}
        }
    verdict = admit(run_doc(spec_dict), SETTINGS)
    assert verdict.built is None and verdict.ctx is None
    assert any("RANK" in e for e in verdict.errors)
    assert any("PAYLOADRUN_RUN" in e for e in verdict.errors)
    assert compositions == ONCE_EACH


def test_a_group_run_composes_its_leaders_and_its_workers_template_once_each(compositions):
    """Two inference templates (the leader's and the workers'), each composed once, and the
    LeaderWorkerSet carries them."""
    verdict = admit(run_doc(group_spec()), SETTINGS)
    assert verdict.built is not None and verdict.errors == []
    assert compositions == {**ONCE_EACH, "inference": 2}
    built = verdict.built
    groups = built.workload("inference")["spec"]["leaderWorkerTemplate"]
    assert groups["leaderTemplate"] is built.pods["inference"]
    assert groups["workerTemplate"] is built.pods["inference-worker"]
