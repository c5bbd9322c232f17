"""Fixtures for tests against a real Kubernetes control plane started on this machine.

``kube_cluster`` (session): etcd + kube-apiserver + kube-controller-manager, built by
``bash cluster/build.sh``, and a node beside them (containerd, kubelet, kube-scheduler,
kube-proxy, CoreDNS) whenever this machine can run one (Linux, root, ``cluster/node-packages.sh``
installed), so pods run. When something is missing the tests that need it are skipped, unless
``PAYLOADRUN_REQUIRE_CLUSTER`` is set (CI sets it): then they fail. ``PAYLOADRUN_NO_NODE=1``
leaves the node out, for a second test session on a machine whose one node is taken (make test's
control-plane part, hack/test.py): the tests that need pods skip, or fail under
``PAYLOADRUN_REQUIRE_CLUSTER`` (they were given to the wrong session).

``namespace`` (function): a fresh namespace per test, deleted afterwards; under
``@pytest.mark.pod_security("restricted")`` (or another level) the API server enforces that Pod
Security level on its pods (``pod_helpers.pod_security_labels``).
``kube_api_client`` (session): an admin ``kubernetes.client.ApiClient``.
``lws`` (session, opt-in): LeaderWorkerSet's controller installed on the node, webhooks on.
``kueue`` (session, opt-in): Kueue's controller installed on the node, webhooks on, looking only at
namespaces that carry its ``namespace_labels``.

An add-on a session's tests ask for is installed in the background from the moment the session's
node is up (:class:`EarlyAddons`), beside the tests before the first that uses it: installing one
is mostly waiting (its image imported, its manager's certificates, its Deployment available, its
webhooks answering: 20-28 s each), which ``make test``'s node part, one test after another,
otherwise spent on its critical path.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from payloadrun_devcluster import (
    CONTROL_PLANE_NAMES,
    Binaries,
    BinariesMissing,
    LocalCluster,
    find_binaries,
    node_unsupported_reason,
)
from payloadrun_devkit.required import required, skip_or_fail


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: needs the local Kubernetes control plane (bash cluster/build.sh)"
    )
    config.addinivalue_line(
        "markers", "node_lifecycle: starts and stops nodes of its own (runs before all others)"
    )
    config.addinivalue_line(
        "markers",
        "pod_security(level): the namespace fixture's namespace enforces this Pod Security "
        "level (restricted, baseline): every pod the test creates in it must comply",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One node per machine: the tests that start their own go before the session's cluster
    # (and its node) starts. The sort is stable: every other test keeps its place.
    items.sort(key=lambda item: item.get_closest_marker("node_lifecycle") is None)


def node_left_out() -> bool:
    """Whether this session leaves the node out on purpose (``PAYLOADRUN_NO_NODE``)."""
    return os.environ.get("PAYLOADRUN_NO_NODE", "").strip() not in ("", "0")


def no_node_reason(binaries: Binaries) -> str | None:
    if node_left_out():
        return "PAYLOADRUN_NO_NODE is set"
    return node_unsupported_reason(binaries)


def built_binaries() -> Binaries:
    try:
        return find_binaries(CONTROL_PLANE_NAMES)  # the node's are checked apart
    except BinariesMissing as error:
        skip_or_fail(str(error))
        raise


@pytest.fixture
def node_binaries() -> Binaries:
    """The binaries, when this machine can run a node (else skipped, or failed under CI)."""
    binaries = built_binaries()
    reason = no_node_reason(binaries)
    if reason:
        skip_or_fail(f"no node can run here: {reason}")
    return binaries


# The add-on fixtures: fixture name -> the payloadrun_devcluster module that installs it
# (its ADDON and install(cluster, build)).
ADDON_FIXTURES = {"lws": "payloadrun_devcluster.lws", "kueue": "payloadrun_devcluster.kueue"}


class EarlyAddons:
    """The installs of the add-ons this session's tests use, started on the session's cluster as
    soon as its node is up, one thread each; an add-on's fixture waits for its install (and
    raises what it raised). One that cannot start here (no node, not built) is not started: its
    fixture skips or fails as it would have."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(len(ADDON_FIXTURES), thread_name_prefix="addon")
        self._started: dict[str, Future] = {}

    def start(self, cluster: LocalCluster, items: list[pytest.Item]) -> None:
        from payloadrun_devcluster.addons import find_build

        if not cluster.with_node:
            return
        used = {name for item in items for name in getattr(item, "fixturenames", ())}
        for fixture, module_name in ADDON_FIXTURES.items():
            if fixture not in used:
                continue
            module = importlib.import_module(module_name)
            try:
                build = find_build(module.ADDON)
            except BinariesMissing:
                continue  # its fixture says so
            self._started[module.ADDON.name] = self._pool.submit(module.install, cluster, build)

    def started(self, name: str) -> Future | None:
        return self._started.get(name)

    def join(self) -> None:
        """Wait for the installs under way (before the cluster they install into stops)."""
        for future in self._started.values():
            with contextlib.suppress(Exception):
                future.result()
        self._pool.shutdown()


EARLY_ADDONS = EarlyAddons()


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """A running cluster, stopped (no process left) at the end of the session, always.

    Its state directory (certificates, kubeconfigs, component logs) is kept under pytest's
    basetemp for post-mortems. The add-ons the session's tests use start installing on it at
    once (:class:`EarlyAddons`).
    """
    binaries = built_binaries()
    no_node = no_node_reason(binaries)
    if no_node and required() and not node_left_out():
        pytest.fail(
            f"PAYLOADRUN_REQUIRE_CLUSTER is set and no node can run here: {no_node}", pytrace=False
        )
    cluster = LocalCluster(
        tmp_path_factory.mktemp("devcluster"),
        binaries=binaries,
        keep_state=True,
        node=no_node is None,
    )
    # start() stops whatever it started when it fails or is interrupted; stop() also runs at
    # interpreter exit (atexit) and the kernel ends the children if this process is killed.
    cluster.start()
    try:
        EARLY_ADDONS.start(cluster, request.session.items)
        yield cluster
    finally:
        EARLY_ADDONS.join()
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
    """A fresh namespace named after the test; deleted (without waiting) after it. With the
    ``pod_security`` marker it enforces that Pod Security level (the API server's admission
    refuses a pod that breaks it)."""
    from pod_helpers import pod_security_labels

    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    metadata: dict = {"name": name}
    if marker := request.node.get_closest_marker("pod_security"):
        metadata["labels"] = pod_security_labels(*marker.args)
    status, body = kube_cluster.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata},
    )
    if status != 201:
        pytest.fail(
            f"creating namespace {name} failed with HTTP {status}: {body.get('message', body)}"
        )
    yield name
    kube_cluster.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="session")
def node_cluster(kube_cluster: LocalCluster) -> LocalCluster:
    """The session's cluster, with its node and the project's images in it; the CRD installed."""
    from pod_helpers import IMAGE, NEXT_IMAGE, REPO

    from payloadrun_devkit.images import build_images
    from payloadrun_operator.api.crd import CRD_FILE
    from payloadrun_operator.api.models import GROUP, PLURAL

    if not kube_cluster.with_node:
        skip_or_fail("these tests need pods: the session's cluster runs no node")
    kube_cluster.load_images(list(build_images(REPO).values()))
    tagged = kube_cluster.node.ctr(
        "images", "tag", "--force", f"docker.io/library/{IMAGE}", f"docker.io/library/{NEXT_IMAGE}"
    )
    assert tagged.returncode == 0, tagged.stderr
    applied = kube_cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_FILE)
    )
    assert applied.returncode == 0, applied.stderr
    kube_cluster.wait_established(f"{PLURAL}.{GROUP}")
    return kube_cluster


@pytest.fixture(scope="session")
def lws(kube_cluster: LocalCluster):
    """LeaderWorkerSet installed on the session's node (opt-in: only sessions with a test that
    asks for it pay for it): upstream's own config/default from the module, its webhooks on and
    its certificates its own (``payloadrun_devcluster.lws``). Its :class:`LwsInstall` says how
    long each step took. Skipped (failed under ``PAYLOADRUN_REQUIRE_CLUSTER``) when the session
    runs no node or the manager is not built (``bash cluster/build.sh``)."""
    return install_addon(kube_cluster, "lws")


@pytest.fixture(scope="session")
def kueue(kube_cluster: LocalCluster):
    """Kueue installed on the session's node (opt-in: only sessions with a test that asks for it
    pay for it): upstream's own config/default from the module, its webhooks on and its
    certificates its own, its webhooks on other APIs' objects and its job management scoped to
    namespaces labelled ``kueue.namespace_labels``, its aggregated visibility API left out
    (``payloadrun_devcluster.kueue``). Its :class:`KueueInstall` says how long each step took.
    Skipped (failed under ``PAYLOADRUN_REQUIRE_CLUSTER``) when the session runs no node or the
    manager is not built (``bash cluster/build.sh``)."""
    return install_addon(kube_cluster, "kueue")


def install_addon(kube_cluster: LocalCluster, fixture: str):
    """The add-on of ``fixture`` (:data:`ADDON_FIXTURES`) installed on the session's node, or the
    test skipped (failed under ``PAYLOADRUN_REQUIRE_CLUSTER``) saying what is missing."""
    from payloadrun_devcluster.addons import find_build

    module = importlib.import_module(ADDON_FIXTURES[fixture])
    if not kube_cluster.with_node:
        skip_or_fail(f"{module.ADDON.title} runs as a pod: the session's cluster runs no node")
    try:
        build = find_build(module.ADDON)
    except BinariesMissing as error:
        skip_or_fail(str(error))
        raise
    early = EARLY_ADDONS.started(module.ADDON.name)
    return early.result() if early else module.install(kube_cluster, build)


@pytest.fixture
def operator(node_cluster: LocalCluster, namespace: str, tmp_path: Path):
    """The operator as a host process watching the test's namespace (restartable)."""
    from pod_helpers import Operator

    op = Operator(node_cluster, namespace, tmp_path)
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture(scope="module")
def crd(kube_cluster):
    """The PayloadRun CRD applied (server-side) and established; its built form."""
    from payloadrun_operator.api.crd import CRD_FILE, build_crd
    from payloadrun_operator.api.models import GROUP, PLURAL

    repo = Path(__file__).resolve().parents[2]
    result = kube_cluster.kubectl("apply", "--server-side", "-f", str(repo / CRD_FILE))
    assert result.returncode == 0, result.stderr
    kube_cluster.wait_established(f"{PLURAL}.{GROUP}")
    return build_crd()


@pytest.fixture(scope="module")
def api(kube_api_client):
    """The official client's APIs the operator tests read and write through."""
    from kubernetes import client

    return {
        "custom": client.CustomObjectsApi(kube_api_client),
        "core": client.CoreV1Api(kube_api_client),
        "apps": client.AppsV1Api(kube_api_client),
        "batch": client.BatchV1Api(kube_api_client),
    }
