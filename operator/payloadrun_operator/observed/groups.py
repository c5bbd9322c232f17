"""What a run's LeaderWorkerSet groups say of themselves: the last failure in one of them.

LeaderWorkerSet recreates a group whose pod failed (``RecreateGroupOnPodRestart``: the leader pod
is deleted, and the group's workers with it) and reports only counts (``status.readyReplicas``):
no pod, no exit code. So while the run's LeaderWorkerSet is not fully ready, a pass lists the
pods of its groups (LeaderWorkerSet's own label, ``leaderworkerset.sigs.k8s.io/name``: one list,
no watch) and reads the failure there: a container that ended (``lastState.terminated`` of one
restarted, or ``state.terminated``), the latest. A group's pods being deleted keep their status
through their grace period, and the pass runs on the LeaderWorkerSet's own status event, which
follows the failure: a pods watch would keep every group pod of every run in the operator's
memory (and need the watch verb on pods) for what one list reads on the rare failure.

A StatefulSet that LeaderWorkerSet's controller cannot make (a quota on StatefulSets, an
admission policy: what the operator's dry run of the templates, :mod:`desired.group_check`,
cannot foresee) is said nowhere in the LeaderWorkerSet's status: its controller records a
Warning event on it (``FailedCreate``, ``FailedUpdate``) and retries with a backoff. So the same
pass lists those events too (one list, by field selector: the LeaderWorkerSet's uid, Warnings)
and :func:`refusal` keeps those still true, read off what the controller has made: a leaders'
StatefulSet refused is current while the LeaderWorkerSet's ``observedGeneration`` trails its
generation (the controller writes it only once the leaders' StatefulSet of that generation is
applied); a group's workers' StatefulSet refused, while that leader pod (the event's ``related``
object, by uid) is there without the rest of its group. Nothing of it is watched, so a pass that
finds the controller still making something (:func:`creating`) asks to be run again soon.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from payloadrun_operator.api.conditions import ReadyReason, StatusField
from payloadrun_operator.api.kinds import LEADER_WORKER_SET
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.observed.status import Check, workload_ready

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # on every pod of a LeaderWorkerSet
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # "0": the group's leader
# LeaderWorkerSet v0.9.0's reasons for a StatefulSet (or its headless Service) it could not make
# or change (``pkg/controllers``: ``FailedCreate``, ``FailedUpdate``), and its notes' shapes
REFUSED_REASONS = frozenset({"FailedCreate", "FailedUpdate"})
LEADERS_NOTE = re.compile(
    r"Failed to (?P<verb>create|update) leader statefulset \S+: (?P<why>.*)", re.S
)
WORKERS_NOTE = re.compile(
    r"Failed to create worker statefulset for leader pod \S+: (?P<why>.*)", re.S
)
LEADERS_TEMPLATE = "spec.inference.template"
WORKERS_TEMPLATE = "spec.inference.workerTemplate, or spec.inference.template where it is unset"


def pods_selector(lws_name: str) -> str:
    return f"{LWS_NAME_LABEL}={lws_name}"


def events_selector(lws: Mapping[str, Any]) -> str:
    """The field selector of the Warning events LeaderWorkerSet's controllers recorded on
    ``lws`` (this object, by uid: not a deleted one's of the same name)."""
    meta = lws["metadata"]
    return ",".join(
        (
            f"involvedObject.kind={LEADER_WORKER_SET.kind}",
            f"involvedObject.name={meta['name']}",
            f"involvedObject.uid={meta['uid']}",
            "type=Warning",
        )
    )


def group_of(pod: Mapping[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LWS_GROUP_INDEX_LABEL)


def leaders_pending(lws: Mapping[str, Any]) -> bool:
    """Whether the controller has not applied the leaders' StatefulSet of ``lws``'s generation
    (it writes ``status.observedGeneration`` only once it has)."""
    observed = (lws.get("status") or {}).get("observedGeneration") or 0
    return observed < (lws["metadata"].get("generation") or 0)


def lone_leaders(pods: Iterable[Mapping[str, Any]], size: int) -> dict[str, str]:
    """The uid -> group index of each leader pod whose group has fewer than ``size`` pods (the
    run's ``podsPerReplica``): its workers' StatefulSet not made yet, or refused."""
    counts: dict[str, int] = {}
    leaders: dict[str, str] = {}
    for pod in pods:
        group = group_of(pod)
        if group is None:
            continue
        counts[group] = counts.get(group, 0) + 1
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(LWS_WORKER_INDEX_LABEL) == "0":
            leaders[meta.get("uid", "")] = group
    return {uid: group for uid, group in leaders.items() if counts[group] < size}


def creating(lws: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], size: int) -> bool:
    """Whether the controller is still making something of ``lws``: the leaders' StatefulSet of
    its generation, or some group's workers' (:func:`lone_leaders`). No watch tells when it is
    done (or refused): a pass that finds it so looks again soon."""
    return leaders_pending(lws) or bool(lone_leaders(pods, size))


def event_time(event: Mapping[str, Any]) -> datetime:
    """When an event was last seen: its series' last observation, its time, or its last
    timestamp (events.k8s.io's recorders fill the first two, core/v1's the last)."""
    series = event.get("series") or {}
    for value in (
        series.get("lastObservedTime"),
        event.get("eventTime"),
        event.get("lastTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        if value:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return datetime.min.replace(tzinfo=UTC)


def refusal(
    lws: Mapping[str, Any],
    events: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    size: int,
) -> Check | None:
    """``Ready`` False (``GroupsRefused``, a Warning) when one of ``lws``'s StatefulSets was
    refused and still is (see the module): which StatefulSet, from which of the run's
    templates, and the API server's words; the latest refusal of each kind. None otherwise."""
    name = lws["metadata"]["name"]
    lone = lone_leaders(pods, size)
    leaders: list[tuple[datetime, str]] = []
    workers: dict[str, tuple[datetime, str]] = {}  # group index -> the latest refusal
    for event in events:
        if event.get("reason") not in REFUSED_REASONS:
            continue
        note = event.get("message") or event.get("note") or ""
        when = event_time(event)
        related = (event.get("related") or {}).get("uid")
        if related:  # about one group's leader pod: its workers' StatefulSet
            group = lone.get(related)
            if group is not None and (when, note) > workers.get(group, (when, "")):
                workers[group] = (when, note)
        elif leaders_pending(lws):
            leaders.append((when, note))
    said = []
    if leaders:
        note = max(leaders)[1]
        found = LEADERS_NOTE.fullmatch(note)
        if found:
            said.append(
                f"could not {found['verb']} its leaders' StatefulSet (pods from "
                f"{LEADERS_TEMPLATE}): {found['why']}"
            )
        else:
            said.append(note)
    if workers:
        groups = sorted(workers, key=int)
        note = max(workers.values())[1]
        found = WORKERS_NOTE.fullmatch(note)
        which = f"replica{'s' if len(groups) > 1 else ''} {', '.join(groups)}"
        said.append(
            f"could not create the workers' StatefulSet of {which} (pods from {WORKERS_TEMPLATE})"
            f": {found['why'] if found else note}"
        )
    if not said:
        return None
    return Check(
        False,
        ReadyReason.GROUPS_REFUSED,
        f"LeaderWorkerSet {name} " + "; and ".join(said) + "; its controller retries: once the "
        "cause is gone (a quota raised, a policy changed, the template fixed) the groups start",
        warning=True,
    )


def ended(pod: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """Each container of ``pod`` that ended (its last run's ``terminated`` record)."""
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or []
    ):
        state, last = container.get("state") or {}, container.get("lastState") or {}
        terminated = last.get("terminated") or state.get("terminated")
        if terminated and (terminated.get("exitCode") != 0 or container.get("restartCount")):
            yield container.get("name", "?"), terminated


def last_failure(pods: Iterable[Mapping[str, Any]], lws_name: str) -> dict[str, Any] | None:
    """The latest container failure among a LeaderWorkerSet's pods, as
    :class:`models.InferenceGroupRestart` (JSON), or None."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        for container, terminated in ended(pod):
            found.append((terminated.get("finishedAt") or "", meta, labels, container, terminated))
    if not found:
        return None
    finished, meta, labels, container, terminated = max(found, key=lambda f: f[0])
    index = labels.get(LWS_GROUP_INDEX_LABEL)
    replica = int(index) if index is not None and index.isdigit() else None
    code, reason = terminated.get("exitCode"), terminated.get("reason")
    where = f"replica {replica}" if replica is not None else "a replica"
    return {
        "time": finished,
        "replica": replica,
        "pod": meta.get("name", "?"),
        "podUid": meta.get("uid", ""),
        "container": container,
        "exitCode": code,
        "reason": reason,
        "message": (
            f"{where} of {lws_name}: container {container} of pod {meta.get('name')} exited "
            f"with code {code}{f' ({reason})' if reason else ''}; LeaderWorkerSet recreates the "
            "replica's group, the other replicas keep serving"
        ),
    }


def restart_fields(recorded: Recorded, failure: Mapping[str, Any] | None) -> dict[str, Any]:
    """The status fields recording ``failure`` when it is one the status does not hold yet (the
    same pod, container and end time are the same failure); else none."""
    if failure is None or not failure["time"]:
        return {}
    last = recorded.last_inference_group_restart
    same = ("podUid", "container", "time")
    if all(last.get(k) == failure[k] for k in same):
        return {}
    return {
        StatusField.INFERENCE_GROUP_RESTARTS: recorded.inference_group_restarts + 1,
        StatusField.LAST_INFERENCE_GROUP_RESTART: dict(failure),
    }


@dataclass(frozen=True)
class Groups:
    """What a pass makes of a run's groups: what it still wants listed (the groups' pods, the
    LeaderWorkerSet's Warning events), the status fields of a failure found in a group, a
    refusal of one of its StatefulSets (:func:`refusal`), and whether to look again soon
    (:func:`creating`)."""

    wants_pods: bool = False
    wants_events: bool = False
    fields: dict[str, Any] = field(default_factory=dict)
    refused: Check | None = None
    recheck: bool = False


def group_status(
    recorded: Recorded,
    lws: Mapping[str, Any] | None,
    size: int,
    pods: list[Any] | None,
    events: list[Any] | None,
) -> Groups:
    """For an active run whose inference is ``lws`` (groups of ``size`` pods): while a group is
    short of ready, the pass lists its groups' pods and the LeaderWorkerSet's Warning events,
    then reads a group's failure (:func:`restart_fields`) and a refusal there."""
    if lws is None or workload_ready(dict(lws))[0]:
        return Groups()
    if pods is None or events is None:
        return Groups(wants_pods=pods is None, wants_events=events is None)
    return Groups(
        fields=restart_fields(recorded, last_failure(pods, lws["metadata"]["name"])),
        refused=refusal(lws, events, pods, size),
        recheck=creating(lws, pods, size),
    )
