"""Runs admitted whole by the real Kueue, with real pods on the local node (issue 37).

Kueue v0.19.2's controller manager runs on the node (the ``kueue`` fixture, webhooks on and
scoped to namespaces labelled ``payloadrun.dev/kueue-tests``, its Job, StatefulSet and
LeaderWorkerSet integrations enabled); the operator runs as a host process. Each test makes its
own ResourceFlavor, ClusterQueue and LocalQueue (the flavor's ``nodeLabels`` are labels the node
has, so an admitted pod that carries them still runs there), with a quota computed from the
run's own pod sets:

1. one run's quota: a second labelled run creates no pod and says why (phase ``Queued``,
   ``Admitted`` False with Kueue's message) until the first finishes, then runs; the time from
   the first run's quota freed (its Workload ``Finished``) to Kueue's admission of the second,
   and from that admission to the second's first pod, is printed (the goal is the second at
   most 2 s); the first run is a LeaderWorkerSet group run, admitted as one; an unlabelled run
   in the same namespace runs at once and has no Workload; and the only Workloads there are the
   runs' own (Kueue's Job, StatefulSet and LeaderWorkerSet integrations made none for their
   children);
2. preemption: a higher-priority run evicts a lower one, every pod of which stops while its
   claim, payload root and retention journal stay; once the higher one finishes, the lower one
   is admitted again and its new pods find the files it left;
3. a run asking more than the ClusterQueue can ever give waits with Kueue's message saying so;
   deleting it deletes its Workload.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pod_helpers import (
    FAKE_VLLM,
    IMAGE,
    SLEEP,
    apply,
    get,
    kubectl,
    live_pods,
    node_run,
    wait_for,
    wait_for_phase,
)

from builders import condition_of, context
from payloadrun.testing.processes import FAKE_VLLM_MODULE
from payloadrun_devcluster import kueue as kueue_objects
from payloadrun_operator.desired import queueing
from payloadrun_operator.desired.builders import build_run

pytestmark = [pytest.mark.integration, pytest.mark.pod_security("restricted")]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# A label every node has: the flavor's node labels must let its admitted pods still run here.
NODE_LABELS = {"kubernetes.io/os": "linux"}
SMALL = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}
DONE = "/tmp/done"  # the trainers exit 0 once it exists (the test creates it)
TRAIN_UNTIL_DONE = ["python", "-m", "payloadrun.testing.roles", "idle", "--until", DONE]
GROUP_PORT = 8100
FAKE_VLLM_GROUP = (
    f"exec python -m {FAKE_VLLM_MODULE} --host 0.0.0.0 --port {GROUP_PORT} --api-servers 1 "
    "--group-size $LWS_GROUP_SIZE --worker-index $PAYLOADRUN_INFERENCE_POD_INDEX "
    "--leader-address $PAYLOADRUN_INFERENCE_HEAD_ADDRESS"
)
RUN_DIRECTORY = "/data"  # on the payload volume (no claim of its own)
ROOT = f"{RUN_DIRECTORY}/outputs/payloads"
PAYLOADS = {"root": ROOT, "volume": {"size": "1Gi", "storageClassName": "standard"}}


def queued_run(name: str, queue: str | None, *, priority: str | None = None, **spec: Any):
    """A small by-handle run on the node, labelled for ``queue`` (None: no label): every
    container asks for 50m of CPU (the sidecars too), so the quota is the run's to compute."""
    roles = {
        "inference": {
            "image": IMAGE,
            "command": FAKE_VLLM,
            "resources": SMALL,
            "writer": {"resources": SMALL},
        },
        "orchestrator": {
            "image": IMAGE,
            "command": SLEEP,
            "resources": SMALL,
            "retention": {"resources": SMALL},
        },
        "trainer": {"image": IMAGE, "command": TRAIN_UNTIL_DONE, "resources": SMALL},
        "runDirectory": {"mountPath": RUN_DIRECTORY},
        "payloads": PAYLOADS,
    }
    run = node_run(name, **(roles | spec))
    labels = {}
    if queue is not None:
        labels[QUEUE_LABEL] = queue
    if priority is not None:
        labels[PRIORITY_LABEL] = priority
    if labels:
        run["metadata"]["labels"] = labels
    return run


def group_inference() -> dict[str, Any]:
    """One replica of two pods (a LeaderWorkerSet group), an API server in each."""
    return {
        "image": IMAGE,
        "command": ["sh", "-c", FAKE_VLLM_GROUP],
        "port": GROUP_PORT,
        "replicas": 1,
        "podsPerReplica": 2,
        "apiServers": "EveryPod",
        "resources": SMALL,
        "writer": {"resources": SMALL},
    }


def cpu_millis(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def requested_cpu(run: dict[str, Any]) -> int:
    """The run's CPU requests in millicores, summed over its pod sets as the operator builds
    them (every container and native sidecar; what Kueue counts, init containers aside)."""
    built = build_run(context(run["spec"]))
    total = 0
    for pod_set in queueing.pod_sets(built):
        pod = pod_set["template"]["spec"]
        containers = pod["containers"] + [
            c for c in pod.get("initContainers", []) if c.get("restartPolicy") == "Always"
        ]
        per_pod = sum(
            cpu_millis(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
            for c in containers
        )
        total += per_pod * pod_set["count"]
    return total


@contextlib.contextmanager
def queue_of(cluster, namespace: str, cpu_millicores: int, **options: Any) -> Iterator[str]:
    """A ResourceFlavor, ClusterQueue and LocalQueue named after the test's namespace, the
    ClusterQueue holding ``cpu_millicores`` of CPU (and memory enough); deleted after."""
    name = namespace
    objects = kueue_objects.quota(
        namespace,
        {"cpu": f"{cpu_millicores}m", "memory": "64Gi"},
        name=name,
        node_labels=NODE_LABELS,
        **options,
    )
    for obj in objects:
        apply(cluster, namespace, obj)
    try:
        yield name
    finally:
        for kind in ("localqueue", "clusterqueue", "resourceflavor"):
            cluster.kubectl("-n", namespace, "delete", kind, name, "--wait=false")


def label_for_kueue(cluster, namespace: str, kueue) -> None:
    labels = [f"{k}={v}" for k, v in kueue.namespace_labels.items()]
    kubectl(cluster, namespace, "label", "namespace", namespace, *labels, "--overwrite")


def workloads(cluster, namespace: str) -> dict[str, dict[str, Any]]:
    items = get(cluster, namespace, "workloads.kueue.x-k8s.io")["items"]
    return {w["metadata"]["name"]: w for w in items}


def condition(status: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    """A condition of a status (a run's, or a Workload's), {} when it has none of that type."""
    return condition_of({"status": status}, ctype) or {}


def true(obj: dict[str, Any] | None, ctype: str) -> bool:
    """Whether an object's (a Workload's) condition ``ctype`` is True."""
    return condition((obj or {}).get("status"), ctype).get("status") == "True"


def run_status(cluster, namespace: str, name: str) -> dict[str, Any]:
    return get(cluster, namespace, "payloadrun", name).get("status") or {}


def finish(cluster, namespace: str, name: str) -> None:
    """Every trainer of ``name`` exits 0 (the run Succeeds)."""
    for pod in live_pods(cluster, namespace, name):
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") == "trainer":
            kubectl(
                cluster,
                namespace,
                "exec",
                pod["metadata"]["name"],
                "-c",
                "trainer",
                "--",
                "touch",
                DONE,
            )


def test_a_queued_run_waits_for_quota_says_why_and_runs_once_it_is_freed(
    kueue, lws, operator, namespace
):
    cluster = operator.cluster
    label_for_kueue(cluster, namespace, kueue)
    first = queued_run("first", namespace, inference=group_inference())
    second = queued_run("second", namespace)
    quota = max(requested_cpu(first), requested_cpu(second))
    with queue_of(cluster, namespace, quota * 3 // 2) as queue:
        first["metadata"]["labels"][QUEUE_LABEL] = queue
        second["metadata"]["labels"][QUEUE_LABEL] = queue
        apply(cluster, namespace, first)
        running = wait_for_phase(cluster, namespace, "first", "Running")
        # admitted as one: the group's leader and worker, the orchestrator and the trainer
        assert running["status"]["queue"]["clusterQueue"] == queue
        assert set(running["status"]["queue"]["flavors"]) == {
            "inference",
            "inference-workers",
            "orchestrator",
            "trainer",
        }
        for pod in live_pods(cluster, namespace, "first"):
            assert NODE_LABELS.items() <= pod["spec"].get("nodeSelector", {}).items(), pod[
                "metadata"
            ]["name"]

        # an unlabelled run in the same namespace: no queue, no Workload, it just runs
        apply(cluster, namespace, queued_run("free", None))
        apply(cluster, namespace, second)
        waiting = wait_for(  # Kueue's words, once its scheduler has tried the Workload (the
            # operator says "waiting for Kueue to consider the run" before that)
            "the second run queued, with Kueue's reason",
            lambda: (
                (s := run_status(cluster, namespace, "second")).get("phase") == "Queued"
                and "insufficient" in (condition(s, "Admitted").get("message") or "")
                and s
            ),
            seen=lambda: run_status(cluster, namespace, "second"),
        )
        admitted = condition(waiting, "Admitted")
        assert (admitted["status"], admitted["reason"]) == ("False", "Pending")
        assert f"waiting for quota in LocalQueue {queue}" in admitted["message"]
        assert "insufficient" in admitted["message"], admitted["message"]
        assert "maximum capacity" not in admitted["message"]  # it fits once quota is free
        assert condition(waiting, "Ready")["reason"] == "Queued"
        wait_for_phase(cluster, namespace, "free", "Running")
        assert live_pods(cluster, namespace, "second") == []
        table = kubectl(cluster, namespace, "get", "payloadruns", "-o", "wide")
        assert "Queued" in table and queue in table, table
        # only the runs' own Workloads: none of Kueue's for their Jobs, StatefulSets or group
        assert sorted(workloads(cluster, namespace)) == ["payloadrun-first", "payloadrun-second"]

        finish(cluster, namespace, "first")
        freed = admitted_at = created_at = None
        deadline = time.monotonic() + 120
        while created_at is None and time.monotonic() < deadline:
            now = time.monotonic()
            found = workloads(cluster, namespace)
            if freed is None and true(found.get("payloadrun-first"), "Finished"):
                freed = now
            if admitted_at is None and true(found.get("payloadrun-second"), "Admitted"):
                admitted_at = now
            if admitted_at is not None and live_pods(cluster, namespace, "second"):
                created_at = now
            time.sleep(0.05)
        assert None not in (freed, admitted_at, created_at), (freed, admitted_at, created_at)
        print(
            f"\nquota freed -> Kueue admitted the waiting run: {admitted_at - freed:.2f} s; "
            f"admitted -> its first pod: {created_at - admitted_at:.2f} s (goal <= 2 s; "
            "each to the test's 50 ms poll and one kubectl call)"
        )
        wait_for_phase(cluster, namespace, "second", "Running")
        assert run_status(cluster, namespace, "first")["phase"] == "Succeeded"
        assert condition(run_status(cluster, namespace, "first"), "Admitted")["reason"] == (
            "Finished"
        )
        assert sorted(workloads(cluster, namespace)) == ["payloadrun-first", "payloadrun-second"]


JOURNAL_LIST = (
    "import json, os, sys; root = sys.argv[1]; "
    "print(json.dumps(sorted(os.path.relpath(os.path.join(d, f), root) "
    "for d, _, fs in os.walk(root) for f in fs)))"
)


def files_under(cluster, namespace: str, name: str, path: str) -> list[str]:
    (pod,) = [
        p
        for p in live_pods(cluster, namespace, name)
        if p["metadata"]["labels"].get("app.kubernetes.io/component") == "orchestrator"
    ]
    out = kubectl(
        cluster,
        namespace,
        "exec",
        pod["metadata"]["name"],
        "-c",
        "orchestrator",
        "--",
        "python",
        "-c",
        JOURNAL_LIST,
        path,
    )
    return json.loads(out)


def test_a_higher_priority_run_preempts_a_lower_one_which_resumes_where_it_was(
    kueue, operator, namespace
):
    cluster = operator.cluster
    label_for_kueue(cluster, namespace, kueue)
    classes = {"payloadrun-low": 100, "payloadrun-high": 1000}
    for name, value in classes.items():
        apply(cluster, namespace, kueue_objects.workload_priority_class(name, value))
    low = queued_run("low", namespace, priority="payloadrun-low")
    high = queued_run("high", namespace, priority="payloadrun-high")
    with queue_of(
        cluster, namespace, requested_cpu(low) * 3 // 2, preempt_lower_priority=True
    ) as queue:
        low["metadata"]["labels"][QUEUE_LABEL] = high["metadata"]["labels"][QUEUE_LABEL] = queue
        apply(cluster, namespace, low)
        running = wait_for_phase(cluster, namespace, "low", "Running")
        claim = running["status"]["claimName"]
        marker = f"{RUN_DIRECTORY}/before-preemption"
        (orchestrator,) = [
            p["metadata"]["name"]
            for p in live_pods(cluster, namespace, "low")
            if p["metadata"]["labels"]["app.kubernetes.io/component"] == "orchestrator"
        ]
        kubectl(
            cluster, namespace, "exec", orchestrator, "-c", "orchestrator", "--", "touch", marker
        )
        before = files_under(cluster, namespace, "low", RUN_DIRECTORY)
        assert "before-preemption" in before
        assert any(f.endswith("journal.jsonl") for f in before), before  # retention's

        apply(cluster, namespace, high)
        wait_for(
            "every pod of the low-priority run gone",
            lambda: (
                not live_pods(cluster, namespace, "low")
                and not [
                    p
                    for p in get(cluster, namespace, "pods")["items"]
                    if p["metadata"].get("labels", {}).get("payloadrun.dev/run") == "low"
                ]
            ),
            seen=lambda: [p["metadata"]["name"] for p in live_pods(cluster, namespace, "low")],
        )
        wait_for_phase(cluster, namespace, "high", "Running")
        evicted = run_status(cluster, namespace, "low")
        assert evicted["phase"] == "Queued", evicted
        events = get(cluster, namespace, "events", "--field-selector", "involvedObject.name=low")[
            "items"
        ]
        preemptor = get(cluster, namespace, "payloadrun", "high")["metadata"]["uid"]
        # Kueue names the workload that took the quota by its job-uid label: the run's uid
        assert any(
            "evicted by Kueue (Preempted" in e["message"] and f"JobUID: {preemptor}" in e["message"]
            for e in events
        ), [e["message"] for e in events]
        # what a suspended run keeps: its claim (and the files on it, seen after it resumes)
        assert get(cluster, namespace, "pvc", claim)["status"]["phase"] == "Bound"

        finish(cluster, namespace, "high")
        wait_for_phase(cluster, namespace, "high", "Succeeded")
        wait_for_phase(cluster, namespace, "low", "Running")
        after = files_under(cluster, namespace, "low", RUN_DIRECTORY)
        assert set(before) <= set(after), (before, after)


def test_a_run_asking_more_than_the_queue_can_ever_give_says_so(kueue, operator, namespace):
    cluster = operator.cluster
    label_for_kueue(cluster, namespace, kueue)
    big = queued_run("big", namespace)
    with queue_of(cluster, namespace, requested_cpu(big) // 2) as queue:
        big["metadata"]["labels"][QUEUE_LABEL] = queue
        apply(cluster, namespace, big)
        status = wait_for(
            "the run queued with Kueue's message",
            lambda: (
                (s := run_status(cluster, namespace, "big")).get("phase") == "Queued"
                and "maximum capacity" in condition(s, "Admitted").get("message", "")
                and s
            ),
            seen=lambda: run_status(cluster, namespace, "big"),
        )
        admitted = condition(status, "Admitted")
        assert admitted["reason"] == "Inadmissible", admitted
        assert live_pods(cluster, namespace, "big") == []
        # deleting the run deletes what it asked Kueue for
        assert "payloadrun-big" in workloads(cluster, namespace)
        kubectl(cluster, namespace, "delete", "payloadrun", "big", "--wait=true")
        wait_for(
            "the run's Workload gone with it",
            lambda: "payloadrun-big" not in workloads(cluster, namespace),
            seen=lambda: sorted(workloads(cluster, namespace)),
        )
