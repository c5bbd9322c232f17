"""A run's status from the run and what was observed of its children (readiness.run_status):
one pure function, table-tested here on built inputs; and what status_update then writes
(nothing when the run already holds it). The same pass against the real API server is in
tests/integration/test_one_pass.py."""

import copy

import pytest

from builders import NAMESPACE, T0, failed_pod, job, observed_children, observed_run
from payloadrun_operator.api.conditions import PayloadsReleasedReason, StatusField
from payloadrun_operator.api.models import PayloadRunStatus
from payloadrun_operator.observed.readiness import LAST_STEP, Observed, RunStatus, run_status
from payloadrun_operator.observed.status import STATUS_FIELDS, Check, status_update

NOW = "2026-12-04T11:00:00Z"


def run(phase="Provisioning", suspend=False, claim="run1-payloads", **status):
    spec = {"suspend": suspend, "failurePolicy": {"backoffLimit": 2}}
    claimed = {"claimName": claim} if claim else {}
    return observed_run(spec, uid="run-uid", phase=phase, **claimed, **status)


def sts(ready=2, replicas=2):
    return {
        "kind": "StatefulSet",
        "metadata": {"name": "run1-inference", "namespace": NAMESPACE, "generation": 1},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": 1, "readyReplicas": ready},
    }


def claim(phase="Bound"):
    return {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "run1-payloads", "namespace": NAMESPACE},
        "status": {"phase": phase},
    }


def running_children(**changes):
    objs = {
        "sts": sts(),
        "orchestrator": job("orchestrator"),
        "trainer": job("trainer", ready=4, parallelism=4),
        "claim": claim(),
    }
    objs.update(changes)
    return observed_children(*(o for o in objs.values() if o is not None))


def observed(kids, **more):
    return Observed(
        kids, claim=kids.get((NAMESPACE, "PersistentVolumeClaim", "run1-payloads")), **more
    )


def said(result: RunStatus):
    """Each condition as (status, reason)."""
    return {str(t): (c.ok, str(c.reason)) for t, c in result.checks.items()}


# --- the table ------------------------------------------------------------------------------------

RELEASED = Check(True, PayloadsReleasedReason.FILES_DELETED, "gone")
COMPLETE = {
    "type": "Complete",
    "status": "True",
    "reason": "TrainersSucceeded",
    "message": "every trainer exited 0 (4)",
    "lastTransitionTime": T0,
}

CASES = {
    "every pod ready, the claim bound": (
        run(),
        observed(running_children()),
        {"VolumeReady": (True, "ClaimBound"), "Ready": (True, "WorkloadsReady")},
        {},
    ),
    "pods starting, the claim pending": (
        run(),
        observed(running_children(sts=sts(ready=1), claim=claim("Pending"))),
        {"VolumeReady": (False, "ClaimPending"), "Ready": (False, "WorkloadsNotReady")},
        {},
    ),
    "the claim not created yet": (
        run(),
        observed(running_children(claim=None)),
        {"VolumeReady": (False, "ClaimMissing"), "Ready": (True, "WorkloadsReady")},
        {},
    ),
    "inline: no claim needed": (
        run(claim=None),
        observed(running_children(claim=None)),
        {"VolumeReady": (True, "NotNeeded"), "Ready": (True, "WorkloadsReady")},
        {},
    ),
    "suspended": (
        run(suspend=True),
        observed(running_children()),
        {
            "VolumeReady": (True, "ClaimBound"),
            "Ready": (False, "Stopped"),
            "Suspended": (True, "SpecSuspended"),
        },
        {},
    ),
    "resumed after a suspension": (
        run(conditions=[{"type": "Suspended", "status": "True", "reason": "SpecSuspended"}]),
        observed(running_children()),
        {
            "VolumeReady": (True, "ClaimBound"),
            "Ready": (True, "WorkloadsReady"),
            "Suspended": (False, "Resumed"),
        },
        {},
    ),
    "the trainers complete: the run's end, with its last step": (
        run(),
        observed(
            running_children(trainer=job("trainer", outcome="Complete")),
            last_step=41,
            last_step_read=True,
        ),
        {
            "VolumeReady": (True, "ClaimBound"),
            "Ready": (False, "Finished"),
            "Complete": (True, "TrainersSucceeded"),
        },
        {"completionTime": NOW, "lastStep": 41},
    ),
    "the trainers complete, the last step unknown": (
        run(),
        observed(running_children(trainer=job("trainer", outcome="Complete")), last_step_read=True),
        {
            "VolumeReady": (True, "ClaimBound"),
            "Ready": (False, "Finished"),
            "Complete": (True, "TrainersSucceeded"),
        },
        {"completionTime": NOW},
    ),
    "a trainers' Job being deleted is no end": (
        run(),
        observed(running_children(trainer=job("trainer", outcome="Failed", deleting=True))),
        {"VolumeReady": (True, "ClaimBound"), "Ready": (True, "WorkloadsReady")},
        {},
    ),
    "a restart already recorded: its Job is deleted, nothing new written": (
        run(trainerRestarts=1, lastTrainerRestart={"jobUid": "trainer-uid"}),
        observed(running_children(trainer=job("trainer", outcome="Failed"))),
        {"VolumeReady": (True, "ClaimBound"), "Ready": (True, "WorkloadsReady")},
        {},
    ),
    "a finished run: not ready, its payloads as released": (
        run(phase="Succeeded", conditions=[COMPLETE]),
        Observed(running_children(), released=RELEASED),
        {"Ready": (False, "Finished"), "PayloadsReleased": (True, "FilesDeleted")},
        {},
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_the_status_of_a_run_from_its_children(case):
    body, seen, conditions, fields = CASES[case]
    result = run_status(body, seen, NOW)
    assert said(result) == conditions
    assert result.fields == fields
    assert result.wants == frozenset()
    # pure: the same inputs, the same status; the inputs untouched
    before = copy.deepcopy(body)
    assert run_status(body, seen, NOW) == result
    assert body == before


def test_a_failed_orchestrator_asks_for_its_pods_then_names_the_failed_one():
    body = run()
    kids = running_children(orchestrator=job("orchestrator", outcome="Failed", failed=3))
    first = run_status(body, observed(kids), NOW)
    # what the cache does not hold, it asks for: the failed Job's pods and the last step
    assert first.wants == {"run1-orchestrator", LAST_STEP}
    pods = {"run1-orchestrator": [failed_pod("orchestrator", 0, 3)]}
    result = run_status(body, observed(kids, pods=pods, last_step_read=True), NOW)
    assert result.wants == frozenset()
    assert said(result)["Failed"] == (True, "OrchestratorFailed")
    assert said(result)["Ready"] == (False, "Finished")
    failure = result.fields["failure"]
    assert failure["component"] == "orchestrator" and failure["pod"] == "run1-orchestrator-0-abcde"
    assert failure["exitCode"] == 3 and "failed 3 time(s)" in failure["message"]
    assert result.fields["completionTime"] == NOW and "lastStep" not in result.fields


def test_a_failed_rank_restarts_every_trainer_until_the_limit():
    kids = running_children(trainer=job("trainer", outcome="Failed"))
    pods = {"run1-trainer": [failed_pod("trainer", 2, 137)]}
    assert run_status(run(), observed(kids), NOW).wants == {"run1-trainer"}
    result = run_status(run(), observed(kids, pods=pods), NOW)
    assert result.restart is not None and result.restart[0] == "restart"
    assert result.fields["trainerRestarts"] == 1
    assert result.fields["lastTrainerRestart"]["pod"] == "run1-trainer-2-abcde"
    assert "Failed" not in said(result)  # a restart is not the run's end
    # past spec.failurePolicy.backoffLimit (2), the run fails, naming the first failed rank
    spent = run(trainerRestarts=2, lastTrainerRestart={"jobUid": "an-earlier-job"})
    result = run_status(spent, observed(kids, pods=pods, last_step_read=True), NOW)
    assert result.restart is None
    assert said(result)["Failed"] == (True, "TrainerFailed")
    assert result.fields["failure"]["message"].startswith(
        "a trainer rank failed after 2 restart(s) of every rank"
    )


def test_what_no_watch_reports_is_looked_at_again_soon():
    """A claim the run brings carries no label of ours, so no watch says when it binds: the pass
    asks to look again until it is bound. A finished run has nothing of the kind to wait for."""
    brought = running_children(claim=None)  # not among the cached children: the run brought it
    assert run_status(run(), Observed(brought, claim=claim("Pending")), NOW).recheck
    assert not run_status(run(), Observed(brought, claim=claim()), NOW).recheck
    done = run(phase="Succeeded", conditions=[COMPLETE])
    assert not run_status(done, Observed(brought, released=RELEASED), NOW).recheck


# --- what is written -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_status_the_run_holds_already_is_not_written_again(case):
    body, seen, _, _ = CASES[case]
    result = run_status(body, seen, NOW)
    status, generation = body["status"], body["metadata"]["generation"]
    first = status_update(status, generation, result.checks, result.fields, NOW)
    held = {**status, **(first.fields or {})}
    # the next pass observes the same children: nothing to write, no event (a run that has
    # just ended is final then: its end is recorded once)
    again = run_status({**body, "status": held}, seen, "2026-12-04T12:00:00Z")
    later = status_update(held, generation, again.checks, again.fields, "2026-12-04T12:00:00Z")
    assert later.fields is None and later.events == []


def test_every_status_field_is_the_models():
    """StatusField names PayloadRunStatus's fields, all of them: a field the model gains is
    written through status_update, and status_update writes none the model lacks."""
    model = {f.alias for f in PayloadRunStatus.model_fields.values()}
    assert set(STATUS_FIELDS) == model
    with pytest.raises(ValueError, match=r"volumeHealth.*not PayloadRunStatus's"):
        status_update({}, 1, {}, {"volumeHealth": "ok"}, NOW)
    assert status_update({}, 1, {}, {StatusField.LAST_STEP: 3}, NOW).fields == {
        "lastStep": 3,
        "phase": "Provisioning",
        "conditions": [],
    }
