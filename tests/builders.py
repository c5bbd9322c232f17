"""The tests' one set of builders: a run's spec and body, its context, its children and their parts.

As JobSet keeps its test wrappers in one file (``pkg/util/testing/wrappers.go``), so that a field
added to a run, or a new argument of the context, is one edit here rather than one per test file.
Plain functions with keyword overrides: each returns a fresh value the test may change.

Importable from every test folder as ``builders`` (``tests/`` is on the path of every test,
through ``tests/conftest.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from payloadrun_operator.api.models import GROUP, KIND, VERSION, PayloadRunSpec
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.platform.settings import OperatorSettings

# The operator's settings in the unit tests: a sidecar image that names no real registry.
SETTINGS = OperatorSettings(sidecar_image="registry.example/payloadrun:test")
NAME, NAMESPACE, UID = "run1", "ml", "uid-123"
# The ownerReference every child of the default run carries, written out (not built by the code
# under test).
OWNER = {
    "apiVersion": "payloadrun.dev/v1alpha1",
    "kind": "PayloadRun",
    "name": NAME,
    "uid": UID,
    "controller": True,
    "blockOwnerDeletion": True,
}

# A multi-node router-replay run (by handle): tests change what they study.
SPEC: dict[str, Any] = {
    "deploymentType": "MultiNode",
    "routerReplay": True,
    "samplingMaskCapture": False,
    "inference": {"image": "vllm/vllm-openai:v0.33.0", "replicas": 2},
    "orchestrator": {"image": "example/orchestrator:1"},
    "trainer": {"image": "example/trainer:1", "replicas": 4},
}
# The claim a run on the local node asks for ("standard": the node's ReadWriteMany class; on
# kind, the class the static volume of hack/kind/volume.yaml names).
NODE_PAYLOADS: dict[str, Any] = {"volume": {"size": "1Gi", "storageClassName": "standard"}}


def run_spec(**fields: Any) -> dict[str, Any]:
    """:data:`SPEC`, a copy, with the top-level ``fields`` set."""
    return copy.deepcopy(SPEC) | copy.deepcopy(fields)


def run_body(
    name: str, spec: dict[str, Any] | None = None, *, namespace: str | None = None
) -> dict[str, Any]:
    """A ``PayloadRun`` as ``kubectl apply`` sends it: ``spec`` (default :func:`run_spec`)."""
    metadata = {"name": name} | ({"namespace": namespace} if namespace is not None else {})
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": copy.deepcopy(spec) if spec is not None else run_spec(),
    }


def context(
    spec: dict[str, Any] | None = None,
    settings: OperatorSettings = SETTINGS,
    *,
    name: str = NAME,
    namespace: str = NAMESPACE,
    uid: str = UID,
    **fields: Any,
) -> RunContext:
    """The run's context as the operator builds it (its payload mode decided from ``spec``);
    ``fields`` are the context's own (``active``, ``layout``)."""
    model = PayloadRunSpec.model_validate(spec if spec is not None else SPEC)
    meta = {"name": name, "namespace": namespace, "uid": uid}
    return RunContext.of(meta, model, settings, **fields)


def by_kind(children: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Children by ``(kind, name)``."""
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def children_of(spec: dict[str, Any] | None = None, **context_args: Any) -> dict:
    """The children built for ``spec``, by ``(kind, name)``."""
    return by_kind(build_children(context(spec, **context_args)))


def pod_of(spec: dict[str, Any] | None, component: str, **context_args: Any) -> dict[str, Any]:
    """The pod template of a component's workload built for ``spec`` (inference: its
    StatefulSet's; the orchestrator and the trainers: their Job's)."""
    kind = "StatefulSet" if component == "inference" else "Job"
    name = context_args.get("name", NAME)
    return children_of(spec, **context_args)[(kind, f"{name}-{component}")]["spec"]["template"]


def group_spec(**inference: Any) -> dict[str, Any]:
    """:data:`SPEC` with replicas of two pods each, every pod running two API servers on 8100
    and 8101 (the writer keeps 8001), eight GPUs a pod; ``inference`` overrides."""
    spec = run_spec()
    spec["inference"] |= {
        "podsPerReplica": 2,
        "apiServersPerPod": 2,
        "port": 8100,
        "resources": {"limits": {"nvidia.com/gpu": 8}},
    } | copy.deepcopy(inference)
    return spec


def group_templates(spec: dict[str, Any], **context_args: Any) -> tuple[dict, dict]:
    """The leader's and the worker's pod templates of the LeaderWorkerSet built for ``spec``."""
    name = context_args.get("name", NAME)
    lws = children_of(spec, **context_args)[("LeaderWorkerSet", f"{name}-vllm")]
    templates = lws["spec"]["leaderWorkerTemplate"]
    return templates["leaderTemplate"], templates["workerTemplate"]


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """The one main container called ``name`` of a pod (or a pod template's ``spec``)."""
    spec = pod.get("spec", pod)
    (found,) = [c for c in spec["containers"] if c["name"] == name]
    return found


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    """A container's environment: name -> value (or its ``valueFrom``)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# --- a run and its children as the operator observes them -----------------------------------------

T0 = "2026-12-01T10:00:00Z"  # when an observed thing happened (a pod finished, a deletion began)
# Kubernetes' reason for each outcome condition of a Job
JOB_OUTCOME_REASONS = {"Failed": "BackoffLimitExceeded", "Complete": "CompletionsReached"}


def observed_run(
    spec: dict[str, Any] | None = None,
    *,
    name: str = NAME,
    namespace: str = NAMESPACE,
    uid: str = UID,
    labels: dict[str, str] | None = None,
    **status: Any,
) -> dict[str, Any]:
    """A ``PayloadRun`` as the operator reads it after its first pass: generation 1, observed,
    provisioning by handle with the sidecars in the inference pods; ``status`` fields (in the
    API's camelCase) over those. ``spec`` defaults to a failure policy of two restarts."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "generation": 1, "uid": uid}
    if labels is not None:
        metadata["labels"] = labels
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": spec if spec is not None else {"failurePolicy": {"backoffLimit": 2}},
        "status": {
            "observedGeneration": 1,
            "phase": "Provisioning",
            "payloadMode": "ByHandle",
            "sidecars": {"podLayout": 2},
            **status,
        },
    }


def run_owner(run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ownerReference the operator sets on a child of ``run`` (default: :data:`OWNER`)."""
    if run is None:
        return dict(OWNER)
    meta = run["metadata"]
    return OWNER | {"apiVersion": run["apiVersion"], "name": meta["name"], "uid": meta["uid"]}


def job(
    component: str = "trainer",
    *,
    name: str | None = None,
    run: str = NAME,
    namespace: str = NAMESPACE,
    uid: str | None = None,
    labels: dict[str, str] | None = None,
    resource_version: str | None = None,
    parallelism: int = 1,
    ready: int = 1,
    outcome: str | None = None,
    failed: int = 0,
    succeeded: int = 0,
    deleting: bool = False,
) -> dict[str, Any]:
    """A component's Job (``<run>-<component>``, or ``name``) as a watch event gives it:
    ``outcome`` ("Failed", "Complete") sets its condition as Kubernetes does, ``deleting`` its
    deletion timestamp."""
    metadata: dict[str, Any] = {
        "name": name or f"{run}-{component}",
        "namespace": namespace,
        "uid": uid or f"{component}-uid",
    }
    if labels is not None:
        metadata["labels"] = labels
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    if deleting:
        metadata["deletionTimestamp"] = T0
    conditions = []
    if outcome:
        conditions = [{"type": outcome, "status": "True", "reason": JOB_OUTCOME_REASONS[outcome]}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"parallelism": parallelism},
        "status": {
            "ready": ready,
            "conditions": conditions,
            "failed": failed,
            "succeeded": succeeded,
        },
    }


def failed_pod(
    component: str, rank: int, code: int, *, finished: str = T0, suffix: str = "abcde"
) -> dict[str, Any]:
    """A pod of a component's indexed Job (rank ``rank``) whose container exited ``code``."""
    return {
        "metadata": {
            "name": f"{NAME}-{component}-{rank}-{suffix}",
            "annotations": {"batch.kubernetes.io/job-completion-index": str(rank)},
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": component,
                    "state": {"terminated": {"exitCode": code, "finishedAt": finished}},
                }
            ],
        },
    }


def observed_children(*objs: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Children as the operator's cache holds them: by ``(namespace, kind, name)``."""
    return {(o["metadata"]["namespace"], o["kind"], o["metadata"]["name"]): o for o in objs}


def condition_of(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    """The condition ``ctype`` in an object's status (a run's, a Workload's, a Job's), or None."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == ctype), None)


# --- Kueue ---------------------------------------------------------------------------------------


def kueue_condition(ctype: str, status: bool, reason: str, message: str = "") -> dict[str, Any]:
    """A Workload condition as Kueue writes it (metav1.Condition)."""
    return {
        "type": ctype,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-12-04T10:00:00Z",
    }


def kueue_workload(
    *conditions: dict[str, Any],
    run: str = NAME,
    namespace: str = NAMESPACE,
    flavors: dict[str, dict[str, str]] | None = None,
    cluster_queue: str = "team-cq",
    **metadata: Any,
) -> dict[str, Any]:
    """A run's Workload (``payloadrun-<run>``) as Kueue leaves it: ``conditions`` in its status
    and, with ``flavors`` (pod set -> resource -> flavor), ``status.admission``."""
    status: dict[str, Any] = {"conditions": list(conditions)}
    if flavors is not None:
        status["admission"] = {
            "clusterQueue": cluster_queue,
            "podSetAssignments": [
                {"name": name, "flavors": by_resource, "count": 1}
                for name, by_resource in flavors.items()
            ],
        }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"payloadrun-{run}",
            "namespace": namespace,
            "uid": "workload-uid",
            "resourceVersion": "7",
            "generation": 1,
            "labels": {"payloadrun.dev/run": run},
            **metadata,
        },
        "status": status,
    }


def admitted_workload(flavors: dict[str, dict[str, str]], **kwargs: Any) -> dict[str, Any]:
    """A run's Workload Kueue admitted with ``flavors``."""
    return kueue_workload(
        kueue_condition("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue"),
        kueue_condition("Admitted", True, "Admitted", "The workload is admitted"),
        flavors=flavors,
        **kwargs,
    )
