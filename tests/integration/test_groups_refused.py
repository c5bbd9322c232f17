"""A group's StatefulSet that the real LeaderWorkerSet controller cannot make (issue 49, item 3),
on the local node (the ``lws`` fixture: upstream's config/default, webhooks on).

A namespace whose ResourceQuota allows one StatefulSet: the operator's dry run of the group's
templates passes (one StatefulSet at a time fits), LeaderWorkerSet's controller makes the
leaders' StatefulSet and its leader pod, then is refused the group's workers' StatefulSet
(``count/statefulsets.apps``), which it says only in a Warning event on the LeaderWorkerSet.
The run's ``Ready`` condition says it (``GroupsRefused``: the replica, the template, the API
server's words, those of LeaderWorkerSet's own event), with a Warning event on the run; once the
quota is raised, the controller's retry makes the workers, and ``Ready`` is back to waiting for
the group (``WorkloadsNotReady``). The rules that keep only refusals still true are unit-tested
in tests/operator/test_lws_following.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from pod_helpers import IMAGE, SLEEP, apply, get, kubectl, node_run, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.pod_security("restricted")]

RUN = "refused"
LWS = f"{RUN}-vllm"
QUOTA = "statefulsets"
WRITER_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}


def quota(limit: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": QUOTA},
        "spec": {"hard": {"count/statefulsets.apps": str(limit)}},
    }


def one_group_run() -> dict[str, Any]:
    """One replica of two pods that only wait: the test needs the pods made, not serving."""
    return node_run(
        RUN,
        inference={
            "replicas": 1,
            "podsPerReplica": 2,
            "image": IMAGE,
            "command": SLEEP,
            "writer": {"resources": WRITER_RESOURCES},
        },
        orchestrator={"image": IMAGE, "command": SLEEP},
        trainer={"image": IMAGE, "command": SLEEP},
    )


def ready_condition(cluster, namespace: str) -> dict[str, Any] | None:
    run = get(cluster, namespace, "payloadrun", RUN)
    conditions = {c["type"]: c for c in (run.get("status") or {}).get("conditions") or []}
    return conditions.get("Ready")


def lws_warnings(cluster, namespace: str) -> list[dict[str, Any]]:
    """The Warning events on the run's LeaderWorkerSet, as the core API lists them."""
    listed = get(
        cluster,
        namespace,
        "events",
        "--field-selector",
        f"involvedObject.kind=LeaderWorkerSet,involvedObject.name={LWS},type=Warning",
    )
    return listed["items"]


def test_a_workers_statefulset_the_controller_is_refused_is_in_the_runs_status(
    lws, operator, namespace
):
    cluster = operator.cluster
    apply(cluster, namespace, quota(1))
    apply(cluster, namespace, one_group_run())

    def refused() -> dict[str, Any] | None:
        ready = ready_condition(cluster, namespace)
        return ready if ready and ready["reason"] == "GroupsRefused" else None

    ready = wait_for("Ready False GroupsRefused", refused, timeout=120)
    assert ready["status"] == "False"
    # LeaderWorkerSet's own words, in its own events (one each time the leader pod's version
    # changed, as its recorder tells them apart by the related object's version, all alike)
    events = [e for e in lws_warnings(cluster, namespace) if e.get("related")]
    assert {(e["reason"], e["related"]["name"]) for e in events} == {("FailedCreate", f"{LWS}-0")}
    (note,) = {e["message"] for e in events}
    prefix = f"Failed to create worker statefulset for leader pod {LWS}-0: "
    assert note.startswith(prefix), note
    said = note.removeprefix(prefix)
    assert "exceeded quota: statefulsets" in said and "count/statefulsets.apps" in said
    assert ready["message"] == (
        f"LeaderWorkerSet {LWS} could not create the workers' StatefulSet of replica 0 (pods "
        "from spec.inference.workerTemplate, or spec.inference.template where it is unset): "
        f"{said}; its controller retries: once the cause is gone (a quota raised, a policy "
        "changed, the template fixed) the groups start"
    )
    # said once to whoever watches the run's events, as a Warning
    run_events = get(
        cluster, namespace, "events", "--field-selector", f"involvedObject.name={RUN}"
    )["items"]
    warned = [e for e in run_events if e["reason"] == "GroupsRefused"]
    assert [e["type"] for e in warned] == ["Warning"], run_events

    # room for the workers: the controller's retry makes them, and the run waits for the group
    apply(cluster, namespace, quota(2))

    def waiting() -> dict[str, Any] | None:
        ready = ready_condition(cluster, namespace)
        return ready if ready and ready["reason"] == "WorkloadsNotReady" else None

    ready = wait_for("Ready back to WorkloadsNotReady", waiting, timeout=120)
    assert ready["message"].startswith(f"waiting for {LWS} 0/1 groups ready"), ready
    workers = get(cluster, namespace, "statefulset", f"{LWS}-0")
    assert workers["metadata"]["ownerReferences"][0]["name"] == f"{LWS}-0"
    kubectl(cluster, namespace, "delete", "resourcequota", QUOTA, "--wait=false")
