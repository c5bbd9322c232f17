"""Every manifest the operator builds matches the Kubernetes API's own schema: no cluster needed.

The schemas are kubernetes-validate's (PyPI): JSON schemas made from each Kubernetes minor
version's OpenAPI document. The strict ones refuse unknown fields (as ``kubectl --validate=strict``
does), so a misspelt field fails here, not in a reconcile against a real cluster. The version is
the control plane's (``KUBERNETES_VERSION`` in cluster/versions.env). kubernetes-validate ships
one set per minor version (1.37.0 for 1.37): Kubernetes changes no API in a patch release, and
``test_bundled_schema_is_the_control_planes_api`` compares it with the exact version's OpenAPI
document whenever ``cluster/build.sh`` has left that version's source in the Go module cache.

jsonschema runs kubernetes-validate's schema files itself, to report every error of a manifest
(the library's ``validate`` raises only the one jsonschema ranks first).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any

import jsonschema
import pytest
import referencing
import referencing.jsonschema
import yaml
from kubernetes_validate import utils as kubernetes_validate

from builders import context, group_spec
from payloadrun_devcluster.binaries import cache_dir, read_versions
from payloadrun_devkit.required import skip_or_fail
from payloadrun_operator.api.crd import build_crd
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.cleanup import build_cleanup

KUBERNETES_VERSION = read_versions()["KUBERNETES_VERSION"].removeprefix("v")  # e.g. 1.37.2
MINOR = kubernetes_validate.major_minor(KUBERNETES_VERSION)


# --- the validator -------------------------------------------------------------------------------


@functools.cache
def schema_dir() -> str:
    """kubernetes-validate's strict schemas for the control plane's minor version."""
    bundled = [v for v in kubernetes_validate.all_versions() if v.startswith(f"{MINOR}.")]
    if not bundled:
        pytest.fail(
            f"kubernetes-validate has no schemas for Kubernetes {MINOR} (cluster/versions.env; "
            f"its newest: {kubernetes_validate.latest_version()}): upgrade it in pyproject.toml",
            pytrace=False,
        )
    return f"kubernetes-json-schema/v{bundled[-1]}-local-strict"


def schema_file(name: str) -> dict[str, Any]:
    return kubernetes_validate.schema_contents(f"{schema_dir()}/{name}", KUBERNETES_VERSION)


@functools.cache
def validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    # The file naming of kubernetes-validate: apps/v1 -> apps-v1, rbac.authorization.k8s.io/v1
    # -> rbac-v1, v1 -> v1.
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = schema_file(f"{kind.lower()}-{group_version}.json")
    definitions = referencing.Resource.from_contents(schema_file("_definitions.json"))
    registry = definitions @ (referencing.Resource.from_contents(schema) @ referencing.Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


# LeaderWorkerSet is no Kubernetes kind: its pod templates are checked against Kubernetes' own
# PodTemplateSpec (strict), the rest against the CRD of the pinned LWS that cluster/build.sh
# copies beside its manager, made as strict (an unknown field is refused), when it is there.
LWS_API_VERSION, LWS_KIND = "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"
DEFINITIONS = "/api/_definitions.json#/$defs/"


def lws_crd_spec_schema() -> dict[str, Any] | None:
    """The pinned LeaderWorkerSet CRD's schema of ``spec``, strict, or None without its build."""
    version = read_versions().get("LWS_VERSION", "")
    crd_file = (
        cache_dir()
        / "bin"
        / f"lws-{version}"
        / "config"
        / "crd"
        / "bases"
        / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
    )
    if not version or not crd_file.is_file():
        return None
    crd = yaml.load(crd_file.read_text(), Loader=yaml.CSafeLoader)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return strict(served["schema"]["openAPIV3Schema"]["properties"]["spec"])


def strict(schema: Any) -> Any:
    """A CRD's structural schema that refuses unknown fields, as the strict Kubernetes ones do."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@functools.cache
def lws_validator() -> jsonschema.protocols.Validator:
    pod_template = {"$ref": DEFINITIONS + "io.k8s.api.core.v1.PodTemplateSpec"}
    spec = lws_crd_spec_schema() or {
        "type": "object",
        "properties": {"leaderWorkerTemplate": {"type": "object", "properties": {}}},
    }
    group = spec["properties"]["leaderWorkerTemplate"]
    group["properties"] |= {"leaderTemplate": pod_template, "workerTemplate": pod_template}
    schema = {
        "$id": "https://kubernetes.io/api/leaderworkerset-v1.json",  # refs resolve beside it
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": LWS_API_VERSION},
            "kind": {"const": LWS_KIND},
            "metadata": {"$ref": DEFINITIONS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
            "spec": spec,
        },
        "additionalProperties": False,
    }
    definitions = referencing.Resource.from_contents(schema_file("_definitions.json"))
    registry = definitions @ referencing.Registry()
    return jsonschema.Draft202012Validator(schema, registry=registry)


def where(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out.lstrip(".") or "(top level)"


def schema_errors(manifest: dict[str, Any]) -> list[str]:
    """Every way ``manifest`` breaks the Kubernetes schema, as ``path: message``."""
    if (manifest["apiVersion"], manifest["kind"]) == (LWS_API_VERSION, LWS_KIND):
        found = lws_validator().iter_errors(manifest)
    else:
        found = validator(manifest["apiVersion"], manifest["kind"]).iter_errors(manifest)
    return sorted(f"{where(e.absolute_path)}: {e.message}" for e in found)


def assert_valid(manifest: dict[str, Any]) -> None:
    errors = schema_errors(manifest)
    assert not errors, (
        f"{manifest['kind']} {manifest['metadata']['name']} does not match the Kubernetes "
        f"{KUBERNETES_VERSION} schema ({schema_dir()}):\n  " + "\n  ".join(errors)
    )


# --- the runs -----------------------------------------------------------------------------------

FULL = {
    "deploymentType": "MultiNode",
    "routerReplay": True,
    "samplingMaskCapture": True,
    "maxOffPolicySteps": 2,
    "maxSteps": 1000,
    "resume": True,
    "payloads": {
        "mode": "ByHandle",
        "mountPath": "/mnt/shared",
        "root": "/mnt/shared/team/run",
        "volume": {"size": "2Ti", "storageClassName": "nfs", "deletionPolicy": "Retain"},
    },
    "inference": {
        "image": "vllm/vllm-openai:v0.33.0",
        "replicas": 4,
        "command": ["vllm", "serve"],
        "args": ["--enable-return-routed-experts"],
        "env": [
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
        ],
        "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "512Gi"}},
        "writer": {
            "image": "mine/writer:2",
            "resources": {"requests": {"cpu": 2}, "limits": {"memory": "8Gi"}},
            "port": 9000,
            "metricsPort": 9100,
            "args": ["--log-level", "debug"],
        },
    },
    "orchestrator": {
        "image": "example/orchestrator:1",
        "command": ["uv", "run", "orchestrator"],
        "args": ["@", "rl.toml"],
        "env": [{"name": "WANDB_MODE", "value": "offline"}],
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}},
        "retention": {"workers": 64, "scanIntervalSeconds": 30, "port": 9002, "metricsPort": 9102},
    },
    "trainer": {
        "image": "example/trainer:1",
        "replicas": 8,
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    },
    "placement": {
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "serviceAccountName": "rl",
        "imagePullSecrets": [{"name": "regcred"}],
    },
}

TEMPLATED = {
    "runDirectory": {"mountPath": "/data"},
    "payloads": {"root": "/data/outputs/payloads"},
    "inference": {
        "replicas": 2,
        "template": {
            "metadata": {"labels": {"team": "rl"}, "annotations": {"a": "b"}},
            "spec": {
                "runtimeClassName": "nvidia",
                "containers": [
                    {
                        "name": "vllm",
                        "image": "primeintellect/prime-rl:main",
                        "ports": [{"name": "api", "containerPort": 8000}],
                        "startupProbe": {"httpGet": {"path": "/health", "port": 8000}},
                        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                        "volumeMounts": [{"name": "config", "mountPath": "/config"}],
                    }
                ],
                "volumes": [{"name": "config", "configMap": {"name": "rl-configs"}}],
                "priorityClassName": "rl",
            },
        },
    },
    "orchestrator": {
        "template": {
            "spec": {
                "containers": [
                    {"name": "orchestrator", "image": "o:1", "ports": [{"containerPort": 5555}]}
                ],
                "nodeSelector": {"cpu": "true"},
            }
        }
    },
    "trainer": {
        "replicas": 2,
        "processesPerNode": 8,
        "image": "t:1",
        "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "512Gi"}},
        "template": {
            "spec": {
                "hostNetwork": True,
                "volumes": [{"name": "ib", "hostPath": {"path": "/dev/infiniband"}}],
                "containers": [
                    {
                        "name": "trainer",
                        "volumeMounts": [{"name": "ib", "mountPath": "/dev/infiniband"}],
                    }
                ],
            }
        },
    },
}

RUNS = {
    "by-handle, pod templates and a run directory": TEMPLATED,
    "by-handle, managed claim": {},
    "by-handle, every field set": FULL,
    "by-handle, existing claim": {"payloads": {"volume": {"claimName": "team-nfs"}}},
    "inline, single node": {"deploymentType": "SingleNode"},
    "inline, disaggregated": {"inference": {"image": "vllm/vllm:1", "disaggregated": True}},
    "inline, no per-token payloads": {"routerReplay": False},
    "by-handle, replicas of two pods, every pod serving": {
        "inference": {
            **group_spec()["inference"],
            "workerTemplate": {"spec": {"priorityClassName": "w"}},
        }
    },
    "inline, replicas of three pods, the leader serving": {
        "payloads": {"mode": "Inline"},
        "inference": group_spec(apiServers="Leader", podsPerReplica=3)["inference"],
    },
}


def children_of(spec_dict: dict[str, Any], overrides: dict[str, Any]) -> list[dict[str, Any]]:
    return build_children(context({**spec_dict, **overrides}))


@pytest.mark.parametrize("run", RUNS)
def test_every_child_matches_the_kubernetes_schema(spec_dict, run):
    children = children_of(spec_dict, RUNS[run])
    for child in children:
        assert_valid(child)
    kinds = {c["kind"] for c in children}
    assert {"ConfigMap", "Service", "Job"} <= kinds
    assert len(kinds & {"StatefulSet", "LeaderWorkerSet"}) == 1


@pytest.mark.parametrize("run", [r for r in RUNS if r.startswith("by-handle")])
def test_a_finished_runs_cleanup_job_matches_the_kubernetes_schema(spec_dict, run):
    assert_valid(build_cleanup(context({**spec_dict, **RUNS[run]})))


def test_every_kind_the_operator_builds_is_checked(spec_dict):
    built = {
        (c["apiVersion"], c["kind"])
        for overrides in RUNS.values()
        for c in children_of(spec_dict, overrides)
    }
    assert built == {
        ("v1", "PersistentVolumeClaim"),
        ("v1", "ConfigMap"),
        ("v1", "Service"),
        ("apps/v1", "StatefulSet"),
        ("batch/v1", "Job"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
    }


def test_the_crd_matches_the_kubernetes_schema():
    assert_valid(build_crd())


# --- a mistake is caught, and said plainly ------------------------------------------------------


def inference_statefulset(spec_dict) -> dict[str, Any]:
    children = children_of(spec_dict, {})
    return next(
        c
        for c in children
        if (c["kind"], c["metadata"]["name"]) == ("StatefulSet", "run1-inference")
    )


def test_a_misspelt_pod_field_is_caught(spec_dict):
    sts = inference_statefulset(spec_dict)
    pod = sts["spec"]["template"]["spec"]
    pod["containres"] = pod.pop("containers")
    assert schema_errors(sts) == [
        "spec.template.spec: 'containers' is a required property",
        "spec.template.spec: Additional properties are not allowed ('containres' was unexpected)",
    ]
    with pytest.raises(AssertionError) as failure:
        assert_valid(sts)
    assert str(failure.value).startswith(
        f"StatefulSet run1-inference does not match the Kubernetes {KUBERNETES_VERSION} schema"
    )
    assert "'containres' was unexpected" in str(failure.value)


def test_a_misspelt_container_field_is_caught(spec_dict):
    sts = inference_statefulset(spec_dict)
    writer = sts["spec"]["template"]["spec"]["initContainers"][0]
    writer["imagePullPolicyy"] = writer.pop("imagePullPolicy")
    assert schema_errors(sts) == [
        "spec.template.spec.initContainers[0]: Additional properties are not allowed "
        "('imagePullPolicyy' was unexpected)"
    ]


def test_a_wrong_type_deep_in_a_probe_is_caught(spec_dict):
    sts = inference_statefulset(spec_dict)
    broken = copy.deepcopy(sts)
    broken["spec"]["template"]["spec"]["initContainers"][0]["startupProbe"]["periodSeconds"] = "5"
    broken["spec"]["replicas"] = "2"
    errors = schema_errors(broken)
    assert len(errors) == 2, errors
    assert errors[0].startswith("spec.replicas: '2' is not of type 'integer'")
    assert errors[1].startswith(
        "spec.template.spec.initContainers[0].startupProbe.periodSeconds: '5' is not of type"
    )


def test_a_leader_worker_sets_mistakes_are_caught_in_its_templates_and_its_own_fields():
    (lws,) = [c for c in build_children(context(group_spec())) if c["kind"] == "LeaderWorkerSet"]
    assert schema_errors(lws) == []
    broken = copy.deepcopy(lws)
    broken["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["subdomian"] = "x"
    assert schema_errors(broken) == [
        "spec.leaderWorkerTemplate.workerTemplate.spec: Additional properties are not allowed "
        "('subdomian' was unexpected)"
    ]
    if lws_crd_spec_schema() is None:
        skip_or_fail("LeaderWorkerSet's CRD is not built (bash cluster/build.sh)")
    broken = copy.deepcopy(lws)
    broken["spec"]["startupPolicy"] = "LeaderStarted"
    broken["spec"]["leaderWorkerTemplate"]["restartPolicie"] = "None"
    errors = schema_errors(broken)
    assert len(errors) == 2, errors
    assert errors[0].startswith("spec.leaderWorkerTemplate: Additional properties are not allowed")
    assert errors[1].startswith("spec.startupPolicy: 'LeaderStarted' is not one of")


# --- the schemas are the control plane's API ----------------------------------------------------


def test_bundled_schema_is_the_control_planes_api():
    """Same definitions, properties and required fields as the exact version's OpenAPI document.

    That document is in the Kubernetes source that ``cluster/build.sh`` fetches into the Go
    module cache; without it (the control plane was never built here) this is skipped.
    """
    swagger = (
        cache_dir()
        / "go"
        / "mod"
        / "k8s.io"
        / f"kubernetes@v{KUBERNETES_VERSION}"
        / "api"
        / "openapi-spec"
        / "swagger.json"
    )
    if not swagger.exists():
        skip_or_fail(f"{swagger} is absent: bash cluster/build.sh fetches it")
    upstream = json.loads(swagger.read_text())["definitions"]
    bundled = schema_file("_definitions.json")["$defs"]
    assert sorted(upstream) == sorted(bundled)
    differ = [
        name
        for name, definition in upstream.items()
        if set(definition.get("properties", {})) != set(bundled[name].get("properties", {}))
        or set(definition.get("required", [])) != set(bundled[name].get("required", []))
    ]
    assert differ == [], (
        f"kubernetes-validate's {schema_dir()} differs from Kubernetes {KUBERNETES_VERSION}'s "
        f"API in {differ}: upgrade kubernetes-validate"
    )
