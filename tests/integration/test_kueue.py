"""The real Kueue controller on the local node (issue 37, item 5).

Installed by the ``kueue`` fixture from upstream's own ``config/default`` (webhooks on,
certificates from its own cert management; ``payloadrun_devcluster.kueue``), looking only at
namespaces labelled ``kueue.namespace_labels``:

- installed as configured: every webhook on another API's objects selects the labelled
  namespaces only, Kueue's own APIs' webhooks are upstream's, no aggregated visibility API;
  in a labelled namespace its webhooks suspend a queued Job and gate a queued Pod (server-side
  dry runs), in any other namespace they touch neither;
- a hand-made ``Workload`` (what the operator will create for a run) is admitted by a
  ClusterQueue through a LocalQueue: ``status.admission`` with the flavor of each resource,
  ``QuotaReserved`` and ``Admitted``; a second that does not fit waits with ``QuotaReserved``
  False and Kueue's message, and is admitted once the first is marked ``Finished`` (what an
  owner writes to release its quota);
- a higher-priority Workload preempts a lower one: Kueue marks it ``Evicted`` (``Preempted``)
  and keeps its quota until the owner clears ``status.admission``; only then is the preemptor
  admitted;
- a Job without the queue-name label in a labelled namespace runs unsuspended and gets no
  Workload, while a queued one beside it is suspended and gets one;
- deleting a labelled namespace holding Kueue's objects (a LocalQueue, Workloads, a queued Job
  whose Workload carries Kueue's finalizer) is not stalled.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pod_helpers import IMAGE, get, kubectl, wait_for

from builders import condition_of
from payloadrun_devcluster import kueue as kq

pytestmark = pytest.mark.integration

CPU_QUOTA = "1"
# a pod set of 2 pods of 300m: one fits in 1 CPU, two do not
POD_CPU = "300m"
PODS = 2
GPU = "example.com/gpu"  # an extended resource, as nvidia.com/gpu is on GPU nodes


def is_true(obj: dict[str, Any], kind: str) -> bool:
    found = condition_of(obj, kind)
    return bool(found) and found["status"] == "True"


def workload(
    name: str,
    queue: str,
    *,
    count: int = PODS,
    cpu: str = POD_CPU,
    priority_class: str | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """A Workload as a non-Go controller writes one: one pod set (``main``) of ``count`` pods,
    each asking ``cpu``, 64Mi and one GPU; optionally a WorkloadPriorityClass and its value."""
    container = {
        "name": "main",
        "image": "payloadrun.invalid/none",  # never run: Kueue reads only the requests
        "resources": {
            "requests": {"cpu": cpu, "memory": "64Mi", GPU: "1"},
            "limits": {GPU: "1"},
        },
    }
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [
            {
                "name": "main",
                "count": count,
                "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
            }
        ],
    }
    if priority_class is not None:
        spec["priorityClassRef"] = {
            "group": kq.GROUP,
            "kind": "WorkloadPriorityClass",
            "name": priority_class,
        }
        spec["priority"] = priority
    return {
        "apiVersion": kq.API_VERSION,
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": spec,
    }


def create(cluster, namespace: str | None, manifest: dict[str, Any]) -> None:
    args = ("-n", namespace) if namespace else ()
    result = cluster.kubectl(*args, "create", "-f", "-", input=json.dumps(manifest))
    assert result.returncode == 0, f"creating {manifest['kind']}: {result.stderr}"


def get_workload(cluster, namespace: str, name: str) -> dict[str, Any]:
    return get(cluster, namespace, "workloads.kueue.x-k8s.io", name)


def wait_workload(cluster, namespace: str, name: str, what: str, check) -> dict[str, Any]:
    """The Workload ``name`` once ``check`` holds of it (read every half second, for 60 s)."""

    def probe() -> dict[str, Any] | None:
        wl = get_workload(cluster, namespace, name)
        return wl if check(wl) else None

    return wait_for(
        f"Workload {name} {what}",
        probe,
        timeout=60,
        seen=lambda: get_workload(cluster, namespace, name).get("status"),
    )


def wait_admitted(cluster, namespace: str, name: str) -> dict[str, Any]:
    return wait_workload(
        cluster,
        namespace,
        name,
        "admitted",
        lambda wl: is_true(wl, "QuotaReserved") and is_true(wl, "Admitted"),
    )


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def owner_writes(
    cluster, namespace: str, name: str, status: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """Write the Workload's status as its owner does: a JSON merge patch of ``status(workload)``
    on the status subresource, guarded by the resourceVersion read (Kueue's own writes are
    server-side applies by the field manager ``kueue-admission``): when Kueue wrote in between,
    the patch is refused with a conflict, and the owner reads again and recomputes. Returns the
    workload as read before the write that went through."""
    for _ in range(10):
        wl = get_workload(cluster, namespace, name)
        body = {
            "metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
            "status": status(wl),
        }
        result = cluster.kubectl(
            "-n",
            namespace,
            "patch",
            "workloads.kueue.x-k8s.io",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(body),
        )
        if result.returncode == 0:
            return wl
        assert "the object has been modified" in result.stderr, result.stderr
    pytest.fail(f"Workload {name}: ten writes in a row conflicted with Kueue's")


def with_condition(
    conditions: list[dict[str, Any]], kind: str, status: str, reason: str, message: str
) -> list[dict[str, Any]]:
    """``conditions`` with ``kind`` set (a merge patch replaces the whole list)."""
    kept = [c for c in conditions if c["type"] != kind]
    return [
        *kept,
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now(),
        },
    ]


def delete_cluster_objects(cluster, objects: list[dict[str, Any]]) -> None:
    for obj in reversed(objects):
        if not obj["metadata"].get("namespace"):
            cluster.kubectl(
                "delete",
                f"{obj['kind'].lower()}s.{kq.GROUP}",
                obj["metadata"]["name"],
                "--ignore-not-found",
                "--wait=false",
            )


def new_namespace(cluster, prefix: str, labels: dict[str, str] | None) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    status, body = cluster.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata},
    )
    assert status == 201, f"creating namespace {name}: HTTP {status} {body.get('message', body)}"
    return name


@pytest.fixture
def queued_namespace(kube_cluster, kueue) -> Iterator[str]:
    """A namespace labelled for Kueue (``kueue.namespace_labels``), deleted afterwards."""
    name = new_namespace(kube_cluster, "kueue", kueue.namespace_labels)
    yield name
    kube_cluster.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def plain_namespace(kube_cluster, kueue) -> Iterator[str]:
    """A namespace without Kueue's label, deleted afterwards."""
    name = new_namespace(kube_cluster, "nokueue", None)
    yield name
    kube_cluster.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def queue(kube_cluster, queued_namespace) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue of 1 CPU, 1Gi and 2 GPUs in it, and a LocalQueue in the
    test's namespace, all named after the namespace; the cluster-scoped ones deleted after."""
    objects = kq.quota(
        queued_namespace,
        {"cpu": CPU_QUOTA, "memory": "1Gi", GPU: 2},
        name=queued_namespace,
        node_labels={"kubernetes.io/os": "linux"},
        preempt_lower_priority=True,
    )
    try:
        for obj in objects:
            create(kube_cluster, obj["metadata"].get("namespace"), obj)
        yield queued_namespace
    finally:
        kube_cluster.request("DELETE", f"/api/v1/namespaces/{queued_namespace}")
        delete_cluster_objects(kube_cluster, objects)


def job(name: str, queue: str | None = None, cpu: str = "10m") -> dict[str, Any]:
    """A Job of one short pod asking ``cpu``; queued (the queue-name label) when ``queue`` is
    given."""
    labels = {kq.QUEUE_NAME_LABEL: queue} if queue else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["python", "-c", "pass"],
                            "resources": {"requests": {"cpu": cpu, "memory": "16Mi"}},
                        }
                    ],
                }
            },
        },
    }


def pod(name: str, queue: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {kq.QUEUE_NAME_LABEL: queue}},
        "spec": {"containers": [{"name": "main", "image": "payloadrun.invalid/none"}]},
    }


def dry_run(cluster, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server would store: a server-side dry run, through every admission webhook."""
    out = kubectl(
        cluster,
        namespace,
        "create",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        input=json.dumps(manifest),
    )
    return json.loads(out)


def owned_workloads(cluster, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    return [
        w
        for w in get(cluster, namespace, "workloads.kueue.x-k8s.io")["items"]
        if any(
            (o["kind"], o["name"]) == (kind, name) for o in w["metadata"].get("ownerReferences", [])
        )
    ]


def test_installed_with_its_webhooks_on_the_labelled_namespaces_only(
    kube_cluster, kueue, queued_namespace, plain_namespace
):
    print(f"Kueue {kueue.version}: installed in {kueue.seconds:.1f} s {kueue.timings}")
    scoped = {"matchLabels": kq.NAMESPACE_LABELS}
    for kind in kq.WEBHOOK_KINDS:
        (config,) = [
            c
            for c in json.loads(kube_cluster.kubectl("get", kind, "-o", "json", check=True).stdout)[
                "items"
            ]
            if c["metadata"]["name"].startswith("kueue-")
        ]
        for hook in config["webhooks"]:
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            assert hook["failurePolicy"] == "Fail", hook["name"]  # upstream's
            assert hook["clientConfig"].get("caBundle"), f"{hook['name']}: no CA injected"
            if groups == {kq.GROUP}:  # Kueue's own APIs: upstream's (no namespace selector)
                assert "namespaceSelector" not in hook or hook["namespaceSelector"] == {}, hook
            else:
                assert hook.get("namespaceSelector") == scoped, hook["name"]
    # no aggregated API of Kueue's (its CRDs' groups are served locally: APIServices without a
    # service), and every APIService available, as namespace deletion needs
    services = json.loads(kube_cluster.kubectl("get", "apiservices", "-o", "json").stdout)["items"]
    assert not [s["metadata"]["name"] for s in services if s["spec"].get("service")]
    assert {f"v1beta1.{kq.GROUP}", f"v1beta2.{kq.GROUP}"} <= {
        s["metadata"]["name"] for s in services
    }
    assert all(is_true(s, "Available") for s in services), [
        s["metadata"]["name"] for s in services if not is_true(s, "Available")
    ]
    config_map = get(kube_cluster, kq.NAMESPACE, "configmap", kq.CONFIG_MAP)
    assert json.loads(config_map["data"][kq.CONFIG_KEY]) == kq.manager_configuration()

    # through the webhooks: a queued Job is suspended and a queued Pod gated, in the labelled
    # namespace only
    queued_job = dry_run(kube_cluster, queued_namespace, job("probe", queue="any"))
    plain_job = dry_run(kube_cluster, plain_namespace, job("probe", queue="any"))
    assert queued_job["spec"]["suspend"] is True
    assert plain_job["spec"].get("suspend") is False
    queued_pod = dry_run(kube_cluster, queued_namespace, pod("probe", "any"))
    plain_pod = dry_run(kube_cluster, plain_namespace, pod("probe", "any"))
    assert {"name": "kueue.x-k8s.io/admission"} in queued_pod["spec"].get("schedulingGates", [])
    assert "kueue.x-k8s.io/managed" in queued_pod["metadata"]["labels"]
    assert not plain_pod["spec"].get("schedulingGates")
    assert set(plain_pod["metadata"]["labels"]) == {kq.QUEUE_NAME_LABEL}
    assert not plain_pod["metadata"].get("finalizers")


def test_a_workload_is_admitted_and_one_that_does_not_fit_waits_until_it_finishes(
    kube_cluster, kueue, queue
):
    namespace = flavor = queue
    create(kube_cluster, namespace, workload("first", queue))
    first = wait_admitted(kube_cluster, namespace, "first")
    admission = first["status"]["admission"]
    assert admission["clusterQueue"] == queue
    (assignment,) = admission["podSetAssignments"]
    assert assignment["name"] == "main"
    assert assignment["flavors"] == {"cpu": flavor, "memory": flavor, GPU: flavor}
    assert assignment["count"] == PODS
    assert assignment["resourceUsage"] == {"cpu": "600m", "memory": "128Mi", GPU: "2"}
    assert (
        condition_of(first, "QuotaReserved")["message"] == f"Quota reserved in ClusterQueue {queue}"
    )
    assert not first["metadata"].get("finalizers")  # Kueue adds none to a hand-made Workload

    create(kube_cluster, namespace, workload("second", queue))

    second = wait_workload(
        kube_cluster,
        namespace,
        "second",
        "to wait for quota",
        lambda wl: (c := condition_of(wl, "QuotaReserved")) is not None and c["status"] == "False",
    )
    reserved = condition_of(second, "QuotaReserved")
    print(f"waiting: reason {reserved['reason']!r}, message {reserved['message']!r}")
    assert reserved["reason"] == "Pending"
    # 1 CPU less the first's 600m leaves 400m of the 600m asked; 2 GPUs less 2 leaves none
    assert reserved["message"] == (
        f"couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor "
        f"{flavor}, 200m more needed, insufficient unused quota for {GPU} in flavor {flavor}, "
        "2 more needed"
    )
    assert not second["status"].get("admission")
    assert not is_true(second, "Admitted")

    # the owner marks the first Finished: its quota is released and the second admitted
    owner_writes(
        kube_cluster,
        namespace,
        "first",
        lambda wl: {
            "conditions": with_condition(
                wl["status"]["conditions"], "Finished", "True", "Succeeded", "the run ended"
            )
        },
    )
    finished_at = time.monotonic()
    wait_admitted(kube_cluster, namespace, "second")
    print(f"second admitted {time.monotonic() - finished_at:.2f} s after first was Finished")
    first = get_workload(kube_cluster, namespace, "first")
    assert is_true(first, "Finished") and first["status"]["admission"]["clusterQueue"] == queue


def test_a_higher_priority_workload_preempts_and_the_owner_releases_the_quota(
    kube_cluster, kueue, queue
):
    namespace = queue
    low, high = f"{queue}-low", f"{queue}-high"
    classes = [kq.workload_priority_class(low, 100), kq.workload_priority_class(high, 1000)]
    try:
        for wpc in classes:
            create(kube_cluster, None, wpc)
        create(kube_cluster, namespace, workload("low", queue, priority_class=low, priority=100))
        wait_admitted(kube_cluster, namespace, "low")
        create(kube_cluster, namespace, workload("high", queue, priority_class=high, priority=1000))

        victim = wait_workload(
            kube_cluster, namespace, "low", "evicted", lambda wl: is_true(wl, "Evicted")
        )
        eviction = condition_of(victim, "Evicted")
        print(f"evicted: {eviction['reason']!r}: {eviction['message']!r}")
        assert eviction["reason"] == "Preempted"
        assert is_true(victim, "Preempted")
        # Kueue keeps the victim's quota until its owner has stopped it and says so
        assert is_true(victim, "QuotaReserved") and victim["status"]["admission"]
        preemptor = get_workload(kube_cluster, namespace, "high")
        assert not is_true(preemptor, "QuotaReserved"), preemptor["status"]

        # the owner, its pods stopped, clears the admission as Kueue's own integrations do
        # (jobframework's reconciler, "handle eviction")
        def released(wl: dict[str, Any]) -> dict[str, Any]:
            evicted = condition_of(wl, "Evicted")
            conditions = with_condition(
                wl["status"]["conditions"], "QuotaReserved", "False", "Pending", evicted["message"]
            )
            conditions = with_condition(
                conditions, "Admitted", "False", "NoReservation", "The workload has no reservation"
            )
            conditions = with_condition(
                conditions, "Requeued", "True", evicted["reason"], evicted["message"]
            )
            return {"admission": None, "conditions": conditions}

        owner_writes(kube_cluster, namespace, "low", released)
        released_at = time.monotonic()
        wait_admitted(kube_cluster, namespace, "high")
        print(f"high admitted {time.monotonic() - released_at:.2f} s after low's release")
        victim = get_workload(kube_cluster, namespace, "low")
        assert not victim["status"].get("admission")
        assert not is_true(victim, "QuotaReserved")
    finally:
        delete_cluster_objects(kube_cluster, classes)


def test_a_job_without_the_queue_label_runs_and_gets_no_workload(
    node_cluster, kueue, queued_namespace
):
    """The operator's children carry no queue-name label: Kueue must leave them alone, even in a
    namespace it manages. A queued Job made before and one made after are the witnesses that
    Kueue's Job controller has processed the namespace's Jobs (queued to a LocalQueue that does
    not exist, so they stay suspended: a Workload is made all the same)."""
    namespace = queued_namespace
    create(node_cluster, namespace, job("before", queue="no-such-queue"))
    create(node_cluster, namespace, job("plain"))
    created = get(node_cluster, namespace, "job", "plain")
    assert created["spec"]["suspend"] is False  # the webhook left it as it was

    wait_for(
        "Job plain complete",
        lambda: is_true(get(node_cluster, namespace, "job", "plain"), "Complete"),
        timeout=120,
        seen=lambda: get(node_cluster, namespace, "job", "plain").get("status"),
    )
    create(node_cluster, namespace, job("after", queue="no-such-queue"))
    for witness in ("before", "after"):
        wait_for(
            f"a Workload for the queued Job {witness}",
            lambda w=witness: owned_workloads(node_cluster, namespace, "Job", w),
            timeout=60,
        )
        assert get(node_cluster, namespace, "job", witness)["spec"]["suspend"] is True
    assert owned_workloads(node_cluster, namespace, "Job", "plain") == []
    plain = get(node_cluster, namespace, "job", "plain")
    assert kq.QUEUE_NAME_LABEL not in plain["metadata"].get("labels", {})
    assert not plain["spec"]["suspend"]


def test_deleting_a_labelled_namespace_is_not_stalled(kube_cluster, kueue, queued_namespace):
    namespace = queued_namespace
    objects = kq.quota(namespace, {"cpu": CPU_QUOTA, "memory": "1Gi", GPU: 2}, name=namespace)
    try:
        for obj in objects:
            create(kube_cluster, obj["metadata"].get("namespace"), obj)
        create(kube_cluster, namespace, workload("admitted", namespace))
        wait_admitted(kube_cluster, namespace, "admitted")
        # a queued Job that does not fit beside the admitted Workload: suspended, its Workload
        # pending (Kueue's finalizer on it)
        create(kube_cluster, namespace, job("queued", queue=namespace, cpu="500m"))
        (queued,) = wait_for(
            "a Workload for the queued Job",
            lambda: owned_workloads(kube_cluster, namespace, "Job", "queued"),
            timeout=60,
        )
        assert "kueue.x-k8s.io/resource-in-use" in queued["metadata"]["finalizers"]

        status, _ = kube_cluster.request("DELETE", f"/api/v1/namespaces/{namespace}")
        assert status == 200, status
        began = time.monotonic()

        def gone() -> bool:
            return kube_cluster.request("GET", f"/api/v1/namespaces/{namespace}")[0] == 404

        def namespace_status() -> object:
            return kube_cluster.request("GET", f"/api/v1/namespaces/{namespace}")[1].get("status")

        wait_for(f"namespace {namespace} deleted", gone, timeout=120, seen=namespace_status)
        print(f"namespace deleted in {time.monotonic() - began:.1f} s")
    finally:
        delete_cluster_objects(kube_cluster, objects)
