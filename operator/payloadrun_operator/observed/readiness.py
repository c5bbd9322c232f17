"""A run's status from its children: one pure function computes it (:func:`run_status`), one
function writes it (:func:`write_status`), and only when it changed.

:func:`run_status` computes ``VolumeReady``, ``Ready``, ``Suspended`` and the run's end
(``Complete``, ``Failed``: :mod:`outcome`), a trainers' restart (:mod:`restarts`) and the
fields that go with them, from the run and what was observed of its children (:class:`Observed`)
and nothing else. What it needs beyond the follower's cache (a failed Job's pods, the retention
sidecar's last step) it asks for (:attr:`RunStatus.wants`), and :func:`observe_wanted` reads
just that for the pass to compute again, so a run whose children did not change costs no call.

The pass (:mod:`reconcile`) observes (:func:`observe`), computes, writes what changed through
:func:`write_status` (guarded by the run's resourceVersion, with an event per transition), then
acts on what it wrote: every status write of the operator goes through that one function, after
:func:`status.status_update` compared it with what the run holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import aiohttp

from payloadrun_operator.api.conditions import (
    JOB_FAILED,
    ConditionType,
    Phase,
    ReadyReason,
    StatusField,
)
from payloadrun_operator.api.kinds import CLAIM, EVENT, JOB, LEADER_WORKER_SET, POD
from payloadrun_operator.api.models import KIND, FailurePolicy
from payloadrun_operator.api.names import (
    API_VERSION,
    LABEL_RUN,
    ORCHESTRATOR,
    ORCHESTRATOR_CONTAINER,
    TRAINER,
    TRAINER_CONTAINER,
    child_name,
)
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.desired import context, pinning
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.desired.pinning import PodLayout
from payloadrun_operator.observed import finishing, groups, outcome, queue, restarts
from payloadrun_operator.observed.status import (
    Check,
    StatusUpdate,
    claim_check,
    workloads_check,
)
from payloadrun_operator.platform.kube import KubeApiError
from payloadrun_operator.platform.metrics import UNKNOWN_MODE
from payloadrun_operator.platform.runtime import Operator

log = logging.getLogger("payloadrun.readiness")
CONTAINERS = {ORCHESTRATOR: ORCHESTRATOR_CONTAINER, TRAINER: TRAINER_CONTAINER}
FINISHED = Check(False, ReadyReason.FINISHED, "the run has finished: its workloads have no pods")
LAST_STEP = "last step"  # what RunStatus.wants besides a Job's name (its pods)
GROUP_PODS = "group pods"  # and the pods of the run's LeaderWorkerSet's groups
GROUP_EVENTS = "group events"  # and the Warning events on the run's LeaderWorkerSet
ENDED = frozenset({"Succeeded", "Failed"})  # a pod's phases once its containers are done
RUN_PODS = "run pods"  # and every pod of an evicted run (are they all gone?)
QUEUED = Check(
    False,
    ReadyReason.QUEUED,
    "Kueue has not admitted the run: no pod runs (see the Admitted condition)",
)
Pods = list[dict[str, Any]]


@dataclass(frozen=True)
class Observed:
    """What a pass observed of a run besides the run: its children (the follower's cache) and
    what it read for them: the payload claim (one the run brings is not cached: it carries no
    label of ours), a failed Job's pods (by the Job's name), the retention sidecar's last step
    (``last_step_read``: asked for, even if it said nothing), and how far a finished run's
    payloads were released (:func:`finishing.release`)."""

    children: finishing.Children
    claim: dict[str, Any] | None = None
    pods: Mapping[str, Pods] = field(default_factory=dict)
    last_step: int | None = None
    last_step_read: bool = False
    released: Check | None = None
    group_pods: Pods | None = None  # the LeaderWorkerSet's pods, once listed (groups.py)
    group_events: list[dict[str, Any]] | None = None  # its Warning events, once listed
    run_pods: Pods | None = None  # every pod of the run, once listed (an evicted run's)


@dataclass(frozen=True)
class RunStatus:
    """A run's status as one pass computes it: its conditions' checks and its other fields (for
    :func:`status.status_update`), the restart of the trainers to carry out once they are
    written (the plan and the failed Job), and what it still ``wants`` observed to be complete
    (Job names whose pods it needs, :data:`LAST_STEP`)."""

    checks: dict[ConditionType, Check]
    fields: dict[str, Any] = field(default_factory=dict)
    restart: tuple[str, dict[str, Any]] | None = None
    wants: frozenset[str] = frozenset()
    queue_duty: queue.Duty = queue.Duty.NONE  # what to write on a queued run's Workload
    dropped: frozenset[ConditionType] = frozenset()  # conditions that no longer apply
    recheck: bool = False  # LeaderWorkerSet still making a group's StatefulSet: look again soon


class Write(StrEnum):
    """What :func:`write_status` did."""

    UNCHANGED = "unchanged"  # nothing to write
    WRITTEN = "written"
    CONFLICT = "conflict"  # the run changed since it was read: nothing written
    GONE = "gone"  # the run was deleted since it was read (or its namespace): nothing to write


def follows(run: Mapping[str, Any]) -> bool:
    """Only runs whose current generation was reconciled and accepted have children to follow."""
    recorded = Recorded.of(run)
    current = recorded.observed_generation == run["metadata"].get("generation")
    return current and recorded.phase not in (None, Phase.REJECTED)


def run_status(run: Mapping[str, Any], observed: Observed, now: str) -> RunStatus:
    """The status of ``run`` from what was ``observed`` of its children: pure, so the same
    inputs give the same status (table tests: tests/operator/test_run_status.py)."""
    meta, recorded = run["metadata"], Recorded.of(run)
    children = observed.children
    admission, queue_checks, fields = queue_part(run, recorded, children)
    if recorded.final:
        return finished_status(observed, admission, queue_checks, fields)
    ns, name = meta["namespace"], meta["name"]
    wants: set[str] = set()

    def pods_of(job: Mapping[str, Any]) -> Pods:
        job_name = job["metadata"]["name"]
        if job_name not in observed.pods:
            wants.add(job_name)
        return observed.pods.get(job_name, [])

    suspend = bool((run.get("spec") or {}).get("suspend", False))
    expected = finishing.workloads_of(run)
    workloads = [children.get((ns, kind, child)) for _, kind, child in expected]
    grouped = expected[0][1] == LEADER_WORKER_SET.kind
    active = context.runs_pods(suspend, recorded.phase)
    queued = admission is not None and not admission.runs_pods
    duty = eviction_duty(admission, observed)
    if duty is None:
        wants.add(RUN_PODS)
    grouped_and_running = grouped and active and not queued
    seen = groups_seen(run, recorded, workloads[0], observed) if grouped_and_running else None
    seen = seen or groups.Groups()
    fields |= seen.fields
    wants |= {GROUP_PODS} if seen.wants_pods else set()
    wants |= {GROUP_EVENTS} if seen.wants_events else set()
    ready = outcome.ready_check(
        active, seen.refused or workloads_check(workloads, [child for _, _, child in expected])
    )
    checks = {
        ConditionType.VOLUME_READY: claim_check(observed.claim, recorded.claim_name),
        ConditionType.READY: QUEUED if active and queued else ready,
        **outcome.suspend_check(suspend, recorded),
        **queue_checks,
    }
    listed = {c: children.get((ns, JOB.kind, child_name(name, c))) for c in (ORCHESTRATOR, TRAINER)}
    # a Job being deleted (a restart, or a reconcile recreating it) is no end of the run
    deleting = {c for c, j in listed.items() if j and j["metadata"].get("deletionTimestamp")}
    jobs = {c: None if c in deleting else j for c, j in listed.items()}
    limit, layout = backoff_limit(run), run_layout(recorded)
    restart = None
    plan = restarts.plan(recorded, jobs[TRAINER], limit, layout)
    if restarts.ACTIONS[plan].delete_job:
        trainers = jobs[TRAINER]
        assert trainers is not None
        if restarts.ACTIONS[plan].record:
            fields |= restarts.restart_record(recorded, trainers, pods_of(trainers), limit, now)
        restart, jobs = (plan, trainers), {**jobs, TRAINER: None}  # not the run's end
    together = None
    if layout.restarts_trainers_together:  # the trainers' Job fails at its first failed rank
        together = (
            f"a trainer rank failed after {recorded.trainer_restarts} "
            f"restart(s) of every rank (spec.failurePolicy.backoffLimit is {limit})"
        )
    failure = failure_of(jobs, pods_of, trainers_lead=together)
    end = outcome.end_checks(recorded, jobs[TRAINER], failure)
    if end:
        checks |= {**end, ConditionType.READY: FINISHED}
        fields |= end_fields(observed, failure, now)
        wants |= set() if observed.last_step_read else {LAST_STEP}
    dropped = frozenset() if admission or queue_checks else frozenset({ConditionType.ADMITTED})
    return RunStatus(
        checks,
        fields,
        restart,
        frozenset(wants),
        duty or queue.Duty.NONE,
        dropped=dropped,
        recheck=seen.recheck,
    )


def groups_seen(
    run: Mapping[str, Any],
    recorded: Recorded,
    lws: Mapping[str, Any] | None,
    observed: Observed,
) -> groups.Groups:
    """What a pass makes of the groups of a run whose inference is ``lws`` (:mod:`groups`)."""
    size = int(run["spec"]["inference"].get("podsPerReplica", 1))
    return groups.group_status(recorded, lws, size, observed.group_pods, observed.group_events)


def end_fields(observed: Observed, failure: dict[str, Any] | None, now: str) -> dict[str, Any]:
    """The fields a run's end writes: when, why it failed, the last step the retention
    sidecar saw (once read)."""
    fields: dict[str, Any] = {StatusField.COMPLETION_TIME: now}
    if failure is not None:
        fields[StatusField.FAILURE] = failure
    if observed.last_step_read and observed.last_step is not None:
        fields[StatusField.LAST_STEP] = observed.last_step
    return fields


def finished_status(
    observed: Observed,
    admission: queue.QueueAdmission | None,
    queue_checks: dict[ConditionType, Check],
    queue_fields: dict[str, Any],
) -> RunStatus:
    """A finished run's status: not Ready, its payloads' release, and a queued run's quota
    released (its Workload Finished)."""
    checks = {ConditionType.READY: FINISHED, **queue_checks}
    if observed.released is not None:
        checks[ConditionType.PAYLOADS_RELEASED] = observed.released
    duty = queue.Duty.NONE
    if admission is not None:
        duty = queue.duty(admission, final=True, pods_running=False)
    return RunStatus(checks, queue_fields, queue_duty=duty)


def eviction_duty(admission: queue.QueueAdmission | None, observed: Observed) -> queue.Duty | None:
    """What an evicted run owes Kueue: its quota back once none of its pods runs (None: its
    pods must be listed first); nothing for any other run."""
    if admission is None or admission.state is not queue.QueueState.EVICTED:
        return queue.Duty.NONE
    if observed.run_pods is None:
        return None
    return queue.duty(admission, final=False, pods_running=bool(observed.run_pods))


def queue_part(
    run: Mapping[str, Any], recorded: Recorded, children: finishing.Children
) -> tuple[queue.QueueAdmission | None, dict[ConditionType, Check], dict[str, Any]]:
    """A queued run's admission (None: the run asks for no queue), its ``Admitted`` condition
    and its ``status.queue``, from its Workload among ``children``."""
    meta = run["metadata"]
    name = queue.queue_in_effect(run)
    if name is None:  # and once a queued run's label is removed, no queue in its status
        was_queued = recorded.queue is not None
        checks = (
            {ConditionType.ADMITTED: queue.started_unqueued_check(run)}
            if queue.started_unqueued(run)
            else {}
        )
        return None, checks, {StatusField.QUEUE: None} if was_queued else {}
    admission = queue.admission_of(queue.cached_workload(children, meta["namespace"], meta["name"]))
    return (
        admission,
        {ConditionType.ADMITTED: queue.admitted_check(name, admission)},
        {StatusField.QUEUE: queue.queue_status(name, meta["name"], admission)},
    )


def run_layout(recorded: Recorded) -> PodLayout:
    """The pod layout the run records it was started with."""
    return pinning.layout_of(recorded.sidecars or {})


async def write_status(
    op: Operator, run: Mapping[str, Any], update: StatusUpdate, now: str
) -> Write:
    """Write ``update`` into ``run``'s status: the one place the operator writes a status.
    Nothing when nothing changed; else a merge patch guarded by the run's resourceVersion (a
    run changed since it was read is not overwritten: :attr:`Write.CONFLICT`, read it again),
    then an event per condition that changed (one the API server refuses is logged: the status
    holds the transition). The run's phase and mode go to the metrics. A run deleted since it
    was read is :attr:`Write.GONE`, not an error."""
    meta = run["metadata"]
    written = update.fields or {}
    mode = written.get(StatusField.PAYLOAD_MODE) or Recorded.of(run).payload_mode or UNKNOWN_MODE
    op.metrics.observe_run(meta["namespace"], meta["name"], update.phase, mode)
    if update.fields is None:
        return Write.UNCHANGED
    try:
        if not await op.client.patch_status(dict(run), update.fields):
            return Write.CONFLICT
    except KubeApiError as exc:
        if exc.status != 404:
            raise
        # Deleted meanwhile (a namespace's deletion takes its runs while a pass is under way):
        # no status to write, no event to post, and no series to keep for it.
        op.metrics.forget_run(meta["namespace"], meta["name"])
        return Write.GONE
    posted = await asyncio.gather(
        *(
            op.client.post_event(dict(run), event_type, reason, message, now)
            for event_type, reason, message in update.events
        ),
        return_exceptions=True,
    )
    for (_, reason, _), result in zip(update.events, posted, strict=True):
        if isinstance(result, KubeApiError | aiohttp.ClientError | OSError | TimeoutError):
            # an event is a notice: the status holds the transition (a namespace being deleted
            # takes no new event, as kopf's own poster found)
            log.warning("%s/%s: event %s not posted: %s", *run_key(run), reason, result)
        elif isinstance(result, BaseException):
            raise result
    return Write.WRITTEN


def run_key(run: Mapping[str, Any]) -> tuple[str, str]:
    return run["metadata"]["namespace"], run["metadata"]["name"]


async def observe(op: Operator, run: Mapping[str, Any], children: finishing.Children) -> Observed:
    """What a pass needs of the children before it computes (acting on them as it goes: a
    finished run's payloads released, the trainers' Job created again after a restart)."""
    meta, recorded = run["metadata"], Recorded.of(run)
    ns = meta["namespace"]
    if recorded.final:
        return Observed(children, released=await finishing.release(op, run, children))
    trainers = children.get((ns, JOB.kind, child_name(meta["name"], TRAINER)))
    if trainers is None and run_layout(recorded).restarts_trainers_together:
        await recreate_trainers(op, run)
    claim_name = recorded.claim_name
    claim = children.get((ns, CLAIM.kind, claim_name or ""))
    if claim_name and claim is None:  # a claim the run brings carries no label of ours
        claim = await op.client.get(CLAIM.api_version, CLAIM.kind, ns, claim_name)
    return Observed(children, claim=claim)


async def observe_wanted(
    op: Operator, run: Mapping[str, Any], observed: Observed, wants: frozenset[str]
) -> Observed:
    """``observed`` with what :func:`run_status` asked for read: Jobs' pods, the last step."""
    ns = run["metadata"]["namespace"]
    pods = dict(observed.pods)
    for job_name in sorted(wants - {LAST_STEP, GROUP_PODS, GROUP_EVENTS, RUN_PODS}):
        pods[job_name] = await finishing.job_pods(op, ns, job_name)
    observed = replace(observed, pods=pods)
    if GROUP_PODS in wants:
        lws_name = finishing.workloads_of(run)[0][2]
        listed = await op.client.list_objects(
            POD.api_version, POD.kind, ns, groups.pods_selector(lws_name)
        )
        observed = replace(observed, group_pods=listed)
    if GROUP_EVENTS in wants:
        lws = observed.children[(ns, LEADER_WORKER_SET.kind, finishing.workloads_of(run)[0][2])]
        listed = await op.client.list_objects(
            EVENT.api_version, EVENT.kind, ns, field_selector=groups.events_selector(lws)
        )
        observed = replace(observed, group_events=listed)
    if RUN_PODS in wants:
        listed = await op.client.list_objects(
            POD.api_version, POD.kind, ns, f"{LABEL_RUN}={run['metadata']['name']}"
        )
        running = [p for p in listed if (p.get("status") or {}).get("phase") not in ENDED]
        observed = replace(observed, run_pods=running)
    if LAST_STEP in wants:  # before its pod stops
        observed = replace(
            observed, last_step=await finishing.last_step(op, run), last_step_read=True
        )
    return observed


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
    if admission.built is None:
        return  # refused: the reconcile reports why
    await op.client.apply(admission.built.workload(TRAINER))


def failure_of(
    jobs: Mapping[str, Mapping[str, Any] | None],
    pods_of: Callable[[Mapping[str, Any]], Pods],
    *,
    trainers_lead: str | None = None,
) -> dict[str, Any] | None:
    """``status.failure`` when the orchestrator's or the trainers' Job has failed, else None
    (``pods_of``: a Job's pods, as observed)."""
    for component, job in jobs.items():
        if job is not None and outcome.job_outcome(job) == JOB_FAILED:
            lead = trainers_lead if component == TRAINER else None
            return outcome.failure_of(
                component,
                job,
                pods_of(job),
                CONTAINERS[component],
                lead=lead,
                first=lead is not None,
            )
    return None
