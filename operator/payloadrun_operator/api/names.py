"""Every name the operator gives or looks for, in one place (the role of KubeRay's ``constant.go``).

Labels, annotation prefixes, the field manager, container, volume and port names, the workload
table and the child naming rule: a rename here is one edit and a test, never a broken pod. The
environment variables the pods get are :class:`payloadrun.settings.Env` (the sidecars read the
same names), the default ports the CRD's (:mod:`payloadrun.settings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from payloadrun_operator.api.kinds import JOB, LEADER_WORKER_SET, STATEFUL_SET
from payloadrun_operator.api.models import GROUP, VERSION

API_VERSION = f"{GROUP}/{VERSION}"

# Who writes: server-side apply's field manager, the events' reporting component.
FIELD_MANAGER = "payloadrun-operator"
# A second field manager that owns only whether workloads run (replicas, suspend): suspending,
# resuming or finishing a run scales its workloads without restating their templates.
ACTIVITY_MANAGER = "payloadrun-operator-activity"
# kopf's state on each run: annotations with this prefix; the finalizer kopf would add.
ANNOTATION_PREFIX = GROUP
FINALIZER = f"{GROUP}/finalizer"
DIFFBASE_KEY = "last-handled-configuration"

# Labels on every child and pod.
APP = "payloadrun"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RUN = f"{GROUP}/run"
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={FIELD_MANAGER}"

# On each workload: the hash of what its template was built from (the run's spec that concerns
# it and the sidecar settings the run pinned). An operator restart or upgrade that finds it
# unchanged leaves the workload's template alone, whatever the new operator would build.
INPUTS_ANNOTATION = f"{GROUP}/inputs"
# On a run: set it to a new value (any string, e.g. the time) to move the run onto the operator's
# current sidecar image and settings. Not under payloadrun.dev/, which kopf keeps for itself and
# leaves out of the changes it reacts to.
ROLLOUT_ANNOTATION = "rollout.payloadrun.dev/sidecars"

# Components: each child is named <run>-<component> (see child_name).
INFERENCE = "inference"
ORCHESTRATOR = "orchestrator"
TRAINER = "trainer"
SETTINGS = "settings"
PAYLOADS = "payloads"  # the managed claim's component label
CLEANUP = "cleanup"  # the Job that deletes a finished run's payload files
HEADLESS_SUFFIX = "-headless"
# The LeaderWorkerSet of a run whose replicas span pods, named <run>-vllm, never
# <run>-inference: LWS names its leader StatefulSet and its headless Service after itself, and
# reuses (without DNS for its pods) a Service of that name that exists already.
INFERENCE_GROUPS_SUFFIX = "-vllm"
# LeaderWorkerSet's own labels on the pods (and, from v0.10.0, the StatefulSets) it makes.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"  # the replica
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # 0: the leader
LWS_LABEL_PREFIX = "leaderworkerset.sigs.k8s.io/"
# The variables LeaderWorkerSet's pod webhook puts first in every container's env.
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_ENV = (LWS_LEADER_ADDRESS, "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")

# Kueue: a run labelled with a LocalQueue's name is admitted whole through one Workload of its own,
# named <WORKLOAD_PREFIX><run>; the priority-class label names a WorkloadPriorityClass. The labels
# are Kueue's own (as on a Job), read on the run only: no child carries them, so Kueue's Job,
# StatefulSet and LeaderWorkerSet integrations leave the run's children alone.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
# the uid of the job a Workload admits, as Kueue's own integrations label it: Kueue's preemption
# message names the preempting job by it ("Preempted to accommodate a workload (UID: ...,
# JobUID: ...)"), so a preempted run's event names the run that took its quota
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
QUEUE_WORKLOAD_PREFIX = "payloadrun-"
# Kueue puts it on a Workload that holds quota; the owner of a Workload takes it off.
KUEUE_FINALIZER = "kueue.x-k8s.io/resource-in-use"
# On the Workload: the hash of its pod sets (Kueue refuses a change of them: a new Workload).
POD_SETS_ANNOTATION = f"{GROUP}/pod-sets"
# On each workload: the hash of the admitted flavors' node labels and tolerations in its pods.
PLACEMENT_ANNOTATION = f"{GROUP}/placement"

# Containers.
VLLM_CONTAINER = "vllm"
WRITER_CONTAINER = "payload-writer"
RETENTION_CONTAINER = "payload-retention"
ORCHESTRATOR_CONTAINER = ORCHESTRATOR
TRAINER_CONTAINER = TRAINER
CLEANUP_CONTAINER = CLEANUP
OPERATOR_CONTAINER = "operator"  # the chart's Deployment

# Volumes and ports.
VOLUME_NAME = "payloads"  # the payload volume (and the run directory, when it is that volume)
RUN_DIRECTORY_VOLUME = "run-directory"  # spec.runDirectory on a claim of its own
SHM_VOLUME = "dshm"  # the memory-backed /dev/shm
HTTP_PORT_NAME = "http"
WRITER_PORT_NAME = "writer"
WRITER_METRICS_PORT_NAME = "writer-metrics"
RETENTION_METRICS_PORT_NAME = "metrics"
TRAINER_DIST_PORT_NAME = "dist"
TRAINER_DIST_PORT = 29500  # torch.distributed's default: MASTER_PORT
VLLM_PORT_NAME = "vllm"  # vLLM's own port on the inference headless Service (admin traffic)
# The Indexed Jobs' pod annotation with the pod's index (the trainer's rank).
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # the Job controller's label on a Job's pods


def job_pods_selector(job_name: str) -> str:
    """The label selector of the pods of the Job ``job_name`` (the Job controller's label)."""
    return f"{JOB_NAME_LABEL}={job_name}"


# The workloads a run owns, as (apiVersion, kind, component); readiness follows each of them.
# Inference serves until the run ends (a StatefulSet); the orchestrator and the trainers are
# Jobs, so a process that exits 0 is done rather than restarted, and failures are counted.
WORKLOADS = (
    (STATEFUL_SET.api_version, STATEFUL_SET.kind, INFERENCE),
    (JOB.api_version, JOB.kind, ORCHESTRATOR),
    (JOB.api_version, JOB.kind, TRAINER),
)


def child_name(run: str, component: str) -> str:
    """The name of a run's child: ``<run>-<component>``."""
    return f"{run}-{component}"


def inference_groups_name(run: str) -> str:
    """The name of a run's LeaderWorkerSet (and so of its leader StatefulSet, its headless
    Service and its pods: ``<run>-vllm-<replica>`` leaders, ``<run>-vllm-<replica>-<w>``
    workers)."""
    return run + INFERENCE_GROUPS_SUFFIX


def run_workloads(run: str, pods_per_replica: int = 1) -> tuple[tuple[str, str, str], ...]:
    """A run's workloads as ``(apiVersion, kind, name)``, inference first: :data:`WORKLOADS`,
    whose inference is a LeaderWorkerSet of its own name (:func:`inference_groups_name`) when
    its replicas span pods (``spec.inference.podsPerReplica`` above 1). Readiness, a run's end
    and the reconcile's apply plan find them by these names, so an object of another name that
    carries the run's labels (the StatefulSets LeaderWorkerSet makes, which copy its labels) is
    never taken for one of them."""
    found = []
    for api_version, kind, component in WORKLOADS:
        if component == INFERENCE and pods_per_replica > 1:
            lws = LEADER_WORKER_SET
            found.append((lws.api_version, lws.kind, inference_groups_name(run)))
        else:
            found.append((api_version, kind, child_name(run, component)))
    return tuple(found)


def workloads_of(run: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """``run``'s workloads (:func:`run_workloads`), read from the run: its inference a
    LeaderWorkerSet when ``spec.inference.podsPerReplica`` is above 1."""
    inference = (run.get("spec") or {}).get("inference") or {}
    return run_workloads(run["metadata"]["name"], int(inference.get("podsPerReplica", 1)))


def queue_workload_name(run: str) -> str:
    """The name of the Kueue Workload of a run that is queued: ``payloadrun-<run>``."""
    return QUEUE_WORKLOAD_PREFIX + run


def headless_name(run: str, component: str) -> str:
    return child_name(run, component + HEADLESS_SUFFIX)


def pod_host(run: str, namespace: str, component: str, index: int) -> str:
    """The DNS name of pod ``index`` of a run's StatefulSet or Indexed Job (its hostname
    ``<run>-<component>-<index>`` on the component's headless Service)."""
    return f"{child_name(run, component)}-{index}.{headless_name(run, component)}.{namespace}.svc"
