"""Fixtures for tests against a real Kubernetes control plane started on this machine.

``kube_cluster`` (session): etcd + kube-apiserver + kube-controller-manager on loopback, built by
``bash cluster/build.sh``. When the binaries are missing the tests are skipped, unless
``PAYLOADRUN_REQUIRE_CLUSTER`` is set (CI sets it): then they fail.

``namespace`` (function): a fresh namespace per test, deleted afterwards.
``kube_api_client`` (session): an admin ``kubernetes.client.ApiClient``.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path

import pytest

try:
    from payloadrun_devcluster import (
        CONTROL_PLANE_NAMES,
        BinariesMissing,
        LocalCluster,
        find_binaries,
    )
except ImportError:  # the project is not installed (pip install -e .): use the checkout's cluster/
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cluster"))
    from payloadrun_devcluster import (
        CONTROL_PLANE_NAMES,
        BinariesMissing,
        LocalCluster,
        find_binaries,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: needs the local Kubernetes control plane (bash cluster/build.sh)"
    )


def cluster_required() -> bool:
    return os.environ.get("PAYLOADRUN_REQUIRE_CLUSTER", "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
    )


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A running control plane, stopped (no process left) at the end of the session, always.

    Its state directory (certificates, kubeconfigs, component logs) is kept under pytest's
    basetemp for post-mortems.
    """
    try:
        binaries = find_binaries(CONTROL_PLANE_NAMES)
        missing = None
    except BinariesMissing as error:
        missing = str(error)
    if missing is not None:
        if cluster_required():
            pytest.fail(f"PAYLOADRUN_REQUIRE_CLUSTER is set and {missing}", pytrace=False)
        pytest.skip(f"{missing} (set PAYLOADRUN_REQUIRE_CLUSTER=1 to make this a failure)")
    cluster = LocalCluster(
        tmp_path_factory.mktemp("devcluster"), binaries=binaries, keep_state=True
    )
    # start() stops whatever it started when it fails or is interrupted; stop() also runs at
    # interpreter exit (atexit) and the kernel ends the children if this process is killed.
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube_api_client(kube_cluster: LocalCluster):
    """An admin client of the official ``kubernetes`` package."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(kube_cluster: LocalCluster, request: pytest.FixtureRequest):
    """A fresh namespace named after the test; deleted (without waiting) after it."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    status, body = kube_cluster.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    if status != 201:
        pytest.fail(
            f"creating namespace {name} failed with HTTP {status}: {body.get('message', body)}"
        )
    yield name
    kube_cluster.request("DELETE", f"/api/v1/namespaces/{name}")
