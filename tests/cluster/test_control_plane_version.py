"""Which Kubernetes the local control plane runs: the pinned one, or the oldest the project claims
(``PAYLOADRUN_KUBERNETES_VERSION``), whose control plane alone is built and no node joins."""

from __future__ import annotations

from pathlib import Path

import pytest

from payloadrun_devcluster.binaries import (
    VERSION_ENV,
    BinariesMissing,
    cache_dir,
    control_plane_version,
    expected_binaries,
    find_binaries,
    node_version_skew,
    pinned_control_plane,
    read_versions,
)

VERSIONS = {
    "KUBERNETES_VERSION": "v1.37.2",
    "KUBERNETES_OLDEST_VERSION": "v1.29.15",
    "ETCD_VERSION": "v3.7.0",
    "HELM_VERSION": "v3.22.0",
    "COREDNS_VERSION": "v1.15.0",
    "KUBE_ROUTER_VERSION": "v2.1.0",
}


@pytest.fixture(autouse=True)
def no_overrides(monkeypatch):
    monkeypatch.delenv(VERSION_ENV, raising=False)
    monkeypatch.delenv("PAYLOADRUN_CLUSTER_BIN", raising=False)


def test_the_pinned_kubernetes_by_default():
    assert control_plane_version(VERSIONS) == "v1.37.2"
    assert pinned_control_plane(VERSIONS)
    assert node_version_skew(VERSIONS) is None
    binaries = expected_binaries(VERSIONS)
    assert binaries.kube_apiserver == cache_dir() / "bin/kubernetes-v1.37.2/kube-apiserver"


def test_the_oldest_gives_its_control_plane_and_keeps_the_rest_pinned(monkeypatch):
    monkeypatch.setenv(VERSION_ENV, "v1.29.15")
    binaries = expected_binaries(VERSIONS)
    bin_root = cache_dir() / "bin"
    assert binaries.kube_apiserver == bin_root / "kubernetes-v1.29.15/kube-apiserver"
    assert binaries.kube_controller_manager == (
        bin_root / "kubernetes-v1.29.15/kube-controller-manager"
    )
    # kubectl, etcd and the node's binaries stay the pinned ones
    assert binaries.kubectl == bin_root / "kubernetes-v1.37.2/kubectl"
    assert binaries.kubelet == bin_root / "kubernetes-v1.37.2/kubelet"
    assert binaries.etcd == bin_root / "etcd-v3.7.0/etcd"
    assert not pinned_control_plane(VERSIONS)
    # no node on it: its kubelet would be newer than the API server
    said = node_version_skew(VERSIONS)
    assert said and "v1.29.15" in said and "v1.37.2" in said and VERSION_ENV in said


def test_a_version_that_is_not_built_is_refused_with_the_ones_that_are(monkeypatch):
    monkeypatch.setenv(VERSION_ENV, "v1.31.0")
    with pytest.raises(BinariesMissing) as refused:
        expected_binaries(VERSIONS)
    assert "v1.31.0" in str(refused.value)
    assert "v1.37.2, v1.29.15" in str(refused.value)


def test_a_missing_oldest_control_plane_says_to_build_it_apart(monkeypatch, tmp_path):
    # cluster/build.sh leaves the oldest out unless asked (--oldest: hack/test.py's oldest part)
    monkeypatch.setenv("PAYLOADRUN_CACHE", str(tmp_path))
    with pytest.raises(BinariesMissing) as pinned:
        find_binaries()
    assert "kubernetes-v1.37.2/kube-apiserver" in str(pinned.value)
    assert "--oldest" not in str(pinned.value)
    monkeypatch.setenv(VERSION_ENV, read_versions()["KUBERNETES_OLDEST_VERSION"])
    with pytest.raises(BinariesMissing) as oldest:
        find_binaries()
    assert "bash cluster/build.sh --oldest" in str(oldest.value)


def test_the_repositorys_oldest_is_older_than_its_pinned():
    versions = read_versions(Path(__file__).resolve().parents[2] / "cluster" / "versions.env")

    def minor(version: str) -> tuple[int, int]:
        major, minor_, _ = version.removeprefix("v").split(".")
        return int(major), int(minor_)

    assert minor(versions["KUBERNETES_OLDEST_VERSION"]) < minor(versions["KUBERNETES_VERSION"])
    # the chart claims what the oldest control plane runs
    chart = (Path(__file__).resolve().parents[2] / "charts/payloadrun/Chart.yaml").read_text()
    low = ".".join(map(str, minor(versions["KUBERNETES_OLDEST_VERSION"])))
    assert f'kubeVersion: ">={low}.0-0"' in chart
