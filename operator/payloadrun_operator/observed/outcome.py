"""How a run ends, read from its Jobs, and the conditions that say it.

The trainers are an Indexed Job: when it completes (every trainer exited 0) the run is
Succeeded. The orchestrator and the trainers fail when their Job does (more failed pods than
``spec.failurePolicy.backoffLimit``): the run is Failed, with the component, the Job's reason and
the exit code of the container that failed (the last one, or the first: the cause, for a group
whose Job fails at its first failure). Both are final, as a Job's are. A suspended run, or one
that ended, is not Ready and says why (:func:`ready_check`, :func:`suspend_check`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from payloadrun_operator.api.conditions import (
    JOB_COMPLETE,
    JOB_FAILED,
    CompleteReason,
    ConditionType,
    FailedReason,
    ReadyReason,
    SuspendedReason,
)
from payloadrun_operator.api.models import ConditionStatus
from payloadrun_operator.api.names import ORCHESTRATOR, TRAINER
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.observed.status import Check

# status.failure.component -> the Failed condition's reason
FAILED_REASONS = {
    ORCHESTRATOR: FailedReason.ORCHESTRATOR_FAILED,
    TRAINER: FailedReason.TRAINER_FAILED,
}


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


def end_checks(
    recorded: Recorded,
    trainer: Mapping[str, Any] | None,
    failure: Mapping[str, Any] | None,
) -> dict[ConditionType, Check]:
    """Failed once a component's Job has (``failure``), Complete once the trainers' Job is (the
    orchestrator exiting 0 is not the run's end); nothing before, and nothing new after."""
    if recorded.holds(ConditionType.COMPLETE) or recorded.holds(ConditionType.FAILED):
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


def suspend_check(suspend: bool, recorded: Recorded) -> dict[ConditionType, Check]:
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
    if recorded.condition(ConditionType.SUSPENDED) is not None:
        return {
            ConditionType.SUSPENDED: Check(
                False, SuspendedReason.RESUMED, "spec.suspend is false: the pods run"
            )
        }
    return {}


def ready_check(active: bool, workloads: Check) -> Check:
    """Ready while active is the workloads' readiness; a stopped run is not ready, and says why."""
    if active:
        return workloads
    return Check(
        False, ReadyReason.STOPPED, "the run is suspended or finished: its workloads have no pods"
    )
