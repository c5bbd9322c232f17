"""What a run needs of the cluster beyond the operator: LeaderWorkerSet's API for a run whose
inference replicas span pods (``spec.inference.podsPerReplica`` above 1), Kueue's for a run
labelled ``kueue.x-k8s.io/queue-name``.

A run whose prerequisite is missing is valid (``Validated`` stays True: its spec is fine, the
cluster is not) and gets nothing: no claim, no Service, no pod, since half a run holds a volume
and node capacity while it cannot serve. ``Applied`` says why (a Warning event), ``Ready``
points there, and the reconcile applies the run once the operator, started again after
LeaderWorkerSet (or Kueue) is installed, finds its API (:mod:`platform.discovery`). A queued run
without Kueue is not run unqueued either: it asked for a quota, and bypassing it is what a
shared cluster's queue exists to prevent.
"""

from __future__ import annotations

from payloadrun_operator.api.addons import KUEUE_ADDON, LEADER_WORKER_SET_ADDON
from payloadrun_operator.api.conditions import AppliedReason, ConditionType, ReadyReason
from payloadrun_operator.api.names import QUEUE_NAME_LABEL
from payloadrun_operator.observed.status import Check

RESTART_HINT = (
    "restart the operator (kubectl rollout restart deployment of the payloadrun chart): it "
    "learns which APIs the cluster serves as it starts, and applies this run then. Nothing of "
    "the run is created until then"
)


def lws_missing_message(pods_per_replica: int, group_versions: tuple[str, ...] = ()) -> str:
    return (
        f"spec.inference.podsPerReplica is {pods_per_replica}: each inference replica is a "
        f"LeaderWorkerSet group, and {LEADER_WORKER_SET_ADDON.not_served(group_versions)}, "
        f"then {RESTART_HINT}"
    )


def kueue_missing_message(queue: str, group_versions: tuple[str, ...] = ()) -> str:
    return (
        f"the run is labelled {QUEUE_NAME_LABEL}={queue}: Kueue admits it whole, and "
        f"{KUEUE_ADDON.not_served(group_versions)}, then {RESTART_HINT}; or remove the label to "
        f"run it without a queue"
    )


def missing_checks(
    pods_per_replica: int,
    lws_served: bool,
    *,
    queue: str | None = None,
    kueue_served: bool = False,
    lws_versions: tuple[str, ...] = (),
    kueue_versions: tuple[str, ...] = (),
) -> dict[ConditionType, Check]:
    """The conditions of a run whose prerequisites the cluster lacks; empty when it has them
    (a run of one-pod replicas without a queue needs nothing but what every cluster serves).
    ``lws_versions`` and ``kueue_versions``: the versions of the add-on's API group the cluster
    serves when it does not serve the one the operator needs (an older release installed)."""
    if pods_per_replica > 1 and not lws_served:
        return {
            ConditionType.APPLIED: Check(
                False,
                AppliedReason.LEADER_WORKER_SET_MISSING,
                lws_missing_message(pods_per_replica, lws_versions),
                warning=True,
            ),
            ConditionType.READY: Check(
                False,
                ReadyReason.LEADER_WORKER_SET_MISSING,
                f"LeaderWorkerSet is {'too old' if lws_versions else 'not installed'}: nothing is "
                "applied (see the Applied condition)",
            ),
        }
    if queue is not None and not kueue_served:
        return {
            ConditionType.APPLIED: Check(
                False,
                AppliedReason.KUEUE_MISSING,
                kueue_missing_message(queue, kueue_versions),
                warning=True,
            ),
            ConditionType.READY: Check(
                False,
                ReadyReason.KUEUE_MISSING,
                f"Kueue is {'too old' if kueue_versions else 'not installed'}: nothing is applied "
                "(see the Applied condition)",
            ),
        }
    return {}
