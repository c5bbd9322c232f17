"""LeaderWorkerSet's install on the local node, its pure parts: the overlay on upstream's
config/default, the readiness rule of its Deployment, what the version says about labels."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from payloadrun_devcluster import lws
from payloadrun_devcluster.binaries import BinariesMissing, expected_binaries
from payloadrun_devkit.required import skip_or_fail


def patch_of(kustomization: dict) -> list[dict]:
    (patch,) = kustomization["patches"]
    assert patch["target"] == {"group": "apps", "kind": "Deployment", "name": lws.DEPLOYMENT}
    return json.loads(patch["patch"])


def test_the_overlay_is_upstreams_config_default_with_three_changes_each_guarded():
    kustomization = lws.overlay("../../lws-v0/config/default", "localhost/payloadrun-lws:v0-abc")
    assert kustomization["resources"] == ["../../lws-v0/config/default"]
    ops = patch_of(kustomization)
    changed = {op["path"]: op["value"] for op in ops if op["op"] != "test"}
    container = "/spec/template/spec/containers/0"
    assert changed == {
        f"{container}/image": "localhost/payloadrun-lws:v0-abc",
        f"{container}/imagePullPolicy": "Never",
        "/spec/replicas": 1,
        f"{container}/resources/requests/cpu": lws.CPU_REQUEST,
    }
    # the container patched is upstream's manager, and upstream still asks for two replicas:
    # a config/default that moved these fails the render instead of being patched elsewhere
    guards = {op["path"]: op["value"] for op in ops if op["op"] == "test"}
    assert guards == {f"{container}/name": lws.CONTAINER, "/spec/replicas": 2}
    assert [op["op"] for op in ops].index("test") == 0


def test_the_base_is_given_relative_to_the_overlay(tmp_path):
    base = tmp_path / "cache" / "bin" / "lws-v0" / "config" / "default"
    base.mkdir(parents=True)
    overlay_dir = tmp_path / "state" / "lws"
    overlay_dir.mkdir(parents=True)
    relative = lws.relative_to(base, overlay_dir)
    assert not os.path.isabs(relative)
    assert (overlay_dir / relative).resolve() == base.resolve()


@pytest.mark.parametrize(
    ("spec", "status", "generation", "available"),
    [
        (
            {"replicas": 1},
            {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1},
            1,
            True,
        ),
        (
            {"replicas": 1},
            {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 0},
            1,
            False,
        ),
        (
            {"replicas": 1},
            {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1},
            2,
            False,
        ),
        ({"replicas": 1}, {}, 1, False),
    ],
)
def test_the_manager_is_available_once_its_newest_generation_is(
    spec, status, generation, available
):
    deployment = {"metadata": {"generation": generation}, "spec": spec, "status": status}
    assert lws.deployment_available(deployment) is available


def test_only_v0_10_and_later_copy_the_lws_labels_onto_statefulsets():
    assert lws.version_tuple("v0.10.0") == (0, 10, 0)
    assert not lws.copies_labels_to_statefulsets("v0.9.0")
    assert lws.copies_labels_to_statefulsets("v0.10.0")
    assert lws.copies_labels_to_statefulsets("v0.11.2")


def test_the_pinned_version_is_where_build_sh_puts_it():
    build = lws.expected_build({"LWS_VERSION": "v9.9.9"})
    assert build.manager.parent.name == "lws-v9.9.9" and build.manager.name == "manager"
    assert build.default_kustomization == build.config / "default"


def test_a_missing_build_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("PAYLOADRUN_CACHE", str(tmp_path))
    with pytest.raises(BinariesMissing, match=r"bash cluster/build\.sh"):
        lws.find_build()


def test_upstreams_config_renders_with_the_overlay(tmp_path):
    """With the pinned build present: kubectl's kustomize renders it, and changes exactly the
    manager Deployment's four fields (upstream's own render beside it)."""
    try:
        build = lws.find_build()
    except BinariesMissing as error:
        skip_or_fail(str(error))
    kubectl = expected_binaries().kubectl
    if not os.access(kubectl, os.X_OK):
        skip_or_fail(f"kubectl is not built: {kubectl}")
    overlay_dir = tmp_path / "overlay"
    overlay_dir.mkdir()
    (overlay_dir / "kustomization.yaml").write_text(
        json.dumps(lws.overlay(lws.relative_to(build.default_kustomization, overlay_dir), "x:y"))
    )

    def render(directory: Path) -> list[str]:
        result = subprocess.run(
            [str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, check=True
        )
        return result.stdout.splitlines()

    ours, upstream = render(overlay_dir), render(build.default_kustomization)
    removed = sorted(set(upstream) - set(ours))
    added = sorted(set(ours) - set(upstream))
    assert [line.strip() for line in removed] == sorted(
        [
            "cpu: 1",
            "replicas: 2",
            next(line.strip() for line in upstream if line.strip().startswith("image: ")),
        ]
    )
    assert [line.strip() for line in added] == sorted(
        ["cpu: 100m", "replicas: 1", "image: x:y", "imagePullPolicy: Never"]
    )
