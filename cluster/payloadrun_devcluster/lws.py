"""LeaderWorkerSet (``sigs.k8s.io/lws``) on the local node, installed as upstream installs it.

What multi-node inference replicas run on (issue 36): the real controller manager, built from
the Go module proxy by ``cluster/build.sh`` at ``LWS_VERSION`` (``cluster/versions.env``: v0.9.0,
the newest whose module zip the proxy serves here) into ``<cache>/bin/lws-<v>/manager``, beside
the module's own ``config/`` tree copied from the module zip. Installing it (:func:`install`) means:

1. the manager binary as a one-layer image (``/manager``, uid 65532 as upstream's distroless
   image has it), imported into the node's containerd; cached by the binary's hash;
2. ``kubectl apply --server-side -k`` of a kustomize overlay whose only resource is upstream's
   ``config/default`` (namespace ``lws-system``, its CRDs, RBAC, the manager Deployment, the
   webhook Service, both webhook configurations, the empty Secret its cert-controller fills), with
   the few changes :func:`overlay` lists, each for a reason of this machine;
3. waiting on facts: the CRD Established, the Deployment available (its readiness check passes
   only once cert-controller has written the serving certificate and the kubelet has put it in
   the pod), and the webhooks answering: a server-side dry run of a LeaderWorkerSet goes through
   its mutating and validating webhooks, so it succeeds only when the API server reaches the
   webhook Service and trusts the CA cert-controller injected into both configurations.

It runs as a pod, not a host process, because its webhooks are Service-backed
(``clientConfig.service``) and cert-controller issues the serving certificate for
``lws-webhook-service.lws-system.svc``: in a pod both work exactly as upstream ships them, while a
host process would need URL-based webhook configurations and a certificate for another name.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .binaries import BinariesMissing, cache_dir, read_versions
from .images import write_single_binary_image

if TYPE_CHECKING:  # the cluster imports nothing of this module
    from .cluster import LocalCluster

NAMESPACE = "lws-system"
DEPLOYMENT = "lws-controller-manager"
CONTAINER = "manager"
CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
API_VERSION = "leaderworkerset.x-k8s.io/v1"
IMAGE_REPOSITORY = "localhost/payloadrun-lws"
IMAGE_USER = "65532:65532"  # upstream's Dockerfile: distroless static, USER 65532:65532
CPU_REQUEST = "100m"
"""Upstream requests a whole CPU per manager (two replicas): the node has two cores, shared by
every pod of a test session, and a request only decides scheduling here."""
# what each LeaderWorkerSet pod carries and its webhooks select on (objectSelector: Exists)
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
BUILD_HINT = "run: bash cluster/build.sh  (it builds LeaderWorkerSet's manager at LWS_VERSION)"


def version_tuple(version: str) -> tuple[int, ...]:
    """``v0.10.0`` -> ``(0, 10, 0)``."""
    return tuple(int(part) for part in version.lstrip("v").split("-")[0].split("."))


def copies_labels_to_statefulsets(version: str) -> bool:
    """Whether this LWS version puts the LeaderWorkerSet's own labels (and annotations) on the
    StatefulSets it makes: v0.10.0 does (``mergeMetadata`` in ``pkg/controllers``, for the leader
    StatefulSet and each group's worker StatefulSet); v0.9.0 gives them only its own
    ``leaderworkerset.sigs.k8s.io/*`` labels and annotations (seen on the node: test_lws.py)."""
    return version_tuple(version) >= (0, 10, 0)


class LwsError(RuntimeError):
    """LeaderWorkerSet could not be installed, or did not become ready."""


@dataclass(frozen=True)
class LwsBuild:
    """What ``cluster/build.sh`` leaves for one LeaderWorkerSet version."""

    version: str
    manager: Path
    config: Path  # the module's config/ (kustomize), as shipped in its zip

    @property
    def default_kustomization(self) -> Path:
        return self.config / "default"


def expected_build(versions: dict[str, str] | None = None) -> LwsBuild:
    """Where the build of the pinned version is, whether or not it is there."""
    version = (versions or read_versions())["LWS_VERSION"]
    directory = cache_dir() / "bin" / f"lws-{version}"
    return LwsBuild(version, directory / "manager", directory / "config")


def find_build() -> LwsBuild:
    """The built manager and its config, or :class:`BinariesMissing` saying what to run."""
    try:
        build = expected_build()
    except KeyError:
        raise BinariesMissing("cluster/versions.env does not set LWS_VERSION") from None
    if not os.access(build.manager, os.X_OK):
        raise BinariesMissing(
            f"LeaderWorkerSet's manager is not built: {build.manager}; {BUILD_HINT}"
        )
    if not (build.default_kustomization / "kustomization.yaml").is_file():
        raise BinariesMissing(
            f"LeaderWorkerSet's config/default is missing beside its manager ({build.config}); "
            f"{BUILD_HINT}"
        )
    return build


def _binary_key(binary: Path) -> str:
    digest = hashlib.sha256()
    with binary.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:12]


def image_name(build: LwsBuild) -> str:
    """``localhost/payloadrun-lws:<version>-<binary hash>``: a rebuilt binary, a new tag."""
    return f"{IMAGE_REPOSITORY}:{build.version}-{_binary_key(build.manager)}"


def image_tarball(build: LwsBuild) -> tuple[str, Path]:
    """The manager's image (name, docker-archive), made once per binary."""
    name = image_name(build)
    tarball = cache_dir() / "images" / f"payloadrun-lws-{name.rsplit(':', 1)[1]}.tar"
    if not tarball.is_file():
        tarball.parent.mkdir(parents=True, exist_ok=True)
        write_single_binary_image(build.manager, "/manager", name, tarball, user=IMAGE_USER)
    return name, tarball


def overlay(base: str, image: str) -> dict:
    """The kustomization installed: upstream's ``config/default`` (``base``, a path relative to
    the kustomization's directory: kustomize refuses absolute ones) and these changes,
    checked by JSON-patch ``test`` operations so that a moved field fails the render instead of
    patching something else:

    - the manager's image: the one built here (upstream's points at a registry this machine does
      not reach), never pulled (``imagePullPolicy: Never``; the node pulls nothing);
    - one replica, not two: one node of two cores; with leader election the second is idle;
    - a CPU request of :data:`CPU_REQUEST`, not 1: see there.

    Everything else (namespace, names, RBAC, webhooks and their failure policy and selectors,
    cert-controller's configuration, probes, security context) is upstream's.
    """
    container = "/spec/template/spec/containers/0"
    patch = [
        {"op": "test", "path": f"{container}/name", "value": CONTAINER},
        {"op": "replace", "path": f"{container}/image", "value": image},
        {"op": "add", "path": f"{container}/imagePullPolicy", "value": "Never"},
        {"op": "test", "path": "/spec/replicas", "value": 2},
        {"op": "replace", "path": "/spec/replicas", "value": 1},
        {"op": "replace", "path": f"{container}/resources/requests/cpu", "value": CPU_REQUEST},
    ]
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "patches": [
            {
                "target": {"group": "apps", "kind": "Deployment", "name": DEPLOYMENT},
                "patch": json.dumps(patch),
            }
        ],
    }


def relative_to(target: Path, directory: Path) -> str:
    """``target`` as a path relative to ``directory`` (``../..`` as needed)."""
    return os.path.relpath(target.resolve(), directory.resolve())


def probe_leaderworkerset(name: str = "payloadrun-lws-probe") -> dict:
    """A minimal LeaderWorkerSet, for a server-side dry run through both LWS webhooks."""
    return {
        "apiVersion": API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 1,
                "workerTemplate": {
                    "spec": {"containers": [{"name": "probe", "image": "probe.invalid/none"}]}
                },
            },
        },
    }


def deployment_available(deployment: dict) -> bool:
    """Whether the manager's Deployment has rolled out: its newest generation observed and every
    wanted replica updated and available."""
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    wanted = spec.get("replicas", 1)
    return (
        status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 1)
        and status.get("updatedReplicas", 0) >= wanted
        and status.get("availableReplicas", 0) >= wanted
    )


@dataclass(frozen=True)
class LwsInstall:
    """An installed LeaderWorkerSet and how long each step took (seconds)."""

    version: str
    image: str
    timings: dict[str, float]

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())


def install(
    cluster: LocalCluster, build: LwsBuild | None = None, timeout: float = 240
) -> LwsInstall:
    """Install LeaderWorkerSet on ``cluster`` (which runs a node) and wait until its webhooks
    answer; idempotent. Raises :class:`LwsError` naming the step that failed, with what it saw."""
    if not cluster.with_node:
        raise LwsError("LeaderWorkerSet runs as a pod: the cluster needs its node (up --node)")
    build = build or find_build()
    timings: dict[str, float] = {}
    began = time.monotonic()
    deadline = began + timeout

    def step(name: str) -> None:
        nonlocal began
        now = time.monotonic()
        timings[name] = round(now - began, 2)
        began = now

    image, tarball = image_tarball(build)
    cluster.load_image(tarball)
    step("image")

    directory = cluster.kubeconfig.parent / "lws"  # in the cluster's state directory
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(  # JSON is YAML
        json.dumps(overlay(relative_to(build.default_kustomization, directory), image), indent=2)
        + "\n"
    )
    applied = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(directory))
    if applied.returncode != 0:
        raise LwsError(f"kubectl apply -k {directory} failed: {applied.stderr.strip()}")
    step("apply")

    cluster.wait_established(CRD, timeout=max(1.0, deadline - time.monotonic()))
    step("crd_established")

    def deployment() -> dict:
        got = cluster.kubectl("-n", NAMESPACE, "get", "deployment", DEPLOYMENT, "-o", "json")
        return json.loads(got.stdout) if got.returncode == 0 else {}

    _wait(
        f"deployment {NAMESPACE}/{DEPLOYMENT} available",
        lambda: bool(d := deployment()) and deployment_available(d),
        deadline,
        seen=lambda: deployment().get("status") or _manager_log_tail(cluster),
    )
    step("manager_available")

    last = {"stderr": ""}

    def webhooks_answer() -> bool:
        result = cluster.kubectl(
            "create",
            "--dry-run=server",
            "-o",
            "name",
            "-f",
            "-",
            input=json.dumps(probe_leaderworkerset()),
        )
        last["stderr"] = result.stderr.strip()
        return result.returncode == 0

    _wait(
        "LeaderWorkerSet's webhooks to answer a server-side dry run",
        webhooks_answer,
        deadline,
        seen=lambda: last["stderr"],
    )
    step("webhooks_answer")
    return LwsInstall(build.version, image, timings)


def _manager_log_tail(cluster: LocalCluster) -> str:
    logs = cluster.kubectl(
        "-n", NAMESPACE, "logs", f"deployment/{DEPLOYMENT}", "--tail=20", timeout=20
    )
    return logs.stdout or logs.stderr


def _wait(
    what: str, check: Callable[[], bool], deadline: float, seen: Callable[[], object]
) -> None:
    while not check():
        if time.monotonic() > deadline:
            raise LwsError(f"timed out waiting for {what}; saw: {seen()}")
        time.sleep(0.5)  # each check is one kubectl call
