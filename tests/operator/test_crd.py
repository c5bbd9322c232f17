from pathlib import Path

import yaml

from payloadrun_operator.crd import CRD_FILE, build_crd, render_yaml

REPO = Path(__file__).resolve().parents[2]


def test_crd_file_matches_the_models():
    committed = (REPO / CRD_FILE).read_text()
    assert committed == render_yaml(), (
        f"{CRD_FILE} drifted from payloadrun_operator/models.py: regenerate it with "
        f"`python -m payloadrun_operator.crd > {CRD_FILE}`"
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
    crd = yaml.safe_load(render_yaml())
    assert crd["metadata"]["name"] == "payloadruns.payloadrun.dev"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Mode"] == ".status.payloadMode"
    assert columns["Phase"] == ".status.phase"
    assert columns["Claim"] == ".status.claimName"
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
