"""The chart's README (what `helm show readme` prints): its values table is helm-docs' output from
values.yaml's comments, never edited by hand, and agrees with values.schema.json."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile

from .conftest import CHART, REPO, run_helm

README = CHART / "README.md"
ROW = re.compile(r"^\| (?P<key>[\w.]+) \| (?P<type>\w+) \| `(?P<default>.*)` \| (?P<text>.*) \|$")
# JSON Schema's types by helm-docs' names for them
SCHEMA_TYPES = {"string": "string", "int": "integer", "bool": "boolean", "list": "array"}


def rows() -> dict[str, dict[str, str]]:
    return {m["key"]: m.groupdict() for m in map(ROW.match, README.read_text().splitlines()) if m}


def test_the_readme_is_what_helm_docs_writes_from_values_yaml():
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "helm-docs.sh"), "--dry-run"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == README.read_text(), (
        "charts/payloadrun/README.md is not what helm-docs writes from values.yaml: edit the "
        "comments of values.yaml (or README.md.gotmpl), then run bash hack/helm-docs.sh"
    )


def schema_node(schema: dict, path: list[str]) -> dict | None:
    """The schema of the value at ``path`` (``$ref`` to ``#/definitions/`` followed)."""
    node = schema
    for name in path:
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].removeprefix("#/definitions/")]
        node = (node.get("properties") or {}).get(name)
        if node is None:
            return None
    while "$ref" in node:
        node = schema["definitions"][node["$ref"].removeprefix("#/definitions/")]
    return node


def test_every_row_is_a_value_of_the_schema_with_its_type():
    schema = json.loads((CHART / "values.schema.json").read_text())
    found = rows()
    assert len(found) >= 40
    for key, row in found.items():
        node = schema_node(schema, key.split("."))
        assert node is not None, f"{key} is in the README but not in values.schema.json"
        want = SCHEMA_TYPES.get(row["type"], "object")
        declared = node.get("type")
        if declared is not None:
            declared = declared if isinstance(declared, list) else [declared]
            assert want in declared or (want == "integer" and "number" in declared), (
                f"{key}: the README says {row['type']}, values.schema.json {declared}"
            )


def test_every_value_with_a_default_has_a_row_or_a_documented_parent():
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    documented = rows()

    def walk(node: object, path: list[str]) -> None:
        key = ".".join(path)
        if key in documented:
            return
        assert isinstance(node, dict) and node, f"{key} has no row in the chart's README"
        for name, child in node.items():
            walk(child, [*path, name])

    for name, node in values.items():
        walk(node, [name])


def test_the_packaged_chart_shows_it_and_leaves_the_template_out(helm, tmp_path):
    """What `helm show readme oci://...` prints for a published chart (hack/publish.sh packages
    it as `helm package` does)."""
    run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    (packaged,) = tmp_path.glob("payloadrun-*.tgz")
    shown = run_helm(helm, "show", "readme", str(packaged)).stdout
    assert shown.strip() == README.read_text().strip()
    with tarfile.open(packaged) as chart:
        names = chart.getnames()
    assert "payloadrun/README.md" in names and "payloadrun/README.md.gotmpl" not in names
