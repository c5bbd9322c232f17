"""Where a queued run stands in Kueue, read from its Workload, and what the operator owes Kueue.

A run labelled ``kueue.x-k8s.io/queue-name`` has one Workload (:mod:`desired.queueing` builds
it) and runs pods only while Kueue admits it. Kueue's scheduler writes the Workload's
``status.admission`` and its conditions; the Workload's owner, the operator, does the rest, as
Kueue's own job integrations do (``pkg/controller/jobframework/reconciler.go``):

- admitted (``QuotaReserved`` and ``Admitted`` True, not ``Evicted``): the run's pods run, with
  the admitted flavors' node labels and tolerations;
- evicted (``Evicted`` True: preempted, deactivated, a flavor's quota gone): every pod stops, and
  once none runs, the operator gives the quota back (``status.admission`` cleared,
  ``QuotaReserved`` False), so that Kueue queues the Workload again;
- finished (the run Succeeded or Failed): ``Finished`` True releases the quota at once.

Pure functions (:func:`admission_of`, :func:`admitted_check`, :func:`duty`, and a pass's whole
queue part, :func:`run_part`) decide; the pass carries out :func:`duty`'s answer
(:mod:`reconcile`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from payloadrun_operator.api.conditions import AdmittedReason, ConditionType, StatusField
from payloadrun_operator.api.kinds import WORKLOAD
from payloadrun_operator.api.models import ConditionStatus
from payloadrun_operator.api.names import QUEUE_NAME_LABEL, queue_workload_name
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.observed.status import Check, upsert_condition

# Kueue's Workload condition types (apis/kueue/v1beta2/workload_types.go)
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"
# Kueue's reasons on QuotaReserved False for a Workload it cannot admit as it is (no such
# LocalQueue, a stopped ClusterQueue, more than any flavor holds), as opposed to one waiting for
# quota (pkg/scheduler/flavorassigner, pkg/controller/core/workload_controller.go)
INADMISSIBLE = frozenset({"Inadmissible", "Misconfigured", "ExceedsMaxQuota", "NoMatchingFlavor"})
# Kueue's words when a pod set cannot fit even in the whole quota (flavorassigner: "request >
# maximum capacity"), as opposed to "insufficient unused quota": it waits for no one, it cannot
# be admitted as it is (v0.19's reason is Pending for both, unless UnadmittedWorkloadsObservability)
NEVER_FITS = "maximum capacity"
DEACTIVATED = "Deactivated"  # an eviction that is not requeued (spec.active false)
# The reasons this operator writes on the Workload (as Kueue's job integrations do)
PENDING = "Pending"
NO_RESERVATION = "NoReservation"  # Admitted False once the quota is given back (SyncAdmitted)
SUCCEEDED = "Succeeded"
FAILED = "Failed"


class QueueState(StrEnum):
    """Where a queued run's Workload stands."""

    MISSING = "missing"  # not created yet (or being replaced)
    PENDING = "pending"  # waiting for quota
    ADMITTED = "admitted"  # every pod may run
    EVICTED = "evicted"  # every pod must stop; the quota goes back once they have
    FINISHED = "finished"  # the run ended; the quota is released


# Where a Workload holds quota: it must be deleted, not changed, to change its pod sets.
HOLDING_QUOTA = frozenset({QueueState.ADMITTED, QueueState.EVICTED})


def queue_name(meta: Mapping[str, Any]) -> str | None:
    """The LocalQueue a run asks for (its ``kueue.x-k8s.io/queue-name`` label), or None."""
    return (meta.get("labels") or {}).get(QUEUE_NAME_LABEL) or None


def started_unqueued(run: Mapping[str, Any]) -> bool:
    """Whether ``run`` asks for a queue but its pods started without one: it has started
    (``status.startTime``), was never queued (no ``status.queue``) and is not suspended.

    A run's queue is decided while it has no pods to stop: when it starts, or while it is
    suspended. A label added to a running run, or a run started by an operator before 0.2.0
    (which had no Kueue support) that carries it, does not stop the run's pods to queue it, as
    Kueue lets a Job's queue change only while the Job is suspended: it runs unqueued, and its
    ``Admitted`` condition says so, until it is suspended."""
    recorded = Recorded.of(run)
    return (
        queue_name(run["metadata"]) is not None
        and recorded.queue is None
        and recorded.start_time is not None
        and not (run.get("spec") or {}).get("suspend")
    )


def queue_in_effect(run: Mapping[str, Any]) -> str | None:
    """The LocalQueue the run is queued in: its label's, unless it started unqueued."""
    return None if started_unqueued(run) else queue_name(run["metadata"])


def started_unqueued_check(run: Mapping[str, Any]) -> Check:
    """The ``Admitted`` condition of a run that :func:`started_unqueued`."""
    return Check(
        False,
        AdmittedReason.STARTED_UNQUEUED,
        f"the run's pods started without a queue, so it runs unqueued and holds no Kueue quota: "
        f"its {QUEUE_NAME_LABEL} label ({queue_name(run['metadata'])}) came once they ran, or an "
        "operator before 0.2.0 started it. The label takes effect while the run is suspended: "
        "suspend it (spec.suspend: true) and resume it to queue it",
        warning=True,
    )


def _condition(workload: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def _true(workload: Mapping[str, Any], ctype: str) -> bool:
    return (_condition(workload, ctype) or {}).get("status") == ConditionStatus.TRUE


@dataclass(frozen=True)
class QueueAdmission:
    """A queued run's Workload as the operator reads it."""

    state: QueueState
    message: str = ""  # Kueue's own words (the deciding condition's message)
    reason: str = ""  # Kueue's reason on that condition
    cluster_queue: str | None = None
    # pod set -> resource -> flavor, while admitted (status.admission.podSetAssignments)
    flavors: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def runs_pods(self) -> bool:
        return self.state is QueueState.ADMITTED

    def flavor_names(self) -> dict[str, list[str]]:
        """Each pod set's flavors, sorted, without repeats (the run's status.queue.flavors)."""
        return {
            name: sorted(set(by_resource.values())) for name, by_resource in self.flavors.items()
        }


def admission_of(workload: Mapping[str, Any] | None) -> QueueAdmission:
    """``workload`` (None: none) as a :class:`QueueAdmission`."""
    if workload is None or (workload.get("metadata") or {}).get("deletionTimestamp"):
        return QueueAdmission(QueueState.MISSING, "the run's Workload is being created")
    if _true(workload, FINISHED):
        return QueueAdmission(QueueState.FINISHED, "the run has ended: its quota is released")
    admission = (workload.get("status") or {}).get("admission")
    held = admission is not None or _true(workload, QUOTA_RESERVED)
    if _true(workload, EVICTED) and held:  # once the quota is back, it waits like any other
        cond = _condition(workload, EVICTED) or {}
        return QueueAdmission(
            QueueState.EVICTED, cond.get("message") or "evicted by Kueue", cond.get("reason") or ""
        )
    if admission and _true(workload, QUOTA_RESERVED) and _true(workload, ADMITTED):
        flavors = {
            a["name"]: dict(a.get("flavors") or {})
            for a in admission.get("podSetAssignments") or []
        }
        cond = _condition(workload, ADMITTED) or {}
        return QueueAdmission(
            QueueState.ADMITTED,
            cond.get("message") or "admitted",
            cond.get("reason") or "",
            admission.get("clusterQueue"),
            flavors,
        )
    cond = _condition(workload, QUOTA_RESERVED) or _condition(workload, ADMITTED) or {}
    return QueueAdmission(
        QueueState.PENDING,
        cond.get("message") or "waiting for Kueue to consider the run",
        cond.get("reason") or "",
    )


def gate_key(workload: Mapping[str, Any] | None) -> tuple[QueueState, tuple[Any, ...]]:
    """What of a Workload decides its run's pods: its state and its flavors (a change of either
    is a reconcile of the run)."""
    admission = admission_of(workload)
    flavors = tuple(sorted((k, tuple(sorted(v.items()))) for k, v in admission.flavors.items()))
    return admission.state, flavors


def admitted_check(queue: str, admission: QueueAdmission) -> Check:
    """The run's ``Admitted`` condition: Kueue's verdict and its own message."""
    state = admission.state
    if state is QueueState.ADMITTED:
        where = f" by ClusterQueue {admission.cluster_queue}" if admission.cluster_queue else ""
        return Check(True, AdmittedReason.ADMITTED, f"admitted{where} through LocalQueue {queue}")
    if state is QueueState.EVICTED:
        return Check(
            False,
            AdmittedReason.EVICTED,
            f"evicted by Kueue ({admission.reason or 'Evicted'}: {admission.message}): every "
            "pod stops, the volume and the payload root stay, and the run resumes once it is "
            "admitted again",
            warning=True,
        )
    if state is QueueState.FINISHED:
        return Check(False, AdmittedReason.FINISHED, admission.message)
    if admission.reason in INADMISSIBLE or NEVER_FITS in admission.message:
        return Check(
            False,
            AdmittedReason.INADMISSIBLE,
            f"Kueue cannot admit the run through LocalQueue {queue}: {admission.message}",
            warning=True,
        )
    return Check(
        False,
        AdmittedReason.PENDING,
        f"waiting for quota in LocalQueue {queue}: {admission.message}",
    )


def queue_status(queue: str, run_name: str, admission: QueueAdmission) -> dict[str, Any]:
    """The run's ``status.queue``."""
    status: dict[str, Any] = {"name": queue, "workload": queue_workload_name(run_name)}
    if admission.state is QueueState.ADMITTED:
        status["clusterQueue"] = admission.cluster_queue
        status["flavors"] = admission.flavor_names()
    return status


def cached_workload(
    children: Mapping[tuple[str, str, str], Mapping[str, Any]], namespace: str, run_name: str
) -> Mapping[str, Any] | None:
    """A run's Workload among the follower's cached children."""
    return children.get((namespace, WORKLOAD.kind, queue_workload_name(run_name)))


class Duty(StrEnum):
    """What the operator owes Kueue for a run's Workload this pass (:func:`duty`)."""

    NONE = "none"
    RELEASE = "release"  # evicted, and no pod of the run runs: give the quota back
    FINISH = "finish"  # the run ended: mark the Workload Finished


def duty(admission: QueueAdmission, *, final: bool, pods_running: bool) -> Duty:
    """What to write on the Workload: ``Finished`` once the run has ended (whatever Kueue said
    last); after an eviction, the quota back once the run's pods are gone (as Kueue's job
    reconciler waits for a Job to be inactive)."""
    if final:
        return (
            Duty.NONE
            if admission.state in (QueueState.FINISHED, QueueState.MISSING)
            else Duty.FINISH
        )
    if admission.state is QueueState.EVICTED and not pods_running:
        return Duty.RELEASE
    return Duty.NONE


def workload_condition(
    ctype: str, status: bool, reason: str, message: str, now: str, generation: int | None
) -> dict[str, Any]:
    cond = {
        "type": ctype,
        "status": ConditionStatus.TRUE if status else ConditionStatus.FALSE,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def duty_status(
    workload: Mapping[str, Any], what: Duty, now: str, *, failed: bool = False
) -> dict[str, Any]:
    """The Workload's status after ``what`` (a merge patch of ``status``): the quota given back
    after an eviction (``admission`` cleared, ``QuotaReserved`` and ``Admitted`` False, as
    Kueue's ``UnsetQuotaReservationWithCondition`` leaves it, and ``Requeued`` True with the
    eviction's reason unless it was a deactivation), or ``Finished`` True."""
    conditions = list((workload.get("status") or {}).get("conditions") or [])
    generation = (workload.get("metadata") or {}).get("generation")
    if what is Duty.FINISH:
        reason, message = (
            (FAILED, "the PayloadRun failed") if failed else (SUCCEEDED, "the PayloadRun succeeded")
        )
        cond = workload_condition(FINISHED, True, reason, message, now, generation)
        return {"conditions": upsert_condition(conditions, cond)}
    evicted = _condition(workload, EVICTED) or {}
    message = evicted.get("message") or "evicted"
    reason = evicted.get("reason") or EVICTED
    for ctype, why in ((QUOTA_RESERVED, PENDING), (ADMITTED, NO_RESERVATION)):
        cond = workload_condition(ctype, False, why, message, now, generation)
        conditions = upsert_condition(conditions, cond)
    requeued = workload_condition(REQUEUED, reason != DEACTIVATED, reason, message, now, generation)
    return {"admission": None, "conditions": upsert_condition(conditions, requeued)}


@dataclass(frozen=True)
class RunQueue:
    """A run's queue as one pass sees it: its admission (None: the run asks for no queue), its
    ``Admitted`` condition and ``status.queue`` when they change, and what the pass owes Kueue
    (None: the run's pods must be listed first, to know whether an evicted run's are gone)."""

    admission: QueueAdmission | None
    checks: dict[ConditionType, Check]
    fields: dict[str, Any]
    duty: Duty | None


def run_part(
    run: Mapping[str, Any],
    recorded: Recorded,
    children: Mapping[tuple[str, str, str], Mapping[str, Any]],
    run_pods: list[Any] | None,
) -> RunQueue:
    """``run``'s queue from its Workload among ``children`` and, for an evicted run, its pods
    still running (``run_pods``, None: not listed): a finished run's Workload is marked
    Finished, an evicted one's quota given back once none of its pods runs."""
    meta = run["metadata"]
    name = queue_in_effect(run)
    if name is None:  # and once a queued run's label is removed, no queue in its status
        checks = (
            {ConditionType.ADMITTED: started_unqueued_check(run)} if started_unqueued(run) else {}
        )
        fields = {StatusField.QUEUE: None} if recorded.queue is not None else {}
        return RunQueue(None, checks, fields, Duty.NONE)
    admission = admission_of(cached_workload(children, meta["namespace"], meta["name"]))
    owed: Duty | None = Duty.NONE
    if recorded.final:
        owed = duty(admission, final=True, pods_running=False)
    elif admission.state is QueueState.EVICTED and run_pods is not None:
        owed = duty(admission, final=False, pods_running=bool(run_pods))
    elif admission.state is QueueState.EVICTED:
        owed = None  # its pods not listed yet
    return RunQueue(
        admission,
        {ConditionType.ADMITTED: admitted_check(name, admission)},
        {StatusField.QUEUE: queue_status(name, meta["name"], admission)},
        owed,
    )
