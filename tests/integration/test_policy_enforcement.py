"""NetworkPolicy is enforced on the local node (kube-router's policy controller, see
``cluster/README.md``), and a run's own policies hold there.

- A policy that admits only pods labelled ``role=allowed`` refuses every other pod, on the server
  pod's address and through its Service alike, while the node itself (the kubelet's probes) still
  reaches it; deleting the policy opens the server again.
- A real PayloadRun in prime-rl's NCCL weight-broadcast layout (two inference replicas, trainer
  rank 0), under the policies the operator made for it: rank 0 serves a store on port 29501 that
  the inference pods join, then NCCL's bootstrap completes across the three pods
  (``payloadrun.testing.bootstrap``: every rank to rank 0's root listener, the root back to each
  rank, each rank to the next one's ring listener, all on ports the kernel picked). A pod outside
  the run is refused on every port the pattern used and every other port the run's pods serve;
  a client the run names reaches the inference Service's port only, Prometheus the metrics
  ports only, while a pod of the run that took no part reaches them all, TCP and UDP.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from pod_helpers import CONNECT, FAKE_VLLM, IMAGE, SLEEP, apply, get, kubectl, running, wait_for

from payloadrun import settings as sidecar
from payloadrun.testing.bootstrap import STORE_PORT
from payloadrun_operator.models import PEER_IP_BLOCK_ALONE_MESSAGE, PEER_NEEDS_ONE_MESSAGE

pytestmark = pytest.mark.integration

PORT = 8080
POLICY = "server-from-allowed"


def pod(name: str, labels: dict[str, str], command: list[str], **container: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": command}
                | container
            ],
        },
    }


SERVER = pod(
    "server",
    {"app": "server"},
    ["python3", "-m", "http.server", str(PORT), "--directory", "/tmp"],
    ports=[{"containerPort": PORT}],
    # the kubelet probes from the node's address: it must get through every policy (a single
    # refused probe would turn the pod unready)
    readinessProbe={
        "httpGet": {"path": "/", "port": PORT},
        "periodSeconds": 1,
        "failureThreshold": 1,
    },
)
SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "server"},
    "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": PORT}]},
}
ONLY_ALLOWED = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": POLICY},
    "spec": {
        "podSelector": {"matchLabels": {"app": "server"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [{"podSelector": {"matchLabels": {"role": "allowed"}}}],
                "ports": [{"port": PORT, "protocol": "TCP"}],
            }
        ],
    },
}


def ready_condition(cluster, namespace: str, name: str) -> dict[str, str]:
    conditions = get(cluster, namespace, "pod", name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "Ready"), {})


def ready(cluster, namespace: str, name: str) -> bool:
    return ready_condition(cluster, namespace, name).get("status") == "True"


def test_a_policy_admits_only_the_pods_it_selects(node_cluster, namespace):
    client, allowed = pod("client", {}, SLEEP), pod("allowed", {"role": "allowed"}, SLEEP)
    for manifest in (SERVER, SERVICE, client, allowed):
        apply(node_cluster, namespace, manifest)
    for name in ("server", "client", "allowed"):
        wait_for(f"pod {name} Ready", lambda n=name: ready(node_cluster, namespace, n), 60)
    server_ip = get(node_cluster, namespace, "pod", "server")["status"]["podIP"]
    service_ip = get(node_cluster, namespace, "service", "server")["spec"]["clusterIP"]
    targets = json.dumps([["pod", server_ip, PORT], ["service", service_ip, 80]])

    seen: list[dict[str, str]] = []

    def connect(source: str) -> dict[str, str]:
        out = kubectl(
            node_cluster, namespace, "exec", source, "--", "python3", "-c", CONNECT, targets
        )
        seen.append(json.loads(out))
        return seen[-1]

    def client_gets(outcome: dict[str, str], why: str) -> None:
        wait_for(why, lambda: connect("client") == outcome, 30, seen=lambda: seen[-3:])

    connected = {"pod": "connected", "service": "connected"}
    refused = {"pod": "ConnectionRefusedError", "service": "ConnectionRefusedError"}
    # no policy: every pod gets through, the Service once kube-proxy has programmed it (its
    # rules follow the Endpoints asynchronously; until then the address is unreachable)
    client_gets(connected, "the unlabelled pod to get through without a policy")
    server_ready = ready_condition(node_cluster, namespace, "server")

    apply(node_cluster, namespace, ONLY_ALLOWED)
    client_gets(refused, "the policy to refuse the unlabelled pod")
    assert connect("allowed") == connected
    # the node itself still reaches the pod: this process, and the kubelet's probes, one a
    # second, none refused while the policy held (the pod never left Ready)
    with socket.create_connection((server_ip, PORT), timeout=3):
        pass
    assert ready_condition(node_cluster, namespace, "server") == server_ready

    kubectl(node_cluster, namespace, "delete", "networkpolicy", POLICY)
    client_gets(connected, "the unlabelled pod to get through once the policy is deleted")


# --- a run's pods trust each other ---------------------------------------------------------

RUN = "nccl"
BOOTSTRAP = ["python", "-m", "payloadrun.testing.bootstrap"]
# every rank's bootstrap must be done by then (pods start within it: the images are local)
BOOTSTRAP_SECONDS = 180
ROUTER = {"app": "router"}  # named in the run's spec.inference.clients
PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}  # the operator's default scrapers
# same namespace, same component label, another run
OUTSIDER = {"payloadrun.dev/run": "other", "app.kubernetes.io/component": "inference"}


def nccl_run(namespace: str) -> dict[str, Any]:
    """prime-rl's NCCL weight-broadcast layout: trainer rank 0 hosts the store on 29501 and the
    two inference replicas join it as ranks 1 and 2 (an extra container in each, as prime-rl's
    vLLM worker extension is part of vLLM's process)."""
    store_host = f"{RUN}-trainer-0.{RUN}-trainer-headless.{namespace}.svc"
    rank = [*BOOTSTRAP, "rank", "--world", "3", "--store-host", store_host]
    rank += ["--store-port", str(STORE_PORT), "--timeout", str(BOOTSTRAP_SECONDS)]
    return {
        "apiVersion": "payloadrun.dev/v1alpha1",
        "kind": "PayloadRun",
        "metadata": {"name": RUN},
        "spec": {
            "routerReplay": True,
            "payloads": {"volume": {"size": "1Gi", "storageClassName": "standard"}},
            "inference": {
                "replicas": 2,
                "image": IMAGE,
                "command": FAKE_VLLM,
                "clients": [{"podSelector": {"matchLabels": ROUTER}}],
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "vllm"},
                            {
                                "name": "nccl",
                                "image": IMAGE,
                                "command": [*rank, "--rank-from-hostname", "1"],
                            },
                        ]
                    }
                },
            },
            "orchestrator": {"image": IMAGE, "command": SLEEP},
            "trainer": {"image": IMAGE, "command": [*rank, "--rank", "0"], "replicas": 1},
        },
    }


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        ({}, PEER_NEEDS_ONE_MESSAGE),
        ({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}, PEER_IP_BLOCK_ALONE_MESSAGE),
    ],
)
def test_the_api_server_refuses_a_client_no_policy_could_hold(
    crd, kube_cluster, namespace, peer, message
):
    """The CRD's CEL says what the operator's models say, at kubectl apply."""
    run = nccl_run(namespace)
    run["spec"]["inference"]["clients"] = [{"podSelector": {"matchLabels": ROUTER}}, peer]
    result = kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(run))
    assert result.returncode != 0 and "spec.inference.clients[1]" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr
    run["spec"]["inference"]["clients"] = [{"podSelector": {"matchLabels": ROUTER}}]
    kubectl(kube_cluster, namespace, "apply", "--dry-run=server", "-f", "-", input=json.dumps(run))


def pods_of(cluster, namespace: str, component: str) -> list[dict[str, Any]]:
    selector = f"payloadrun.dev/run={RUN},app.kubernetes.io/component={component}"
    items = get(cluster, namespace, "pods", "-l", selector)["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def outcome(cluster, namespace: str, pod: str, container: str) -> dict[str, Any] | None:
    """The rank's ``complete`` or ``failed`` line, once it has printed one."""
    logs = cluster.kubectl("-n", namespace, "logs", pod, "-c", container)
    if logs.returncode != 0:  # not started yet
        return None
    for line in logs.stdout.splitlines():
        event = json.loads(line)
        if event["event"] in ("complete", "failed"):
            return event
    return None


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def test_a_runs_pods_complete_nccls_bootstrap_and_nobody_else_gets_in(operator, namespace):
    cluster = operator.cluster
    outsiders = {"outsider": OUTSIDER, "router": ROUTER, "prometheus": PROMETHEUS}
    for name, labels in outsiders.items():
        apply(cluster, namespace, pod(name, labels, SLEEP))
    apply(cluster, namespace, nccl_run(namespace))

    def ranks() -> dict[int, tuple[str, str]] | None:
        """rank -> (pod, container), once the operator has made every pod."""
        trainers, inference = (pods_of(cluster, namespace, c) for c in ("trainer", "inference"))
        if len(trainers) != 1 or len(inference) != 2:
            return None
        found = {0: (trainers[0]["metadata"]["name"], "trainer")}
        for i, p in enumerate(inference):
            assert p["metadata"]["name"] == f"{RUN}-inference-{i}"
            found[i + 1] = (p["metadata"]["name"], "nccl")
        return found

    where = wait_for("the run's three pods", ranks, 120)
    outcomes: dict[int, dict[str, Any] | None] = {}

    def every_outcome() -> bool:
        for rank, (name, container) in where.items():
            if outcomes.get(rank) is None:
                outcomes[rank] = outcome(cluster, namespace, name, container)
        return all(outcomes.values())

    # each rank's own deadline bounds this: it prints complete or failed by then
    wait_for("every rank's outcome", every_outcome, BOOTSTRAP_SECONDS + 120, seen=lambda: outcomes)
    assert {r: o["event"] for r, o in outcomes.items()} == dict.fromkeys(where, "complete"), (
        outcomes
    )

    # every pod Ready (the writers and the retention sidecar serving), so every port listens
    running(cluster, namespace, RUN)
    pod_ip = {
        name: get(cluster, namespace, "pod", name)["status"]["podIP"] for name, _ in where.values()
    }
    done = outcomes[0]
    by_rank = {r["rank"]: r for r in done["ranks"]}
    assert sorted(by_rank) == [0, 1, 2]
    for rank, (name, _) in where.items():
        record = by_rank[rank]
        assert record["host"] == pod_ip[name], (rank, record)
        # each rank connected to the next one's ring listener, in another pod
        following = (rank + 1) % 3
        assert (record["next_rank"], record["prev_rank"]) == (following, (rank - 1) % 3)
        assert record["next"] == by_rank[following]["ring_listener"]
        assert record["prev_from"] == by_rank[(rank - 1) % 3]["host"]
        assert record["gathered"] == 3
    # the inference pods joined rank 0's store, and the root connected back to every rank
    inference_ips = {pod_ip[where[r][0]] for r in (1, 2)}
    assert inference_ips <= set(done["store_clients"])
    assert done["root_connected_back"] == [by_rank[r]["root_listener"] for r in (0, 1, 2)]

    # every address the pattern used, TCP and UDP, and the other ports the run's pods serve
    trainer_ip = pod_ip[where[0][0]]
    targets = [
        ["store", "tcp", trainer_ip, STORE_PORT],
        ["store-udp", "udp", trainer_ip, STORE_PORT],
    ]
    for rank, record in by_rank.items():
        for listener in ("root_listener", "ring_listener", *(["root"] if rank == 0 else [])):
            host, port = address(record[listener])
            targets.append([f"rank{rank}-{listener}", "tcp", host, port])
            targets.append([f"rank{rank}-{listener}-udp", "udp", host, record["udp"][str(port)]])
    writers = []
    for i in (0, 1):
        ip = pod_ip[f"{RUN}-inference-{i}"]
        writers.append(f"inference{i}-writer")
        targets += [
            [f"inference{i}-writer", "tcp", ip, sidecar.WRITER_PORT],
            [f"inference{i}-writer-metrics", "tcp", ip, sidecar.WRITER_METRICS_PORT],
            [f"inference{i}-vllm", "tcp", ip, sidecar.VLLM_PORT],
        ]
    (orchestrator,) = pods_of(cluster, namespace, "orchestrator")
    orchestrator_ip = orchestrator["status"]["podIP"]
    targets.append(["retention-metrics", "tcp", orchestrator_ip, sidecar.RETENTION_METRICS_PORT])
    service_ip = get(cluster, namespace, "service", f"{RUN}-inference")["spec"]["clusterIP"]
    targets.append(["inference-service", "tcp", service_ip, sidecar.WRITER_PORT])

    metrics = {"inference0-writer-metrics", "inference1-writer-metrics", "retention-metrics"}
    reached = {
        # a pod of the run that took no part in the pattern: every port
        "orchestrator": {t[0] for t in targets},
        # a client the run names: the inference Service's port (the writer's), on the pods too
        "router": {*writers, "inference-service"},
        "prometheus": metrics,
        "outsider": set(),
    }
    seen: dict[str, list[dict[str, str]]] = {who: [] for who in reached}

    def reaches(who: str, name: str, container: str) -> bool:
        out = kubectl(
            cluster,
            namespace,
            "exec",
            name,
            "-c",
            container,
            "--",
            *BOOTSTRAP,
            "reach",
            json.dumps(targets),
        )
        seen[who].append(json.loads(out))
        got = {t for t, result in seen[who][-1].items() if result in ("connected", "echoed")}
        return got == reached[who]

    for name in outsiders:
        wait_for(f"pod {name} Ready", lambda n=name: ready(cluster, namespace, n), 60)
    # the outsiders first (kube-router programs a new pod's rules shortly after it starts), then
    # the pod of the run: every listener still open after the outsiders' tries (a closed one
    # would refuse them too)
    for who in ("outsider", "router", "prometheus"):
        wait_for(
            f"{who} to reach exactly {sorted(reached[who])}",
            lambda w=who: reaches(w, w, "main"),
            60,
            seen=lambda w=who: seen[w][-2:],
        )
    assert reaches("orchestrator", orchestrator["metadata"]["name"], "orchestrator"), seen[
        "orchestrator"
    ][-1]
