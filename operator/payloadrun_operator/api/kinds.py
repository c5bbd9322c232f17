"""The Kubernetes kinds the operator touches, in one table: each kind's apiVersion, its plural
(the API path the client calls), whether the status follows it (watched, and listed by the
managed-by label) and whether a cluster may lack its API (``optional``: an add-on such as
LeaderWorkerSet, followed only where discovery finds it served). The client (kube.py), the
watches (observed/watching.py), the follower's cache (following.py), discovery
(platform/discovery.py) and the workloads (names.WORKLOADS) read this table, and a test holds
every child the builders make to it."""

from __future__ import annotations

from dataclasses import dataclass

from payloadrun_operator.api.models import GROUP, KIND, PLURAL, VERSION


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    followed: bool = False  # the status reads it: watched and listed by the managed-by label
    # an add-on's API, which a cluster may not serve: the operator learns at start whether it
    # does (platform/discovery.py), and lists it, and uses it, only where it does
    optional: bool = False

    @property
    def group(self) -> str:
        """The API group ('' for the core group's ``v1``)."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        """The API version within its group (``v1beta2`` of ``kueue.x-k8s.io/v1beta2``)."""
        return self.api_version.rpartition("/")[2]

    @property
    def type_meta(self) -> dict[str, str]:
        """A manifest's first two fields (Kubernetes' TypeMeta): its apiVersion and kind."""
        return {"apiVersion": self.api_version, "kind": self.kind}


RUN = Kind(f"{GROUP}/{VERSION}", KIND, PLURAL)
CLAIM = Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims", followed=True)
CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")
SERVICE = Kind("v1", "Service", "services")
STATEFUL_SET = Kind("apps/v1", "StatefulSet", "statefulsets", followed=True)
# development builds before 0.1.0 made Deployments; nothing makes one now
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
JOB = Kind("batch/v1", "Job", "jobs", followed=True)
POD = Kind("v1", "Pod", "pods")
# created as a dry run only: a group run's pod templates checked (desired/group_check.py)
POD_TEMPLATE = Kind("v1", "PodTemplate", "podtemplates")
# posted about runs; a LeaderWorkerSet's Warnings listed (a StatefulSet its controller
# could not make)
EVENT = Kind("v1", "Event", "events")
NETWORK_POLICY = Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
# the operators' leader election (platform/election.py)
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases")
# A run's multi-node inference replicas (spec.inference.podsPerReplica > 1): kubernetes-sigs/lws,
# installed in the cluster or not (the operator follows it only where its API exists).
LEADER_WORKER_SET = Kind(
    "leaderworkerset.x-k8s.io/v1",
    "LeaderWorkerSet",
    "leaderworkersets",
    followed=True,
    optional=True,
)

# Kueue (kubernetes-sigs/kueue), for a run labelled kueue.x-k8s.io/queue-name: the run's one
# Workload (every pod of it, admitted whole), followed like a child; the flavors its admission
# names and the priority class its label names, read (both cluster-scoped).
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
WORKLOAD = Kind(KUEUE_API_VERSION, "Workload", "workloads", followed=True, optional=True)
RESOURCE_FLAVOR = Kind(KUEUE_API_VERSION, "ResourceFlavor", "resourceflavors", optional=True)
WORKLOAD_PRIORITY_CLASS = Kind(
    KUEUE_API_VERSION, "WorkloadPriorityClass", "workloadpriorityclasses", optional=True
)

KINDS = (
    RUN,
    CLAIM,
    CONFIG_MAP,
    SERVICE,
    STATEFUL_SET,
    DEPLOYMENT,
    JOB,
    POD,
    POD_TEMPLATE,
    EVENT,
    NETWORK_POLICY,
    LEASE,
    LEADER_WORKER_SET,
    WORKLOAD,
    RESOURCE_FLAVOR,
    WORKLOAD_PRIORITY_CLASS,
)
# (apiVersion, kind) -> plural, for the kinds the operator creates or reads.
PLURALS = {(k.api_version, k.kind): k.plural for k in KINDS}
# (apiVersion, kind) -> its Kind (a built child's row of the table).
BY_KIND = {(k.api_version, k.kind): k for k in KINDS}
# The kinds of child the status reads, as (apiVersion, kind): readiness lists them by the
# managed-by label, and the follower's reflectors watch each (observed/watching.py).
CHILD_KINDS = tuple((k.api_version, k.kind) for k in KINDS if k.followed)
FOLLOWED = tuple(k for k in KINDS if k.followed)
# The add-ons' kinds, whose APIs the operator looks for at start.
OPTIONAL = tuple(k for k in KINDS if k.optional)
