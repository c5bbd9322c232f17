"""Restarting the trainers together when one rank fails, as JobSet and LeaderWorkerSet do.

A replacement rank alone would join a group whose collectives never complete: the surviving
ranks wait in theirs until the distributed timeout (prime-rl's default is an hour). So the
trainers' Job has ``backoffLimit: 0`` (any rank's failure fails it, and the Job controller stops
the other ranks), and the pass, seeing it failed, restarts the group: it records the
restart in the run's status (``trainerRestarts``, ``lastTrainerRestart``, a Warning event with
the failed rank and its exit code), deletes the Job (foreground: its pods go first) and, once it
is gone, creates it again with the same template, so every rank starts afresh under the same
names (rank 0 keeps the master's address). A restart counts once against
``spec.failurePolicy.backoffLimit``, however many ranks failed; past it the run is Failed, with
the last failed rank kept for its logs.

Runs started before this (pod layout 1) keep a Job that replaces ranks one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from payloadrun_operator.api.conditions import JOB_FAILED, StatusField
from payloadrun_operator.api.names import COMPLETION_INDEX_ANNOTATION, TRAINER_CONTAINER
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.desired.pinning import PodLayout
from payloadrun_operator.observed import outcome


class RestartAction(StrEnum):
    """What the pass does about the trainers' Job (:func:`plan`), as JobSet's
    FailurePolicyAction names what its controller does about a failed child Job."""

    NONE = "none"  # nothing to do
    RESTART = "restart"  # record a new restart, then delete the failed Job
    DELETE = "delete"  # this failed Job's restart is recorded already: delete it (again)
    FAIL = "fail"  # no restart left: the run fails


@dataclass(frozen=True)
class Steps:
    """What an action does: each step the pass takes for it."""

    record: bool  # count a new restart in the status, and post a TrainersRestarted event
    # delete the failed Job (foreground; created again once it is gone): then it is no end of
    # the run, which fails only once no restart is left
    delete_job: bool


# The action table, as JobSet's failurePolicyActionApplier: what each action does.
ACTIONS: dict[RestartAction, Steps] = {
    RestartAction.NONE: Steps(record=False, delete_job=False),
    RestartAction.RESTART: Steps(record=True, delete_job=True),
    RestartAction.DELETE: Steps(record=False, delete_job=True),
    RestartAction.FAIL: Steps(record=False, delete_job=False),
}


def plan(
    recorded: Recorded, job: Mapping[str, Any] | None, limit: int, layout: PodLayout | int
) -> RestartAction:
    """What to do about the trainers' Job of a run whose status is ``recorded``."""
    if (
        not PodLayout.of(layout).restarts_trainers_together
        or job is None
        or job["metadata"].get("deletionTimestamp")
    ):
        return RestartAction.NONE
    if outcome.job_outcome(job) != JOB_FAILED:
        return RestartAction.NONE
    if recorded.last_trainer_restart.get("jobUid") == job["metadata"].get("uid"):
        return RestartAction.DELETE
    return RestartAction.RESTART if recorded.trainer_restarts < limit else RestartAction.FAIL


def restart_record(
    recorded: Recorded,
    job: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    limit: int,
    now: str,
) -> dict[str, Any]:
    """The status fields of a new restart: the count and what failed."""
    pods = list(pods)
    count = recorded.trainer_restarts + 1
    # the first rank to fail is the cause: the Job controller stopped the others after it
    pod, exit_code = outcome.first_failed_container(pods, TRAINER_CONTAINER)
    rank = next(
        (
            p["metadata"].get("annotations", {}).get(COMPLETION_INDEX_ANNOTATION)
            for p in pods
            if p["metadata"]["name"] == pod
        ),
        None,
    )
    if pod is None:
        what = "a trainer pod failed"
    else:
        what = f"trainer rank {rank} (pod {pod}) exited with code {exit_code}"
    message = (
        f"{what}: every rank restarts together (restart {count} of at most {limit}, "
        "spec.failurePolicy.backoffLimit)"
    )
    record: dict[str, Any] = {"time": now, "jobUid": job["metadata"]["uid"], "message": message}
    if pod is not None:
        record["pod"] = pod
        record["exitCode"] = exit_code
    return {StatusField.TRAINER_RESTARTS: count, StatusField.LAST_TRAINER_RESTART: record}


def trainers_restart(
    recorded: Recorded,
    job: Mapping[str, Any] | None,
    limit: int,
    layout: PodLayout,
    pods_of: Callable[[Mapping[str, Any]], list[Any]],
    now: str,
) -> tuple[tuple[RestartAction, Mapping[str, Any]] | None, dict[str, Any]]:
    """What a pass does about the trainers' ``job`` (:func:`plan`): the restart to carry out
    once it is written (the action and the failed Job to delete; None: no Job to delete, so a
    failed one is the run's end) and the status fields of a new restart (``pods_of``: a Job's
    pods, as observed)."""
    action = plan(recorded, job, limit, layout)
    if not ACTIONS[action].delete_job:
        return None, {}
    assert job is not None  # a Job to delete is there
    if not ACTIONS[action].record:
        return (action, job), {}
    return (action, job), restart_record(recorded, job, pods_of(job), limit, now)


def failure_lead(recorded: Recorded, limit: int, layout: PodLayout) -> str | None:
    """How a failure of the trainers' Job begins in ``status.failure`` when its ranks restart
    together (the Job fails at its first failed rank); None: a Job that replaces ranks."""
    if not layout.restarts_trainers_together:
        return None
    return (
        f"a trainer rank failed after {recorded.trainer_restarts} "
        f"restart(s) of every rank (spec.failurePolicy.backoffLimit is {limit})"
    )
