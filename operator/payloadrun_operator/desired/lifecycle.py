"""A run's lifecycle, as pure functions: what it runs with, whether its pods run, how it ends.

- **Pinned sidecars.** A run records in its status, when it starts, the sidecar image and the
  settings the operator injects (:data:`PIN_FIELDS`). Every later reconcile builds from that
  record, so an operator restart or upgrade with new defaults leaves a live run as it is; new
  runs get the new defaults. The annotation ``rollout.payloadrun.dev/sidecars`` set to a new
  value takes the operator's current settings again (an explicit roll).
- **Inputs.** Each workload carries the hash of what its template is built from
  (:func:`inputs_hash`): the part of the spec that concerns it and the pinned settings it uses.
  A reconcile that finds the hash unchanged leaves the template alone, whatever code built it,
  and changing one component's spec rolls that component only.
- **Activity.** Pods run unless ``spec.suspend`` is set or the run has finished.
- **The end.** The trainers are an Indexed Job: when it completes (every trainer exited 0) the
  run is Succeeded. The orchestrator and the trainers fail when their Job does (more failed pods
  than ``spec.failurePolicy.backoffLimit``): the run is Failed, with the component, the Job's
  reason and the exit code of the last failed container. Both are final, as a Job's are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from payloadrun_operator.api.conditions import (
    JOB_COMPLETE,
    JOB_FAILED,
    PHASE_FAILED,
    PHASE_SUCCEEDED,
    CompleteReason,
    ConditionType,
    FailedReason,
    ReadyReason,
    SuspendedReason,
)
from payloadrun_operator.api.models import ConditionStatus, PayloadRunSpec
from payloadrun_operator.api.names import (
    INFERENCE,
    INPUTS_ANNOTATION,
    ORCHESTRATOR,
    ROLLOUT_ANNOTATION,
    TRAINER,
)
from payloadrun_operator.desired.decisions import decide_payload_mode
from payloadrun_operator.observed.status import Check, condition
from payloadrun_operator.platform.settings import OperatorSettings

FINAL_PHASES = (PHASE_SUCCEEDED, PHASE_FAILED)
# status.failure.component -> the Failed condition's reason
FAILED_REASONS = {
    ORCHESTRATOR: FailedReason.ORCHESTRATOR_FAILED,
    TRAINER: FailedReason.TRAINER_FAILED,
}

# The layout of the pods the operator builds: 1 before pod templates, 2 since (templates, the run
# directory, addresses, rendezvous, /dev/shm, trainers restarted together). A run records the
# layout it started with in status.sidecars.podLayout (absent: 1); its workloads' inputs are
# hashed as that layout's were, so an operator upgrade does not roll it, and its trainers fail
# as that layout's did. The rollout annotation moves it onto the current layout.
POD_LAYOUT = 2
# Spec fields that layout 2 added, as (section or None for the spec, field, default): left out of
# a layout-1 run's inputs while they have their default, as they were before they existed.
LAYOUT_2_FIELDS = (
    (None, "runDirectory", None),
    (INFERENCE, "shmSize", None),
    (INFERENCE, "template", None),
    (ORCHESTRATOR, "template", None),
    (TRAINER, "processesPerNode", 1),
    (TRAINER, "shmSize", None),
    (TRAINER, "payloadAccess", "ReadOnly"),
    (TRAINER, "template", None),
)

# status.sidecars key -> the OperatorSettings field it pins.
PIN_FIELDS = {
    "image": "sidecar_image",
    "imagePullPolicy": "sidecar_image_pull_policy",
    "uid": "sidecar_uid",
    "logFormat": "sidecar_log_format",
    "writerResources": "writer_resources",
    "retentionResources": "retention_resources",
}
# The pinned settings each workload's template uses (the trainers only share the pods' fsGroup).
PINS_USED = {
    INFERENCE: ("image", "imagePullPolicy", "uid", "logFormat", "writerResources"),
    ORCHESTRATOR: ("image", "imagePullPolicy", "uid", "logFormat", "retentionResources"),
    TRAINER: ("uid",),
}
# Spec fields that concern one workload only, or none's template.
COMPONENT_FIELDS = (INFERENCE, ORCHESTRATOR, TRAINER)
NOT_IN_TEMPLATES = ("suspend", "failurePolicy")
# A component's fields that no template uses (its NetworkPolicy's clients): a change rolls no pod.
NOT_IN_COMPONENT_TEMPLATES = {INFERENCE: ("clients",)}


# --- pinned sidecars -------------------------------------------------------------------------


def pin_of(settings: OperatorSettings, rollout: str | None = None) -> dict[str, Any]:
    """The record of ``settings`` a run keeps in ``status.sidecars`` (with today's layout)."""
    pin: dict[str, Any] = {key: getattr(settings, attr) for key, attr in PIN_FIELDS.items()}
    pin["podLayout"] = POD_LAYOUT
    if rollout is not None:
        pin["rollout"] = rollout
    return pin


def current_pin(
    settings: OperatorSettings, status: Mapping[str, Any], annotations: Mapping[str, str]
) -> dict[str, Any]:
    """The record this reconcile builds with: the run's own, or the operator's current settings
    for a run that has none yet or whose rollout annotation asks for them."""
    recorded = status.get("sidecars")
    wanted = annotations.get(ROLLOUT_ANNOTATION)
    # removing the annotation is no request: the run keeps what it has
    if recorded and (wanted is None or recorded.get("rollout") == wanted):
        return dict(recorded)
    return pin_of(settings, wanted)


def layout_of(pin: Mapping[str, Any]) -> int:
    """The pod layout a run's record says it was started with (1: recorded before layouts)."""
    return int(pin.get("podLayout") or 1)


def pinned_settings(settings: OperatorSettings, pin: Mapping[str, Any]) -> OperatorSettings:
    """The operator's settings with the run's pinned ones in place of the current defaults."""
    values = {attr: pin[key] for key, attr in PIN_FIELDS.items() if key in pin}
    return dataclasses.replace(settings, **values)


# --- inputs -----------------------------------------------------------------------------------


def inputs_hash(spec: PayloadRunSpec, component: str, pin: Mapping[str, Any]) -> str:
    """What ``component``'s template is built from, hashed: the run-wide spec, the payload mode
    (which inference.disaggregated alone can change), the component's own section and, by
    handle, the pinned settings it uses; the orchestrator also the inference ports it calls and
    (layout 2) the number of replicas its admin URLs list. Neither suspend, the failure policy
    nor inference.clients (its NetworkPolicy's) is part of any template. A layout-1 run's
    inputs leave out the fields added since while they are unset (:data:`LAYOUT_2_FIELDS`), so
    they hash as they did then."""
    data = spec.model_dump(mode="json", by_alias=True)
    layout = layout_of(pin)
    if layout < 2:
        for section, name, default in LAYOUT_2_FIELDS:
            where = data if section is None else data[section]
            if where.get(name) == default:
                where.pop(name, None)
    for name in NOT_IN_COMPONENT_TEMPLATES.get(component, ()):
        data[component].pop(name, None)
    skipped = (*COMPONENT_FIELDS, *NOT_IN_TEMPLATES)
    by_handle = decide_payload_mode(spec).by_handle
    inputs: dict[str, Any] = {
        "run": {k: v for k, v in data.items() if k not in skipped},
        "byHandle": by_handle,
        component: data[component],
        "sidecars": {key: pin.get(key) for key in PINS_USED[component]} if by_handle else {},
    }
    if component == ORCHESTRATOR:
        inference = data[INFERENCE]
        inputs["inferencePorts"] = [inference["port"], inference["writer"]["port"]]
        if layout >= 2:
            inputs["inferenceReplicas"] = inference["replicas"]
    if layout >= 2:
        inputs["podLayout"] = layout
    encoded = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:20]


# --- activity ---------------------------------------------------------------------------------


def is_final(phase: str | None) -> bool:
    return phase in FINAL_PHASES


def runs_pods(suspend: bool, phase: str | None) -> bool:
    """Whether the run's workloads should have pods."""
    return not suspend and not is_final(phase)


# --- jobs -------------------------------------------------------------------------------------


def job_outcome(job: Mapping[str, Any] | None) -> str | None:
    """``Complete`` or ``Failed`` once the Job has finished, else None."""
    for cond in (job or {}).get("status", {}).get("conditions") or []:
        if (
            cond.get("type") in (JOB_COMPLETE, JOB_FAILED)
            and cond.get("status") == ConditionStatus.TRUE
        ):
            return str(cond["type"])
    return None


def job_failure_reason(job: Mapping[str, Any]) -> tuple[str, str]:
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") == JOB_FAILED and cond.get("status") == ConditionStatus.TRUE:
            return cond.get("reason") or JOB_FAILED, cond.get("message") or ""
    return JOB_FAILED, ""


def failed_containers(
    pods: Iterable[Mapping[str, Any]], container: str
) -> list[tuple[str, str, int | None]]:
    """``(finishedAt, pod, exit code)`` of every failed pod of a Job, in the order they ended."""
    found = []
    for pod in pods:
        if pod.get("status", {}).get("phase") != "Failed":
            continue
        for status in pod["status"].get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated")
            if status.get("name") == container and terminated:
                when = terminated.get("finishedAt") or ""
                found.append((when, pod["metadata"]["name"], terminated.get("exitCode")))
    return sorted(found)


def last_failed_container(
    pods: Iterable[Mapping[str, Any]], container: str
) -> tuple[str | None, int | None]:
    """The most recent failed pod of a Job and its container's exit code."""
    found = failed_containers(pods, container)
    return (found[-1][1], found[-1][2]) if found else (None, None)


def first_failed_container(
    pods: Iterable[Mapping[str, Any]], container: str
) -> tuple[str | None, int | None]:
    """The pod of a Job that failed first, and its container's exit code: in a group whose Job
    fails at its first failure (the trainers), the cause; the others were stopped after it."""
    found = failed_containers(pods, container)
    return (found[0][1], found[0][2]) if found else (None, None)


def failure_of(
    component: str,
    job: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    container: str,
    *,
    lead: str | None = None,
    first: bool = False,
) -> dict[str, Any]:
    """``status.failure`` for a component whose Job failed (``lead``: what happened, when the
    Job's own count of failed pods does not say it; ``first``: name the pod that failed first,
    the cause, rather than the last)."""
    reason, job_message = job_failure_reason(job)
    pick = first_failed_container if first else last_failed_container
    pod, exit_code = pick(pods, container)
    failed = job.get("status", {}).get("failed", 0)
    message = f"{lead or f'the {component} failed {failed} time(s)'}: {reason}"
    if job_message:
        message += f" ({job_message})"
    if pod:
        namespace = job["metadata"]["namespace"]
        message += (
            f"; the {'first' if first else 'last'} failed pod {pod} exited with code {exit_code}"
        )
        message += f" (kubectl logs -n {namespace} {pod} -c {container})"
    failure: dict[str, Any] = {"component": component, "reason": reason, "message": message}
    if pod:
        failure["pod"] = pod
        failure["exitCode"] = exit_code
    return failure


# --- conditions -------------------------------------------------------------------------------


def end_checks(
    status: Mapping[str, Any],
    trainer: Mapping[str, Any] | None,
    failure: Mapping[str, Any] | None,
) -> dict[ConditionType, Check]:
    """Failed once a component's Job has (``failure``), Complete once the trainers' Job is (the
    orchestrator exiting 0 is not the run's end); nothing before, and nothing new after."""
    conds = status.get("conditions") or []
    if any(
        (condition(conds, c) or {}).get("status") == ConditionStatus.TRUE
        for c in (ConditionType.COMPLETE, ConditionType.FAILED)
    ):
        return {}
    if failure is not None:
        reason = FAILED_REASONS[failure["component"]]
        return {ConditionType.FAILED: Check(True, reason, failure["message"], warning=True)}
    if job_outcome(trainer) == JOB_COMPLETE:
        done = (trainer or {}).get("status", {}).get("succeeded", 0)
        return {
            ConditionType.COMPLETE: Check(
                True, CompleteReason.TRAINERS_SUCCEEDED, f"every trainer exited 0 ({done})"
            )
        }
    return {}


def suspend_check(suspend: bool, status: Mapping[str, Any]) -> dict[ConditionType, Check]:
    """Suspended while spec.suspend is set; False (resumed) once a suspended run resumes."""
    if suspend:
        return {
            ConditionType.SUSPENDED: Check(
                True,
                SuspendedReason.SPEC_SUSPENDED,
                "spec.suspend is true: no pod runs; "
                "the claim, the payload directory and the journal stay",
            )
        }
    if condition(status.get("conditions") or [], ConditionType.SUSPENDED) is not None:
        return {
            ConditionType.SUSPENDED: Check(
                False, SuspendedReason.RESUMED, "spec.suspend is false: the pods run"
            )
        }
    return {}


# --- applying workloads -----------------------------------------------------------------------

APPLY = "apply"  # create it, or bring its template up to date (a StatefulSet rolls)
SCALE = "scale"  # same template: only its activity fields (pods or not, failure limit) change
KEEP = "keep"  # nothing to write
RECREATE = "recreate"  # a Job whose inputs changed: its template is immutable, so delete it first
WAIT = "wait"  # the previous Job is still being deleted


def activity_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a workload that change without its template: whether it has pods (a
    StatefulSet's replicas, a Job's suspend) and a Job's failure limit."""
    spec = manifest.get("spec", {})
    if manifest.get("kind") == "Job":
        fields = {"suspend": bool(spec.get("suspend", False))}
        if "backoffLimit" in spec:
            fields["backoffLimit"] = spec["backoffLimit"]
        return fields
    return {"replicas": spec.get("replicas", 1)}


def activity_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Only the activity fields of ``manifest``, for the activity field manager's apply."""
    meta = manifest["metadata"]
    return {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": activity_of(manifest),
    }


def workload_plan(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> str:
    """What to do to bring the live workload to ``desired`` without disturbing what is equal."""
    if live is None:
        return APPLY
    if live["metadata"].get("deletionTimestamp"):
        return WAIT
    wanted = desired["metadata"].get("annotations", {}).get(INPUTS_ANNOTATION)
    if (live["metadata"].get("annotations") or {}).get(INPUTS_ANNOTATION) != wanted:
        return RECREATE if desired["kind"] == "Job" else APPLY
    return SCALE if needs_scaling(desired, live) else KEEP


def needs_scaling(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether the live workload's activity differs from ``desired``'s (a finished Job is left
    as it ended: it has no pods to start or stop)."""
    wanted = activity_of(desired)
    live_activity = activity_of({"kind": desired["kind"], "spec": live.get("spec", {})})
    if all(live_activity.get(key) == value for key, value in wanted.items()):
        return False
    return not (desired["kind"] == "Job" and job_outcome(live))


def ready_check(active: bool, workloads: Check) -> Check:
    """Ready while active is the workloads' readiness; a stopped run is not ready, and says why."""
    if active:
        return workloads
    return Check(
        False, ReadyReason.STOPPED, "the run is suspended or finished: its workloads have no pods"
    )
