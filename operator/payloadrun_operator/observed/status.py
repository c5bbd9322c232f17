"""Pure functions for the run's status: conditions, readiness of children, phase.

The conditions follow metav1.Condition, and the CRD enforces its rules (:class:`models.Condition`):
a reason matches ``REASON_PATTERN``, a message has at most 32768 characters, and
``lastTransitionTime`` is always set, in RFC 3339 (:func:`rfc3339`). A status that broke them
would be refused by the API server, so they are kept here, where the conditions are made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from payloadrun_operator.api.conditions import (
    JOB_COMPLETE,
    REASONS,
    TRUE_REASONS,
    AdmittedReason,
    ConditionType,
    EventType,
    Phase,
    ReadyReason,
    Reason,
    StatusField,
    VolumeReadyReason,
)
from payloadrun_operator.api.kinds import JOB, LEADER_WORKER_SET
from payloadrun_operator.api.models import MAX_CONDITION_MESSAGE, REASON_PATTERN, ConditionStatus

STATUS_FIELDS = frozenset(StatusField)


@dataclass(frozen=True)
class Check:
    """One condition's verdict: ``True``/``False`` with a CamelCase reason and a message.

    ``warning`` marks a failure that needs someone's attention (its event is a Warning), as
    opposed to progress that only has to wait (a claim being bound, pods starting).
    """

    ok: bool
    reason: Reason
    message: str
    warning: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(REASON_PATTERN, self.reason) or len(self.reason) > 1024:
            raise ValueError(
                f"condition reason {self.reason!r} does not match {REASON_PATTERN} (at most 1024 "
                "characters): the API server would refuse the status"
            )


def rfc3339(moment: datetime) -> str:
    """``moment`` as metav1.Time writes it: RFC 3339 in UTC, whole seconds, ``Z``."""
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no time zone: RFC 3339 needs one")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bounded_message(message: str) -> str:
    """``message`` cut to the condition's limit (an API error can be longer than that)."""
    if len(message) <= MAX_CONDITION_MESSAGE:
        return message
    return message[: MAX_CONDITION_MESSAGE - 1] + "\u2026"


def vocabulary_error(ctype: ConditionType, check: Check) -> str | None:
    """Why ``check`` cannot be condition ``ctype`` (a type, reason or status outside the
    vocabulary), or None. A programming error: the reference and alerts list only these."""
    if not isinstance(ctype, ConditionType):
        return f"{ctype!r} is not a ConditionType: add it there (and to the reference) first"
    reasons = REASONS[ctype]
    if not isinstance(check.reason, reasons):
        return (
            f"{ctype} has no reason {str(check.reason)!r}: its reasons are "
            f"{', '.join(reasons)} ({reasons.__name__})"
        )
    if check.ok != (check.reason in TRUE_REASONS):
        return f"{ctype}'s reason {check.reason} goes with status {not check.ok}, not {check.ok}"
    return None


def set_condition(
    conditions: Iterable[dict[str, Any]],
    ctype: ConditionType,
    check: Check,
    *,
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """``conditions`` with ``ctype`` set; its transition time moves only when its status does.

    ``now`` is an RFC 3339 time (:func:`rfc3339`); a condition that has no transition time yet
    gets it. ``ctype`` and the check's reason must be of the vocabulary (:data:`REASONS`).
    """
    problem = vocabulary_error(ctype, check)
    if problem is not None:
        raise ValueError(problem)
    status = ConditionStatus.TRUE if check.ok else ConditionStatus.FALSE
    return upsert_condition(conditions, _condition(ctype, status, check, generation, now))


def upsert_condition(
    conditions: Iterable[Mapping[str, Any]], cond: dict[str, Any]
) -> list[dict[str, Any]]:
    """``conditions`` with ``cond`` in place of its type's, in place, or last; its
    ``lastTransitionTime`` kept from the one it replaces when the status did not change (as
    metav1's SetStatusCondition). Any object's conditions: a run's, a Kueue Workload's."""
    out: list[dict[str, Any]] = []
    found = False
    for existing in conditions:
        if existing.get("type") != cond["type"]:
            out.append(dict(existing))
            continue
        found = True
        same = existing.get("status") == cond["status"]
        since = existing.get("lastTransitionTime") if same else None
        out.append({**cond, "lastTransitionTime": since or cond["lastTransitionTime"]})
    if not found:
        out.append(cond)
    return out


def _condition(
    ctype: ConditionType, status: str, check: Check, generation: int | None, since: str
) -> dict[str, Any]:
    cond = {
        "type": str(ctype),
        "status": str(status),
        "reason": str(check.reason),
        "message": bounded_message(check.message),
        "lastTransitionTime": since,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def condition(conditions: Iterable[dict[str, Any]], ctype: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == ctype), None)


# Conditions whose first appearance is news: a suspension, the run's end, what became of its
# payload files. The others are set on every new run, in the state every new run starts in.
NEWS_ON_APPEARANCE = frozenset(
    {
        ConditionType.SUSPENDED,
        ConditionType.COMPLETE,
        ConditionType.FAILED,
        ConditionType.PAYLOADS_RELEASED,
    }
)


def deserves_event(ctype: ConditionType, check: Check, before: dict[str, Any] | None) -> bool:
    """Whether setting ``check`` over the condition as it was (``before``, None: absent) is
    worth an event, each of which is a request to the API server: a Warning whenever its
    status or reason changes; a Normal event only for what a user acts on: a status that
    flips (the workloads ready, or no longer; the volume bound; a spec fixed) or a condition
    that is news when it appears (:data:`NEWS_ON_APPEARANCE`). A new run's Validated, Applied,
    VolumeReady and Ready, and a reason changing under the same status (a claim found, then
    pending), are in its status and post nothing."""
    status = ConditionStatus.TRUE if check.ok else ConditionStatus.FALSE
    if before is None:
        return check.warning or ctype in NEWS_ON_APPEARANCE
    if (before.get("status"), before.get("reason")) == (status, check.reason):
        return False
    return check.warning or before.get("status") != status


def transitions(
    before: Iterable[dict[str, Any]], after: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The conditions whose status or reason changed (each deserves an event)."""
    old = {c["type"]: (c.get("status"), c.get("reason")) for c in before}
    return [c for c in after if old.get(c["type"]) != (c["status"], c["reason"])]


def phase(conditions: Iterable[dict[str, Any]]) -> str:
    conds = list(conditions)
    validated = condition(conds, ConditionType.VALIDATED)
    if validated is not None and validated["status"] == ConditionStatus.FALSE:
        return Phase.REJECTED
    for ctype, final_phase in (
        (ConditionType.FAILED, Phase.FAILED),
        (ConditionType.COMPLETE, Phase.SUCCEEDED),
    ):
        if (condition(conds, ctype) or {}).get("status") == ConditionStatus.TRUE:
            return final_phase
    if (condition(conds, ConditionType.SUSPENDED) or {}).get("status") == ConditionStatus.TRUE:
        return Phase.SUSPENDED
    admitted = condition(conds, ConditionType.ADMITTED) or {}
    if (
        admitted.get("status") == ConditionStatus.FALSE
        and admitted.get("reason") != AdmittedReason.STARTED_UNQUEUED  # it runs, unqueued
    ):
        return Phase.QUEUED
    ready = condition(conds, ConditionType.READY)
    if ready is not None and ready["status"] == ConditionStatus.TRUE:
        return Phase.RUNNING
    return Phase.PROVISIONING


def claim_check(claim: dict[str, Any] | None, name: str | None) -> Check:
    """Is the payload volume usable? ``name`` None means inline mode: no volume needed."""
    if name is None:
        return Check(True, VolumeReadyReason.NOT_NEEDED, "payloads move inline: no shared volume")
    if claim is None:
        return Check(
            False,
            VolumeReadyReason.CLAIM_MISSING,
            f"PersistentVolumeClaim {name} does not exist yet",
        )
    claim_phase = claim.get("status", {}).get("phase", "Pending")
    if claim_phase == "Bound":
        return Check(True, VolumeReadyReason.CLAIM_BOUND, f"PersistentVolumeClaim {name} is bound")
    lost = claim_phase == "Lost"
    return Check(
        False,
        VolumeReadyReason.CLAIM_LOST if lost else VolumeReadyReason.CLAIM_PENDING,
        f"PersistentVolumeClaim {name} is {claim_phase}: it needs a ReadWriteMany volume "
        "(a storage class that provisions one, or a matching PersistentVolume)",
        warning=lost,
    )


def workload_ready(obj: dict[str, Any] | None, name: str | None = None) -> tuple[bool, str]:
    """A StatefulSet's, a LeaderWorkerSet's or a Job's readiness, and what it waits for: every
    pod it wants ready, and a StatefulSet or LeaderWorkerSet at its current generation. A
    LeaderWorkerSet's ``readyReplicas`` counts its groups whose leader is running and ready and
    whose workers' StatefulSet is (LeaderWorkerSet v0.9.0, ``updateConditions``): a replica is
    ready when every pod of its group is."""
    if obj is None:  # ``name``: the workload's, said of one that does not exist yet
        return False, f"{name} not created yet" if name else "not created yet"
    name = obj["metadata"]["name"]
    spec = obj.get("spec", {})
    status = obj.get("status", {})
    if obj.get("kind") == JOB.kind:  # its template never changes: no generation to wait for
        if any(
            c.get("type") == JOB_COMPLETE and c.get("status") == ConditionStatus.TRUE
            for c in status.get("conditions") or []
        ):  # an orchestrator may exit 0 before the trainers are done
            return True, f"{name} complete"
        want, ready, current = spec.get("parallelism", 1), status.get("ready", 0), True
    else:
        want, ready = spec.get("replicas", 1), status.get("readyReplicas", 0)
        current = status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
    unit = " groups" if obj.get("kind") == LEADER_WORKER_SET.kind else ""
    return current and ready >= want, f"{name} {ready}/{want}{unit} ready"


def workloads_check(workloads: Iterable[dict[str, Any] | None], names: Iterable[str] = ()) -> Check:
    """Whether every workload is ready (:func:`workload_ready`); ``names``: theirs, in order,
    for those that do not exist yet."""
    named = list(names)
    results = [
        workload_ready(w, named[i] if i < len(named) else None) for i, w in enumerate(workloads)
    ]
    waiting = [msg for ok, msg in results if not ok]
    if waiting:
        return Check(False, ReadyReason.WORKLOADS_NOT_READY, "waiting for " + ", ".join(waiting))
    return Check(True, ReadyReason.WORKLOADS_READY, ", ".join(msg for _, msg in results))


@dataclass(frozen=True)
class StatusUpdate:
    """What to write into a run's status, and the events to post, after a set of checks."""

    fields: dict[str, Any] | None  # status fields to write; None when nothing changed
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    phase: str = Phase.PROVISIONING


def status_update(
    status: Mapping[str, Any],
    generation: int | None,
    checks: Mapping[ConditionType, Check],
    fields: Mapping[str, Any],
    now: str,
    *,
    dropped: frozenset[ConditionType] = frozenset(),
) -> StatusUpdate:
    """The status a pass computed (``checks`` as conditions over ``status``, and ``fields``)
    against what the run holds: what to write, None when nothing changed (as KubeRay compares
    before it writes), and an event for each condition that changed in a way worth one
    (:func:`deserves_event`); ``dropped``: conditions that no longer apply (a run's queue
    label removed: its ``Admitted``). Every status write goes
    through here (:func:`writing.write_status` sends it)."""
    unknown = [k for k in fields if k not in STATUS_FIELDS]
    if unknown:
        raise ValueError(
            f"status fields {unknown} are not PayloadRunStatus's ({', '.join(StatusField)}): "
            "add them to models.PayloadRunStatus and StatusField first"
        )
    before = list(status.get(StatusField.CONDITIONS) or [])
    after = [c for c in before if c.get("type") not in dropped]
    for ctype, check in checks.items():
        after = set_condition(after, ctype, check, generation=generation, now=now)
    run_phase = phase(after)
    changed = {c["type"] for c in transitions(before, after)}
    new_fields = {**fields, StatusField.PHASE: run_phase}
    write = None
    if (
        changed
        or after != before  # a message too (the groups ready, 0/2 then 1/2): what it says is true
        or any(status.get(k) != v for k, v in new_fields.items())
    ):
        write = {str(k): v for k, v in {**new_fields, StatusField.CONDITIONS: after}.items()}
    events = [
        (
            EventType.WARNING if check.warning else EventType.NORMAL,
            str(check.reason),
            f"{ctype} is {check.ok}: {check.message}",
        )
        for ctype, check in checks.items()
        if ctype in changed and deserves_event(ctype, check, condition(before, ctype))
    ]
    return StatusUpdate(write, events, run_phase)
