"""LeaderWorkerSet (``sigs.k8s.io/lws``) on the local node, installed as upstream installs it.

What multi-node inference replicas run on (issue 36): the real controller manager, built from
the Go module proxy by ``cluster/build.sh`` at ``LWS_VERSION`` (``cluster/versions.env``: v0.9.0,
the newest whose module zip the proxy serves here) into ``<cache>/bin/lws-<v>/manager``, beside
the module's own ``config/`` tree copied from the module zip, and installed the way every add-on
is (:mod:`.addons`: the manager as a one-layer image imported into the node, ``kubectl apply
--server-side -k`` of an overlay on upstream's ``config/default``, then waiting on its CRD, its
Deployment and its webhooks). ``config/default`` is namespace ``lws-system``, its CRDs, RBAC, the
manager Deployment, the webhook Service, both webhook configurations and the empty Secret its
cert-controller fills; :func:`overlay` lists the few changes, each for a reason of this machine.
The webhooks are probed with a server-side dry run of a LeaderWorkerSet
(:func:`probe_leaderworkerset`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import addons
from .addons import AddonError

if TYPE_CHECKING:  # the cluster imports nothing of this module
    from .cluster import LocalCluster

# the shared parts, under the names this module has always given them
LwsBuild = addons.AddonBuild
LwsInstall = addons.AddonInstall
IMAGE_USER = addons.IMAGE_USER
deployment_available = addons.deployment_available
relative_to = addons.relative_to

NAMESPACE = "lws-system"
DEPLOYMENT = "lws-controller-manager"
CONTAINER = "manager"
CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
API_VERSION = "leaderworkerset.x-k8s.io/v1"
CPU_REQUEST = "100m"
"""Upstream requests a whole CPU per manager (two replicas): the node has two cores, shared by
every pod of a test session, and a request only decides scheduling here."""
# what each LeaderWorkerSet pod carries and its webhooks select on (objectSelector: Exists)
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


class LwsError(AddonError):
    """LeaderWorkerSet could not be installed, or did not become ready."""


ADDON = addons.Addon(
    title="LeaderWorkerSet",
    name="lws",
    version_key="LWS_VERSION",
    namespace=NAMESPACE,
    deployment=DEPLOYMENT,
    crds=(CRD,),
    error=LwsError,
)
IMAGE_REPOSITORY = ADDON.image_repository
BUILD_HINT = ADDON.build_hint


def version_tuple(version: str) -> tuple[int, ...]:
    """``v0.10.0`` -> ``(0, 10, 0)``."""
    return tuple(int(part) for part in version.lstrip("v").split("-")[0].split("."))


def copies_labels_to_statefulsets(version: str) -> bool:
    """Whether this LWS version puts the LeaderWorkerSet's own labels (and annotations) on the
    StatefulSets it makes: v0.10.0 does (``mergeMetadata`` in ``pkg/controllers``, for the leader
    StatefulSet and each group's worker StatefulSet); v0.9.0 gives them only its own
    ``leaderworkerset.sigs.k8s.io/*`` labels and annotations (seen on the node: test_lws.py)."""
    return version_tuple(version) >= (0, 10, 0)


def expected_build(versions: dict[str, str] | None = None) -> LwsBuild:
    """Where the build of the pinned version is, whether or not it is there."""
    return addons.expected_build(ADDON, versions)


def find_build() -> LwsBuild:
    """The built manager and its config, or :class:`BinariesMissing` saying what to run."""
    return addons.find_build(ADDON)


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
        "patches": [addons.deployment_patch(DEPLOYMENT, patch)],
    }


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


def install(
    cluster: LocalCluster, build: LwsBuild | None = None, timeout: float = 240
) -> LwsInstall:
    """Install LeaderWorkerSet on ``cluster`` (which runs a node) and wait until its webhooks
    answer; idempotent. Raises :class:`LwsError` naming the step that failed, with what it saw."""
    return addons.install(cluster, ADDON, build, overlay, probe_leaderworkerset(), timeout)
