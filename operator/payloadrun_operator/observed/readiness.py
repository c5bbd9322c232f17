"""A run's status from its children, computed by one pure function (:func:`run_status`).

:func:`run_status` computes ``VolumeReady``, ``Ready``, ``Suspended`` and the run's end
(``Complete``, ``Failed``: :mod:`outcome`), a trainers' restart (:mod:`restarts`), what a queued
run owes Kueue (:mod:`queue`) and the fields that go with them, from the run and what was
observed of its children (:class:`Observed`) and nothing else. What it needs beyond the
follower's cache (a failed Job's pods, the retention sidecar's last step) it asks for
(:attr:`RunStatus.wants`), and :func:`observing.observe_wanted` reads just that for the pass to
compute again, so a run whose children did not change costs no call.

The pass (:mod:`reconcile`) observes (:mod:`observing`), computes, writes what changed
(:func:`writing.write_status`, the one place a status is written), then acts on what it wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from payloadrun_operator.api.conditions import (
    JOB_FAILED,
    ConditionType,
    Phase,
    ReadyReason,
    StatusField,
)
from payloadrun_operator.api.kinds import CLAIM, JOB, LEADER_WORKER_SET
from payloadrun_operator.api.models import FailurePolicy
from payloadrun_operator.api.names import (
    ORCHESTRATOR,
    ORCHESTRATOR_CONTAINER,
    TRAINER,
    TRAINER_CONTAINER,
    child_name,
    workloads_of,
)
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.desired import context, pinning
from payloadrun_operator.observed import groups, outcome, queue, restarts
from payloadrun_operator.observed.finishing import Children
from payloadrun_operator.observed.status import Check, claim_check, workloads_check

CONTAINERS = {ORCHESTRATOR: ORCHESTRATOR_CONTAINER, TRAINER: TRAINER_CONTAINER}
FINISHED = Check(False, ReadyReason.FINISHED, "the run has finished: its workloads have no pods")
LAST_STEP = "last step"  # what RunStatus.wants besides a Job's name (its pods)
GROUP_PODS = "group pods"  # and the pods of the run's LeaderWorkerSet's groups
GROUP_EVENTS = "group events"  # and the Warning events on the run's LeaderWorkerSet
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
    what it read for them (:mod:`observing`): the payload claim (one the run brings is not
    cached: it carries no label of ours), a failed Job's pods (by the Job's name), the retention
    sidecar's last step (``last_step_read``: asked for, even if it said nothing), and how far a
    finished run's payloads were released (:func:`finishing.release`)."""

    children: Children
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
    written (the plan and the failed Job), what it still ``wants`` observed to be complete
    (Job names whose pods it needs, :data:`LAST_STEP`), and whether to look again soon at what
    no watch reports (``recheck``)."""

    checks: dict[ConditionType, Check]
    fields: dict[str, Any] = field(default_factory=dict)
    restart: tuple[str, dict[str, Any]] | None = None
    wants: frozenset[str] = frozenset()
    queue_duty: queue.Duty = queue.Duty.NONE  # what to write on a queued run's Workload
    dropped: frozenset[ConditionType] = frozenset()  # conditions that no longer apply
    # a claim the run brings not yet bound, an evicted run's pods still stopping, LeaderWorkerSet
    # still making a group's StatefulSet
    recheck: bool = False


def follows(run: Mapping[str, Any]) -> bool:
    """Only runs whose current generation was reconciled and accepted have children to follow."""
    recorded = Recorded.of(run)
    current = recorded.observed_generation == run["metadata"].get("generation")
    return current and recorded.phase not in (None, Phase.REJECTED)


def run_status(run: Mapping[str, Any], observed: Observed, now: str) -> RunStatus:
    """The status of ``run`` from what was ``observed`` of its children: pure, so the same
    inputs give the same status (table tests: tests/operator/test_run_status.py)."""
    meta, recorded, spec = run["metadata"], Recorded.of(run), run.get("spec") or {}
    children = observed.children
    queued_part = queue.run_part(run, recorded, children, observed.run_pods)
    admission, fields = queued_part.admission, dict(queued_part.fields)
    dropped = (
        frozenset() if admission or queued_part.checks else frozenset({ConditionType.ADMITTED})
    )
    if recorded.final:  # not Ready, its payloads' release, a queued run's quota released
        checks = {ConditionType.READY: FINISHED, **queued_part.checks}
        if observed.released is not None:
            checks[ConditionType.PAYLOADS_RELEASED] = observed.released
        return RunStatus(checks, fields, queue_duty=queued_part.duty or queue.Duty.NONE)
    ns, name = meta["namespace"], meta["name"]
    wants: set[str] = set() if queued_part.duty is not None else {RUN_PODS}

    def pods_of(job: Mapping[str, Any]) -> Pods:
        job_name = job["metadata"]["name"]
        if job_name not in observed.pods:
            wants.add(job_name)
        return observed.pods.get(job_name, [])

    suspend = bool(spec.get("suspend", False))
    policy = spec.get("failurePolicy") or {}
    limit = int(policy.get("backoffLimit", FailurePolicy().backoff_limit))
    layout = pinning.layout_of(recorded.sidecars or {})
    size = int((spec.get("inference") or {}).get("podsPerReplica", 1))
    expected = workloads_of(run)
    workloads = [children.get((ns, kind, child)) for _, kind, child in expected]
    active = context.runs_pods(suspend, recorded.phase)
    queued = admission is not None and not admission.runs_pods
    grouped_and_running = expected[0][1] == LEADER_WORKER_SET.kind and active and not queued
    seen = (
        groups.group_status(
            recorded, workloads[0], size, observed.group_pods, observed.group_events
        )
        if grouped_and_running
        else groups.Groups()
    )
    fields |= seen.fields
    wants |= {GROUP_PODS} if seen.wants_pods else set()
    wants |= {GROUP_EVENTS} if seen.wants_events else set()
    ready_workloads = seen.refused or workloads_check(
        workloads, [child for _, _, child in expected]
    )
    volume = claim_check(observed.claim, recorded.claim_name)
    checks = {
        ConditionType.VOLUME_READY: volume,
        ConditionType.READY: QUEUED
        if active and queued
        else outcome.ready_check(active, ready_workloads),
        **outcome.suspend_check(suspend, recorded),
        **queued_part.checks,
    }
    listed = {c: children.get((ns, JOB.kind, child_name(name, c))) for c in (ORCHESTRATOR, TRAINER)}
    # a Job being deleted (a restart, or a reconcile recreating it) is no end of the run
    deleting = {c for c, j in listed.items() if j and j["metadata"].get("deletionTimestamp")}
    jobs = {c: None if c in deleting else j for c, j in listed.items()}
    restart, restart_fields = restarts.trainers_restart(
        recorded, jobs[TRAINER], limit, layout, pods_of, now
    )
    fields |= restart_fields
    if restart is not None:  # its Job deleted: not the run's end
        jobs = {**jobs, TRAINER: None}
    lead = restarts.failure_lead(recorded, limit, layout)
    failure = failure_of(jobs, pods_of, trainers_lead=lead)
    end = outcome.end_checks(recorded, jobs[TRAINER], failure)
    if end:
        checks |= {**end, ConditionType.READY: FINISHED}
        fields |= end_fields(observed, failure, now)
        wants |= set() if observed.last_step_read else {LAST_STEP}
    claim_name = recorded.claim_name
    brought = bool(claim_name) and (ns, CLAIM.kind, claim_name) not in children
    return RunStatus(
        checks,
        fields,
        restart,
        frozenset(wants),
        queued_part.duty or queue.Duty.NONE,
        dropped=dropped,
        recheck=(brought and not volume.ok) or bool(observed.run_pods) or seen.recheck,
    )


def end_fields(observed: Observed, failure: dict[str, Any] | None, now: str) -> dict[str, Any]:
    """The fields a run's end writes: when, why it failed, the last step the retention
    sidecar saw (once read)."""
    fields: dict[str, Any] = {StatusField.COMPLETION_TIME: now}
    if failure is not None:
        fields[StatusField.FAILURE] = failure
    if observed.last_step_read and observed.last_step is not None:
        fields[StatusField.LAST_STEP] = observed.last_step
    return fields


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
