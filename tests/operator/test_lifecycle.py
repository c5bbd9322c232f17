"""A run's lifecycle (lifecycle.py): pinned sidecars, workload inputs, activity, Job outcomes and
how a run ends, with the builders and the status they feed.

The Kubernetes objects are shaped as the API server returns them: Job conditions as the Job
controller writes them (FailureTarget/SuccessCriteriaMet before Failed/Complete), pods with
containerStatuses[].state.terminated and native sidecars in initContainerStatuses.
"""

import copy
import json
import re

import pytest

from builders import context
from payloadrun_operator.api.conditions import REASONS, TRUE_REASONS, ConditionType, ReadyReason
from payloadrun_operator.api.models import (
    PayloadRunSpec,
    PayloadRunStatus,
    PinnedSidecars,
    RunFailure,
)
from payloadrun_operator.api.names import (
    INFERENCE,
    INPUTS_ANNOTATION,
    ORCHESTRATOR,
    ROLLOUT_ANNOTATION,
    TRAINER,
    WORKLOADS,
)
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.cleanup import build_cleanup
from payloadrun_operator.desired.context import is_final, runs_pods
from payloadrun_operator.desired.pinning import current_pin, inputs_hash, pin_of, pinned_settings
from payloadrun_operator.observed.outcome import (
    end_checks,
    failure_of,
    job_outcome,
    last_failed_container,
    ready_check,
    suspend_check,
)
from payloadrun_operator.observed.plan import (
    WorkloadPlan,
    activity_manifest,
    needs_scaling,
    workload_plan,
)
from payloadrun_operator.observed.status import Check, phase, set_condition, status_update
from payloadrun_operator.platform.settings import (
    DEFAULT_RETENTION_RESOURCES,
    DEFAULT_WRITER_RESOURCES,
    OperatorSettings,
)

COMPLETE = ConditionType.COMPLETE
FAILED = ConditionType.FAILED
READY = ConditionType.READY
SUSPENDED = ConditionType.SUSPENDED
VALIDATED = ConditionType.VALIDATED
VOLUME_READY = ConditionType.VOLUME_READY

COMPONENTS = (INFERENCE, ORCHESTRATOR, TRAINER)
KIND_OF = {component: kind for _, kind, component in WORKLOADS}

# The operator a run started under, and the one it was upgraded to (every pinned setting new, and
# some settings that are never pinned new as well).
OLD = OperatorSettings(sidecar_image="registry.example/payloadrun:0.1.0")
NEW = OperatorSettings(
    sidecar_image="registry.example/payloadrun:0.2.0",
    sidecar_image_pull_policy="Always",
    sidecar_uid=1000,
    sidecar_log_format="plain",
    writer_resources={"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "8Gi"}},
    retention_resources={"requests": {"cpu": "500m", "memory": "512Mi"}},
    namespaces=("ml",),
    metrics_port=9500,
    resync_seconds=30,
)
NEW_IMAGE_ONLY = OperatorSettings(sidecar_image="registry.example/payloadrun:0.2.0")

T0 = "2026-03-01T10:00:00Z"
T1 = "2026-03-01T11:00:00Z"


def stored(value):
    """``value`` as the API server gives it back (JSON)."""
    return json.loads(json.dumps(value))


def parse(spec_dict):
    return PayloadRunSpec.model_validate(spec_dict)


def hashes(spec_dict, pin):
    spec = parse(spec_dict)
    return {c: inputs_hash(spec, c, pin) for c in COMPONENTS}


def workloads(children):
    """component -> workload manifest."""
    out = {}
    for child in children:
        if child["kind"] in ("StatefulSet", "Job"):
            out[child["metadata"]["labels"]["app.kubernetes.io/component"]] = child
    return out


def dumps(value):
    return json.dumps(value)


# --- pinned sidecars ---------------------------------------------------------------------------


def test_a_run_without_a_record_gets_the_operators_current_settings():
    expected = {
        "image": "registry.example/payloadrun:0.1.0",
        "imagePullPolicy": "IfNotPresent",
        "uid": 65532,
        "logFormat": "json",
        "writerResources": DEFAULT_WRITER_RESOURCES,
        "retentionResources": DEFAULT_RETENTION_RESOURCES,
        "podLayout": 2,
    }
    assert current_pin(OLD, None, {}) == expected
    assert current_pin(NEW, None, {})["image"] == "registry.example/payloadrun:0.2.0"
    assert "rollout" not in current_pin(OLD, None, {})


def test_the_record_fits_the_crds_status_schema():
    for pin in (pin_of(OLD), pin_of(NEW, "2026-03-01")):
        parsed = PinnedSidecars.model_validate(stored(pin))
        assert parsed.model_dump(mode="json", by_alias=True, exclude_none=True) == pin
        status = PayloadRunStatus.model_validate({"sidecars": stored(pin)})
        assert status.sidecars == parsed


def test_an_operator_upgrade_keeps_the_recorded_pin():
    status = {"sidecars": stored(pin_of(OLD)), "phase": "Running"}
    pin = current_pin(NEW, status["sidecars"], {})
    assert pin == pin_of(OLD)
    assert pin["image"] == "registry.example/payloadrun:0.1.0" and pin["uid"] == 65532
    # a copy: the caller may change it without changing the run's status
    pin["image"] = "elsewhere"
    assert status["sidecars"]["image"] == "registry.example/payloadrun:0.1.0"
    # unrelated annotations change nothing
    other = {"kopf.zalando.org/last-handled-configuration": "{}", "team": "rl"}
    assert current_pin(NEW, status["sidecars"], other) == pin_of(OLD)


def test_the_rollout_annotation_takes_the_current_settings_once_per_value():
    status = {"sidecars": stored(pin_of(OLD))}
    rolled = current_pin(NEW, status["sidecars"], {ROLLOUT_ANNOTATION: "2026-03-01T12:00:00Z"})
    assert rolled == {**pin_of(NEW), "rollout": "2026-03-01T12:00:00Z"}
    # recorded; the same value again keeps the record, whatever the operator runs now
    status = {"sidecars": stored(rolled)}
    newer = OperatorSettings(sidecar_image="registry.example/payloadrun:0.3.0")
    again = current_pin(newer, status["sidecars"], {ROLLOUT_ANNOTATION: "2026-03-01T12:00:00Z"})
    assert again == rolled
    # a new value rolls again
    later = current_pin(newer, status["sidecars"], {ROLLOUT_ANNOTATION: "2026-04-01T00:00:00Z"})
    assert later == {**pin_of(newer), "rollout": "2026-04-01T00:00:00Z"}


def test_a_new_run_with_the_annotation_records_its_value():
    pin = current_pin(NEW, None, {ROLLOUT_ANNOTATION: "v2"})
    assert pin == {**pin_of(NEW), "rollout": "v2"}
    assert current_pin(OLD, stored(pin), {ROLLOUT_ANNOTATION: "v2"}) == pin


def test_removing_the_rollout_annotation_keeps_the_record():
    status = {"sidecars": stored(pin_of(OLD, "v1"))}
    assert current_pin(NEW, status["sidecars"], {}) == pin_of(OLD, "v1")


def test_pinned_settings_put_the_pinned_values_in_place_of_the_operators():
    pinned = pinned_settings(NEW, stored(pin_of(OLD, "v1")))
    for attr in (
        "sidecar_image",
        "sidecar_image_pull_policy",
        "sidecar_uid",
        "sidecar_log_format",
        "writer_resources",
        "retention_resources",
    ):
        assert getattr(pinned, attr) == getattr(OLD, attr), attr
        assert getattr(pinned, attr) != getattr(NEW, attr), attr  # the test means something
    # what is not pinned stays the operator's own
    assert pinned.namespaces == ("ml",)
    assert pinned.metrics_port == 9500 and pinned.resync_seconds == 30
    # the pin of the pinned settings is the record itself (without its rollout token)
    assert pin_of(pinned) == pin_of(OLD)


def test_pinned_settings_leave_what_a_partial_record_lacks_alone():
    pinned = pinned_settings(NEW, {"image": "registry.example/payloadrun:0.1.0"})
    assert pinned.sidecar_image == "registry.example/payloadrun:0.1.0"
    assert pinned.sidecar_uid == 1000 and pinned.sidecar_log_format == "plain"
    assert pinned_settings(NEW, {}) == NEW


# --- inputs ------------------------------------------------------------------------------------


def test_inputs_are_stable_for_equal_inputs(spec_dict):
    pin = pin_of(OLD)
    first = hashes(spec_dict, pin)
    assert first == hashes(copy.deepcopy(spec_dict), stored(pin))
    for value in first.values():
        assert re.fullmatch(r"[0-9a-f]{20}", value)
    assert len(set(first.values())) == 3  # each component its own
    # defaults spelled out are the same spec
    spelled = copy.deepcopy(spec_dict)
    spelled["inference"]["port"] = 8000
    spelled["inference"]["writer"] = {"port": 8001, "args": []}
    spelled["failurePolicy"] = {"backoffLimit": 3}
    spelled["suspend"] = False
    assert hashes(spelled, pin) == first
    # the key order of the record does not matter
    assert hashes(spec_dict, dict(reversed(list(pin.items())))) == first


def _set(path, value):
    def change(spec_dict):
        *parents, leaf = path.split(".")
        node = spec_dict
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return change


SPEC_CHANGES = [
    # (what changes, the components whose inputs change)
    ("trainer.replicas", 8, {TRAINER}),
    ("trainer.args", ["--lr", "1e-5"], {TRAINER}),
    ("trainer.image", "example/trainer:2", {TRAINER}),
    ("inference.args", ["--enable-return-routed-experts"], {INFERENCE}),
    # the orchestrator's admin URLs list every replica
    ("inference.replicas", 3, {INFERENCE, ORCHESTRATOR}),
    ("inference.image", "vllm/vllm-openai:v0.34.0", {INFERENCE}),
    ("inference.writer.args", ["--workers", "4"], {INFERENCE}),
    # the orchestrator calls inference on these ports
    ("inference.port", 8080, {INFERENCE, ORCHESTRATOR}),
    ("inference.writer.port", 9001, {INFERENCE, ORCHESTRATOR}),
    ("orchestrator.args", ["--batch-size", "64"], {ORCHESTRATOR}),
    ("orchestrator.retention.workers", 16, {ORCHESTRATOR}),
    # run-wide
    ("maxSteps", 1000, {INFERENCE, ORCHESTRATOR, TRAINER}),
    ("placement.nodeSelector", {"pool": "gpu"}, {INFERENCE, ORCHESTRATOR, TRAINER}),
    ("payloads.mountPath", "/data", {INFERENCE, ORCHESTRATOR, TRAINER}),
    # neither is part of a template
    ("suspend", True, set()),
    ("failurePolicy.backoffLimit", 9, set()),
]


@pytest.mark.parametrize(("path", "value", "changed"), SPEC_CHANGES)
def test_a_spec_change_changes_the_inputs_of_the_workloads_it_concerns(
    spec_dict, path, value, changed
):
    pin = pin_of(OLD)
    before = hashes(spec_dict, pin)
    _set(path, value)(spec_dict)
    after = hashes(spec_dict, pin)
    assert {c for c in COMPONENTS if before[c] != after[c]} == changed


PIN_CHANGES = [
    ("image", "registry.example/payloadrun:0.2.0", {INFERENCE, ORCHESTRATOR}),
    ("imagePullPolicy", "Always", {INFERENCE, ORCHESTRATOR}),
    ("logFormat", "plain", {INFERENCE, ORCHESTRATOR}),
    ("writerResources", {"requests": {"cpu": "2"}}, {INFERENCE}),
    ("retentionResources", {"requests": {"cpu": "2"}}, {ORCHESTRATOR}),
    # the trainers share the pods' fsGroup
    ("uid", 1000, {INFERENCE, ORCHESTRATOR, TRAINER}),
    # the token that asked for the settings is not one of them
    ("rollout", "2026-03-01T12:00:00Z", set()),
]


@pytest.mark.parametrize(("key", "value", "changed"), PIN_CHANGES)
def test_a_pin_change_changes_the_inputs_of_the_workloads_that_use_it(
    spec_dict, key, value, changed
):
    pin = pin_of(OLD)
    before = hashes(spec_dict, pin)
    after = hashes(spec_dict, {**pin, key: value})
    assert {c for c in COMPONENTS if before[c] != after[c]} == changed


# Spec changes that rebuild some workload's pod template: whatever template changes must change
# that workload's inputs, or a reconcile that finds the inputs unchanged leaves the old one.
TEMPLATE_CHANGES = [
    pytest.param(path, value, id=path)
    for path, value in (
        ("inference.args", ["--max-model-len", "8192"]),
        ("inference.port", 8080),
        ("inference.writer.port", 9001),
        ("inference.writer.image", "mine/writer:2"),
        ("inference.env", [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]),
        ("orchestrator.args", ["--seed", "1"]),
        ("orchestrator.retention.port", 9102),
        ("orchestrator.retention.scanIntervalSeconds", 30),
        ("trainer.args", ["--lr", "1e-5"]),
        ("trainer.resources", {"limits": {"nvidia.com/gpu": 8}}),
        ("maxSteps", 1000),
        ("maxOffPolicySteps", 2),
        ("resume", True),
        ("payloads.mountPath", "/data"),
        ("payloads.mode", "Inline"),
        ("routerReplay", False),
        ("deploymentType", "SingleNode"),
        ("placement.serviceAccountName", "rl"),
    )
] + [pytest.param("inference.disaggregated", True, id="inference.disaggregated")]


@pytest.mark.parametrize(("path", "value"), TEMPLATE_CHANGES)
def test_a_workload_whose_template_changes_has_new_inputs(spec_dict, path, value):
    before = workloads(build_children(context(spec_dict, OLD)))
    _set(path, value)(spec_dict)
    after = workloads(build_children(context(spec_dict, OLD)))
    rebuilt = [
        c for c in COMPONENTS if before[c]["spec"]["template"] != after[c]["spec"]["template"]
    ]
    assert rebuilt, "the change should rebuild some template"
    for component in rebuilt:
        old = before[component]["metadata"]["annotations"][INPUTS_ANNOTATION]
        new = after[component]["metadata"]["annotations"][INPUTS_ANNOTATION]
        assert old != new, f"{component}'s template changed, its inputs did not"


# --- builders with pinned settings ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ByHandle", "Inline"])
def test_an_operator_upgrade_changes_no_byte_of_a_pinned_runs_workloads(spec_dict, mode):
    spec_dict["payloads"] = {"mode": mode}
    started = build_children(context(spec_dict, OLD))
    # what the run recorded when it started, read back after the upgrade
    status = {"sidecars": stored(current_pin(OLD, None, {}))}
    pin = current_pin(NEW, status["sidecars"], {})
    upgraded = build_children(context(spec_dict, pinned_settings(NEW, pin)))
    before, after = workloads(started), workloads(upgraded)
    for component in COMPONENTS:
        assert dumps(after[component]["spec"]["template"]) == dumps(
            before[component]["spec"]["template"]
        ), component
        assert dumps(after[component]) == dumps(before[component]), component
    assert dumps(upgraded) == dumps(started)
    # and without the pin, the new operator would build other workloads (inline has no sidecar)
    if mode == "ByHandle":
        unpinned = workloads(build_children(context(spec_dict, NEW)))
        for component in COMPONENTS:  # the sidecars, and the fsGroup the trainers share
            assert unpinned[component]["spec"]["template"] != before[component]["spec"]["template"]


def test_a_rollout_rebuilds_the_sidecars_workloads_only(spec_dict):
    pin = pin_of(OLD)
    rolled = current_pin(NEW_IMAGE_ONLY, pin, {ROLLOUT_ANNOTATION: "v2"})
    before = workloads(build_children(context(spec_dict, pinned_settings(NEW_IMAGE_ONLY, pin))))
    after = workloads(build_children(context(spec_dict, pinned_settings(NEW_IMAGE_ONLY, rolled))))
    for component, plan in ((INFERENCE, WorkloadPlan.APPLY), (ORCHESTRATOR, WorkloadPlan.RECREATE)):
        (sidecar,) = after[component]["spec"]["template"]["spec"]["initContainers"]
        assert sidecar["image"] == "registry.example/payloadrun:0.2.0"
        assert workload_plan(after[component], live_copy(before[component])) == plan
    assert dumps(after[TRAINER]) == dumps(before[TRAINER])
    assert workload_plan(after[TRAINER], live_copy(before[TRAINER])) == WorkloadPlan.KEEP


def test_every_workload_carries_its_inputs(spec_dict):
    ctx = context(spec_dict, pinned_settings(NEW, pin_of(OLD)))
    children = build_children(ctx)
    found = workloads(children)
    assert set(found) == set(COMPONENTS)
    for component, manifest in found.items():
        assert manifest["kind"] == KIND_OF[component]
        annotation = manifest["metadata"]["annotations"][INPUTS_ANNOTATION]
        assert annotation == ctx.inputs(component)
        assert annotation == inputs_hash(ctx.spec, component, pin_of(OLD))
        # on the workload, not in its pods' template: a new value rolls no pod by itself
        assert "annotations" not in manifest["spec"]["template"]["metadata"]
    for child in children:
        if child["kind"] not in ("StatefulSet", "Job"):
            assert INPUTS_ANNOTATION not in child["metadata"].get("annotations", {})


def test_the_cleanup_job_of_a_pinned_run_uses_the_pinned_image_and_user(spec_dict):
    pin = stored(pin_of(OLD))
    job = build_cleanup(context(spec_dict, pinned_settings(NEW, pin), active=False))
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/payloadrun:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["fsGroup"] == 65532
    assert {"name": "PAYLOADRUN_LOG_FORMAT", "value": "json"} in container["env"]


# --- applying workloads --------------------------------------------------------------------------


def live_copy(manifest, **changes):
    """``manifest`` as the API server returns it once applied: server fields and defaults added."""
    live = copy.deepcopy(manifest)
    meta = live["metadata"]
    meta.update(
        uid="8f1c2b7e-0000-4000-8000-000000000001",
        resourceVersion="48213",
        generation=1,
        creationTimestamp=T0,
        managedFields=[{"manager": "payloadrun-operator", "operation": "Apply"}],
    )
    spec = live["spec"]
    spec["template"]["spec"].setdefault("terminationGracePeriodSeconds", 30)
    spec["template"]["spec"].setdefault("dnsPolicy", "ClusterFirst")
    if live["kind"] == "Job":
        spec.setdefault("manualSelector", False)
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": meta["uid"]}}
        live["status"] = {"active": 1, "ready": 1, "startTime": T0, "terminating": 0}
    else:
        spec.setdefault("revisionHistoryLimit", 10)
        live["status"] = {"replicas": 2, "readyReplicas": 2, "observedGeneration": 1}
    for key, value in changes.items():
        if key == "annotations":
            meta["annotations"] = value
        else:
            spec[key] = value
    return live


def desired(spec_dict, component, *, active=True):
    return workloads(build_children(context(spec_dict, OLD, active=active)))[component]


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_missing_workload_is_applied(spec_dict, component):
    assert workload_plan(desired(spec_dict, component), None) == WorkloadPlan.APPLY


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_workload_being_deleted_is_waited_for(spec_dict, component):
    want = desired(spec_dict, component)
    live = live_copy(want, annotations={INPUTS_ANNOTATION: "0123456789abcdef0123"})
    live["metadata"]["deletionTimestamp"] = T1
    live["metadata"]["finalizers"] = ["foregroundDeletion"]
    assert workload_plan(want, live) == WorkloadPlan.WAIT
    same = live_copy(want)
    same["metadata"]["deletionTimestamp"] = T1
    assert workload_plan(want, same) == WorkloadPlan.WAIT


@pytest.mark.parametrize(
    ("component", "plan"),
    [
        (INFERENCE, WorkloadPlan.APPLY),
        (ORCHESTRATOR, WorkloadPlan.RECREATE),
        (TRAINER, WorkloadPlan.RECREATE),
    ],
)
def test_new_inputs_roll_a_statefulset_and_recreate_a_job(spec_dict, component, plan):
    old = desired(spec_dict, component)
    spec_dict[component]["args"] = ["--changed"]
    new = desired(spec_dict, component)
    assert workload_plan(new, live_copy(old)) == plan
    # a workload an older operator made, with no inputs recorded, too
    assert workload_plan(new, live_copy(old, annotations=None)) == plan
    assert workload_plan(new, live_copy(old, annotations={"other": "x"})) == plan


@pytest.mark.parametrize("component", COMPONENTS)
def test_same_inputs_and_same_activity_are_kept(spec_dict, component):
    want = desired(spec_dict, component)
    assert workload_plan(want, live_copy(want)) == WorkloadPlan.KEEP
    stopped = desired(spec_dict, component, active=False)
    assert workload_plan(stopped, live_copy(stopped)) == WorkloadPlan.KEEP


def test_same_inputs_and_other_replicas_scale_the_statefulset(spec_dict):
    running = desired(spec_dict, INFERENCE)
    stopped = desired(spec_dict, INFERENCE, active=False)
    assert (running["spec"]["replicas"], stopped["spec"]["replicas"]) == (2, 0)
    # suspend changes no inputs: the template stays, the replicas change
    assert running["metadata"]["annotations"] == stopped["metadata"]["annotations"]
    assert workload_plan(stopped, live_copy(running)) == WorkloadPlan.SCALE
    assert workload_plan(running, live_copy(stopped)) == WorkloadPlan.SCALE
    # the API server's default of 1 counts as 1
    live = live_copy(running)
    del live["spec"]["replicas"]
    assert workload_plan(running, live) == WorkloadPlan.SCALE
    one = copy.deepcopy(running)
    one["spec"]["replicas"] = 1
    assert workload_plan(one, live) == WorkloadPlan.KEEP


@pytest.mark.parametrize("component", [ORCHESTRATOR, TRAINER])
def test_same_inputs_and_other_suspend_scale_the_job(spec_dict, component):
    running = desired(spec_dict, component)
    stopped = desired(spec_dict, component, active=False)
    assert (running["spec"]["suspend"], stopped["spec"]["suspend"]) == (False, True)
    assert workload_plan(stopped, live_copy(running)) == WorkloadPlan.SCALE
    assert workload_plan(running, live_copy(stopped)) == WorkloadPlan.SCALE
    # a live Job without the field is not suspended
    live = live_copy(running)
    del live["spec"]["suspend"]
    assert workload_plan(running, live) == WorkloadPlan.KEEP
    assert workload_plan(stopped, live) == WorkloadPlan.SCALE


COMPLETE_STATUS = {
    "conditions": [
        {
            "type": "SuccessCriteriaMet",
            "status": "True",
            "reason": "CompletionsReached",
            "message": "Reached expected number of succeeded pods",
            "lastProbeTime": T1,
            "lastTransitionTime": T1,
        },
        {
            "type": "Complete",
            "status": "True",
            "reason": "CompletionsReached",
            "message": "Reached expected number of succeeded pods",
            "lastProbeTime": T1,
            "lastTransitionTime": T1,
        },
    ],
    "startTime": T0,
    "completionTime": T1,
    "succeeded": 4,
    "completedIndexes": "0-3",
    "ready": 0,
    "terminating": 0,
    "uncountedTerminatedPods": {},
}
FAILED_STATUS = {
    "conditions": [
        {
            "type": "FailureTarget",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
            "lastProbeTime": T1,
            "lastTransitionTime": T1,
        },
        {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
            "lastProbeTime": T1,
            "lastTransitionTime": T1,
        },
    ],
    "startTime": T0,
    "failed": 4,
    "ready": 0,
    "terminating": 0,
    "uncountedTerminatedPods": {},
}
SUSPENDED_STATUS = {
    "conditions": [
        {
            "type": "Suspended",
            "status": "True",
            "reason": "JobSuspended",
            "message": "Job suspended",
            "lastProbeTime": T1,
            "lastTransitionTime": T1,
        }
    ],
    "ready": 0,
    "terminating": 0,
}
RUNNING_STATUS = {"active": 4, "ready": 4, "startTime": T0, "terminating": 0}


def job_with(status, name="run1-trainer"):
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "uid": "job-uid"},
        "spec": {"suspend": False, "completions": 4, "parallelism": 4, "backoffLimit": 3},
        "status": copy.deepcopy(status),
    }


@pytest.mark.parametrize("component", [ORCHESTRATOR, TRAINER])
@pytest.mark.parametrize("status", [COMPLETE_STATUS, FAILED_STATUS], ids=["Complete", "Failed"])
def test_a_finished_job_is_left_as_it_ended(spec_dict, component, status):
    running = desired(spec_dict, component)
    stopped = desired(spec_dict, component, active=False)
    live = live_copy(running)
    live["status"] = copy.deepcopy(status)
    assert workload_plan(stopped, live) == WorkloadPlan.KEEP
    assert not needs_scaling(stopped, live)
    # an unfinished one is stopped
    live["status"] = copy.deepcopy(RUNNING_STATUS)
    assert workload_plan(stopped, live) == WorkloadPlan.SCALE


def test_needs_scaling_as_finishing_stops_a_run(spec_dict):
    """finishing.stop compares a bare stopped manifest with the live workloads."""
    sts = live_copy(desired(spec_dict, INFERENCE))
    job = live_copy(desired(spec_dict, TRAINER))
    stop_sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"replicas": 0}}
    stop_job = {"apiVersion": "batch/v1", "kind": "Job", "spec": {"suspend": True}}
    assert needs_scaling(stop_sts, sts)
    assert needs_scaling(stop_job, job)
    sts["spec"]["replicas"] = 0
    job["spec"]["suspend"] = True
    assert not needs_scaling(stop_sts, sts)
    assert not needs_scaling(stop_job, job)
    job["spec"]["suspend"] = False
    job["status"] = copy.deepcopy(COMPLETE_STATUS)
    assert not needs_scaling(stop_job, job)


@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.parametrize("active", [True, False])
def test_the_activity_manifest_holds_only_the_activity(spec_dict, component, active):
    want = desired(spec_dict, component, active=active)
    manifest = activity_manifest(want)
    # whether it has pods, and a Job's failure limit (mutable on a live Job)
    expected = {"replicas": 2 if active else 0}
    if KIND_OF[component] == "Job":
        # the trainers' Job fails at a rank's failure: the operator restarts every rank
        expected = {"suspend": not active, "backoffLimit": 3 if component == ORCHESTRATOR else 0}
    assert manifest == {
        "apiVersion": want["apiVersion"],
        "kind": KIND_OF[component],
        "metadata": {"name": f"run1-{component}", "namespace": "ml"},
        "spec": expected,
    }
    for key, value in expected.items():
        assert type(manifest["spec"][key]) is type(value)
    # a copy: applying it changes nothing else
    manifest["metadata"]["name"] = "x"
    assert want["metadata"]["name"] == f"run1-{component}"


# --- jobs --------------------------------------------------------------------------------------


def test_job_outcome():
    assert job_outcome(None) is None
    assert job_outcome({"metadata": {"name": "j"}}) is None
    assert job_outcome(job_with({})) is None
    assert job_outcome(job_with({"conditions": None})) is None
    assert job_outcome(job_with(RUNNING_STATUS)) is None
    assert job_outcome(job_with(SUSPENDED_STATUS)) is None
    assert job_outcome(job_with(COMPLETE_STATUS)) == "Complete"
    assert job_outcome(job_with(FAILED_STATUS)) == "Failed"
    # the controller's interim conditions (pods still terminating) are not an outcome
    interim = copy.deepcopy(FAILED_STATUS)
    interim["conditions"] = interim["conditions"][:1]
    assert job_outcome(job_with(interim)) is None
    interim = copy.deepcopy(COMPLETE_STATUS)
    interim["conditions"] = interim["conditions"][:1]
    assert job_outcome(job_with(interim)) is None
    # a condition that is not True is not an outcome
    false = copy.deepcopy(FAILED_STATUS)
    for cond in false["conditions"]:
        cond["status"] = "False"
    assert job_outcome(job_with(false)) is None


def pod(name, phase, *containers, init=()):
    """A Job's pod; each container is (name, state)."""

    def statuses(items):
        return [
            {
                "name": cname,
                "state": state,
                "lastState": {},
                "ready": False,
                "restartCount": 0,
                "image": "example/trainer:1",
                "imageID": "example/trainer@sha256:" + "0" * 64,
                "started": False,
            }
            for cname, state in items
        ]

    status = {"phase": phase, "startTime": T0, "containerStatuses": statuses(containers)}
    if init:
        status["initContainerStatuses"] = statuses(init)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {"batch.kubernetes.io/job-name": name.rsplit("-", 2)[0]},
        },
        "status": status,
    }


def terminated(exit_code, finished, reason=None):
    state = {
        "exitCode": exit_code,
        "reason": reason or ("Completed" if exit_code == 0 else "Error"),
        "startedAt": T0,
        "finishedAt": finished,
        "containerID": "containerd://" + "a" * 64,
    }
    return {"terminated": state}


RUNNING = {"running": {"startedAt": T0}}
WAITING = {"waiting": {"reason": "ContainerCreating"}}


def trainer_pods():
    return [
        pod("run1-trainer-0-aaaaa", "Failed", ("trainer", terminated(1, "2026-03-01T10:10:00Z"))),
        # the latest failure, listed neither first nor last
        pod(
            "run1-trainer-2-ccccc",
            "Failed",
            ("trainer", terminated(137, "2026-03-01T10:30:00Z", "OOMKilled")),
        ),
        pod("run1-trainer-1-bbbbb", "Failed", ("trainer", terminated(2, "2026-03-01T10:20:00Z"))),
        # later, but did not fail
        pod(
            "run1-trainer-3-ddddd", "Succeeded", ("trainer", terminated(0, "2026-03-01T10:50:00Z"))
        ),
        pod("run1-trainer-1-eeeee", "Running", ("trainer", RUNNING)),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "run1-trainer-1-fffff", "namespace": "ml"},
            "status": {"phase": "Pending"},
        },
    ]


def test_the_last_failed_container_is_the_latest_to_finish():
    assert last_failed_container(trainer_pods(), "trainer") == ("run1-trainer-2-ccccc", 137)
    assert last_failed_container(list(reversed(trainer_pods())), "trainer") == (
        "run1-trainer-2-ccccc",
        137,
    )
    assert last_failed_container([], "trainer") == (None, None)
    assert last_failed_container(trainer_pods()[3:], "trainer") == (None, None)


def test_the_last_failed_container_ignores_other_containers():
    pods = [
        # the orchestrator failed; its native sidecar stopped after it, with 143
        pod(
            "run1-orchestrator-aaaaa",
            "Failed",
            ("orchestrator", terminated(3, "2026-03-01T10:10:00Z")),
            init=[("payload-retention", terminated(143, "2026-03-01T10:10:30Z"))],
        ),
        # another container of a failed pod, later, and a failed pod whose container never ran
        pod(
            "run1-orchestrator-bbbbb",
            "Failed",
            ("log-shipper", terminated(1, "2026-03-01T10:40:00Z")),
            ("orchestrator", WAITING),
        ),
    ]
    assert last_failed_container(pods, "orchestrator") == ("run1-orchestrator-aaaaa", 3)
    assert last_failed_container(pods, "trainer") == (None, None)


def test_the_failure_names_the_component_reason_pod_exit_code_and_logs():
    failure = failure_of(TRAINER, job_with(FAILED_STATUS), trainer_pods(), "trainer")
    assert {k: v for k, v in failure.items() if k != "message"} == {
        "component": "trainer",
        "reason": "BackoffLimitExceeded",
        "pod": "run1-trainer-2-ccccc",
        "exitCode": 137,
    }
    message = failure["message"]
    for part in (
        "trainer",
        "4 time(s)",
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
        "run1-trainer-2-ccccc",
        "code 137",
        "kubectl logs -n ml run1-trainer-2-ccccc -c trainer",
    ):
        assert part in message, part
    # what the CRD's status.failure accepts
    parsed = RunFailure.model_validate(stored(failure))
    assert (parsed.exit_code, parsed.pod) == (137, "run1-trainer-2-ccccc")


def test_a_failure_without_failed_pods_names_no_pod():
    job = job_with(FAILED_STATUS, name="run1-orchestrator")
    failure = failure_of(ORCHESTRATOR, job, [], "orchestrator")
    assert "pod" not in failure and "exitCode" not in failure
    assert failure["component"] == "orchestrator" and failure["reason"] == "BackoffLimitExceeded"
    assert "kubectl" not in failure["message"] and "orchestrator" in failure["message"]
    RunFailure.model_validate(stored(failure))


def test_a_failure_without_a_reason_says_failed():
    status = copy.deepcopy(FAILED_STATUS)
    status["conditions"] = [
        {"type": "Failed", "status": "True", "lastTransitionTime": T1},
    ]
    failure = failure_of(TRAINER, job_with(status), trainer_pods(), "trainer")
    assert failure["reason"] == "Failed"
    assert "()" not in failure["message"]


# --- conditions ----------------------------------------------------------------------------------


def check_of(ctype: str, ok: bool) -> Check:
    """A check of the vocabulary for condition ``ctype`` with status ``ok``."""
    reason = next(r for r in REASONS[ConditionType(ctype)] if (r in TRUE_REASONS) == ok)
    return Check(ok, reason, "m")


def with_condition(conds, ctype: str, ok: bool, now: str = T0):
    """``conds`` with ``ctype`` True or False as the operator writes it; as a status edited by
    hand would have it for a status the operator never sets (Complete or Failed False)."""
    if any(r for r in REASONS[ConditionType(ctype)] if (r in TRUE_REASONS) == ok):
        return set_condition(
            conds, ConditionType(ctype), check_of(ctype, ok), generation=1, now=now
        )
    raw = {
        "type": ctype,
        "status": str(ok),
        "reason": "ByHand",
        "message": "",
        "lastTransitionTime": now,
    }
    return [*(c for c in conds if c["type"] != ctype), raw]


def conditions(**values):
    """Conditions as the operator writes them, from TYPE=True/False."""
    conds = []
    for ctype, ok in values.items():
        conds = with_condition(conds, ctype, ok)
    return conds


def running_status():
    return {
        "phase": "Running",
        "observedGeneration": 1,
        "payloadMode": "ByHandle",
        "conditions": conditions(Validated=True, VolumeReady=True, Ready=True),
    }


ORCHESTRATOR_FAILURE = failure_of(
    ORCHESTRATOR,
    job_with(FAILED_STATUS, name="run1-orchestrator"),
    [pod("run1-orchestrator-aaaaa", "Failed", ("orchestrator", terminated(3, T1)))],
    "orchestrator",
)


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (ORCHESTRATOR_FAILURE, "OrchestratorFailed"),
        (
            failure_of(TRAINER, job_with(FAILED_STATUS), trainer_pods(), "trainer"),
            "TrainerFailed",
        ),
    ],
)
def test_a_failure_fails_the_run(failure, reason):
    trainer = job_with(RUNNING_STATUS)
    checks = end_checks(Recorded.of_status(running_status()), trainer, failure)
    assert checks == {FAILED: Check(True, reason, failure["message"], warning=True)}


def test_trainers_that_complete_complete_the_run():
    checks = end_checks(Recorded.of_status(running_status()), job_with(COMPLETE_STATUS), None)
    assert checks == {COMPLETE: Check(True, "TrainersSucceeded", "every trainer exited 0 (4)")}


def test_nothing_ends_a_running_run():
    status = running_status()
    # the orchestrator finishing is not the run's end (not even an input), the trainers' is
    assert end_checks(Recorded.of_status(status), job_with(RUNNING_STATUS), None) == {}
    assert end_checks(Recorded.of_status(status), None, None) == {}  # not created yet
    assert end_checks(Recorded.of_status(status), job_with(SUSPENDED_STATUS), None) == {}


@pytest.mark.parametrize("final", [COMPLETE, FAILED])
def test_a_finished_run_gets_no_new_end(final):
    status = running_status()
    status["conditions"] = with_condition(status["conditions"], final, True, T1)
    trainer = job_with(COMPLETE_STATUS)
    assert end_checks(Recorded.of_status(status), trainer, None) == {}
    assert end_checks(Recorded.of_status(status), trainer, ORCHESTRATOR_FAILURE) == {}
    # a False one is no end
    status["conditions"] = with_condition(status["conditions"], final, False, T1)
    assert end_checks(Recorded.of_status(status), trainer, None) != {}


def test_suspend_check():
    checks = suspend_check(True, Recorded())
    assert list(checks) == [SUSPENDED]
    assert checks[SUSPENDED].ok and checks[SUSPENDED].reason == "SpecSuspended"
    assert suspend_check(True, Recorded.of_status(running_status())) == checks
    # never suspended: no condition at all
    assert suspend_check(False, Recorded()) == {}
    assert suspend_check(False, Recorded.of_status(running_status())) == {}
    # once suspended, resuming says so, and keeps saying so
    for was in (True, False):
        status = {"conditions": conditions(Validated=True, Suspended=was)}
        resumed = suspend_check(False, Recorded.of_status(status))
        assert list(resumed) == [SUSPENDED]
        assert not resumed[SUSPENDED].ok and resumed[SUSPENDED].reason == "Resumed"


def test_suspend_and_resume_through_the_status():
    status = running_status()
    checks = {READY: ready_check(False, Check(True, "WorkloadsReady", "ok"))}
    suspended = status_update(
        status, 2, checks | suspend_check(True, Recorded.of_status(status)), {}, T1
    )
    assert suspended.phase == "Suspended"
    assert ("Normal", "SpecSuspended") in [(t, r) for t, r, _ in suspended.events]
    status = {**status, **suspended.fields}
    checks = {READY: Check(False, ReadyReason.WORKLOADS_NOT_READY, "waiting")}
    resumed = status_update(
        status, 3, checks | suspend_check(False, Recorded.of_status(status)), {}, T1
    )
    assert resumed.phase == "Provisioning"
    assert ("Normal", "Resumed") in [(t, r) for t, r, _ in resumed.events]
    status = {**status, **resumed.fields}
    again = status_update(
        status, 3, checks | suspend_check(False, Recorded.of_status(status)), {}, T1
    )
    assert again.fields is None and again.events == []  # no new transition


def test_ready_check():
    ready = Check(True, "WorkloadsReady", "run1-inference 2/2 ready")
    waiting = Check(False, "WorkloadsNotReady", "waiting for run1-trainer 0/4 ready")
    assert ready_check(True, ready) is ready
    assert ready_check(True, waiting) is waiting
    for workloads_verdict in (ready, waiting):
        stopped = ready_check(False, workloads_verdict)
        assert not stopped.ok and stopped.reason == "Stopped"


@pytest.mark.parametrize(
    ("suspend", "run_phase", "runs"),
    [
        (False, None, True),
        (False, "Provisioning", True),
        (False, "Running", True),
        (False, "Suspended", True),  # resumed: the phase follows
        (True, "Running", False),
        (True, None, False),
        (False, "Succeeded", False),
        (False, "Failed", False),
        (True, "Failed", False),
        (False, "Rejected", True),
    ],
)
def test_runs_pods(suspend, run_phase, runs):
    assert runs_pods(suspend, run_phase) is runs
    assert is_final(run_phase) is (run_phase in ("Succeeded", "Failed"))


# --- phase -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({VALIDATED: False, FAILED: True, COMPLETE: True, SUSPENDED: True}, "Rejected"),
        ({VALIDATED: True, FAILED: True, COMPLETE: True, SUSPENDED: True}, "Failed"),
        ({VALIDATED: True, COMPLETE: True, SUSPENDED: True, READY: True}, "Succeeded"),
        ({VALIDATED: True, COMPLETE: True, READY: False}, "Succeeded"),
        ({VALIDATED: True, FAILED: True, READY: True}, "Failed"),
        ({VALIDATED: True, SUSPENDED: True, READY: True}, "Suspended"),
        ({VALIDATED: True, SUSPENDED: True, READY: False}, "Suspended"),
        ({VALIDATED: True, SUSPENDED: False, READY: True}, "Running"),
        ({VALIDATED: True, FAILED: False, COMPLETE: False, READY: True}, "Running"),
        ({VALIDATED: True, SUSPENDED: False, READY: False}, "Provisioning"),
        ({VALIDATED: True, VOLUME_READY: False}, "Provisioning"),
        ({}, "Provisioning"),
    ],
)
def test_phase_ordering(values, expected):
    assert phase(conditions(**values)) == expected
    assert phase(list(reversed(conditions(**values)))) == expected


def test_a_completed_run_stays_succeeded_when_ready_flips():
    status = running_status()
    trainer = job_with(COMPLETE_STATUS)
    end = end_checks(Recorded.of_status(status), trainer, None)
    done = status_update(status, 1, {**end, READY: Check(False, ReadyReason.FINISHED, "m")}, {}, T1)
    assert done.phase == "Succeeded" and done.fields["phase"] == "Succeeded"
    assert ("Normal", "TrainersSucceeded") in [(t, r) for t, r, _ in done.events]
    status = {**status, **done.fields}
    PayloadRunStatus.model_validate(status)
    for ok in (True, False, True):
        flipped = status_update(status, 1, {READY: check_of(READY, ok)}, {}, T1)
        assert flipped.phase == "Succeeded"
        assert (flipped.fields or status)["phase"] == "Succeeded"
        status = {**status, **(flipped.fields or {})}
    # and the end is not announced again
    assert end_checks(Recorded.of_status(status), trainer, None) == {}


def test_a_failed_run_is_failed_with_its_failure_in_the_status():
    status = running_status()
    end = end_checks(Recorded.of_status(status), job_with(RUNNING_STATUS), ORCHESTRATOR_FAILURE)
    fields = {"failure": ORCHESTRATOR_FAILURE, "completionTime": T1}
    update = status_update(
        status, 1, {**end, READY: Check(False, ReadyReason.FINISHED, "m")}, fields, T1
    )
    assert update.phase == "Failed"
    assert ("Warning", "OrchestratorFailed") in [(t, r) for t, r, _ in update.events]
    parsed = PayloadRunStatus.model_validate({**status, **update.fields})
    assert parsed.failure is not None and parsed.failure.exit_code == 3
    assert parsed.phase == "Failed"


def test_a_new_failure_limit_reaches_a_live_job_without_recreating_it(spec_dict):
    live = desired(spec_dict, "orchestrator", active=True)
    spec_dict["failurePolicy"] = {"backoffLimit": 9}
    want = desired(spec_dict, "orchestrator", active=True)
    assert workload_plan(want, live) == WorkloadPlan.SCALE
    assert activity_manifest(want)["spec"] == {"suspend": False, "backoffLimit": 9}
    # the trainers' Job keeps 0: the run's limit counts their restarts together (restarts.py)
    trainers = desired(spec_dict, "trainer", active=True)
    assert trainers["spec"]["backoffLimit"] == 0


# Hashes the operator before pod layout 2 gave these specs' workloads (git 8c8c80d): a run it
# started keeps them after an upgrade, so its pods do not roll.
LAYOUT_1_HASHES = {
    "0-inference": "aef710993b3a795114a6",
    "0-orchestrator": "e813751bbcddb21b6d7b",
    "0-trainer": "49074f704a1fc37b1a3a",
    "1-inference": "a18538bef0f78544026b",
    "1-orchestrator": "61cc3a216edc26444959",
    "1-trainer": "bd1008f379d72cde6da0",
}
LAYOUT_1_SPECS = [
    {
        "routerReplay": True,
        "payloads": {"mountPath": "/payloads"},
        "inference": {"image": "v", "replicas": 2},
        "orchestrator": {"image": "o"},
        "trainer": {"image": "t", "replicas": 2},
    },
    {
        "deploymentType": "SingleNode",
        "payloads": {"mountPath": "/payloads"},
        "inference": {"image": "v", "args": ["a"], "env": [{"name": "X", "value": "1"}]},
        "orchestrator": {"image": "o", "command": ["x"]},
        "trainer": {"image": "t"},
    },
]


# Printed by inputs_hash before spec.inference grew multi-node replicas (main at f0549eb).
LAYOUT_2_HASHES = {
    "0-inference": "f32ba825230d1cde66ad",
    "0-orchestrator": "b4220828b46655b5f767",
    "0-trainer": "f0edf67200cd040f0f1a",
    "1-inference": "885a6ea27043c071f18d",
    "1-orchestrator": "1c9f4aaba371494ab2b4",
    "1-trainer": "a23eeb5ae798e9cd7e26",
}
LAYOUT_2_SPECS = [
    LAYOUT_1_SPECS[0],
    {
        "routerReplay": True,
        "runDirectory": {"mountPath": "/data"},
        "inference": {
            "image": "v",
            "replicas": 3,
            "shmSize": "2Gi",
            "port": 9000,
            "template": {"spec": {"containers": [{"name": "vllm", "args": ["--x"]}]}},
        },
        "orchestrator": {"image": "o"},
        "trainer": {"image": "t", "replicas": 2, "processesPerNode": 4},
    },
]


# what a run started by 0.1.0's operator pinned: its default sidecar image (the hashes below
# were recorded with it; a later default must not move them)
RELEASED_0_1_0 = OperatorSettings(sidecar_image="ghcr.io/payloadrun/payloadrun:0.1.0")


def test_a_run_started_before_multi_node_replicas_keeps_its_hashes():
    pin = pin_of(RELEASED_0_1_0)
    got = {
        f"{i}-{c}": inputs_hash(PayloadRunSpec.model_validate(spec), c, pin)
        for i, spec in enumerate(LAYOUT_2_SPECS)
        for c in COMPONENTS
    }
    assert got == LAYOUT_2_HASHES
    # setting one of the new fields, even to what it would be, changes nothing; another value does
    spec = {**LAYOUT_2_SPECS[0], "inference": {"image": "v", "replicas": 2, "podsPerReplica": 1}}
    assert inputs_hash(PayloadRunSpec.model_validate(spec), INFERENCE, pin) == got["0-inference"]
    spec["inference"]["apiServersPerPod"] = 2
    assert inputs_hash(PayloadRunSpec.model_validate(spec), INFERENCE, pin) != got["0-inference"]


def test_a_run_started_before_pod_templates_keeps_its_hashes():
    pin = {k: v for k, v in pin_of(RELEASED_0_1_0).items() if k != "podLayout"}
    got = {
        f"{i}-{c}": inputs_hash(PayloadRunSpec.model_validate(spec), c, pin)
        for i, spec in enumerate(LAYOUT_1_SPECS)
        for c in COMPONENTS
    }
    assert got == LAYOUT_1_HASHES
    # a field of the new layout that such a run sets does change its inputs
    templated = {**LAYOUT_1_SPECS[0], "trainer": {"image": "t", "replicas": 2, "shmSize": "1Gi"}}
    assert inputs_hash(PayloadRunSpec.model_validate(templated), TRAINER, pin) != got["0-trainer"]
    # and a new run hashes its layout too
    assert (
        inputs_hash(PayloadRunSpec.model_validate(LAYOUT_1_SPECS[0]), TRAINER, pin_of(OLD))
        != (got["0-trainer"])
    )
