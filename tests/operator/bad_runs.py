"""render's bad-input table: PayloadRuns the API server refuses for their schema, each with the
errors render must print, and the near misses both accept.

One table for two tests: ``test_render_bad_input.py`` runs ``payloadrun-operator render`` on
each, ``tests/integration/test_render_api.py`` sends each to a real kube-apiserver (``kubectl
apply --dry-run=server``) and checks that render refuses what it refuses, in its words. Loaded
by path there, so keep it free of imports from the test folders.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

BASE_RUN: dict[str, Any] = {
    "apiVersion": "payloadrun.dev/v1alpha1",
    "kind": "PayloadRun",
    "metadata": {"name": "bad"},
    "spec": {
        "deploymentType": "MultiNode",
        "routerReplay": True,
        "inference": {"image": "vllm/vllm-openai:v0.33.0", "replicas": 2},
        "orchestrator": {"image": "example/orchestrator:1"},
        "trainer": {"image": "example/trainer:1", "replicas": 4},
    },
}
ABSENT = object()  # set_path's value that deletes the field


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set (or, with ``ABSENT``, delete) the field at a dotted path; ``[i]`` indexes a list."""
    steps: list[str | int] = []
    for part in path.split("."):
        steps.append(part.split("[", 1)[0])
        steps += [int(i) for i in re.findall(r"\[(\d+)\]", part)]
    node: Any = doc
    for step in steps[:-1]:
        node = node[step]
    if value is ABSENT:
        del node[steps[-1]]
    else:
        node[steps[-1]] = value


def container(role_main: str, **fields: Any) -> dict[str, Any]:
    """A pod template whose one container is the role's main one, with ``fields``."""
    return {"spec": {"containers": [{"name": role_main, **fields}]}}


@dataclass(frozen=True)
class Case:
    """A run made of ``BASE_RUN`` with ``changes`` (dotted path: value), and the errors render
    must print: each a field path and words its line must hold (the kind of error, what the
    schema wants, the value given)."""

    id: str
    changes: dict[str, Any]
    errors: list[tuple[str, ...]] = field(default_factory=list)

    def run(self) -> dict[str, Any]:
        doc = copy.deepcopy(BASE_RUN)
        for path, value in self.changes.items():
            set_path(doc, path, value)
        return doc


def type_error(path: str, wants: str, given_type: str, given: str) -> tuple[str, ...]:
    """The API server's words for a value of the wrong type, and the value render adds."""
    return (
        path,
        f'Invalid value: "{given_type}": {path} in body must be of type {wants}: "{given_type}"',
        f"(the value given: {given})",
    )


INF = "spec.inference.template"
VLLM = f"{INF}.spec.containers[0]"
TRAINER = "spec.trainer.template.spec.containers[0]"

BAD: list[Case] = [
    Case(
        "container port in words",
        {INF: container("vllm", ports=[{"containerPort": "eight-thousand"}])},
        [type_error(f"{VLLM}.ports[0].containerPort", "integer", "string", '"eight-thousand"')],
    ),
    Case(
        "env as a map",
        {INF: container("vllm", env={"HF_HOME": "/cache"})},
        [
            type_error(f"{VLLM}.env", "array", "object", '{"HF_HOME":"/cache"}'),
            (f"{VLLM}.env.HF_HOME", f'unknown field "{VLLM}.env.HF_HOME"'),
        ],
    ),
    Case(
        "template labels as a list",
        {INF: {"metadata": {"labels": ["team-a"]}}},
        [type_error(f"{INF}.metadata.labels", "object", "array", '["team-a"]')],
    ),
    Case(
        "probe period in words",
        {
            INF: container(
                "vllm", readinessProbe={"periodSeconds": "five", "tcpSocket": {"port": 8000}}
            )
        },
        [type_error(f"{VLLM}.readinessProbe.periodSeconds", "integer", "string", '"five"')],
    ),
    Case(
        "runtime class as a number",
        {f"{INF}": {"spec": {"runtimeClassName": 5}}},
        [type_error(f"{INF}.spec.runtimeClassName", "string", "integer", "5")],
    ),
    Case(
        "env entry without a name",
        {INF: container("vllm", env=[{"value": "1"}])},
        [(f"{VLLM}.env[0].name", "Required value")],
    ),
    Case(
        "replicas in words",
        {"spec.trainer.replicas": "two"},
        [type_error("spec.trainer.replicas", "integer", "string", '"two"')],
    ),
    Case(
        "replicas as a quoted number",  # pydantic alone would take "2"
        {"spec.trainer.replicas": "2"},
        [type_error("spec.trainer.replicas", "integer", "string", '"2"')],
    ),
    Case(
        "replicas with a fraction",
        {"spec.inference.replicas": 1.5},
        [
            type_error("spec.inference.replicas", "integer", "number", "1.5"),
            (  # the API server's second line for it, with no field path of its own
                "<nil>",
                'Invalid value: "": Checked value must be of type integer (default format) in '
                "spec.inference.replicas (the value given: 1.5)",
            ),
        ],
    ),
    Case(
        "a port beyond int32",
        {INF: container("vllm", ports=[{"containerPort": 3_000_000_000}])},
        [
            (
                "<nil>",
                'Invalid value: "": Checked value must be of type integer with format int32 in '
                f"{VLLM}.ports[0].containerPort (the value given: 3000000000)",
            )
        ],
    ),
    Case(
        "a boolean in words",  # pydantic alone would take "yes"
        {"spec.routerReplay": "yes"},
        [type_error("spec.routerReplay", "boolean", "string", '"yes"')],
    ),
    Case(
        "an unknown enum value",
        {"spec.deploymentType": "Multinode"},
        [
            (
                "spec.deploymentType",
                'Unsupported value: "Multinode": supported values: "MultiNode", "SingleNode"',
            )
        ],
    ),
    Case(
        "a role missing",
        {"spec.trainer": ABSENT},
        [("spec.trainer", "spec.trainer: Required value")],
    ),
    Case(
        "a null role is a missing one",  # the API server drops a null before validating
        {"spec.orchestrator": None},
        [("spec.orchestrator", "spec.orchestrator: Required value")],
    ),
    Case(
        "a container without a name (the list's map key)",
        {INF: {"spec": {"containers": [{"image": "vllm/vllm-openai:v0.33.0"}]}}},
        [(f"{INF}.spec.containers[0].name", "Required value")],
    ),
    Case(
        "two env entries of one name",
        {INF: container("vllm", env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}])},
        [(f"{VLLM}.env[1]", 'Duplicate value: {"name":"A"}')],
    ),
    Case(
        "two ports that differ only by the default protocol",
        {
            INF: container(
                "vllm",
                ports=[{"containerPort": 9000}, {"containerPort": 9000, "protocol": "TCP"}],
            )
        },
        [(f"{VLLM}.ports[1]", 'Duplicate value: {"containerPort":9000,"protocol":"TCP"}')],
    ),
    Case(
        "a quantity that is not one (int-or-string with a pattern)",
        {INF: container("vllm", resources={"limits": {"memory": "lots"}})},
        [
            (
                f"{VLLM}.resources.limits.memory",
                'Invalid value: "lots"',
                f"{VLLM}.resources.limits.memory in body should match '^(\\+|-)?",
            )
        ],
    ),
    Case(
        "an int-or-string port given a list",
        {INF: container("vllm", livenessProbe={"httpGet": {"path": "/health", "port": [8000]}})},
        [type_error(f"{VLLM}.livenessProbe.httpGet.port", "integer,string", "array", "[8000]")],
    ),
    Case(
        "a list given a string, deep in affinity",
        {
            "spec.trainer.template": {
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {"key": "gpu", "operator": "In", "values": "h100"}
                                        ]
                                    }
                                ]
                            }
                        }
                    }
                }
            }
        },
        [
            type_error(
                "spec.trainer.template.spec.affinity.nodeAffinity."
                "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]."
                "matchExpressions[0].values",
                "array",
                "string",
                '"h100"',
            )
        ],
    ),
    Case(
        "an int32 field given a boolean (the API server names the format)",
        {INF: container("vllm", readinessProbe={"periodSeconds": True, "tcpSocket": {"port": 1}})},
        [
            (
                f"{VLLM}.readinessProbe.periodSeconds",
                f'Invalid value: "": {VLLM}.readinessProbe.periodSeconds in body must be of '
                'type int32: ""',
                "(the value given: true)",
            )
        ],
    ),
    Case(
        "a port out of range",
        {"spec.inference.port": 70000},
        [
            (
                "spec.inference.port",
                "Invalid value: 70000: spec.inference.port in body should be less than or "
                "equal to 65535",
            )
        ],
    ),
    Case(
        "an empty image",
        {"spec.trainer.image": ""},
        [
            (
                "spec.trainer.image",
                'Invalid value: "": spec.trainer.image in body should be at least 1 chars long',
            )
        ],
    ),
    Case(
        "an image name too long",
        {"spec.trainer.image": "x" * 300},
        [("spec.trainer.image", "Too long: may not be more than 253 bytes")],
    ),
    Case(
        "a relative payload root",
        {"spec.payloads": {"root": "payloads/run"}},
        [
            (
                "spec.payloads.root",
                "Invalid value: \"payloads/run\": spec.payloads.root in body should match '^/'",
            )
        ],
    ),
    Case(
        "misspelt fields, the run's own and a template's",
        {"spec.trainer.replica": 4, "spec.trainer.template": container("trainer", imagee="x")},
        [
            ("spec.trainer.replica", 'unknown field "spec.trainer.replica"'),
            (f"{TRAINER}.imagee", f'unknown field "{TRAINER}.imagee"'),
        ],
    ),
    Case(
        "the run's own env as a map",
        {"spec.orchestrator.env": {"A": "1"}},
        [type_error("spec.orchestrator.env", "array", "object", '{"A":"1"}')],
    ),
    Case(
        "a name Kubernetes refuses",
        {"metadata.name": "My_Run"},
        [("metadata.name", 'Invalid value: "My_Run": a lowercase RFC 1123 subdomain')],
    ),
    Case(
        "an env value as a number (a YAML slip)",
        {INF: container("vllm", env=[{"name": "WORKERS", "value": 4}])},
        [type_error(f"{VLLM}.env[0].value", "string", "integer", "4")],
    ),
    Case(
        "the run's own env value as a number",
        {"spec.trainer.env": [{"name": "WORKERS", "value": 4}]},
        [type_error("spec.trainer.env[0].value", "string", "integer", "4")],
    ),
    Case(
        "a node selector value as a boolean",
        {"spec.trainer.template": {"spec": {"nodeSelector": {"gpu": True}}}},
        [type_error("spec.trainer.template.spec.nodeSelector.gpu", "string", "boolean", "true")],
    ),
    Case(
        "a CPU count with a fraction (a quantity is an integer or a string here)",
        {INF: container("vllm", resources={"requests": {"cpu": 0.5}})},
        [type_error(f"{VLLM}.resources.requests.cpu", "integer,string", "number", "0.5")],
    ),
    Case(
        "containers as a map",
        {INF: {"spec": {"containers": {"name": "vllm"}}}},
        [
            type_error(f"{INF}.spec.containers", "array", "object", '{"name":"vllm"}'),
            (f"{INF}.spec.containers.name", f'unknown field "{INF}.spec.containers.name"'),
        ],
    ),
    Case(
        "a null container",
        {INF: {"spec": {"containers": [None]}}},
        [type_error(f"{INF}.spec.containers[0]", "object", "null", "null")],
    ),
    Case(
        "a template's own name (a template has none)",
        {INF: {"metadata": {"name": "mine"}}},
        [(f"{INF}.metadata.name", f'unknown field "{INF}.metadata.name"')],
    ),
    Case(
        "a mount option twice (a set list)",
        {
            INF: container(
                "vllm",
                volumeMounts=[{"name": "c", "mountPath": "/c", "bindMountOptions": ["ro", "ro"]}],
            )
        },
        [(f"{VLLM}.volumeMounts[0].bindMountOptions[1]", 'Duplicate value: "ro"')],
    ),
    Case(
        "every error of a document at once",
        {
            "spec.trainer.replicas": "two",
            "spec.deploymentType": "Multinode",
            INF: container("vllm", env=[{"value": "1"}], ports=[{"containerPort": "http"}]),
        },
        [
            type_error("spec.trainer.replicas", "integer", "string", '"two"'),
            ("spec.deploymentType", 'Unsupported value: "Multinode"'),
            (f"{VLLM}.env[0].name", "Required value"),
            type_error(f"{VLLM}.ports[0].containerPort", "integer", "string", '"http"'),
        ],
    ),
]

# Near misses: what the API server takes, so render must too.
GOOD: list[Case] = [
    Case(
        "a GPU count as a number, a port by name (int-or-string)",
        {
            INF: container(
                "vllm",
                resources={"limits": {"nvidia.com/gpu": 8, "memory": "64Gi"}},
                livenessProbe={"httpGet": {"path": "/health", "port": "http"}},
                ports=[{"name": "http", "containerPort": 8000}],
            )
        },
    ),
    Case("a null template is no template", {"spec.trainer.template": None}),
    Case("replicas as a whole float", {"spec.trainer.replicas": 2.0}),
    Case(
        "free-form fields the CRD keeps (env valueFrom)",
        {"spec.trainer.env": [{"name": "X", "valueFrom": {"anything": {"goes": 1}}}]},
    ),
]
