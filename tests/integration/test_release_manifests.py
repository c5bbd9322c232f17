"""The release's manifests (hack/publish.sh manifests, uploaded beside the chart by the release
workflow): the CRD alone and everything in one, at the release's version, taken whole by the real
API server with `kubectl apply --server-side` (server-side dry run: the session's cluster has
the chart's release in payloadrun-system, which a real apply would take over)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from payloadrun_devkit.release import release_version

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def manifests(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("manifests")
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "publish.sh"), "manifests", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    files = [Path(line) for line in done.stdout.split()]
    assert [f.name for f in files] == ["payloadrun-crd.yaml", "payloadrun.yaml"]
    return {f.name: f for f in files}


def test_the_crd_alone_is_the_generated_one(manifests):
    crd = manifests["payloadrun-crd.yaml"]
    assert crd.read_bytes() == (REPO / "crds" / "payloadrun.dev_payloadruns.yaml").read_bytes()


def test_everything_in_one_is_the_namespace_the_crd_rbac_and_the_operator_at_the_version(
    manifests,
):
    documents = [
        d
        for d in yaml.load_all(manifests["payloadrun.yaml"].read_text(), Loader=yaml.CSafeLoader)
        if d
    ]
    assert documents[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "payloadrun-system"},
    }
    kinds = [d["kind"] for d in documents]
    for kind in ("CustomResourceDefinition", "ServiceAccount", "ClusterRole", "Deployment"):
        assert kind in kinds, kinds
    namespaced = [d for d in documents[1:] if d["kind"] not in CLUSTER_SCOPED]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"payloadrun-system"}
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    version = release_version(REPO)
    assert container["image"] == f"ghcr.io/payloadrun/payloadrun-operator:{version}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PAYLOADRUN_SIDECAR_IMAGE"] == f"ghcr.io/payloadrun/payloadrun:{version}"


CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}


@pytest.mark.parametrize("name", ["payloadrun-crd.yaml", "payloadrun.yaml"])
def test_the_api_server_takes_each_whole_with_a_server_side_apply(kube_cluster, manifests, name):
    """What the install page tells a cluster admin to run, every object validated by the real
    API server (a client-side apply cannot: the CRD is too large for its annotation). A dry run
    creates no namespace, so the objects in it are checked in one that exists: made here when
    the session has none yet, and left (the chart's tests install into it; deleting it would
    leave it terminating under them)."""
    created = kube_cluster.kubectl("create", "namespace", "payloadrun-system")
    assert created.returncode == 0 or "AlreadyExists" in created.stderr, created.stderr
    applied = kube_cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--dry-run=server",
        "-f", str(manifests[name]),
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr[-3000:]
    lines = applied.stdout.splitlines()
    assert any("customresourcedefinition" in line for line in lines), lines
    if name == "payloadrun.yaml":
        assert any(line.startswith("deployment.apps/payloadrun ") for line in lines), lines
