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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from payloadrun_operator.api.conditions import StatusField
from payloadrun_operator.observed.status import workload_ready

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # on every pod of a LeaderWorkerSet
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
GROUP_RESTARTED = "InferenceGroupRestarted"  # the Warning event's reason


def pods_selector(lws_name: str) -> str:
    return f"{LWS_NAME_LABEL}={lws_name}"


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


def restart_fields(status: Mapping[str, Any], failure: Mapping[str, Any] | None) -> dict[str, Any]:
    """The status fields recording ``failure`` when it is one the status does not hold yet (the
    same pod, container and end time are the same failure); else none."""
    if failure is None or not failure["time"]:
        return {}
    last = status.get(StatusField.LAST_INFERENCE_GROUP_RESTART) or {}
    same = ("podUid", "container", "time")
    if all(last.get(k) == failure[k] for k in same):
        return {}
    seen = status.get(StatusField.INFERENCE_GROUP_RESTARTS) or 0
    return {
        StatusField.INFERENCE_GROUP_RESTARTS: seen + 1,
        StatusField.LAST_INFERENCE_GROUP_RESTART: dict(failure),
    }


def group_status(
    status: Mapping[str, Any], lws: Mapping[str, Any] | None, pods: list[Any] | None
) -> tuple[bool, dict[str, Any]]:
    """For an active run whose inference is ``lws``: whether a pass wants its groups' pods
    listed (a group short of ready: LeaderWorkerSet may have recreated one), and once ``pods``
    are, the status fields of a failure found there (:func:`restart_fields`)."""
    if lws is None or workload_ready(dict(lws))[0]:
        return False, {}
    if pods is None:
        return True, {}
    return False, restart_fields(status, last_failure(pods, lws["metadata"]["name"]))
