"""A group run's pod templates, checked by the API server as the pods of the StatefulSets they
become.

LeaderWorkerSet's webhook checks its own fields, not the pod templates in it: a template with a
field Kubernetes refuses (a negative ``containerPort``, a port name of 16 characters) is
admitted, and the refusal comes only when LeaderWorkerSet's controller creates the StatefulSets
(the leaders' at once, each group's workers' once its leader pod exists), as a Warning event
``FailedCreate`` on the LeaderWorkerSet; the run's pods never start, and the run itself says
nothing of it (read in LeaderWorkerSet v0.9.0's controllers: ``leaderworkerset_controller.go``
and ``pod_controller.go`` return the error and record the event, no status condition).

So before the operator applies a LeaderWorkerSet whose inputs changed, it asks the API server to
create, as dry runs, two objects of each template (:func:`checks`): a PodTemplate, whose pod
spec every Kubernetes version validates whole, then a StatefulSet, for a StatefulSet's own
rules (a pod that restarts ``Always``, the selector). The PodTemplate is there for clusters
before Kubernetes 1.34: until then the API server did not validate a StatefulSet's pod template
at all (``ValidatePodTemplateSpecForStatefulSet`` checked its labels and annotations; read in
k8s.io/kubernetes v1.29.15 to v1.33.7, and found by the tests on v1.29.15), so the StatefulSet
alone let a negative port through. A refusal (HTTP 422) is the run's spec's, said at its
template's path with each container named (:func:`refusal`), once a template.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from payloadrun_operator.api.kinds import POD_TEMPLATE, STATEFUL_SET

Manifest = dict[str, Any]

LEADER_PATH = "spec.inference.template"
WORKER_PATH = "spec.inference.workerTemplate"
# A name the API server never has (a dry run persists nothing; generateName avoids a clash with
# a StatefulSet of the same name), short enough that no name limit is the refusal.
CHECK_NAME_PREFIX = "payloadrun-check-"


def checks(lws: Mapping[str, Any], has_worker_template: bool) -> list[tuple[str, Manifest]]:
    """``(the run's template path, an object to create as a dry run)`` for the leaders' and
    the workers' templates of ``lws`` (the LeaderWorkerSet the operator built): for each, a
    PodTemplate, then a StatefulSet."""
    spec = lws["spec"]["leaderWorkerTemplate"]
    namespace = lws["metadata"]["namespace"]
    out = []
    for key, path in (
        ("leaderTemplate", LEADER_PATH),
        ("workerTemplate", WORKER_PATH if has_worker_template else LEADER_PATH),
    ):
        template = copy.deepcopy(spec[key])
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        metadata = {"generateName": CHECK_NAME_PREFIX, "namespace": namespace, "labels": labels}
        pod_template = {
            "apiVersion": POD_TEMPLATE.api_version,
            "kind": POD_TEMPLATE.kind,
            "metadata": copy.deepcopy(metadata),
            "template": copy.deepcopy(template),
        }
        statefulset = {
            "apiVersion": STATEFUL_SET.api_version,
            "kind": STATEFUL_SET.kind,
            "metadata": metadata,
            "spec": {
                "replicas": 0,
                "serviceName": lws["metadata"]["name"],
                "selector": {"matchLabels": labels},
                "template": template,
            },
        }
        out += [(path, pod_template), (path, statefulset)]
    return out


def pod_template(check: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod template a check object carries (a PodTemplate's, or a StatefulSet's)."""
    return check["template"] if check["kind"] == POD_TEMPLATE.kind else check["spec"]["template"]


# a field of the template: spec.template.<...> in a StatefulSet, template.<...> in a PodTemplate
_TEMPLATE_FIELD = re.compile(r"(?<![\w.])(?:spec\.)?template\.((?:spec|metadata)[\w.\[\]-]*)")
_CONTAINER_INDEX = re.compile(r"\.(containers|initContainers)\[(\d+)\]")


def refusal(message: str, path: str, check: Mapping[str, Any]) -> str:
    """The API server's refusal of a check object, at the run's template ``path``:
    ``spec.template.spec.containers[1].ports[0].containerPort`` (a StatefulSet's field) or
    ``template.spec.containers[1]...`` (a PodTemplate's) becomes
    ``spec.inference.workerTemplate.spec.containers[proxy].ports[0].containerPort``, the
    composed template's container named (the operator's parts may have shifted the indices)."""
    pod = pod_template(check).get("spec") or {}

    def named(match: re.Match[str]) -> str:
        kind, index = match.group(1), int(match.group(2))
        items = pod.get(kind) or []
        name = items[index].get("name") if index < len(items) else None
        return f".{kind}[{name if name is not None else index}]"

    def field(match: re.Match[str]) -> str:
        return f"{path}." + _CONTAINER_INDEX.sub(named, f".{match.group(1)}")[1:]

    text = re.sub(r'^(StatefulSet\.apps|PodTemplate) "[^"]*" is invalid: ', "", message)
    return (
        f"{path}: the API server refuses its pods as a StatefulSet's (as LeaderWorkerSet's "
        f"controller would create them): {_TEMPLATE_FIELD.sub(field, text)}"
    )
