"""The children's watches: which step each event of a stream asks of the reflector; which of
their events reconcile a run. (That they ask the API server for the operator's children only,
and list again after 410 Gone, tests/integration/test_watching.py holds against the real one.)"""

from payloadrun_operator.api.kinds import JOB, STATEFUL_SET, WORKLOAD
from payloadrun_operator.observed.following import child_event_requeues
from payloadrun_operator.observed.watching import Step, step_of, version_of


def test_each_event_of_a_watch_stream_is_a_step_of_the_reflector():
    job = {"metadata": {"name": "r-trainer", "resourceVersion": "12"}}
    for kind in ("ADDED", "MODIFIED", "DELETED"):
        assert step_of({"type": kind, "object": job}) is Step.DELIVER
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "40"}}}
    assert step_of(bookmark) is Step.ADVANCE and version_of(bookmark) == "40"
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    assert step_of(gone) is Step.RELIST and version_of(gone) == ""
    refused = {"type": "ERROR", "object": {"kind": "Status", "code": 500}}
    assert step_of(refused) is Step.RECONNECT


def test_a_childs_deletion_and_a_workloads_new_admission_requeue_its_run_nothing_else_does():
    sts = {"metadata": {"name": "r-inference", "labels": {"payloadrun.dev/run": "r"}}}
    assert child_event_requeues(STATEFUL_SET, "DELETED", sts, None)
    # not cached: not the run's (LeaderWorkerSet's StatefulSets carry the run's labels too)
    assert not child_event_requeues(STATEFUL_SET, "DELETED", None, None)
    for event in ("ADDED", "MODIFIED"):
        assert not child_event_requeues(STATEFUL_SET, event, sts, sts)
        assert not child_event_requeues(JOB, event, None, sts)
    pending = {"metadata": {"name": "payloadrun-r"}, "status": {}}
    admitted = {
        "metadata": {"name": "payloadrun-r"},
        "status": {
            "admission": {"podSetAssignments": [{"name": "trainer", "flavors": {"cpu": "a"}}]},
            "conditions": [
                {"type": "QuotaReserved", "status": "True"},
                {"type": "Admitted", "status": "True"},
            ],
        },
    }
    assert child_event_requeues(WORKLOAD, "MODIFIED", pending, admitted)
    assert not child_event_requeues(WORKLOAD, "MODIFIED", admitted, admitted)
    assert child_event_requeues(WORKLOAD, "DELETED", admitted, None)
