"""Restarting the trainers together (restarts.py): when, how often, what is recorded."""

from builders import T0, failed_pod, job
from payloadrun_operator.api.models import PayloadRunStatus
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.observed import restarts


def failed_job(uid: str = "job-1", **changes) -> dict:
    """The trainers' Job after a rank failed (Kubernetes' Failed condition), by default."""
    return job(uid=uid, **{"outcome": "Failed", "failed": 1, **changes})


def test_a_failed_trainer_job_restarts_the_group_until_the_limit():
    assert (
        restarts.plan(Recorded(), failed_job(), limit=2, layout=2) == restarts.RestartAction.RESTART
    )
    assert (
        restarts.plan(Recorded.of_status({"trainerRestarts": 1}), failed_job(), limit=2, layout=2)
        == restarts.RestartAction.RESTART
    )
    assert (
        restarts.plan(Recorded.of_status({"trainerRestarts": 2}), failed_job(), limit=2, layout=2)
        == restarts.RestartAction.FAIL
    )
    assert restarts.plan(Recorded(), failed_job(), limit=0, layout=2) == restarts.RestartAction.FAIL


def test_nothing_to_do_before_a_failure_during_a_restart_or_for_old_runs():
    assert restarts.plan(Recorded(), None, limit=3, layout=2) == restarts.RestartAction.NONE
    assert (
        restarts.plan(Recorded(), failed_job(outcome=None), limit=3, layout=2)
        == restarts.RestartAction.NONE
    )
    assert (
        restarts.plan(Recorded(), failed_job(deleting=True), limit=3, layout=2)
        == restarts.RestartAction.NONE
    )
    # a run started before pod layout 2: its Job replaces ranks one by one, as it did
    assert restarts.plan(Recorded(), failed_job(), limit=3, layout=1) == restarts.RestartAction.NONE


def test_a_recorded_restart_is_counted_once_however_often_it_is_seen():
    status = {"trainerRestarts": 1, "lastTrainerRestart": {"jobUid": "job-1"}}
    assert (
        restarts.plan(Recorded.of_status(status), failed_job("job-1"), limit=3, layout=2)
        == restarts.RestartAction.DELETE
    )
    # the next attempt's Job fails: a new restart
    assert (
        restarts.plan(Recorded.of_status(status), failed_job("job-2"), limit=3, layout=2)
        == restarts.RestartAction.RESTART
    )


def test_the_record_names_the_failed_rank_and_fits_the_status_schema():
    pods = [failed_pod("trainer", 1, 137)]
    fields = restarts.restart_record(
        Recorded.of_status({"trainerRestarts": 1}), failed_job(), pods, limit=3, now=T0
    )
    assert fields == {
        "trainerRestarts": 2,
        "lastTrainerRestart": {
            "time": T0,
            "jobUid": "job-1",
            "pod": "run1-trainer-1-abcde",
            "exitCode": 137,
            "message": "trainer rank 1 (pod run1-trainer-1-abcde) exited with code 137: every "
            "rank restarts together (restart 2 of at most 3, spec.failurePolicy.backoffLimit)",
        },
    }
    PayloadRunStatus.model_validate(fields)
    unknown = restarts.restart_record(Recorded(), failed_job(), [], limit=3, now=T0)[
        "lastTrainerRestart"
    ]
    assert unknown["message"].startswith("a trainer pod failed: every rank restarts together")
    assert "pod" not in unknown


def test_the_record_names_the_rank_that_failed_first_not_one_stopped_after_it():
    pods = [
        failed_pod("trainer", 0, 143, suffix="aaaaa", finished="2026-12-01T10:00:05Z"),  # stopped
        failed_pod("trainer", 1, 3, suffix="bbbbb", finished="2026-12-01T10:00:01Z"),  # the cause
    ]
    record = restarts.restart_record(Recorded(), failed_job(), pods, limit=3, now=T0)[
        "lastTrainerRestart"
    ]
    assert (record["pod"], record["exitCode"]) == ("run1-trainer-1-bbbbb", 3)
