"""The plan for applying a workload: what to do to bring a live StatefulSet or Job to what the
builders made of the run, without disturbing what is equal.

A workload whose inputs' hash (:func:`pinning.inputs_hash`) is unchanged keeps its template;
only its activity fields (pods or not, a Job's failure limit) are applied, by a field manager
of their own. A Job whose inputs changed is deleted first (its template is immutable) and
recreated once it is gone.

A queued run's workloads also carry the placement Kueue admitted them with (the flavors' node
labels and tolerations, :mod:`desired.queueing`): a workload about to have pods whose placement
differs is applied whole. A suspended Job takes a new placement in place (Kubernetes lets a
suspended Job's scheduling directives change, as Kueue relies on); a running one is recreated.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from payloadrun_operator.api.kinds import JOB
from payloadrun_operator.api.names import INPUTS_ANNOTATION, PLACEMENT_ANNOTATION
from payloadrun_operator.observed.outcome import job_outcome


class WorkloadPlan(StrEnum):
    """What to do to one workload this pass (:func:`workload_plan`)."""

    APPLY = "apply"  # create it, or bring its template up to date (a StatefulSet rolls)
    SCALE = "scale"  # same template: only its activity fields (pods or not, failure limit) change
    KEEP = "keep"  # nothing to write
    RECREATE = (
        "recreate"  # a Job whose inputs changed: its template is immutable, so delete it first
    )
    WAIT = "wait"  # the previous Job is still being deleted


def activity_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a workload that change without its template: whether it has pods (a
    StatefulSet's replicas, a Job's suspend) and a Job's failure limit."""
    spec = manifest.get("spec", {})
    if manifest.get("kind") == JOB.kind:
        fields = {"suspend": bool(spec.get("suspend", False))}
        if "backoffLimit" in spec:
            fields["backoffLimit"] = spec["backoffLimit"]
        return fields
    return {"replicas": spec.get("replicas", 1)}


def activity_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Only the activity fields of ``manifest``, for the activity field manager's apply."""
    meta = manifest["metadata"]
    return {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": activity_of(manifest),
    }


def workload_plan(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> WorkloadPlan:
    """What to do to bring the live workload to ``desired`` without disturbing what is equal."""
    if live is None:
        return WorkloadPlan.APPLY
    if live["metadata"].get("deletionTimestamp"):
        return WorkloadPlan.WAIT
    wanted = desired["metadata"].get("annotations") or {}
    have = live["metadata"].get("annotations") or {}
    is_job = desired["kind"] == JOB.kind
    if have.get(INPUTS_ANNOTATION) != wanted.get(INPUTS_ANNOTATION):
        return WorkloadPlan.RECREATE if is_job else WorkloadPlan.APPLY
    if has_pods(desired) and have.get(PLACEMENT_ANNOTATION) != wanted.get(PLACEMENT_ANNOTATION):
        running = is_job and not (live.get("spec") or {}).get("suspend", False)
        return WorkloadPlan.RECREATE if running else WorkloadPlan.APPLY
    return WorkloadPlan.SCALE if needs_scaling(desired, live) else WorkloadPlan.KEEP


def has_pods(manifest: Mapping[str, Any]) -> bool:
    """Whether the workload ``manifest`` asks for pods (not suspended, replicas above 0)."""
    activity = activity_of(manifest)
    if manifest.get("kind") == JOB.kind:
        return not activity["suspend"]
    return bool(activity["replicas"])


def needs_scaling(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether the live workload's activity differs from ``desired``'s (a finished Job is left
    as it ended: it has no pods to start or stop)."""
    wanted = activity_of(desired)
    live_activity = activity_of({"kind": desired["kind"], "spec": live.get("spec", {})})
    if all(live_activity.get(key) == value for key, value in wanted.items()):
        return False
    return not (desired["kind"] == JOB.kind and job_outcome(live))
