"""A queued run's Workload for Kueue, and the admitted flavors in its pods.

A run labelled ``kueue.x-k8s.io/queue-name`` asks Kueue for all of its pods at once: one
``Workload`` (``kueue.x-k8s.io/v1beta2``, ``payloadrun-<run>``, owned by the run) whose pod sets
are the run's own pod templates as the builders composed them, sidecars included, so Kueue counts
every container's requests as the scheduler will (native sidecars through its ``PodRequests``):

========================  =============================================  ====================
pod set                   template                                       count
========================  =============================================  ====================
``inference``             the inference pods (a group run: its leaders)  replicas
``inference-workers``     a group run's workers                          replicas x (pods - 1)
``orchestrator``          the orchestrator                               1
``trainer``               the trainers                                   trainer.replicas
========================  =============================================  ====================

Kueue admits the Workload whole or not at all (gang admission), and the operator creates the
run's pods only then (:mod:`observed.queue`). Pod sets cannot change once quota is reserved: a
run whose pod sets change (``replicas``, a template) gets a new Workload, queued again.

Admission names a ResourceFlavor per pod set and resource; each admitted flavor's
``nodeLabels`` join the pods' ``nodeSelector`` and its ``tolerations`` their tolerations, as
Kueue's own integrations apply them (``pkg/podset``). :func:`placed` puts them in the workloads'
pod templates, with a hash in ``payloadrun.dev/placement``: a readmission to another flavor
reaches the pods (:func:`observed.plan.workload_plan`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from payloadrun_operator.api import names
from payloadrun_operator.api.kinds import (
    LEADER_WORKER_SET,
    WORKLOAD,
    WORKLOAD_PRIORITY_CLASS,
)
from payloadrun_operator.api.names import INFERENCE, ORCHESTRATOR, TRAINER
from payloadrun_operator.desired.builders import BuiltRun, metadata
from payloadrun_operator.desired.pods import INFERENCE_WORKER

Manifest = dict[str, Any]

# pod set name -> the BuiltRun.pods key of its template
POD_SETS = {
    INFERENCE: INFERENCE,
    "inference-workers": INFERENCE_WORKER,
    ORCHESTRATOR: ORCHESTRATOR,
    TRAINER: TRAINER,
}
# Kueue's kind of a priority class (spec.priorityClassRef)
PRIORITY_GROUP = WORKLOAD_PRIORITY_CLASS.group


@dataclass(frozen=True)
class Placement:
    """What admitted flavors add to a pod set's pods."""

    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.node_selector or self.tolerations)


def pod_sets(built: BuiltRun) -> list[Manifest]:
    """The run's pod sets (:data:`POD_SETS`), from the templates ``built`` composed."""
    ctx = built.ctx
    inference, trainer = ctx.spec.inference, ctx.spec.trainer
    counts = {INFERENCE: inference.replicas, ORCHESTRATOR: 1, TRAINER: trainer.replicas}
    if ctx.inference_shape.groups:
        counts["inference-workers"] = inference.replicas * (inference.pods_per_replica - 1)
    return [
        {"name": name, "count": counts[name], "template": copy.deepcopy(built.pods[key])}
        for name, key in POD_SETS.items()
        if name in counts
    ]


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def workload_manifest(
    built: BuiltRun, queue: str, priority: tuple[str, int] | None = None
) -> Manifest:
    """The run's Workload: its pod sets, its LocalQueue, and the priority class its label names
    (``(name, value)``: Kueue's webhook does not resolve it for a Workload it did not make)."""
    ctx = built.ctx
    sets = pod_sets(built)
    meta = metadata(ctx, names.queue_workload_name(ctx.name), INFERENCE)
    meta["labels"].pop(names.LABEL_COMPONENT)  # the whole run's, not a component's
    meta["labels"][names.JOB_UID_LABEL] = ctx.uid
    spec: Manifest = {"queueName": queue, "podSets": sets}
    if priority is not None:
        name, value = priority
        spec["priorityClassRef"] = {
            "group": PRIORITY_GROUP,
            "kind": WORKLOAD_PRIORITY_CLASS.kind,
            "name": name,
        }
        spec["priority"] = value
    # what Kueue refuses to change while it holds quota, hashed: a change is a new Workload
    meta["annotations"] = {names.POD_SETS_ANNOTATION: digest(spec)}
    return {
        "apiVersion": WORKLOAD.api_version,
        "kind": WORKLOAD.kind,
        "metadata": meta,
        "spec": spec,
    }


def same_pod_sets(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether the live Workload was made with ``desired``'s pod sets, queue and priority
    (else it is changed, or replaced)."""
    key = names.POD_SETS_ANNOTATION
    wanted = desired["metadata"]["annotations"][key]
    return (live["metadata"].get("annotations") or {}).get(key) == wanted


def placement_of(
    flavors: Mapping[str, Mapping[str, str]], resource_flavors: Mapping[str, Mapping[str, Any]]
) -> dict[str, Placement]:
    """Each pod set's placement from its admitted flavors (pod set -> resource -> flavor) and
    the ResourceFlavor objects by name: every distinct flavor's ``nodeLabels`` and
    ``tolerations``, merged in the flavors' name order."""
    placements = {}
    for pod_set, by_resource in flavors.items():
        selector: dict[str, str] = {}
        tolerations: list[Mapping[str, Any]] = []
        for flavor in sorted(set(by_resource.values())):
            spec = (resource_flavors.get(flavor) or {}).get("spec") or {}
            selector.update(spec.get("nodeLabels") or {})
            tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
        placements[pod_set] = Placement(selector, tuple(tolerations))
    return placements


def flavor_names(flavors: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Every flavor an admission names, sorted (the ResourceFlavors to read)."""
    return sorted({f for by_resource in flavors.values() for f in by_resource.values()})


def _place_pod(template: Manifest, placement: Placement) -> None:
    spec = template.setdefault("spec", {})
    if placement.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **placement.node_selector}
    if placement.tolerations:
        existing = list(spec.get("tolerations") or [])
        spec["tolerations"] = existing + [t for t in placement.tolerations if t not in existing]


def _pod_templates(workload: Manifest) -> dict[str, Manifest]:
    """A workload's pod templates by pod set name."""
    spec = workload["spec"]
    if workload["kind"] == LEADER_WORKER_SET.kind:
        group = spec["leaderWorkerTemplate"]
        return {INFERENCE: group["leaderTemplate"], "inference-workers": group["workerTemplate"]}
    component = workload["metadata"]["labels"][names.LABEL_COMPONENT]
    return {component: spec["template"]}


def placed(built: BuiltRun, placements: Mapping[str, Placement]) -> list[Manifest]:
    """The run's children with each workload's pods placed where its pod sets were admitted,
    and the placement's hash on the workload (:data:`names.PLACEMENT_ANNOTATION`); the other
    children as they are. Nothing changes without placements (a run without a queue)."""
    if not any(placements.values()):
        return list(built.children)
    out = []
    for child in built.children:
        if not built.is_workload(child):
            out.append(child)
            continue
        workload = copy.deepcopy(child)
        applied = {}
        for pod_set, template in _pod_templates(workload).items():
            placement = placements.get(pod_set)
            if placement:
                _place_pod(template, placement)
                applied[pod_set] = [dict(placement.node_selector), list(placement.tolerations)]
        if applied:
            annotations = workload["metadata"].setdefault("annotations", {})
            annotations[names.PLACEMENT_ANNOTATION] = digest(applied)
        out.append(workload)
    return out
