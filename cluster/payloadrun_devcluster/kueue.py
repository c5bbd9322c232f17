"""Kueue (``sigs.k8s.io/kueue``) on the local node, installed as upstream installs it.

What queued runs are admitted by (issue 37): the real controller manager, built from the Go module
proxy by ``cluster/build.sh`` at ``KUEUE_VERSION`` (``cluster/versions.env``) into
``<cache>/bin/kueue-<v>/manager``, beside the module's own ``config/`` tree copied from the module
zip, and installed the way every add-on is (:mod:`.addons`: the manager as a one-layer image
imported into the node, ``kubectl apply --server-side -k`` of an overlay on upstream's
``config/default``, then waiting on its CRDs, its Deployment and its webhooks). ``config/default``
is namespace ``kueue-system``, Kueue's CRDs (their v1beta1/v1beta2 conversion webhooks
included), RBAC, the manager Deployment and its configuration, the webhook Service, both webhook
configurations, the empty Secret its internal cert management fills (and whose CA it injects into
the webhook configurations and the CRDs' conversion webhooks), the metrics Service and the
on-demand visibility API. :func:`overlay` lists the changes, each for a reason of this machine:
the important ones keep the rest of a test session independent of Kueue (its webhooks and its
job management scoped to namespaces labelled :data:`NAMESPACE_LABELS`, no aggregated API).

The webhooks are probed with a server-side dry run of a ResourceFlavor (cluster-scoped, so the
namespace scoping never skips it). Helpers give the objects a test queues work with:
:func:`quota`, :func:`resource_flavor`, :func:`cluster_queue`, :func:`local_queue`,
:func:`workload_priority_class`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import addons
from .addons import AddonError

if TYPE_CHECKING:  # the cluster imports nothing of this module
    from .cluster import LocalCluster

NAMESPACE = "kueue-system"
DEPLOYMENT = "kueue-controller-manager"
CONTAINER = "manager"
CONFIG_MAP = "kueue-manager-config"
CONFIG_KEY = "controller_manager_config.yaml"
GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"  # the storage version of every Kueue API in v0.19
CRDS = tuple(
    f"{plural}.{GROUP}"
    for plural in (
        "workloads",
        "clusterqueues",
        "localqueues",
        "resourceflavors",
        "workloadpriorityclasses",
    )
)
NAMESPACE_LABEL = "payloadrun.dev/kueue-tests"
NAMESPACE_LABELS = {NAMESPACE_LABEL: "true"}
"""What a namespace carries for Kueue to look at it at all: its webhooks on other APIs' objects
(pods, Jobs, StatefulSets, Deployments, LeaderWorkerSets, ...) and its job management
(``managedJobsNamespaceSelector``) select these namespaces only, so no test outside them ever
waits on Kueue's webhooks or finds a workload suspended by it."""
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
CPU_REQUEST = "100m"
"""Upstream requests 500m: the node has two cores, shared by every pod of a test session, and a
request only decides scheduling here."""
UPSTREAM_CPU_REQUEST = "500m"
FRAMEWORKS = (
    "batch/job",
    "pod",
    "deployment",
    "statefulset",
    "leaderworkerset.x-k8s.io/leaderworkerset",
)
"""Upstream's integrations less those whose APIs this cluster never serves (MPIJob, RayJob,
RayCluster, RayService, JobSet, AppWrapper, TrainJob): each of those would only wait, polling
discovery, for an API that never comes. LeaderWorkerSet's starts once the ``lws`` fixture has
installed its CRD (Kueue waits for it)."""
VISIBILITY_API_SERVICES = (
    f"v1beta1.visibility.{GROUP}",
    f"v1beta2.visibility.{GROUP}",
)
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


class KueueError(AddonError):
    """Kueue could not be installed, or did not become ready."""


ADDON = addons.Addon(
    title="Kueue",
    name="kueue",
    version_key="KUEUE_VERSION",
    namespace=NAMESPACE,
    deployment=DEPLOYMENT,
    crds=CRDS,
    error=KueueError,
)
KueueBuild = addons.AddonBuild


@dataclass(frozen=True)
class KueueInstall(addons.AddonInstall):
    """An installed Kueue: its version, image and step timings, and what a namespace needs."""

    @property
    def namespace_labels(self) -> dict[str, str]:
        """The labels a test namespace carries for Kueue's webhooks and job management."""
        return dict(NAMESPACE_LABELS)


def expected_build(versions: dict[str, str] | None = None) -> KueueBuild:
    """Where the build of the pinned version is, whether or not it is there."""
    return addons.expected_build(ADDON, versions)


def find_build() -> KueueBuild:
    """The built manager and its config, or :class:`BinariesMissing` saying what to run."""
    return addons.find_build(ADDON)


def manager_configuration() -> dict:
    """The manager's configuration (``config.kueue.x-k8s.io/v1beta2``), in place of upstream's
    ``config/components/manager/controller_manager_config.yaml``: the same health, metrics,
    webhook, leader election, concurrency and client settings, and these changes:

    - ``managedJobsNamespaceSelector``: namespaces labelled :data:`NAMESPACE_LABELS` (upstream's
      default is every namespace but kube-system and kueue-system);
    - ``manageJobsWithoutQueueName: false`` (upstream's default too, written out): an object is
      Kueue's only with a ``kueue.x-k8s.io/queue-name`` label, so the operator's children, which
      carry none, are never given a Workload of their own;
    - the feature gate ``VisibilityOnDemand`` off (beta, on by default): its server is an
      aggregated API (the APIServices, left out by :func:`overlay`), which this API server is not
      configured for; an unavailable aggregated API makes discovery fail and stalls every
      namespace deletion;
    - integrations :data:`FRAMEWORKS` (see there); ``externalFrameworks`` empty: in v0.19 it only
      makes a kind a known owner, whose children's reconcile then looks its Workload up through
      an owner index Kueue builds for its own integrations only (cluster/README.md).
    """
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {
            "groupKindConcurrency": {
                "Job.batch": 5,
                "Pod": 5,
                "Workload.kueue.x-k8s.io": 10,
                "LocalQueue.kueue.x-k8s.io": 5,
                "Cohort.kueue.x-k8s.io": 1,
                "ClusterQueue.kueue.x-k8s.io": 5,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "clientConnection": {"qps": 300, "burst": 500},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": dict(NAMESPACE_LABELS)},
        "featureGates": {"VisibilityOnDemand": False},
        "integrations": {"frameworks": list(FRAMEWORKS)},
    }


def namespace_scoped_webhooks(rendered: str) -> dict[tuple[str, str], list[str]]:
    """The webhooks upstream scopes by namespace, from ``kubectl kustomize`` of its
    ``config/default``: ``(kind, name)`` of each webhook configuration -> the names of its
    webhooks that have a ``namespaceSelector`` (those on other APIs' objects: pods, Jobs,
    StatefulSets, ...; Kueue's own APIs' webhooks have none and stay as they are).

    Read line by line (the package is standard library only): in a webhook configuration, the
    keys of each entry of the top-level ``webhooks:`` list sit at an indent of two."""
    scoped: dict[tuple[str, str], list[str]] = {}
    for document in re.split(r"^---$", rendered, flags=re.MULTILINE):
        lines = document.strip("\n").splitlines()
        kind = next((line[len("kind: ") :] for line in lines if line.startswith("kind: ")), "")
        if kind not in WEBHOOK_KINDS or "webhooks:" not in lines:
            continue
        top = lines.index("webhooks:")
        metadata = lines.index("metadata:")
        name = next(
            line.split(": ", 1)[1]
            for line in lines[metadata + 1 : top]
            if line.startswith("  name: ")
        )
        entries: list[dict[str, str]] = []
        for line in lines[top + 1 :]:
            if line.startswith("- "):
                entries.append({})
            if entries and len(line) > 2 and line[2] not in " -" and ":" in line:
                key, _, value = line[2:].partition(":")
                entries[-1][key] = value.strip()
        scoped[(kind, name)] = [entry["name"] for entry in entries if "namespaceSelector" in entry]
    return scoped


def overlay(base: str, image: str, scoped: Mapping[tuple[str, str], Sequence[str]]) -> dict:
    """The kustomization installed: upstream's ``config/default`` (``base``, a path relative to
    the kustomization's directory) and these changes, guarded so that a moved field fails the
    render instead of patching something else (JSON-patch ``test`` operations; ``replace`` fails
    on a missing field; a webhook named that upstream lacks would be added without a client
    configuration and refused by the API server):

    - the manager's image: the one built here (upstream's points at a registry this machine does
      not reach), never pulled (``imagePullPolicy: Never``, not Always; the node pulls nothing);
    - a CPU request of :data:`CPU_REQUEST`, not 500m: see there;
    - the manager's configuration: :func:`manager_configuration`;
    - every webhook in ``scoped`` (:func:`namespace_scoped_webhooks`: upstream's selector is
      "every namespace but kube-system and kueue-system", ``failurePolicy: Fail``) selects only
      the namespaces labelled :data:`NAMESPACE_LABELS`: with the manager down or slow, no pod,
      Job, StatefulSet or Deployment elsewhere waits on it or is refused;
    - the on-demand visibility API's two APIServices left out (the feature gate is off too):
      this API server is not configured for aggregation, and an unavailable aggregated API
      stalls every namespace deletion.

    Everything else (namespace, names, CRDs and their conversion webhooks, RBAC, the webhooks'
    rules, failure policy and Kueue's own APIs' webhooks, internal cert management, probes,
    security context, one replica) is upstream's.
    """
    container = "/spec/template/spec/containers/0"
    deployment = [
        {"op": "test", "path": f"{container}/name", "value": CONTAINER},
        {"op": "replace", "path": f"{container}/image", "value": image},
        {"op": "test", "path": f"{container}/imagePullPolicy", "value": "Always"},
        {"op": "replace", "path": f"{container}/imagePullPolicy", "value": "Never"},
        {
            "op": "test",
            "path": f"{container}/resources/requests/cpu",
            "value": UPSTREAM_CPU_REQUEST,
        },
        {"op": "replace", "path": f"{container}/resources/requests/cpu", "value": CPU_REQUEST},
    ]
    configuration = [
        {
            "op": "replace",
            "path": f"/data/{CONFIG_KEY}",
            "value": json.dumps(manager_configuration(), indent=2) + "\n",  # JSON is YAML
        }
    ]
    webhooks = [
        {
            "patch": json.dumps(
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": kind,
                    "metadata": {"name": name},
                    "webhooks": [
                        {
                            "name": webhook,
                            "namespaceSelector": {
                                "$patch": "replace",
                                "matchLabels": dict(NAMESPACE_LABELS),
                            },
                        }
                        for webhook in names
                    ],
                }
            )
        }
        for (kind, name), names in sorted(scoped.items())
    ]
    visibility = [
        {
            "patch": json.dumps(
                {
                    "apiVersion": "apiregistration.k8s.io/v1",
                    "kind": "APIService",
                    "metadata": {"name": name},
                    "$patch": "delete",
                }
            )
        }
        for name in VISIBILITY_API_SERVICES
    ]
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "patches": [
            addons.deployment_patch(DEPLOYMENT, deployment),
            {
                "target": {"version": "v1", "kind": "ConfigMap", "name": CONFIG_MAP},
                "patch": json.dumps(configuration),
            },
            *webhooks,
            *visibility,
        ],
    }


def resource_flavor(
    name: str,
    node_labels: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping] = (),
) -> dict:
    """A ResourceFlavor: the nodes its quota stands for (``nodeLabels``, which Kueue's own
    integrations put into an admitted pod's nodeSelector, with its ``tolerations``)."""
    spec: dict = {}
    if node_labels:
        spec["nodeLabels"] = dict(node_labels)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def cluster_queue(
    name: str,
    flavor: str,
    nominal_quota: Mapping[str, str | int],
    *,
    preempt_lower_priority: bool = False,
    namespace_selector: Mapping | None = None,
) -> dict:
    """A ClusterQueue of one resource group: ``nominal_quota`` of each resource (``cpu``,
    ``memory``, an extended resource like ``nvidia.com/gpu``) in ``flavor``. Its
    ``namespaceSelector`` defaults to every namespace (Kueue's default, null, admits none);
    ``preempt_lower_priority`` lets a workload preempt lower-priority ones in this queue
    (``withinClusterQueue: LowerPriority``; Kueue's default is Never)."""
    spec: dict = {
        "namespaceSelector": dict(namespace_selector or {}),
        "resourceGroups": [
            {
                "coveredResources": list(nominal_quota),
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": resource, "nominalQuota": str(amount)}
                            for resource, amount in nominal_quota.items()
                        ],
                    }
                ],
            }
        ],
    }
    if preempt_lower_priority:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> dict:
    """A LocalQueue: what ``spec.queueName`` (a Workload) or the ``kueue.x-k8s.io/queue-name``
    label (a job) names, in its namespace, feeding ``cluster_queue_name``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def quota(
    namespace: str,
    nominal_quota: Mapping[str, str | int],
    *,
    name: str,
    node_labels: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping] = (),
    preempt_lower_priority: bool = False,
) -> list[dict]:
    """The three objects a test queues work through, all named ``name``: a ResourceFlavor, a
    ClusterQueue with ``nominal_quota`` of it, and a LocalQueue in ``namespace`` feeding it.
    ClusterQueues and ResourceFlavors are cluster-scoped: give each test its own ``name`` (e.g.
    its namespace's) and delete them after it."""
    return [
        resource_flavor(name, node_labels, tolerations),
        cluster_queue(name, name, nominal_quota, preempt_lower_priority=preempt_lower_priority),
        local_queue(name, namespace, name),
    ]


def workload_priority_class(name: str, value: int, description: str = "") -> dict:
    """A WorkloadPriorityClass: what the ``kueue.x-k8s.io/priority-class`` label names; a
    Workload refers to it by ``spec.priorityClassRef`` and carries its value in
    ``spec.priority``."""
    wpc: dict = {
        "apiVersion": API_VERSION,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
    if description:
        wpc["description"] = description
    return wpc


def probe_resource_flavor(name: str = "payloadrun-kueue-probe") -> dict:
    """A ResourceFlavor for a server-side dry run through Kueue's mutating and validating
    ResourceFlavor webhooks (cluster-scoped: no namespace selector skips them)."""
    return resource_flavor(name)


def install(
    cluster: LocalCluster, build: KueueBuild | None = None, timeout: float = 240
) -> KueueInstall:
    """Install Kueue on ``cluster`` (which runs a node) and wait until its webhooks answer;
    idempotent. Raises :class:`KueueError` naming the step that failed, with what it saw."""
    if not cluster.with_node:
        raise KueueError("Kueue runs as a pod: the cluster needs its node (up --node)")
    build = build or find_build()
    rendered = cluster.kubectl("kustomize", str(build.default_kustomization))
    if rendered.returncode != 0:
        raise KueueError(
            f"kubectl kustomize {build.default_kustomization} failed: {rendered.stderr.strip()}"
        )
    scoped = namespace_scoped_webhooks(rendered.stdout)
    if not any(scoped.values()):
        raise KueueError(
            f"found no namespace-scoped webhook in {build.default_kustomization}'s render: "
            "upstream's webhook configuration changed; see kueue.namespace_scoped_webhooks"
        )
    installed = addons.install(
        cluster,
        ADDON,
        build,
        lambda base, image: overlay(base, image, scoped),
        probe_resource_flavor(),
        timeout,
    )
    return KueueInstall(installed.version, installed.image, installed.timings)
