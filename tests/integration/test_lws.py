"""The real LeaderWorkerSet controller on the local node (issue 36, item 7's groundwork).

Installed by the ``lws`` fixture from upstream's own ``config/default`` (webhooks on, certificates
from its own cert-controller; ``payloadrun_devcluster.lws``). A LeaderWorkerSet of 2 groups of 2
pods with ``RecreateGroupOnPodRestart``:

- all four pods run, and LWS's pod webhook gave every container ``LWS_LEADER_ADDRESS``,
  ``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX`` (in the pod spec and in the running process);
- the leader's address (a name under the headless Service LWS made) resolves inside a worker,
  through the node's CoreDNS, to the leader pod's address;
- deleting a worker pod recreates its whole group (the leader deleted by LWS, then both pods
  anew), while the other group's pods keep their UIDs; so does a worker container's restart.

And what LWS makes of its name and labels (item 2): the leader StatefulSet takes the LWS's own
name, each group's worker StatefulSet its leader pod's name, the headless Service the LWS's
name, created only when no Service of that name exists. Which labels and annotations reach the
StatefulSets depends on the version: the pinned v0.9.0 (the newest whose module zip the Go
module proxy serves here, cluster/versions.env) gives them only its own
``leaderworkerset.sigs.k8s.io/*`` keys and never the LWS's labels or annotations; v0.10.0 (the
release issue 36 names, its source's ``mergeMetadata``) copies the LWS's labels and annotations
onto the leader StatefulSet and every worker StatefulSet. This matters for item 2: on v0.10.0 a
label the operator puts on the LWS lands on StatefulSets the operator did not make, where its
StatefulSet watch would read them as the run's own children. The node proves v0.9.0's side
only, so the operator must not rely on it: it must label the LWS as if the labels were copied.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
from pod_helpers import IMAGE, SLEEP, apply, get, kubectl, wait_for

from payloadrun_devcluster.lws import (
    API_VERSION,
    GROUP_INDEX_LABEL,
    NAME_LABEL,
    WORKER_INDEX_LABEL,
    copies_labels_to_statefulsets,
)

pytestmark = pytest.mark.integration

GROUPS = 2
SIZE = 2
LWS_PREFIX = "leaderworkerset.sigs.k8s.io/"
REVISION_LABEL = LWS_PREFIX + "template-revision-hash"
GROUP_KEY_LABEL = LWS_PREFIX + "group-key"
VARIABLES = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")
# LWS_* variables of the container's main process (PID 1), from /proc: what the process got
PROCESS_LWS_ENV = (
    "import json; env = open('/proc/1/environ', 'rb').read().decode().split('\\0'); "
    "print(json.dumps(dict(e.split('=', 1) for e in env if e.startswith('LWS_'))))"
)


def leaderworkerset(
    name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "replicas": GROUPS,
            "leaderWorkerTemplate": {
                "size": SIZE,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": {
                    "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [
                            {
                                "name": "main",
                                "image": IMAGE,
                                "imagePullPolicy": "Never",
                                "command": SLEEP,
                            }
                        ],
                    }
                },
            },
        },
    }


def position(pod: dict[str, Any]) -> tuple[int, int]:
    """(group index, worker index) from the labels LWS gives each pod."""
    labels = pod["metadata"]["labels"]
    return int(labels[GROUP_INDEX_LABEL]), int(labels[WORKER_INDEX_LABEL])


def ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def group_pods(cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return get(cluster, namespace, "pods", "-l", f"{NAME_LABEL}={name}")["items"]


def all_ready(cluster, namespace: str, name: str) -> dict[tuple[int, int], dict[str, Any]] | None:
    """Every (group, worker) position held by one ready pod and no other pod around, or None."""
    pods = group_pods(cluster, namespace, name)
    placed = {position(p): p for p in pods if ready(p)}
    wanted = {(g, w) for g in range(GROUPS) for w in range(SIZE)}
    return placed if set(placed) == wanted and len(pods) == len(wanted) else None


def pods_ready(cluster, namespace: str, name: str) -> dict[tuple[int, int], dict[str, Any]]:
    return wait_for(
        f"{GROUPS} groups of {SIZE} ready pods of LeaderWorkerSet {name}",
        lambda: all_ready(cluster, namespace, name),
        seen=lambda: [
            (
                p["metadata"]["name"],
                p["status"].get("phase"),
                p["metadata"].get("deletionTimestamp"),
            )
            for p in group_pods(cluster, namespace, name)
        ],
    )


def container_env(pod: dict[str, Any]) -> dict[str, str]:
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def resolve(cluster, namespace: str, pod: str, host: str) -> str | None:
    """The address ``host`` resolves to inside ``pod`` (its resolv.conf, the node's CoreDNS)."""
    result = cluster.kubectl("-n", namespace, "exec", pod, "--", "getent", "hosts", host)
    return result.stdout.split()[0] if result.returncode == 0 and result.stdout.strip() else None


def test_groups_get_lws_variables_resolve_their_leader_and_recreate_whole(
    node_cluster, lws, namespace
):
    name = "pair"
    began = time.monotonic()
    apply(node_cluster, namespace, leaderworkerset(name))
    pods = pods_ready(node_cluster, namespace, name)
    print(
        f"LeaderWorkerSet {lws.version}: installed in {lws.seconds:.1f} s {lws.timings}; "
        f"{GROUPS} groups of {SIZE} ready {time.monotonic() - began:.1f} s after the apply"
    )

    for (group, worker), pod in pods.items():
        expected = {
            "LWS_LEADER_ADDRESS": f"{name}-{group}.{name}.{namespace}",
            "LWS_GROUP_SIZE": str(SIZE),
            "LWS_WORKER_INDEX": str(worker),
        }
        pod_name = pod["metadata"]["name"]
        assert pod_name == (f"{name}-{group}" if worker == 0 else f"{name}-{group}-{worker}")
        spec_env = container_env(pod)
        assert {k: spec_env.get(k) for k in VARIABLES} == expected, pod_name
        process = kubectl(
            node_cluster, namespace, "exec", pod_name, "--", "python", "-c", PROCESS_LWS_ENV
        )
        assert json.loads(process) == expected, pod_name

    # the leader's name resolves inside its worker to the leader pod's address
    leader, worker = pods[(0, 0)], pods[(0, 1)]
    address = container_env(worker)["LWS_LEADER_ADDRESS"]
    resolved = wait_for(
        f"{address} to resolve inside {worker['metadata']['name']}",
        lambda: resolve(node_cluster, namespace, worker["metadata"]["name"], address),
        timeout=60,
    )
    assert resolved == leader["status"]["podIP"]

    # a worker deleted: LWS deletes its leader, and the whole group comes back anew
    before = {at: pod["metadata"]["uid"] for at, pod in pods.items()}
    kubectl(node_cluster, namespace, "delete", "pod", worker["metadata"]["name"], "--wait=false")

    def recreated() -> dict[tuple[int, int], dict[str, Any]] | None:
        now = all_ready(node_cluster, namespace, name)
        fresh = now and all(now[(0, w)]["metadata"]["uid"] != before[(0, w)] for w in range(SIZE))
        return now if fresh else None

    deleted_at = time.monotonic()
    after = wait_for(
        "group 0 recreated, both its pods new and ready",
        recreated,
        seen=lambda: {
            p["metadata"]["name"]: (p["metadata"]["uid"], p["metadata"].get("deletionTimestamp"))
            for p in group_pods(node_cluster, namespace, name)
        },
    )
    print(f"group 0 ready again {time.monotonic() - deleted_at:.1f} s after its worker's deletion")
    assert {w: after[(1, w)]["metadata"]["uid"] for w in range(SIZE)} == {
        w: before[(1, w)] for w in range(SIZE)
    }, "the other group's pods were replaced"
    assert all(
        s["restartCount"] == 0
        for w in range(SIZE)
        for s in after[(1, w)]["status"]["containerStatuses"]
    )
    events = get(node_cluster, namespace, "events", "--field-selector", "reason=RecreateGroup")
    assert any(worker["metadata"]["name"] in e["message"] for e in events["items"]), events


def caught_signals(status: str) -> int:
    """The ``SigCgt`` mask of a ``/proc/<pid>/status``: bit n-1 set when signal n has a handler."""
    (line,) = [line for line in status.splitlines() if line.startswith("SigCgt:")]
    return int(line.split()[1], 16)


def test_a_restarted_container_recreates_its_group(node_cluster, lws, namespace):
    """RecreateGroupOnPodRestart fires on a container's restart too (its restart count, init
    containers' included, issue 36 item 5): a worker's main process ends, the kubelet restarts
    it in place, and LWS recreates that whole group; the other group is left alone."""
    name = "crash"

    def catches_sigterm(pod: str) -> bool:
        status = kubectl(node_cluster, namespace, "exec", pod, "--", "cat", "/proc/1/status")
        return bool(caught_signals(status) & 1 << (signal.SIGTERM - 1))

    apply(node_cluster, namespace, leaderworkerset(name))
    pods = pods_ready(node_cluster, namespace, name)
    before = {at: pod["metadata"]["uid"] for at, pod in pods.items()}
    worker = pods[(1, 1)]["metadata"]["name"]
    # SIGTERM to the container's main process (it exits at once, 143): a restart in place. A
    # container's PID 1 ignores a signal it has no handler for, and the pod is Ready as soon as
    # the process starts, before Python has set its handler: sent then, it was lost (once, on a
    # slow machine: no restart, a 180 s timeout). So first the handler, read off /proc/1/status.
    wait_for("the worker's main process catches SIGTERM", lambda: catches_sigterm(worker))
    kubectl(node_cluster, namespace, "exec", worker, "--", "sh", "-c", "kill -TERM 1")

    def recreated() -> dict[tuple[int, int], dict[str, Any]] | None:
        now = all_ready(node_cluster, namespace, name)
        fresh = now and all(now[(1, w)]["metadata"]["uid"] != before[(1, w)] for w in range(SIZE))
        return now if fresh else None

    after = wait_for("group 1 recreated after its worker's restart", recreated)
    assert {w: after[(0, w)]["metadata"]["uid"] for w in range(SIZE)} == {
        w: before[(0, w)] for w in range(SIZE)
    }, "the other group's pods were replaced"


def test_what_lws_makes_of_its_name_and_labels(node_cluster, lws, namespace):
    """Item 2 of issue 36, as the running controller does it: names taken from the LWS's own
    name, its Service made only when none of that name exists, and which labels reach the
    StatefulSets (the installed version's behaviour; see cluster/README.md)."""
    labels = {"app.kubernetes.io/part-of": "payloadrun-probe"}
    annotations = {"payloadrun.dev/probe": "named"}
    apply(node_cluster, namespace, leaderworkerset("named", labels, annotations))
    pods_ready(node_cluster, namespace, "named")

    leader_sts = get(node_cluster, namespace, "statefulset", "named")
    assert leader_sts["spec"]["serviceName"] == "named"
    owner = leader_sts["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("LeaderWorkerSet", "named")
    for group in range(GROUPS):  # each group's workers: a StatefulSet named after its leader pod
        workers = get(node_cluster, namespace, "statefulset", f"named-{group}")
        assert workers["metadata"]["ownerReferences"][0]["kind"] == "Pod"
        assert workers["metadata"]["labels"][GROUP_INDEX_LABEL] == str(group)
    service = get(node_cluster, namespace, "service", "named")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert service["metadata"]["ownerReferences"][0]["name"] == "named"

    # a Service of the LWS's name made first is kept as it is (not headless, not LWS's)
    apply(
        node_cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "taken"},
            "spec": {"selector": {"app": "other"}, "ports": [{"port": 80}]},
        },
    )
    apply(node_cluster, namespace, leaderworkerset("taken"))
    pods = pods_ready(node_cluster, namespace, "taken")
    service = get(node_cluster, namespace, "service", "taken")
    assert service["spec"]["clusterIP"] != "None"
    assert "ownerReferences" not in service["metadata"]
    # ... so the leader's address never gets a DNS record: CoreDNS answers pod names only under
    # a headless Service (asked after every pod is ready and the Service is known)
    worker = pods[(0, 1)]["metadata"]["name"]
    assert resolve(node_cluster, namespace, worker, f"taken-0.taken.{namespace}") is None

    # the LWS's labels and annotations on the StatefulSets LWS made: what the version copies
    made = {
        sts["metadata"]["name"]: sts["metadata"]
        for sts in get(node_cluster, namespace, "statefulsets", "-l", f"{NAME_LABEL}=named")[
            "items"
        ]
    }
    assert set(made) == {"named", "named-0", "named-1"}
    if copies_labels_to_statefulsets(lws.version):
        for sts, meta in made.items():
            assert labels.items() <= meta.get("labels", {}).items(), (lws.version, sts)
            assert annotations.items() <= meta.get("annotations", {}).items(), (lws.version, sts)
    else:  # only LWS's own keys: the leader's its name and revision, the workers' their group's
        own = {
            sts: sorted(
                key
                for key in {**meta.get("labels", {}), **meta.get("annotations", {})}
                if not key.startswith(LWS_PREFIX)
            )
            for sts, meta in made.items()
        }
        assert own == {sts: [] for sts in made}, f"LWS {lws.version}"
        assert set(made["named"]["labels"]) == {NAME_LABEL, REVISION_LABEL}
        for group in range(GROUPS):
            assert set(made[f"named-{group}"]["labels"]) == {
                NAME_LABEL,
                REVISION_LABEL,
                GROUP_INDEX_LABEL,
                GROUP_KEY_LABEL,
            }
