"""The children's watches ask the API server for the operator's children only, as kopf itself
resolves its settings for each resource it watches; which of their events reconcile a run."""

import kopf

from payloadrun_operator.api.kinds import FOLLOWED, JOB, RUN, STATEFUL_SET, WORKLOAD
from payloadrun_operator.api.names import MANAGED_SELECTOR
from payloadrun_operator.handlers import child_event_requeues, configure_kopf
from payloadrun_operator.platform.settings import OperatorSettings


def resource(kind) -> kopf.Resource:
    group, _, version = kind.api_version.rpartition("/")
    return kopf.Resource(group, version, kind.plural, kind=kind.kind, namespaced=True)


def test_each_followed_kind_is_watched_with_the_managed_by_selector_and_runs_with_none():
    settings = kopf.OperatorSettings()
    configure_kopf(settings, OperatorSettings())
    selectors = settings.watching.label_selectors
    assert FOLLOWED  # claims, StatefulSets, Jobs at least
    for kind in FOLLOWED:
        assert list(selectors.collect(resource(kind))) == [MANAGED_SELECTOR], kind
    assert list(selectors.collect(resource(RUN))) == []
    # a kind the operator does not follow (pods: the benchmark's, the cluster's) gets none
    assert list(selectors.collect(kopf.Resource("", "v1", "pods", namespaced=True))) == []


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
