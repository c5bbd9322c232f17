import importlib.util
import json
from pathlib import Path

import yaml

from payloadrun_devcluster.binaries import read_versions
from payloadrun_devkit.required import skip_or_fail
from payloadrun_operator.api.conditions import ConditionType
from payloadrun_operator.api.crd import CRD_FILE, build_crd, render_yaml
from payloadrun_operator.api.kubeschema import (
    OPENAPI_FILE,
    extract,
    kubernetes_version,
    render_openapi_file,
)

READY = ConditionType.READY
VALIDATED = ConditionType.VALIDATED
VOLUME_READY = ConditionType.VOLUME_READY

REPO = Path(__file__).resolve().parents[2]


def test_crd_file_matches_the_models():
    committed = (REPO / CRD_FILE).read_text()
    assert committed == render_yaml(), (
        f"{CRD_FILE} drifted from payloadrun_operator/api/models.py: regenerate it with "
        f"`python -m payloadrun_operator.api.crd > {CRD_FILE}`"
    )


def walk(node, path=""):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


def test_schema_is_structural():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        if not isinstance(node, dict):
            continue
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "title" not in node, path
        assert node.get("default", "absent") is not None, f"null default at {path}"
        if "properties" in node:
            assert node.get("type") == "object", path


def test_crd_metadata_and_columns():
    crd = yaml.load(render_yaml(), Loader=yaml.CSafeLoader)
    assert crd["metadata"]["name"] == "payloadruns.payloadrun.dev"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Mode"] == ".status.payloadMode"
    assert columns["Phase"] == ".status.phase"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Claim"] == ".status.claimName"
    default = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert default == ["Mode", "Phase", "Ready", "Claim", "Age"]
    assert columns["Age"] == ".metadata.creationTimestamp"
    assert crd["spec"]["names"]["shortNames"] == ["prun"]


def test_cel_rules_are_present():
    text = render_yaml()
    assert "self.inference.disaggregated" in text
    assert "oldSelf.claimName" in text
    assert "self.metadata.name.size() <= 40" in text


def test_defaults_reach_nested_objects():
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    payloads = spec["properties"]["payloads"]
    assert payloads["default"] == {}
    assert payloads["properties"]["volume"]["default"] == {}
    assert payloads["properties"]["mode"]["default"] == "Auto"
    size = payloads["properties"]["volume"]["properties"]["size"]
    assert size == {
        "x-kubernetes-int-or-string": True,
        "description": "Size of the managed claim (default 100Gi).",
    }


def schema():
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def fields(node, path=""):
    """(path, node) of every field under ``node``, through arrays' items."""
    for name, child in node.get("properties", {}).items():
        yield f"{path}.{name}", child
        yield from fields(child.get("items", child), f"{path}.{name}")


def test_every_field_has_a_description():
    """``kubectl explain`` prints these: the run, its spec, its status and every field below."""
    root = schema()
    assert root["description"].startswith("A multi-node RL run")
    missing = [path for path, node in fields(root) if not node.get("description", "").strip()]
    # the API server refuses anything but a type on metadata (it publishes ObjectMeta's schema)
    assert missing == [".metadata"], f"fields without a description (see models.py): {missing}"
    assert root["properties"]["metadata"] == {"type": "object"}
    status = root["properties"]["status"]
    for ctype in (VALIDATED, VOLUME_READY, READY):
        assert ctype in status["properties"]["conditions"]["description"]


def test_descriptions_are_unwrapped_docstrings():
    """Ours on one line; Kubernetes' own (the pod templates) one line per paragraph."""
    for path, node in fields(schema()):
        assert "  " not in node.get("description", ""), path
        if ".template." in path:
            assert "\n\n\n" not in node.get("description", ""), path
            assert all(p.strip() == p for p in node.get("description", "").split("\n\n")), path
        else:
            assert "\n" not in node.get("description", ""), path


def test_conditions_follow_metav1_condition():
    """The rules of k8s.io/apimachinery's metav1.Condition, so every tool reads them alike."""
    conditions = schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["type"] == "array"
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    props = item["properties"]
    assert sorted(item["required"]) == sorted(
        ["type", "status", "lastTransitionTime", "reason", "message"]
    )
    assert props["type"]["maxLength"] == 316
    assert props["type"]["pattern"] == (
        r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
    )
    assert props["status"]["enum"] == ["True", "False", "Unknown"]
    assert props["status"]["type"] == "string"
    assert props["lastTransitionTime"] == {
        "type": "string",
        "format": "date-time",
        "description": props["lastTransitionTime"]["description"],
    }
    assert props["reason"]["pattern"] == r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    assert (props["reason"]["minLength"], props["reason"]["maxLength"]) == (1, 1024)
    assert props["message"]["maxLength"] == 32768
    for generation in (
        props["observedGeneration"],
        schema()["properties"]["status"]["properties"]["observedGeneration"],
    ):
        assert (generation["type"], generation["format"], generation["minimum"]) == (
            "integer",
            "int64",
            0,
        )


# --- the pod templates: Kubernetes' own schema ----------------------------------------------


def template_schema(role="trainer"):
    return schema()["properties"]["spec"]["properties"][role]["properties"]["template"]


def test_each_role_takes_kubernetes_pod_template_schema():
    for role in ("inference", "orchestrator", "trainer"):
        template = template_schema(role)
        assert template["description"].startswith(f"The {role} pods' template")
        assert "x-kubernetes-preserve-unknown-fields" not in json.dumps(template)
        pod = template["properties"]["spec"]["properties"]
        assert {
            "containers",
            "volumes",
            "initContainers",
            "runtimeClassName",
            "hostNetwork",
        } <= set(pod)
        assert "ephemeralContainers" not in pod  # a pod cannot be created with them
        # the short fields can make the main container alone
        assert "required" not in template["properties"]["spec"]
        assert template["properties"]["metadata"]["properties"].keys() == {"labels", "annotations"}
    assert kubernetes_version() == read_versions()["KUBERNETES_VERSION"]


def test_quantities_take_numbers_and_list_map_keys_have_their_defaults():
    container = template_schema()["properties"]["spec"]["properties"]["containers"]
    assert (container["x-kubernetes-list-type"], container["x-kubernetes-list-map-keys"]) == (
        "map",
        ["name"],
    )
    item = container["items"]["properties"]
    limits = item["resources"]["properties"]["limits"]["additionalProperties"]
    assert limits["x-kubernetes-int-or-string"] is True and "type" not in limits
    ports = item["ports"]
    assert ports["x-kubernetes-list-map-keys"] == ["containerPort", "protocol"]
    # the API server refuses a list-map key that is neither required nor defaulted
    assert ports["items"]["properties"]["protocol"]["default"] == "TCP"
    probe_port = item["startupProbe"]["properties"]["httpGet"]["properties"]["port"]
    assert probe_port["x-kubernetes-int-or-string"] is True
    assert (
        "Protocol for port. Must be UDP, TCP, or SCTP."
        in ports["items"]["properties"]["protocol"]["description"]
    )


def test_no_patch_strategy_and_no_default_but_the_list_map_keys_reach_the_crd():
    text = json.dumps(template_schema())
    assert "x-kubernetes-patch" not in text and "$ref" not in text and "allOf" not in text
    defaults = [
        p for p, node in walk(template_schema()) if isinstance(node, dict) and "default" in node
    ]
    # a port's protocol (TCP) and an image pull secret's name (""): Kubernetes' own defaults of
    # list-map keys; the template itself has none (a run without one stores none)
    keys = (".protocol", ".imagePullSecrets.items.properties.name")
    assert defaults and all(p.endswith(keys) for p in defaults), defaults


def test_the_vendored_openapi_is_the_pinned_kubernetes_version():
    """operator/payloadrun_operator/api/openapi/ is what hack/kubernetes_openapi.py extracts from
    the pinned version's OpenAPI document (in the Go module cache after cluster/build.sh)."""
    spec = importlib.util.spec_from_file_location(
        "kubernetes_openapi", REPO / "hack" / "kubernetes_openapi.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    version = read_versions()["KUBERNETES_VERSION"]
    path = module.document_path(version)
    if not path.exists():
        skip_or_fail(f"{path} is absent: bash cluster/build.sh fetches it")
    assert (REPO / "operator" / "payloadrun_operator" / "api" / OPENAPI_FILE).read_text() == (
        render_openapi_file(extract(json.loads(path.read_text()), version))
    ), "run python hack/kubernetes_openapi.py, then regenerate the CRD"
