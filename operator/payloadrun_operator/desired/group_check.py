"""A group run's pod templates, checked by the API server as the StatefulSets they become.

LeaderWorkerSet's webhook checks its own fields, not the pod templates in it: a template with a
field Kubernetes refuses (a negative ``containerPort``, a port name of 16 characters) is
admitted, and the refusal comes only when LeaderWorkerSet's controller creates the StatefulSets
(the leaders' at once, each group's workers' once its leader pod exists), as a Warning event
``FailedCreate`` on the LeaderWorkerSet; the run's pods never start, and the run itself says
nothing of it (read in LeaderWorkerSet v0.9.0's controllers: ``leaderworkerset_controller.go``
and ``pod_controller.go`` return the error and record the event, no status condition).

So before the operator applies a LeaderWorkerSet whose inputs changed, it asks the API server to
create, as a dry run, a StatefulSet of each template (:func:`statefulsets`): the same
validation a StatefulSet gets, admission included. A refusal (HTTP 422) is the run's spec's,
said at its template's path with each container named (:func:`refusal`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from payloadrun_operator.api.kinds import STATEFUL_SET

Manifest = dict[str, Any]

LEADER_PATH = "spec.inference.template"
WORKER_PATH = "spec.inference.workerTemplate"
# A name the API server never has (a dry run persists nothing; generateName avoids a clash with
# a StatefulSet of the same name), short enough that no name limit is the refusal.
CHECK_NAME_PREFIX = "payloadrun-check-"


def statefulsets(lws: Mapping[str, Any], has_worker_template: bool) -> list[tuple[str, Manifest]]:
    """``(the run's template path, a StatefulSet to create as a dry run)`` for the leaders' and
    the workers' templates of ``lws`` (the LeaderWorkerSet the operator built)."""
    spec = lws["spec"]["leaderWorkerTemplate"]
    out = []
    for key, path in (
        ("leaderTemplate", LEADER_PATH),
        ("workerTemplate", WORKER_PATH if has_worker_template else LEADER_PATH),
    ):
        template = copy.deepcopy(spec[key])
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        out.append(
            (
                path,
                {
                    "apiVersion": STATEFUL_SET.api_version,
                    "kind": STATEFUL_SET.kind,
                    "metadata": {
                        "generateName": CHECK_NAME_PREFIX,
                        "namespace": lws["metadata"]["namespace"],
                        "labels": labels,
                    },
                    "spec": {
                        "replicas": 0,
                        "serviceName": lws["metadata"]["name"],
                        "selector": {"matchLabels": labels},
                        "template": template,
                    },
                },
            )
        )
    return out


_TEMPLATE_FIELD = re.compile(r"spec\.template\.((?:spec|metadata)[\w.\[\]-]*)")
_CONTAINER_INDEX = re.compile(r"\.(containers|initContainers)\[(\d+)\]")


def refusal(message: str, path: str, statefulset: Mapping[str, Any]) -> str:
    """The API server's refusal of a check's StatefulSet, at the run's template ``path``:
    ``spec.template.spec.containers[1].ports[0].containerPort`` becomes
    ``spec.inference.workerTemplate.spec.containers[proxy].ports[0].containerPort``, the
    composed template's container named (the operator's parts may have shifted the indices)."""
    pod = statefulset["spec"]["template"].get("spec") or {}

    def named(match: re.Match[str]) -> str:
        kind, index = match.group(1), int(match.group(2))
        items = pod.get(kind) or []
        name = items[index].get("name") if index < len(items) else None
        return f".{kind}[{name if name is not None else index}]"

    def field(match: re.Match[str]) -> str:
        return f"{path}." + _CONTAINER_INDEX.sub(named, f".{match.group(1)}")[1:]

    text = re.sub(r'^StatefulSet\.apps "[^"]*" is invalid: ', "", message)
    return (
        f"{path}: the API server refuses its pods as a StatefulSet's (as LeaderWorkerSet's "
        f"controller would create them): {_TEMPLATE_FIELD.sub(field, text)}"
    )
