"""The vocabulary of a run's status: its fields, every condition type and reason the operator
sets, what each condition means, a Job's final condition types, and the run's phases.

Words only, no computing (that is :mod:`payloadrun_operator.observed.status`), so the CRD
(:mod:`crd`) is generated from them without importing what computes status.
"""

from __future__ import annotations

from enum import StrEnum

# --- the vocabulary: every condition type and reason the operator sets -------------------------
# One home, used wherever a condition is set: set_condition refuses a type or a reason outside it,
# the CRD's descriptions and docs/payloadrun-reference.md#conditions are generated from it
# (hack/crd_reference.py), and alerts and runbooks can rely on it.


class ConditionType(StrEnum):
    """The conditions of a run, each True or False with a reason of its own enum (REASONS)."""

    VALIDATED = "Validated"
    APPLIED = "Applied"
    VOLUME_READY = "VolumeReady"
    READY = "Ready"
    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"
    PAYLOADS_RELEASED = "PayloadsReleased"
    ADMITTED = "Admitted"


class ValidatedReason(StrEnum):
    SPEC_VALID = "SpecValid"  # True
    INVALID_SPEC = "InvalidSpec"  # False: the phase is Rejected, nothing is applied


class AppliedReason(StrEnum):
    CHILDREN_APPLIED = "ChildrenApplied"  # True
    APPLY_FAILED = "ApplyFailed"  # False: the API server refused a child (which, and why)
    # False (a Warning): the run's replicas are groups and the cluster does not serve
    # LeaderWorkerSet's API: nothing of the run is applied
    LEADER_WORKER_SET_MISSING = "LeaderWorkerSetMissing"
    # False (a Warning): the run is labelled kueue.x-k8s.io/queue-name and the cluster does not
    # serve Kueue's API: nothing of the run is applied
    KUEUE_MISSING = "KueueMissing"


class VolumeReadyReason(StrEnum):
    CLAIM_BOUND = "ClaimBound"  # True
    NOT_NEEDED = "NotNeeded"  # True: inline, no shared volume
    CLAIM_MISSING = "ClaimMissing"  # False
    CLAIM_PENDING = "ClaimPending"  # False
    CLAIM_LOST = "ClaimLost"  # False (a Warning)


class ReadyReason(StrEnum):
    WORKLOADS_READY = "WorkloadsReady"  # True
    WORKLOADS_NOT_READY = "WorkloadsNotReady"  # False
    APPLY_FAILED = "ApplyFailed"  # False: a child was refused (the Applied condition says which)
    SPEC_REJECTED = "SpecRejected"  # False: the spec was refused (the Validated condition)
    LEADER_WORKER_SET_MISSING = "LeaderWorkerSetMissing"  # False: see the Applied condition
    KUEUE_MISSING = "KueueMissing"  # False: see the Applied condition
    # False (a Warning): LeaderWorkerSet's controller could not make a StatefulSet of the run's
    # groups (a quota, an admission policy): which one, from which template, and why
    GROUPS_REFUSED = "GroupsRefused"
    QUEUED = "Queued"  # False: Kueue has not admitted the run (the Admitted condition says why)
    STOPPED = "Stopped"  # False: suspended
    FINISHED = "Finished"  # False: the run has ended


class SuspendedReason(StrEnum):
    SPEC_SUSPENDED = "SpecSuspended"  # True
    RESUMED = "Resumed"  # False


class CompleteReason(StrEnum):
    TRAINERS_SUCCEEDED = "TrainersSucceeded"  # True


class FailedReason(StrEnum):
    ORCHESTRATOR_FAILED = "OrchestratorFailed"  # True
    TRAINER_FAILED = "TrainerFailed"  # True


class PayloadsReleasedReason(StrEnum):
    FILES_DELETED = "FilesDeleted"  # True
    NO_PAYLOAD_FILES = "NoPayloadFiles"  # True: the run was inline
    DELETING_FILES = "DeletingFiles"  # False: the cleanup Job runs
    RETAINED = "Retained"  # False: deletionPolicy Retain
    KEPT_AFTER_FAILURE = "KeptAfterFailure"  # False: a failed run keeps them for debugging
    CLEANUP_FAILED = "CleanupFailed"  # False (a Warning)


class AdmittedReason(StrEnum):
    """Kueue's verdict on a queued run's Workload (runs without the queue label have none)."""

    ADMITTED = "Admitted"  # True: quota reserved for every pod of the run, which runs
    PENDING = "Pending"  # False: waiting for quota (Kueue's message says where)
    INADMISSIBLE = "Inadmissible"  # False (a Warning): Kueue cannot admit it as it is
    EVICTED = "Evicted"  # False: preempted or evicted: every pod stops, then it waits again
    FINISHED = "Finished"  # False: the run has ended, and its quota is released
    # False (a Warning): the run's pods started without a queue (the label came later, or an
    # operator before 0.2.0 started it): it runs unqueued until it is suspended
    STARTED_UNQUEUED = "StartedUnqueued"


Reason = (
    ValidatedReason
    | AppliedReason
    | VolumeReadyReason
    | ReadyReason
    | SuspendedReason
    | CompleteReason
    | FailedReason
    | PayloadsReleasedReason
    | AdmittedReason
)

REASONS: dict[ConditionType, type[StrEnum]] = {
    ConditionType.VALIDATED: ValidatedReason,
    ConditionType.APPLIED: AppliedReason,
    ConditionType.VOLUME_READY: VolumeReadyReason,
    ConditionType.READY: ReadyReason,
    ConditionType.SUSPENDED: SuspendedReason,
    ConditionType.COMPLETE: CompleteReason,
    ConditionType.FAILED: FailedReason,
    ConditionType.PAYLOADS_RELEASED: PayloadsReleasedReason,
    ConditionType.ADMITTED: AdmittedReason,
}

# Reasons that go with a True status; every other reason goes with False (set_condition checks).
TRUE_REASONS: frozenset[StrEnum] = frozenset(
    {
        ValidatedReason.SPEC_VALID,
        AppliedReason.CHILDREN_APPLIED,
        VolumeReadyReason.CLAIM_BOUND,
        VolumeReadyReason.NOT_NEEDED,
        ReadyReason.WORKLOADS_READY,
        SuspendedReason.SPEC_SUSPENDED,
        CompleteReason.TRAINERS_SUCCEEDED,
        FailedReason.ORCHESTRATOR_FAILED,
        FailedReason.TRAINER_FAILED,
        PayloadsReleasedReason.FILES_DELETED,
        PayloadsReleasedReason.NO_PAYLOAD_FILES,
        AdmittedReason.ADMITTED,
    }
)

# What each condition says when True (the CRD's descriptions and the reference are made of these).
MEANINGS: dict[ConditionType, str] = {
    ConditionType.VALIDATED: "the spec was accepted (False: it was refused, the phase is "
    "Rejected and nothing is applied)",
    ConditionType.APPLIED: "every child was applied (False: the API server refused one, the "
    "message says which and why; or the run's replicas are LeaderWorkerSet groups and the "
    "cluster does not serve LeaderWorkerSet's API, or it is labelled "
    "kueue.x-k8s.io/queue-name and the cluster does not serve Kueue's)",
    ConditionType.VOLUME_READY: "the payload volume's claim is bound, or the run needs none",
    ConditionType.READY: "the accepted spec's workloads have every pod ready (the phase is "
    "then Running)",
    ConditionType.SUSPENDED: "spec.suspend is true: no pod runs (set once a run was suspended; "
    "False after it resumed)",
    ConditionType.COMPLETE: "every trainer exited 0: the phase is Succeeded, for good",
    ConditionType.FAILED: "a component failed beyond spec.failurePolicy: the phase is Failed, "
    "for good",
    ConditionType.ADMITTED: "Kueue admitted every pod of the run (only on a run labelled "
    "kueue.x-k8s.io/queue-name; False: waiting for quota, the phase is Queued and no pod runs, "
    "with Kueue's own message; or evicted, every pod stopping until it is admitted again; or the "
    "run's pods started without a queue, and it runs unqueued until it is suspended)",
    ConditionType.PAYLOADS_RELEASED: "a finished run's payload files were deleted, or it had "
    "none (False: being deleted, or kept: deletionPolicy Retain, a failed run, a failed "
    "cleanup Job)",
}


class EventType(StrEnum):
    """The types of the Kubernetes events the operator posts about a run."""

    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(StrEnum):
    """The reasons of the run's events that are no condition's transition (those carry the
    condition's reason): restarts, each said once, as a Warning."""

    # the trainers' Job failed and every rank restarts together (restarts.py)
    TRAINERS_RESTARTED = "TrainersRestarted"
    # a LeaderWorkerSet group failed and restarts whole (groups.py)
    INFERENCE_GROUP_RESTARTED = "InferenceGroupRestarted"


# A batch/v1 Job's condition types once it has ended (outcome.job_outcome's values): the Job's
# vocabulary, not the run's.
JOB_COMPLETE = "Complete"
JOB_FAILED = "Failed"


class Phase(StrEnum):
    """A run's phase (``status.phase``), made of its conditions (status.phase); the printer
    column, the ``payloadrun_operator_runs`` metric's label and the alerts read it."""

    REJECTED = "Rejected"
    PROVISIONING = "Provisioning"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def final(self) -> bool:
        """Succeeded and Failed are for good: nothing of the run runs on (until it is deleted)."""
        return self in FINAL_PHASES


FINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


# --- the status's fields -----------------------------------------------------------------------


class StatusField(StrEnum):
    """The fields of a run's status, as :class:`models.PayloadRunStatus` (the CRD's schema)
    names them: every field the operator writes is one of these (``status_update`` refuses any
    other), and a test holds them equal to the model's, so a field the next issues add to the
    status is added to the model, and written through ``observed.status.status_update``. What
    decisions read of a run's status they read through :class:`api.recorded.Recorded`, which
    names its fields by these."""

    OBSERVED_GENERATION = "observedGeneration"
    OBSERVED_DIGEST = "observedDigest"
    PHASE = "phase"
    PAYLOAD_MODE = "payloadMode"
    PAYLOAD_MODE_REASON = "payloadModeReason"
    PAYLOAD_MODE_MESSAGE = "payloadModeMessage"
    PAYLOAD_ROOT = "payloadRoot"
    CLAIM_NAME = "claimName"
    SIDECARS = "sidecars"
    START_TIME = "startTime"
    COMPLETION_TIME = "completionTime"
    LAST_STEP = "lastStep"
    FAILURE = "failure"
    TRAINER_RESTARTS = "trainerRestarts"
    LAST_TRAINER_RESTART = "lastTrainerRestart"
    INFERENCE_GROUP_RESTARTS = "inferenceGroupRestarts"
    LAST_INFERENCE_GROUP_RESTART = "lastInferenceGroupRestart"
    QUEUE = "queue"
    CONDITIONS = "conditions"
