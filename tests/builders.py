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
