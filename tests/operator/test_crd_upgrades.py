"""The CRD against the previous release's (``CHANGELOG.md`` names it; its CRD read from git):
every field the CRD gives a default existed then. The API server writes a CRD's defaults into
every run it serves, so a default on a newer field would make the previous release's operator,
still running while ``helm upgrade`` replaces it, read each live run as an invalid spec and mark
it Rejected (seen from 0.1.0: tests/integration/test_upgrade.py). Such a field is marked
``ADDED_AFTER_RELEASE`` in the models instead: its default is the operator's only."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from payloadrun_devkit.previous import previous_release
from payloadrun_devkit.required import skip_or_fail
from payloadrun_operator.api.crd import CRD_FILE, defaults_left_to_the_operator, render_yaml
from payloadrun_operator.api.models import NO_CRD_DEFAULT, PayloadRunSpec

REPO = Path(__file__).resolve().parents[2]


def fields(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every node of a structural schema, by its path (``.spec.inference.replicas``)."""
    yield path, schema
    for name, node in (schema.get("properties") or {}).items():
        yield from fields(node, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from fields(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from fields(schema["additionalProperties"], f"{path}{{}}")


def served_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]


def previous_crd() -> dict[str, Any]:
    release = previous_release(REPO)
    shown = subprocess.run(
        ["git", "show", f"{release.ref}:{CRD_FILE}"],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if shown.returncode != 0:
        skip_or_fail(
            f"the previous release {release.version} ({release.ref}) is not in this clone: "
            f"{shown.stderr.strip()} (`git fetch --unshallow --tags` brings it)"
        )
    return yaml.load(shown.stdout, Loader=yaml.CSafeLoader)


def test_every_field_the_crd_defaults_was_in_the_previous_release():
    before = dict(fields(served_schema(previous_crd())))
    now = served_schema(yaml.load(render_yaml(), Loader=yaml.CSafeLoader))
    defaulted_new = [
        f"{path} (default {node['default']!r})"
        for path, node in fields(now)
        if "default" in node and path not in before
    ]
    assert defaulted_new == [], (
        "fields the previous release did not have are defaulted by the CRD; mark them "
        "json_schema_extra=ADDED_AFTER_RELEASE (payloadrun_operator.api.models) and read them "
        f"with given_or() in CEL rules: {defaulted_new}"
    )


def test_the_marker_never_reaches_the_crd():
    assert NO_CRD_DEFAULT not in render_yaml()


def test_the_defaults_left_to_the_operator_are_the_ones_a_run_without_them_gets():
    left = defaults_left_to_the_operator()
    assert set(left) >= {"spec.inference.podsPerReplica", "spec.inference.dataParallelRpcPort"}
    spec = PayloadRunSpec.model_validate(
        {"inference": {"image": "v"}, "orchestrator": {"image": "o"}, "trainer": {"image": "t"}}
    ).model_dump(by_alias=True, mode="json")
    for path, value in left.items():
        node = {"spec": spec}
        for part in path.split("."):
            node = node[part]
        assert node == value, path
