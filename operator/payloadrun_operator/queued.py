"""The reconcile's part for a run labelled ``kueue.x-k8s.io/queue-name``: whether Kueue lets its
pods run (its :class:`Gate`, from its Workload and the admitted ResourceFlavors) and its Workload
brought to what the run needs (:func:`bring_queue`), around the pure parts
(:mod:`desired.queueing` builds, :mod:`observed.queue` reads). The follower's side (the quota
given back after an eviction, ``Finished``) is carried out after the pass's status write
(:mod:`reconcile`); a Workload's change of admission owes its run the spec side again
(:func:`observed.following.child_event_requeues`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from payloadrun_operator.api.kinds import RESOURCE_FLAVOR, WORKLOAD, WORKLOAD_PRIORITY_CLASS
from payloadrun_operator.api.names import PRIORITY_CLASS_LABEL, queue_workload_name
from payloadrun_operator.desired import queueing
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.desired.builders import BuiltRun
from payloadrun_operator.observed import queue
from payloadrun_operator.observed.following import Follower, live_object
from payloadrun_operator.platform.kube import KubeApiError
from payloadrun_operator.platform.runtime import Operator


@dataclasses.dataclass(frozen=True)
class Gate:
    """Whether a run's pods may run as far as Kueue is concerned (a run without a queue: yes),
    its Workload as it is, and where the admitted flavors put each pod set."""

    admitted: bool = True
    workload: dict[str, Any] | None = None
    placements: dict[str, queueing.Placement] = dataclasses.field(default_factory=dict)


async def queue_gate(
    op: Operator, follower: Follower | None, meta: Mapping[str, Any], queue_name: str | None
) -> Gate:
    """A queued run's :class:`Gate`, from its Workload (the follower's cache, once synced) and
    the ResourceFlavors its admission names; any other run's is open (and a run whose queue
    label was removed gives its quota back: its Workload is deleted)."""
    if not op.discovery.serves(WORKLOAD):
        return Gate()  # a queued run is refused later, with KueueMissing
    if queue_name is None:
        await drop_workload(op, follower, meta)
        return Gate()
    ns, name = meta["namespace"], queue_workload_name(meta["name"])
    workload = await live_object(op, follower, WORKLOAD, ns, name)
    admission = queue.admission_of(workload)
    if not admission.runs_pods:
        return Gate(False, workload)
    flavors = {}
    for flavor in queueing.flavor_names(admission.flavors):  # cluster-scoped, a few at most
        found = await op.client.get(RESOURCE_FLAVOR.api_version, RESOURCE_FLAVOR.kind, "", flavor)
        flavors[flavor] = found or {}
    return Gate(True, workload, queueing.placement_of(admission.flavors, flavors))


async def drop_workload(op: Operator, follower: Follower | None, meta: Mapping[str, Any]) -> None:
    """Delete the Workload of a run that no longer asks for a queue (none to delete: nothing,
    and no request once the follower's cache is synced)."""
    ns, name = meta["namespace"], queue_workload_name(meta["name"])
    synced, cached = follower.live(WORKLOAD.kind, ns, name) if follower else (False, None)
    if synced and cached is None:
        return
    await op.client.delete(WORKLOAD.api_version, WORKLOAD.kind, ns, name, "Background")


async def priority_of(op: Operator, meta: Mapping[str, Any]) -> tuple[str, int] | None:
    """The WorkloadPriorityClass a run's ``kueue.x-k8s.io/priority-class`` label names, with its
    value (Kueue resolves it only for Workloads it makes); None without the label."""
    name = (meta.get("labels") or {}).get(PRIORITY_CLASS_LABEL)
    if not name:
        return None
    kind = WORKLOAD_PRIORITY_CLASS
    found = await op.client.get(kind.api_version, kind.kind, "", name)
    if found is None:
        raise KubeApiError(
            404,
            "NotFound",
            f"WorkloadPriorityClass {name!r} (the run's {PRIORITY_CLASS_LABEL} label) does not "
            "exist: create it, or remove the label",
            f"reading WorkloadPriorityClass {name}",
        )
    return name, int(found.get("value", 0))


async def bring_queue(
    op: Operator,
    follower: Follower | None,
    body: Mapping[str, Any],
    built: BuiltRun,
    queue_name: str,
    gate: Gate,
) -> BuiltRun:
    """Bring a queued run's Workload to what ``built`` needs, and return what to apply: the
    children placed where Kueue admitted them. A Workload whose pod sets, queue or priority
    changed is replaced while it holds quota (else changed in place) and queued again: until
    Kueue admits the new one the run has no pods (built again, stopped)."""
    meta = body["metadata"]
    desired = queueing.workload_manifest(built, queue_name, await priority_of(op, meta))
    live = gate.workload
    if live is not None and queueing.same_pod_sets(desired, live):
        return built.with_children(queueing.placed(built, gate.placements))
    if live is not None and queue.admission_of(live).state in queue.HOLDING_QUOTA:
        await op.client.delete(
            WORKLOAD.api_version,
            WORKLOAD.kind,
            meta["namespace"],
            desired["metadata"]["name"],
            "Background",
            uid=live["metadata"]["uid"],
        )
    else:  # a new Workload, or one without quota: Kueue lets its spec change
        answer = await op.client.apply(desired)
        if follower is not None:
            follower.wrote(answer)
    if not gate.admitted:
        return built
    stopped = admit(body, op.settings, queue_admitted=False).built
    assert stopped is not None  # the same body was just accepted
    return stopped
