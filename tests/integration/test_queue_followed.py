"""A queued run against the real control plane (kube-apiserver, etcd, kube-controller-manager; no
node, no Kueue controller), Kueue's part written by the test as Kueue's scheduler writes it:

- without Kueue's API, a run labelled ``kueue.x-k8s.io/queue-name`` gets Applied/Ready
  ``KueueMissing`` and a Warning event, and nothing of it is created;
- with Kueue's CRDs (``config/components/crd/bases`` of the version ``cluster/build.sh``
  fetched; the operator started again, as it learns the cluster's APIs at start), the run gets
  its Workload (every pod set, owned by the run) and children without pods (phase ``Queued``);
  an admission written into the Workload's status (as Kueue's scheduler writes it: quota
  reserved, admitted, a flavor per pod set) reaches the workloads, with the flavor's node labels
  and tolerations in their pods, in a time the test prints; an eviction stops them, and the
  operator gives the quota back (admission cleared, ``Requeued``) since no pod runs; a
  readmission to another flavor moves the placement, the suspended Jobs changed in place; a
  change of the trainers' count replaces the Workload; removing the label deletes it and the
  run runs unqueued.

The same with the real Kueue and real pods: tests/integration/test_queue_pods.py.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from addon_api import AddonApi
from example_runs import example_run
from test_groups_followed import get_run, has_condition, local_operator, run_children
from test_operator import eventually

from builders import condition_of
from payloadrun_devcluster import BinariesMissing
from payloadrun_devkit.required import skip_or_fail
from payloadrun_operator.api.kinds import KUEUE_API_VERSION, WORKLOAD
from payloadrun_operator.api.models import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.integration

KUEUE_GROUP, KUEUE_VERSION = KUEUE_API_VERSION.split("/")
DISCOVERY = f"/apis/{KUEUE_API_VERSION}"
CRDS = ("workloads", "resourceflavors", "workloadpriorityclasses")
QUEUE = "rl"
FLAVORS = {
    "gpu-a": {"nodeLabels": {"pool": "a"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]},
    "gpu-b": {"nodeLabels": {"pool": "b"}},
}


def kueue_served(kube_cluster) -> bool:
    status, body = kube_cluster.request("GET", DISCOVERY)
    return status == 200 and any(
        r.get("name") == WORKLOAD.plural for r in body.get("resources") or []
    )


def kueue_crd_files() -> list[Path]:
    from payloadrun_devcluster.kueue import find_build

    try:
        build = find_build()
    except BinariesMissing as error:
        skip_or_fail(str(error))
        raise
    bases = build.config / "components" / "crd" / "bases"
    return [bases / f"{KUEUE_GROUP}_{plural}.yaml" for plural in CRDS]


@pytest.fixture(scope="module")
def kueue_api(kube_cluster, crd) -> Iterator[AddonApi]:
    """Kueue's Workload, ResourceFlavor and WorkloadPriorityClass CRDs (no controller, no
    webhooks)."""

    def install() -> None:
        for path in kueue_crd_files():
            applied = kube_cluster.kubectl("apply", "--server-side", "-f", str(path))
            assert applied.returncode == 0, applied.stderr
        for plural in CRDS:
            kube_cluster.wait_established(f"{plural}.{KUEUE_GROUP}")
        eventually("Kueue's API in discovery", lambda: kueue_served(kube_cluster))

    def remove() -> None:
        for plural in CRDS:
            kube_cluster.delete_crd(f"{plural}.{KUEUE_GROUP}")
        eventually("Kueue's API gone", lambda: not kueue_served(kube_cluster))

    api = AddonApi(lambda: kueue_served(kube_cluster), install, remove)
    yield api
    api.restore()


def queued_run(queue: str | None = QUEUE) -> dict[str, Any]:
    body = copy.deepcopy(example_run("multinode-by-handle.yaml"))
    if queue is not None:
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    return body


def custom(api) -> Any:
    return api["custom"]


def workload(api, namespace: str, run: str) -> dict[str, Any] | None:
    from kubernetes.client.rest import ApiException

    try:
        return custom(api).get_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOAD.plural, f"payloadrun-{run}"
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def kueue_condition(ctype: str, status: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_workload_status(api, namespace: str, found: dict[str, Any], status: dict) -> None:
    """The Workload's status, written through its status subresource as Kueue writes it."""
    body = {"metadata": {"resourceVersion": found["metadata"]["resourceVersion"]}} | {
        "status": status
    }
    custom(api).patch_namespaced_custom_object_status(
        KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOAD.plural, found["metadata"]["name"], body
    )


def admit(api, namespace: str, run: str, flavor: str) -> None:
    """Kueue's admission of the run's Workload: quota reserved in ``flavor`` for every pod set,
    then admitted."""
    found = workload(api, namespace, run)
    assert found is not None
    conditions = [
        c
        for c in (found.get("status") or {}).get("conditions") or []
        if c["type"] not in ("QuotaReserved", "Admitted", "Evicted")
    ]
    write_workload_status(
        api,
        namespace,
        found,
        {
            "admission": {
                "clusterQueue": "rl-team",
                "podSetAssignments": [
                    {"name": s["name"], "flavors": {"cpu": flavor}, "count": s["count"]}
                    for s in found["spec"]["podSets"]
                ],
            },
            "conditions": [
                *conditions,
                kueue_condition("QuotaReserved", True, "QuotaReserved", "Quota reserved"),
                kueue_condition("Admitted", True, "Admitted", "The workload is admitted"),
            ],
        },
    )


def workloads_of(api, namespace: str, run: str) -> dict[str, Any]:
    return {
        "inference": api["apps"].read_namespaced_stateful_set(f"{run}-inference", namespace),
        "orchestrator": api["batch"].read_namespaced_job(f"{run}-orchestrator", namespace),
        "trainer": api["batch"].read_namespaced_job(f"{run}-trainer", namespace),
    }


def running(api, namespace: str, run: str) -> bool:
    found = workloads_of(api, namespace, run)
    return (
        found["inference"].spec.replicas > 0
        and not found["orchestrator"].spec.suspend
        and not found["trainer"].spec.suspend
    )


def stopped(api, namespace: str, run: str) -> bool:
    found = workloads_of(api, namespace, run)
    return (
        found["inference"].spec.replicas == 0
        and found["orchestrator"].spec.suspend
        and found["trainer"].spec.suspend
    )


def test_a_queued_run_waits_for_kueue_then_follows_its_workloads_admission(
    kube_cluster, crd, api, namespace, kueue_api, tmp_path
):
    kueue_api.remove()  # whatever installed it before: this test starts without it
    body = queued_run()
    name = body["metadata"]["name"]
    operator = local_operator(kube_cluster, namespace, tmp_path / "before.log")
    try:
        custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        run = eventually(
            "Applied KueueMissing", has_condition(api, namespace, name, "Applied", "KueueMissing")
        )
        applied = condition_of(run, "Applied")
        assert applied["status"] == "False"
        assert "Install Kueue (https://kueue.sigs.k8s.io/" in applied["message"]
        assert "(served from Kueue v0.15.0 on; tested with v0.19.2)" in applied["message"]
        assert "remove the label to run it without a queue" in applied["message"]
        assert condition_of(run, "Ready")["reason"] == "KueueMissing"
        assert run_children(api, namespace, name) == []
        selector = f"involvedObject.name={name},involvedObject.kind=PayloadRun"
        events = api["core"].list_namespaced_event(namespace, field_selector=selector).items
        assert [(e.type, e.reason) for e in events if e.reason == "KueueMissing"] == [
            ("Warning", "KueueMissing")
        ]
    finally:
        operator.stop()

    kueue_api.install()
    for flavor, spec in FLAVORS.items():
        custom(api).create_cluster_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            "resourceflavors",
            {
                "apiVersion": KUEUE_API_VERSION,
                "kind": "ResourceFlavor",
                "metadata": {"name": f"{namespace}-{flavor}"},
                "spec": spec,
            },
        )
    operator = local_operator(kube_cluster, namespace, tmp_path / "after.log")
    try:
        # queued: its Workload, every pod set, and children without pods
        found = eventually("the run's Workload", lambda: workload(api, namespace, name))
        assert found["spec"]["queueName"] == QUEUE
        assert {s["name"]: s["count"] for s in found["spec"]["podSets"]} == {
            "inference": body["spec"]["inference"]["replicas"],
            "orchestrator": 1,
            "trainer": body["spec"]["trainer"]["replicas"],
        }
        (owner,) = found["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("PayloadRun", name, True)
        run = eventually(
            "the run Queued",
            lambda: (r := get_run(api, namespace, name))["status"].get("phase") == "Queued" and r,
        )
        assert condition_of(run, "Admitted")["reason"] == "Pending"
        assert condition_of(run, "Ready")["reason"] == "Queued"
        assert run["status"]["queue"] == {"name": QUEUE, "workload": f"payloadrun-{name}"}
        assert eventually("its workloads without pods", lambda: stopped(api, namespace, name))

        # admitted: the workloads have pods, placed by the flavor
        flavor_a = f"{namespace}-gpu-a"
        started = time.monotonic()
        admit(api, namespace, name, flavor_a)
        eventually("its workloads with pods", lambda: running(api, namespace, name), timeout=10)
        print(
            f"\nadmission written -> the run's workloads with pods: "
            f"{time.monotonic() - started:.2f} s (to the test's 0.2 s poll)"
        )
        found = workloads_of(api, namespace, name)
        job_uid = found["trainer"].metadata.uid
        for workload_obj in found.values():
            pod = workload_obj.spec.template.spec
            assert pod.node_selector["pool"] == "a"
            assert [(t.key, t.operator) for t in pod.tolerations or []][-1:] == [("gpu", "Exists")]
        run = eventually(
            "Admitted True",
            lambda: (
                (r := get_run(api, namespace, name))
                and (condition_of(r, "Admitted") or {}).get("status") == "True"
                and r
            ),
        )
        assert run["status"]["queue"]["flavors"] == {
            s: [flavor_a] for s in ("inference", "orchestrator", "trainer")
        }

        # evicted: stopped, and with no pod left the quota goes back
        found_wl = workload(api, namespace, name)
        write_workload_status(
            api,
            namespace,
            found_wl,
            {
                "conditions": [
                    *found_wl["status"]["conditions"],
                    kueue_condition("Evicted", True, "Preempted", "Preempted by a higher one"),
                ]
            },
        )
        assert eventually("stopped again", lambda: stopped(api, namespace, name))

        def released() -> Any:
            now = workload(api, namespace, name)
            conds = {c["type"]: c for c in now["status"].get("conditions") or []}
            return (
                "admission" not in now["status"]
                and conds["QuotaReserved"]["status"] == "False"
                and conds["Requeued"]["status"] == "True"
                and now
            )

        eventually("the quota given back", released)
        selector = f"involvedObject.name={name},involvedObject.kind=PayloadRun"

        def evicted_event() -> Any:
            events = api["core"].list_namespaced_event(namespace, field_selector=selector).items
            return [e for e in events if e.reason == "Evicted"]

        (event,) = eventually("the eviction's Warning event", evicted_event)
        assert event.type == "Warning" and "Preempted" in event.message

        # readmitted elsewhere: the new placement, the suspended Jobs changed in place
        admit(api, namespace, name, f"{namespace}-gpu-b")
        eventually(
            "running in pool b",
            lambda: (
                running(api, namespace, name)
                and workloads_of(api, namespace, name)[
                    "trainer"
                ].spec.template.spec.node_selector.get("pool")
                == "b"
            ),
        )
        assert workloads_of(api, namespace, name)["trainer"].metadata.uid == job_uid

        # more trainers: Kueue would refuse to change the pod sets; a new Workload, queued again
        old_uid = workload(api, namespace, name)["metadata"]["uid"]
        replicas = body["spec"]["trainer"]["replicas"] + 1
        custom(api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, {"spec": {"trainer": {"replicas": replicas}}}
        )
        renewed = eventually(
            "a new Workload",
            lambda: (w := workload(api, namespace, name)) and w["metadata"]["uid"] != old_uid and w,
        )
        counts = {s["name"]: s["count"] for s in renewed["spec"]["podSets"]}
        assert counts["trainer"] == replicas
        assert eventually("stopped until admitted", lambda: stopped(api, namespace, name))

        # the label removed: the Workload goes, the run runs unqueued
        custom(api).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": None}}},
        )
        eventually("the Workload deleted", lambda: workload(api, namespace, name) is None or "")
        assert eventually("running unqueued", lambda: running(api, namespace, name))
    finally:
        operator.stop()
        for flavor in FLAVORS:
            custom(api).delete_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", f"{namespace}-{flavor}"
            )


def test_a_label_on_a_run_whose_pods_started_keeps_it_running_until_it_is_suspended(
    kube_cluster, crd, api, namespace, kueue_api, tmp_path
):
    """A run that started unqueued (as every run an operator before 0.2.0 started) and then
    gets the queue label is not stopped to be queued: it runs on, Admitted False
    StartedUnqueued (a Warning), no Workload; suspended, it is queued (its Workload made);
    resumed, it waits for Kueue like any queued run."""
    kueue_api.install()
    body = queued_run(queue=None)
    name = body["metadata"]["name"]
    operator = local_operator(kube_cluster, namespace, tmp_path / "operator.log")
    try:
        custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        eventually(
            "the run applied", has_condition(api, namespace, name, "Applied", "ChildrenApplied")
        )
        eventually("its workloads running", lambda: running(api, namespace, name))
        label = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": QUEUE}}}
        custom(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, label)
        run = eventually(
            "Admitted StartedUnqueued",
            has_condition(api, namespace, name, "Admitted", "StartedUnqueued"),
        )
        assert condition_of(run, "Admitted")["status"] == "False"
        assert f"({QUEUE})" in condition_of(run, "Admitted")["message"]
        assert run["status"]["phase"] != "Queued"
        assert "queue" not in run["status"]
        assert workload(api, namespace, name) is None
        assert running(api, namespace, name)
        selector = f"involvedObject.name={name},involvedObject.kind=PayloadRun"
        events = api["core"].list_namespaced_event(namespace, field_selector=selector).items
        assert ("Warning", "StartedUnqueued") in {(e.type, e.reason) for e in events}

        # suspended: no pod to stop, the label takes effect; resumed: it waits for Kueue
        suspend = {"spec": {"suspend": True}}
        custom(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, suspend)
        eventually("its Workload", lambda: workload(api, namespace, name))
        eventually(
            "queued in its status", lambda: "queue" in get_run(api, namespace, name)["status"]
        )
        resume = {"spec": {"suspend": False}}
        custom(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, resume)
        run = eventually(
            "Admitted Pending", has_condition(api, namespace, name, "Admitted", "Pending")
        )
        assert eventually(
            "the phase Queued", lambda: get_run(api, namespace, name)["status"]["phase"] == "Queued"
        )
        assert stopped(api, namespace, name)
    finally:
        operator.stop()


def older_kueue_crds() -> list[dict[str, Any]]:
    """Kueue's CRDs as a release before v0.15.0 serves them: the same kinds, at
    ``kueue.x-k8s.io/v1beta1`` only (v0.15.0 added v1beta2 beside it)."""
    import yaml

    older = []
    for path in kueue_crd_files():
        crd = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
        (stored,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
        crd["spec"]["versions"] = [{**stored, "name": "v1beta1"}]
        crd["spec"].pop("conversion", None)
        older.append(crd)
    return older


def test_an_older_kueue_is_named_too_old_with_the_release_the_operator_needs(
    kube_cluster, crd, api, namespace, kueue_api, tmp_path
):
    """A cluster with a Kueue older than v0.15.0 serves its group at v1beta1 only: the operator
    says so at start and in a queued run's Applied condition (upgrade it), rather than that
    Kueue is missing."""
    import json

    kueue_api.remove()
    older = older_kueue_crds()
    for document in older:
        applied = kube_cluster.kubectl(
            "apply", "--server-side", "-f", "-", input=json.dumps(document)
        )
        assert applied.returncode == 0, applied.stderr
    try:
        for document in older:
            kube_cluster.wait_established(document["metadata"]["name"])
        eventually(
            "kueue.x-k8s.io/v1beta1 in discovery",
            lambda: kube_cluster.request("GET", f"/apis/{KUEUE_GROUP}/v1beta1")[0] == 200,
        )
        body = queued_run()
        name = body["metadata"]["name"]
        log = tmp_path / "operator.log"
        operator = local_operator(kube_cluster, namespace, log)
        try:
            custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
            run = eventually(
                "Applied KueueMissing",
                has_condition(api, namespace, name, "Applied", "KueueMissing"),
            )
        finally:
            operator.stop()
        message = condition_of(run, "Applied")["message"]
        assert f"served {KUEUE_GROUP} at v1beta1 only" in message, message
        assert "an older Kueue than the operator needs: kueue.x-k8s.io/v1beta2" in message
        assert "(served from Kueue v0.15.0 on; tested with v0.19.2). Upgrade Kueue" in message
        assert condition_of(run, "Ready")["message"].startswith("Kueue is too old:")
        assert run_children(api, namespace, name) == []
        # and said once at start, in the operator's log
        started = [line for line in log.read_text().splitlines() if "Workload kueue" in line]
        assert any(f"served {KUEUE_GROUP} at v1beta1 only" in line for line in started), started
    finally:
        for document in older:
            kube_cluster.delete_crd(document["metadata"]["name"])
        eventually(
            "kueue.x-k8s.io gone",
            lambda: kube_cluster.request("GET", f"/apis/{KUEUE_GROUP}")[0] == 404,
        )
