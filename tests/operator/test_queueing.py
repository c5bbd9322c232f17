"""A queued run and Kueue: its Workload's pod sets, the admitted flavors in its pods, where it
stands read from the Workload, and what it owes Kueue back (desired/queueing.py,
observed/queue.py, the queue's part of the status and of the apply plan)."""

from __future__ import annotations

import copy

import pytest

from builders import (
    NAME,
    NAMESPACE,
    OWNER,
    admitted_workload,
    by_kind,
    context,
    group_spec,
    kueue_condition,
    kueue_workload,
    observed_children,
    observed_run,
    run_spec,
)
from payloadrun_operator.api.conditions import (
    AdmittedReason,
    AppliedReason,
    ConditionType,
    Phase,
    ReadyReason,
    StatusField,
)
from payloadrun_operator.api.names import PLACEMENT_ANNOTATION, POD_SETS_ANNOTATION
from payloadrun_operator.desired import queueing
from payloadrun_operator.desired.builders import build_run
from payloadrun_operator.observed import queue
from payloadrun_operator.observed.plan import WorkloadPlan, workload_plan
from payloadrun_operator.observed.prerequisites import missing_checks
from payloadrun_operator.observed.readiness import RUN_PODS, Observed, run_status
from payloadrun_operator.observed.status import status_update

NOW = "2026-12-04T11:00:00Z"
GPU_FLAVOR = {
    "metadata": {"name": "h100"},
    "spec": {
        "nodeLabels": {"cloud.example/gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}
CPU_FLAVOR = {"metadata": {"name": "cpu"}, "spec": {"nodeLabels": {"pool": "cpu"}}}


def built(spec=None, **context_args):
    return build_run(context(spec, **context_args))


# --- the Workload ------------------------------------------------------------------------------


def test_the_pod_sets_are_every_pod_of_the_run_as_the_builders_composed_them():
    run = built()
    sets = {s["name"]: s for s in queueing.pod_sets(run)}
    assert {name: s["count"] for name, s in sets.items()} == {
        "inference": 2,
        "orchestrator": 1,
        "trainer": 4,
    }
    for name, pod_set in sets.items():
        assert pod_set["template"] == run.pods[name]
    # the writer sidecar is in the inference pod set: Kueue counts its requests too
    init = sets["inference"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in init if c.get("restartPolicy") == "Always"] == ["payload-writer"]


def test_a_group_run_asks_for_its_leaders_and_its_workers():
    run = built(group_spec())
    sets = {s["name"]: s for s in queueing.pod_sets(run)}
    replicas = run.ctx.spec.inference.replicas
    pods = run.ctx.spec.inference.pods_per_replica
    assert sets["inference"]["count"] == replicas
    assert sets["inference-workers"]["count"] == replicas * (pods - 1)
    assert sets["inference-workers"]["template"] == run.pods["inference-worker"]


def test_the_workload_is_the_runs_own_and_names_its_queue_and_priority():
    workload = queueing.workload_manifest(built(), "team-a", ("high", 1000))
    meta = workload["metadata"]
    assert (workload["apiVersion"], workload["kind"]) == ("kueue.x-k8s.io/v1beta2", "Workload")
    assert (meta["name"], meta["namespace"]) == (f"payloadrun-{NAME}", NAMESPACE)
    assert meta["ownerReferences"] == [OWNER]
    assert meta["labels"]["payloadrun.dev/run"] == NAME
    assert "app.kubernetes.io/component" not in meta["labels"]
    assert "kueue.x-k8s.io/queue-name" not in meta["labels"]  # Kueue reads spec.queueName
    # as Kueue's own integrations do: its preemption messages name the job by this label
    assert meta["labels"]["kueue.x-k8s.io/job-uid"] == OWNER["uid"]
    spec = workload["spec"]
    assert spec["queueName"] == "team-a"
    assert spec["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    assert spec["priority"] == 1000
    assert "priorityClassRef" not in queueing.workload_manifest(built(), "team-a")["spec"]


def test_a_change_of_pod_sets_queue_or_priority_is_a_changed_workload():
    base = queueing.workload_manifest(built(), "team-a")
    assert queueing.same_pod_sets(base, queueing.workload_manifest(built(), "team-a"))
    more = run_spec(trainer={"image": "example/trainer:1", "replicas": 8})
    for other in (
        queueing.workload_manifest(built(more), "team-a"),
        queueing.workload_manifest(built(), "team-b"),
        queueing.workload_manifest(built(), "team-a", ("high", 1)),
    ):
        assert (
            other["metadata"]["annotations"][POD_SETS_ANNOTATION]
            != (base["metadata"]["annotations"][POD_SETS_ANNOTATION])
        )
        assert not queueing.same_pod_sets(other, base)


# --- the admitted flavors in the pods ------------------------------------------------------------


def test_the_admitted_flavors_node_labels_and_tolerations_reach_each_pod_set():
    flavors = {
        "inference": {"cpu": "cpu", "nvidia.com/gpu": "h100"},
        "orchestrator": {"cpu": "cpu"},
        "trainer": {"nvidia.com/gpu": "h100"},
    }
    assert queueing.flavor_names(flavors) == ["cpu", "h100"]
    placements = queueing.placement_of(flavors, {"h100": GPU_FLAVOR, "cpu": CPU_FLAVOR})
    assert placements["inference"].node_selector == {"pool": "cpu", "cloud.example/gpu": "h100"}
    assert placements["orchestrator"] == queueing.Placement({"pool": "cpu"})
    run = built()
    placed = by_kind(queueing.placed(run, placements))
    inference = placed["StatefulSet", f"{NAME}-inference"]["spec"]["template"]["spec"]
    assert inference["nodeSelector"] == {"pool": "cpu", "cloud.example/gpu": "h100"}
    assert inference["tolerations"] == GPU_FLAVOR["spec"]["tolerations"]
    trainer = placed["Job", f"{NAME}-trainer"]["spec"]["template"]["spec"]
    assert trainer["nodeSelector"] == {"cloud.example/gpu": "h100"}
    marks = {
        key: child["metadata"].get("annotations", {}).get(PLACEMENT_ANNOTATION)
        for key, child in placed.items()
        if child["kind"] in ("StatefulSet", "Job")
    }
    assert all(marks.values()) and len(set(marks.values())) == 3, marks
    # the rest as built, and the built children untouched
    unplaced = by_kind(run.children)
    assert placed["ConfigMap", f"{NAME}-settings"] == unplaced["ConfigMap", f"{NAME}-settings"]
    assert "nodeSelector" not in unplaced["Job", f"{NAME}-trainer"]["spec"]["template"]["spec"]
    assert queueing.placed(run, {}) == list(run.children)


def test_a_group_runs_leaders_and_workers_are_placed_as_their_pod_sets():
    placements = {
        "inference": queueing.Placement({"role": "head"}),
        "inference-workers": queueing.Placement({"role": "worker"}),
    }
    placed = by_kind(queueing.placed(built(group_spec()), placements))
    group = placed["LeaderWorkerSet", f"{NAME}-vllm"]["spec"]["leaderWorkerTemplate"]
    assert group["leaderTemplate"]["spec"]["nodeSelector"] == {"role": "head"}
    assert group["workerTemplate"]["spec"]["nodeSelector"] == {"role": "worker"}


def test_a_new_placement_reaches_a_workload_about_to_run_and_nothing_else():
    run = built()
    children = by_kind(run.children)
    placements = {"trainer": queueing.Placement({"pool": "a"})}
    job = by_kind(queueing.placed(run, placements))["Job", f"{NAME}-trainer"]
    suspended = copy.deepcopy(children["Job", f"{NAME}-trainer"])
    suspended["spec"]["suspend"] = True  # as a queued run's Job waits
    # admitted: the suspended Job takes its placement in place (a suspended Job's scheduling
    # directives may change), a running one (placed elsewhere) is recreated
    assert workload_plan(job, suspended) == WorkloadPlan.APPLY
    running = copy.deepcopy(suspended)
    running["spec"]["suspend"] = False
    assert workload_plan(job, running) == WorkloadPlan.RECREATE
    # placed as wanted: only its activity
    assert (
        workload_plan(job, copy.deepcopy(job) | {"spec": {"suspend": True}}) == WorkloadPlan.SCALE
    )
    # stopping (evicted): the placement stays as it was, only the activity changes
    stopped = by_kind(build_run(context(active=False)).children)["Job", f"{NAME}-trainer"]
    assert workload_plan(stopped, copy.deepcopy(job) | {"spec": {"suspend": False}}) == (
        WorkloadPlan.SCALE
    )


# --- where the run stands ------------------------------------------------------------------------


PENDING_MESSAGE = (
    "couldn't assign flavors to pod set trainer: insufficient unused quota for nvidia.com/gpu in "
    "flavor h100, 4 more needed"
)
NEVER_FITS_MESSAGE = (
    "couldn't assign flavors to pod set trainer: insufficient quota for nvidia.com/gpu in flavor "
    "h100, previously considered podsets requests (0) + current podset request (8) > maximum "
    "capacity (4)"
)


@pytest.mark.parametrize(
    ("workload", "state", "reason"),
    [
        (None, queue.QueueState.MISSING, AdmittedReason.PENDING),
        (kueue_workload(), queue.QueueState.PENDING, AdmittedReason.PENDING),
        (
            kueue_workload(kueue_condition("QuotaReserved", False, "Pending", PENDING_MESSAGE)),
            queue.QueueState.PENDING,
            AdmittedReason.PENDING,
        ),
        (
            kueue_workload(
                kueue_condition("QuotaReserved", False, "Inadmissible", "LocalQueue x is missing")
            ),
            queue.QueueState.PENDING,
            AdmittedReason.INADMISSIBLE,
        ),
        (
            # quota reserved, admission checks pending: not admitted yet
            kueue_workload(
                kueue_condition("QuotaReserved", True, "QuotaReserved"),
                flavors={"inference": {"cpu": "cpu"}},
            ),
            queue.QueueState.PENDING,
            AdmittedReason.PENDING,
        ),
        (admitted_workload({"inference": {"cpu": "cpu"}}), queue.QueueState.ADMITTED, None),
        (
            admitted_workload(
                {"inference": {"cpu": "cpu"}},
            )
            | {
                "status": admitted_workload({"inference": {"cpu": "cpu"}})["status"]
                | {
                    "conditions": [
                        *admitted_workload({})["status"]["conditions"],
                        kueue_condition("Evicted", True, "Preempted", "preempted by run2"),
                    ]
                }
            },
            queue.QueueState.EVICTED,
            AdmittedReason.EVICTED,
        ),
        (
            kueue_workload(kueue_condition("Finished", True, "Succeeded")),
            queue.QueueState.FINISHED,
            AdmittedReason.FINISHED,
        ),
    ],
)
def test_where_a_queued_run_stands(workload, state, reason):
    admission = queue.admission_of(workload)
    assert admission.state is state
    check = queue.admitted_check("team-a", admission)
    assert check.ok == (state is queue.QueueState.ADMITTED)
    if reason is not None:
        assert check.reason == reason
    assert admission.runs_pods == (state is queue.QueueState.ADMITTED)


def test_kueues_own_words_say_why_a_run_waits():
    waiting = kueue_workload(kueue_condition("QuotaReserved", False, "Pending", PENDING_MESSAGE))
    check = queue.admitted_check("team-a", queue.admission_of(waiting))
    assert (check.reason, check.warning) == (AdmittedReason.PENDING, False)
    assert check.message == f"waiting for quota in LocalQueue team-a: {PENDING_MESSAGE}"
    # v0.19 says Pending for both: its message tells a run that can never fit
    never = kueue_workload(kueue_condition("QuotaReserved", False, "Pending", NEVER_FITS_MESSAGE))
    check = queue.admitted_check("team-a", queue.admission_of(never))
    assert (check.reason, check.warning) == (AdmittedReason.INADMISSIBLE, True)
    assert NEVER_FITS_MESSAGE in check.message
    too_big = kueue_workload(kueue_condition("QuotaReserved", False, "ExceedsMaxQuota", "8 > 4"))
    check = queue.admitted_check("team-a", queue.admission_of(too_big))
    assert (check.reason, check.warning) == (AdmittedReason.INADMISSIBLE, True)
    assert "8 > 4" in check.message


def test_the_status_names_the_queue_and_once_admitted_its_cluster_queue_and_flavors():
    admitted = queue.admission_of(
        admitted_workload({"inference": {"cpu": "cpu", "nvidia.com/gpu": "h100"}})
    )
    assert queue.queue_status("team-a", NAME, admitted) == {
        "name": "team-a",
        "workload": f"payloadrun-{NAME}",
        "clusterQueue": "team-cq",
        "flavors": {"inference": ["cpu", "h100"]},
    }
    waiting = queue.admission_of(kueue_workload())
    assert queue.queue_status("team-a", NAME, waiting) == {
        "name": "team-a",
        "workload": f"payloadrun-{NAME}",
    }


def test_a_change_of_flavors_or_state_is_news_for_the_run_and_nothing_else_is():
    one = admitted_workload({"inference": {"cpu": "cpu"}})
    assert queue.gate_key(one) == queue.gate_key(copy.deepcopy(one))
    elsewhere = admitted_workload({"inference": {"cpu": "spot"}})
    assert queue.gate_key(one) != queue.gate_key(elsewhere)
    assert queue.gate_key(one) != queue.gate_key(kueue_workload())
    assert queue.gate_key(None) == queue.gate_key(None)


# --- what the run owes Kueue ----------------------------------------------------------------------


def evicted(reason="Preempted"):
    workload = admitted_workload({"inference": {"cpu": "cpu"}})
    workload["status"]["conditions"].append(
        kueue_condition("Evicted", True, reason, "Preempted to accommodate a higher priority")
    )
    return workload


def test_an_evicted_run_gives_its_quota_back_once_its_pods_are_gone():
    admission = queue.admission_of(evicted())
    assert queue.duty(admission, final=False, pods_running=True) is queue.Duty.NONE
    assert queue.duty(admission, final=False, pods_running=False) is queue.Duty.RELEASE
    status = queue.duty_status(evicted(), queue.Duty.RELEASE, NOW)
    assert status["admission"] is None
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["QuotaReserved"]["status"], conds["QuotaReserved"]["reason"]) == (
        "False",
        "Pending",
    )
    assert conds["Admitted"]["status"] == "False"
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("True", "Preempted")
    assert conds["Evicted"]["status"] == "True"  # Kueue's, kept
    # released: waiting again, not evicted
    after = evicted()
    after["status"] = status
    assert queue.admission_of(after).state is queue.QueueState.PENDING
    # a deactivated Workload is not queued again
    off = queue.duty_status(evicted("Deactivated"), queue.Duty.RELEASE, NOW)
    assert {c["type"]: c["status"] for c in off["conditions"]}["Requeued"] == "False"


def test_a_finished_run_releases_its_quota_at_once():
    admission = queue.admission_of(admitted_workload({"inference": {"cpu": "cpu"}}))
    assert queue.duty(admission, final=True, pods_running=True) is queue.Duty.FINISH
    done = queue.duty_status(admitted_workload({}), queue.Duty.FINISH, NOW, failed=True)
    finished = [c for c in done["conditions"] if c["type"] == "Finished"]
    assert [(c["status"], c["reason"]) for c in finished] == [("True", "Failed")]
    already = queue.admission_of(kueue_workload(kueue_condition("Finished", True, "Succeeded")))
    assert queue.duty(already, final=True, pods_running=False) is queue.Duty.NONE


# --- the run's status ----------------------------------------------------------------------------


def queued_run(phase="Provisioning", **labels):
    queue_label = {"kueue.x-k8s.io/queue-name": "team-a", **labels}
    spec = {"failurePolicy": {"backoffLimit": 2}}
    return observed_run(spec, uid="run-uid", labels=queue_label, phase=phase, payloadMode="Inline")


def test_a_run_waiting_for_quota_is_queued_not_ready():
    waiting = kueue_workload(kueue_condition("QuotaReserved", False, "Pending", PENDING_MESSAGE))
    result = run_status(queued_run(), Observed(observed_children(waiting)), NOW)
    assert result.checks[ConditionType.READY].reason == ReadyReason.QUEUED
    admitted = result.checks[ConditionType.ADMITTED]
    assert (admitted.ok, admitted.reason) == (False, AdmittedReason.PENDING)
    assert PENDING_MESSAGE in admitted.message
    assert result.fields[StatusField.QUEUE]["name"] == "team-a"
    update = status_update({}, 1, result.checks, result.fields, NOW)
    assert update.phase == Phase.QUEUED


def test_an_admitted_run_is_ready_when_its_workloads_are():
    workload = admitted_workload({"inference": {"cpu": "cpu"}})
    result = run_status(queued_run(), Observed(observed_children(workload)), NOW)
    assert result.checks[ConditionType.ADMITTED].ok
    assert result.checks[ConditionType.READY].reason == ReadyReason.WORKLOADS_NOT_READY
    update = status_update({}, 1, result.checks, result.fields, NOW)
    assert update.phase == Phase.PROVISIONING


def test_an_evicted_run_lists_its_pods_and_owes_the_quota_once_none_runs():
    result = run_status(queued_run(), Observed(observed_children(evicted())), NOW)
    assert RUN_PODS in result.wants
    running = [{"metadata": {"name": "run1-trainer-0"}, "status": {"phase": "Running"}}]
    result = run_status(queued_run(), Observed(observed_children(evicted()), run_pods=running), NOW)
    assert result.queue_duty is queue.Duty.NONE and not result.wants
    assert result.checks[ConditionType.ADMITTED].reason == AdmittedReason.EVICTED
    result = run_status(queued_run(), Observed(observed_children(evicted()), run_pods=[]), NOW)
    assert result.queue_duty is queue.Duty.RELEASE


def test_a_finished_queued_run_marks_its_workload_finished():
    workload = admitted_workload({"inference": {"cpu": "cpu"}})
    result = run_status(queued_run(phase="Succeeded"), Observed(observed_children(workload)), NOW)
    assert result.queue_duty is queue.Duty.FINISH


def test_a_run_without_a_queue_has_no_admitted_condition():
    body = queued_run()
    body["metadata"]["labels"] = {}
    result = run_status(body, Observed(observed_children(evicted())), NOW)
    assert ConditionType.ADMITTED not in result.checks
    assert StatusField.QUEUE not in result.fields
    assert result.queue_duty is queue.Duty.NONE


def test_a_queued_run_without_kueue_gets_nothing_and_says_why():
    assert missing_checks(1, lws_served=False, queue=None, kueue_served=False) == {}
    assert missing_checks(1, lws_served=False, queue="team-a", kueue_served=True) == {}
    checks = missing_checks(1, lws_served=False, queue="team-a", kueue_served=False)
    applied = checks[ConditionType.APPLIED]
    assert (applied.ok, applied.reason, applied.warning) == (
        False,
        AppliedReason.KUEUE_MISSING,
        True,
    )
    assert "kueue.x-k8s.io/queue-name=team-a" in applied.message
    assert "remove the label" in applied.message
    assert checks[ConditionType.READY].reason == ReadyReason.KUEUE_MISSING


def test_a_run_whose_queue_label_was_removed_leaves_queued_behind():
    body = queued_run()
    waiting = run_status(body, Observed(observed_children(kueue_workload())), NOW)
    before = status_update({}, 1, waiting.checks, waiting.fields, NOW)
    assert before.phase == Phase.QUEUED
    body["metadata"]["labels"] = {}
    body["status"] |= before.fields
    result = run_status(body, Observed(observed_children()), NOW)
    assert result.fields[StatusField.QUEUE] is None  # removed from the status (a merge patch)
    after = status_update(
        body["status"], 1, result.checks, result.fields, NOW, dropped=result.dropped
    )
    assert after.fields is not None
    assert "Admitted" not in {c["type"] for c in after.fields["conditions"]}
    assert after.phase == Phase.PROVISIONING


def test_a_run_whose_pods_started_unqueued_runs_on_and_says_so():
    body = queued_run(phase="Running")
    body["status"]["startTime"] = NOW  # started (by 0.1.0, or before the label), never queued
    assert queue.started_unqueued(body)
    assert queue.queue_in_effect(body) is None
    result = run_status(body, Observed(observed_children()), NOW)
    admitted = result.checks[ConditionType.ADMITTED]
    assert (admitted.ok, admitted.reason, admitted.warning) == (
        False,
        AdmittedReason.STARTED_UNQUEUED,
        True,
    )
    assert "(team-a)" in admitted.message
    assert "spec.suspend: true" in admitted.message
    assert result.checks[ConditionType.READY].reason != ReadyReason.QUEUED
    assert StatusField.QUEUE not in result.fields
    assert result.queue_duty is queue.Duty.NONE
    update = status_update({}, 1, result.checks, result.fields, NOW, dropped=result.dropped)
    assert update.phase != Phase.QUEUED
    assert update.fields is not None
    assert "Admitted" in {c["type"] for c in update.fields["conditions"]}


def test_a_label_takes_effect_at_the_start_or_while_suspended_and_a_queued_run_stays_queued():
    body = queued_run()
    assert queue.queue_in_effect(body) == "team-a"  # not started yet
    body["status"]["startTime"] = NOW
    assert queue.queue_in_effect(body) is None  # its pods started unqueued
    body["spec"]["suspend"] = True
    assert queue.queue_in_effect(body) == "team-a"  # no pods to stop
    body["spec"]["suspend"] = False
    body["status"]["queue"] = {"name": "team-a", "workload": f"payloadrun-{NAME}"}
    assert queue.queue_in_effect(body) == "team-a"  # queued since it started
    body["metadata"]["labels"] = {}
    assert queue.queue_in_effect(body) is None and not queue.started_unqueued(body)
