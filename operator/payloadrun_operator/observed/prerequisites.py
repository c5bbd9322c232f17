"""What a run needs of the cluster beyond the operator: LeaderWorkerSet's API for a run whose
inference replicas span pods (``spec.inference.podsPerReplica`` above 1).

A run whose prerequisite is missing is valid (``Validated`` stays True: its spec is fine, the
cluster is not) and gets nothing: no claim, no Service, no pod, since half a run holds a volume
and node capacity while it cannot serve. ``Applied`` says why (a Warning event), ``Ready``
points there, and the reconcile applies the run once the operator, started again after
LeaderWorkerSet is installed, finds its API (:mod:`platform.discovery`).
"""

from __future__ import annotations

from payloadrun_operator.api.conditions import AppliedReason, ConditionType, ReadyReason
from payloadrun_operator.api.kinds import LEADER_WORKER_SET
from payloadrun_operator.observed.status import Check

# The LeaderWorkerSet versions the operator's tests ran against (its API: v1).
LWS_TESTED_VERSIONS = "v0.9.0"
LWS_INSTALL = "https://lws.sigs.k8s.io/docs/installation/"


def lws_missing_message(pods_per_replica: int) -> str:
    return (
        f"spec.inference.podsPerReplica is {pods_per_replica}: each inference replica is a "
        f"LeaderWorkerSet group, and this cluster did not serve {LEADER_WORKER_SET.api_version} "
        f"{LEADER_WORKER_SET.plural} when the operator started. Install LeaderWorkerSet "
        f"(tested with {LWS_TESTED_VERSIONS}; {LWS_INSTALL}), then restart the operator "
        "(kubectl rollout restart deployment of the payloadrun chart): it learns which APIs "
        "the cluster serves as it starts, and applies this run then. Nothing of the run is "
        "created until then"
    )


def missing_checks(pods_per_replica: int, lws_served: bool) -> dict[ConditionType, Check]:
    """The conditions of a run whose prerequisites the cluster lacks; empty when it has them
    (a run of one-pod replicas needs nothing but what every cluster serves)."""
    if pods_per_replica <= 1 or lws_served:
        return {}
    message = lws_missing_message(pods_per_replica)
    return {
        ConditionType.APPLIED: Check(
            False, AppliedReason.LEADER_WORKER_SET_MISSING, message, warning=True
        ),
        ConditionType.READY: Check(
            False,
            ReadyReason.LEADER_WORKER_SET_MISSING,
            "LeaderWorkerSet is not installed: nothing is applied (see the Applied condition)",
        ),
    }
