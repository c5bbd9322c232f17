"""A run's status from its children: the one function that computes it (:func:`refresh_run`).

:func:`refresh_run` recomputes ``VolumeReady``, ``Ready``, ``Suspended`` and the run's end
(``Complete``, ``Failed``: :mod:`outcome`) from the run and its children with pure functions,
and writes what changed (guarded by the run's resourceVersion) with an event per transition. A
run that has ended is stopped and its payloads released (:mod:`finishing`), and a failed rank
restarts every trainer (:mod:`restarts`). :mod:`following` calls it whenever a watch event
touches the run or one of its children, from a cache of what the watches delivered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from payloadrun_operator.api.conditions import (
    JOB_FAILED,
    ConditionType,
    Phase,
    ReadyReason,
)
from payloadrun_operator.api.models import KIND, FailurePolicy
from payloadrun_operator.api.names import (
    API_VERSION,
    ORCHESTRATOR,
    ORCHESTRATOR_CONTAINER,
    TRAINER,
    TRAINER_CONTAINER,
    WORKLOADS,
    child_name,
)
from payloadrun_operator.desired import context, pinning
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.desired.builders import build_trainer
from payloadrun_operator.observed import finishing, outcome, restarts
from payloadrun_operator.observed.status import Check, claim_check, status_update, workloads_check
from payloadrun_operator.platform.metrics import UNKNOWN_MODE
from payloadrun_operator.platform.runtime import Operator

log = logging.getLogger("payloadrun.readiness")
CONTAINERS = {ORCHESTRATOR: ORCHESTRATOR_CONTAINER, TRAINER: TRAINER_CONTAINER}
FINISHED = Check(False, ReadyReason.FINISHED, "the run has finished: its workloads have no pods")


@dataclass(frozen=True)
class Refreshed:
    """What a refresh did: ``written`` the status; ``recheck``: look again soon, for what no
    watch reports (a claim the run brings carries no label of ours, so nothing watches it)."""

    written: bool
    recheck: bool = False


def follows(run: dict[str, Any]) -> bool:
    """Only runs whose current generation was reconciled and accepted have children to follow."""
    status = run.get("status") or {}
    return status.get("observedGeneration") == run["metadata"].get("generation") and status.get(
        "phase"
    ) not in (None, Phase.REJECTED)


async def refresh_run(
    op: Operator, run: dict[str, Any], children: finishing.Children, now: str
) -> Refreshed:
    """Recompute one run's conditions from its children; act on its end."""
    client = op.client
    meta, status = run["metadata"], run["status"]
    ns, name = meta["namespace"], meta["name"]
    checks: dict[ConditionType, Check] = {}
    fields: dict[str, Any] = {}
    restart: tuple[str, dict[str, Any]] | None = None  # (plan, the failed trainers' Job)
    if context.is_final(status.get("phase")):
        checks[ConditionType.READY] = FINISHED
        checks[ConditionType.PAYLOADS_RELEASED] = await finishing.release(op, run, children)
    else:
        restart = await follow_active(op, run, children, now, checks, fields)
    update = status_update(status, meta.get("generation"), checks, fields, now)
    op.metrics.observe_run(ns, name, update.phase, status.get("payloadMode") or UNKNOWN_MODE)
    if update.fields is not None:
        if await client.patch_status(run, update.fields) is None:
            return Refreshed(False)  # the run changed since it was read: its event follows
        for event_type, reason, message in update.events:
            await client.post_event(run, event_type, reason, message, now)
    if restart is not None:  # recorded: now the failed Job goes, and its pods with it
        plan, job = restart
        if restarts.ACTIONS[plan].record:
            message = fields["lastTrainerRestart"]["message"]
            await client.post_event(run, "Warning", "TrainersRestarted", message, now)
        job_meta = job["metadata"]
        await client.delete(
            "batch/v1", "Job", ns, job_meta["name"], "Foreground", uid=job_meta["uid"]
        )
    # Once its end is recorded (a reconcile then builds it stopped too), nothing of it runs on:
    # checked at every pass, it costs no write when everything is stopped already.
    if context.is_final(update.phase):
        await finishing.stop(op, run, children)
    volume = checks.get(ConditionType.VOLUME_READY)
    brought = (
        bool(status.get("claimName"))
        and (
            ns,
            "PersistentVolumeClaim",
            status["claimName"],
        )
        not in children
    )
    return Refreshed(update.fields is not None, recheck=brought and not (volume and volume.ok))


async def follow_active(
    op: Operator,
    run: dict[str, Any],
    children: finishing.Children,
    now: str,
    checks: dict[ConditionType, Check],
    fields: dict[str, Any],
) -> tuple[str, dict[str, Any]] | None:
    """The checks and fields of a run that has not ended (into ``checks`` and ``fields``), and
    the trainers' restart to carry out once they are written."""
    meta, status = run["metadata"], run["status"]
    ns, name = meta["namespace"], meta["name"]
    suspend = bool((run.get("spec") or {}).get("suspend", False))
    claim_name = status.get("claimName")
    claim = children.get((ns, "PersistentVolumeClaim", claim_name or ""))
    if claim_name and claim is None:  # a claim the run brings carries no label of ours
        claim = await op.client.get("v1", "PersistentVolumeClaim", ns, claim_name)
    workloads = [children.get((ns, kind, child_name(name, c))) for _, kind, c in WORKLOADS]
    active = context.runs_pods(suspend, status.get("phase"))
    checks[ConditionType.VOLUME_READY] = claim_check(claim, claim_name)
    checks[ConditionType.READY] = outcome.ready_check(active, workloads_check(workloads))
    checks |= outcome.suspend_check(suspend, status)
    listed = {c: children.get((ns, "Job", child_name(name, c))) for c in (ORCHESTRATOR, TRAINER)}
    # a Job being deleted (a restart, or a reconcile recreating it) is no end of the run
    deleting = {c for c, j in listed.items() if j and j["metadata"].get("deletionTimestamp")}
    jobs = {c: None if c in deleting else j for c, j in listed.items()}
    limit, layout = backoff_limit(run), pinning.layout_of(status.get("sidecars") or {})
    if listed[TRAINER] is None and layout.restarts_trainers_together:
        await recreate_trainers(op, run)
    restart = None
    plan = restarts.plan(status, jobs[TRAINER], limit, layout)
    if restarts.ACTIONS[plan].delete_job:
        trainers = jobs[TRAINER]
        assert trainers is not None
        if restarts.ACTIONS[plan].record:
            pods = await finishing.job_pods(op, ns, trainers["metadata"]["name"])
            fields |= restarts.restart_record(status, trainers, pods, limit, now)
        restart, jobs = (plan, trainers), {**jobs, TRAINER: None}  # not the run's end
    together = None
    if layout.restarts_trainers_together:  # the trainers' Job fails at its first failed rank
        together = (
            f"a trainer rank failed after {status.get('trainerRestarts') or 0} restart(s) of "
            f"every rank (spec.failurePolicy.backoffLimit is {limit})"
        )
    failure = await failure_of(op, ns, jobs, trainers_lead=together)
    end = outcome.end_checks(status, jobs[TRAINER], failure)
    if end:
        checks |= end
        checks[ConditionType.READY] = FINISHED
        fields["completionTime"] = now
        if failure is not None:
            fields["failure"] = failure
        step = await finishing.last_step(op, run)  # before its pod stops
        if step is not None:
            fields["lastStep"] = step
    return restart


def backoff_limit(run: dict[str, Any]) -> int:
    policy = (run.get("spec") or {}).get("failurePolicy") or {}
    return int(policy.get("backoffLimit", FailurePolicy().backoff_limit))


async def recreate_trainers(op: Operator, run: dict[str, Any]) -> None:
    """Create the trainers' Job again once a restart's deletion is done (or someone deleted
    it): the same manifest the reconcile builds, from the run as the API server has it (the
    follower's copy has no pod templates)."""
    meta = run["metadata"]
    live = await op.client.get(API_VERSION, KIND, meta["namespace"], meta["name"])
    if live is None:
        return  # deleted meanwhile: its children go with it
    admission = admit(live, op.settings)
    if admission.ctx is None:
        return  # refused: the reconcile reports why
    (job,) = [c for c in build_trainer(admission.ctx) if c["kind"] == "Job"]
    await op.client.apply(job)


async def failure_of(
    op: Operator,
    namespace: str,
    jobs: dict[str, dict[str, Any] | None],
    *,
    trainers_lead: str | None = None,
) -> dict[str, Any] | None:
    """``status.failure`` when the orchestrator's or the trainers' Job has failed, else None."""
    for component, job in jobs.items():
        if job is not None and outcome.job_outcome(job) == JOB_FAILED:
            pods = await finishing.job_pods(op, namespace, job["metadata"]["name"])
            lead = trainers_lead if component == TRAINER else None
            return outcome.failure_of(
                component, job, pods, CONTAINERS[component], lead=lead, first=lead is not None
            )
    return None
