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
from payloadrun_operator.api.models import PEER_IP_BLOCK_ALONE_MESSAGE, PEER_NEEDS_ONE_MESSAGE

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
# every rank's bootstrap must be done by then, counted from the go file (its pods are running)
BOOTSTRAP_SECONDS = 90
GO_FILE = "/tmp/go"  # the ranks start once it exists: when the test has seen the policies hold
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
    rank += ["--after", GO_FILE]
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
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event["event"] in ("complete", "failed"):
            return event
    return None


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


class Reacher:
    """``payloadrun.testing.bootstrap reach`` from a pod: what each try reached, kept."""

    def __init__(self, cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.seen: dict[str, list[dict[str, str]]] = {}

    def reached(self, who: str, pod_name: str, container: str, targets: list[list[Any]]) -> set:
        out = kubectl(
            self.cluster,
            self.namespace,
            "exec",
            pod_name,
            "-c",
            container,
            "--",
            *BOOTSTRAP,
            "reach",
            json.dumps(targets),
        )
        self.seen.setdefault(who, []).append(json.loads(out))
        return {t for t, got in self.seen[who][-1].items() if got in ("connected", "echoed")}

    def wait_exactly(self, who: str, pod_name: str, container: str, targets, wanted: set) -> None:
        """Until ``who`` reaches exactly ``wanted`` of ``targets`` (kube-router programs a new
        pod's rules shortly after it starts)."""
        wait_for(
            f"{who} to reach exactly {sorted(wanted)}",
            lambda: self.reached(who, pod_name, container, targets) == wanted,
            60,
            seen=lambda: self.seen.get(who, [])[-2:],
        )


def test_a_runs_pods_complete_nccls_bootstrap_and_nobody_else_gets_in(operator, namespace):
    cluster = operator.cluster
    outsiders = {"outsider": OUTSIDER, "router": ROUTER, "prometheus": PROMETHEUS}
    for name, labels in outsiders.items():
        apply(cluster, namespace, pod(name, labels, SLEEP))
    apply(cluster, namespace, nccl_run(namespace))
    # every pod Ready (the writers and the retention sidecar serving, rank 0's store listening)
    running(cluster, namespace, RUN)
    for name in outsiders:
        wait_for(f"pod {name} Ready", lambda n=name: ready(cluster, namespace, n), 60)
    (trainer,) = pods_of(cluster, namespace, "trainer")
    inference = pods_of(cluster, namespace, "inference")
    assert [p["metadata"]["name"] for p in inference] == [f"{RUN}-inference-{i}" for i in (0, 1)]
    (orchestrator,) = pods_of(cluster, namespace, "orchestrator")
    where = {0: (trainer, "trainer"), 1: (inference[0], "nccl"), 2: (inference[1], "nccl")}
    ip = {r: p["status"]["podIP"] for r, (p, _) in where.items()}
    orchestrator_ip = orchestrator["status"]["podIP"]
    service_ip = get(cluster, namespace, "service", f"{RUN}-inference")["spec"]["clusterIP"]

    # the ports the run's pods serve before the pattern starts
    served = [["store", "tcp", ip[0], STORE_PORT], ["store-udp", "udp", ip[0], STORE_PORT]]
    writers = {f"inference{i}-writer" for i in (0, 1)}
    for i in (0, 1):
        served += [
            [f"inference{i}-writer", "tcp", ip[i + 1], sidecar.WRITER_PORT],
            [f"inference{i}-writer-metrics", "tcp", ip[i + 1], sidecar.WRITER_METRICS_PORT],
            [f"inference{i}-vllm", "tcp", ip[i + 1], sidecar.VLLM_PORT],
        ]
    served += [
        ["retention-metrics", "tcp", orchestrator_ip, sidecar.RETENTION_METRICS_PORT],
        ["inference-service", "tcp", service_ip, sidecar.WRITER_PORT],
    ]
    metrics = {"inference0-writer-metrics", "inference1-writer-metrics", "retention-metrics"}
    allowed = {
        "outsider": set(),
        "router": {*writers, "inference-service"},  # named in spec.inference.clients
        "prometheus": metrics,
    }
    reach = Reacher(cluster, namespace)
    # the policies in force on all four pods before the group starts: the outsider refused
    # on every port they serve
    reach.wait_exactly("outsider", "outsider", "main", served, set())

    for name, container in ((p["metadata"]["name"], c) for p, c in where.values()):
        kubectl(cluster, namespace, "exec", name, "-c", container, "--", "touch", GO_FILE)
    outcomes: dict[int, dict[str, Any] | None] = {}

    def every_outcome() -> bool:
        for rank, (p, container) in where.items():
            if outcomes.get(rank) is None:
                outcomes[rank] = outcome(cluster, namespace, p["metadata"]["name"], container)
        return all(outcomes.values())

    # each rank's own deadline bounds this: it prints complete or failed by then
    wait_for("every rank's outcome", every_outcome, BOOTSTRAP_SECONDS + 60, seen=lambda: outcomes)
    assert {r: o["event"] for r, o in outcomes.items()} == dict.fromkeys(where, "complete"), (
        outcomes
    )
    done = outcomes[0]
    by_rank = {r["rank"]: r for r in done["ranks"]}
    assert sorted(by_rank) == [0, 1, 2]
    for rank, record in by_rank.items():
        assert record["host"] == ip[rank], (rank, record)
        # each rank connected to the next one's ring listener, in another pod, and the
        # previous one connected to it
        following, previous = (rank + 1) % 3, (rank - 1) % 3
        assert (record["next_rank"], record["prev_rank"]) == (following, previous)
        assert record["next"] == by_rank[following]["ring_listener"]
        assert record["prev_from"] == ip[previous]
        assert record["gathered"] == 3
    # the inference pods joined rank 0's store, and the root connected back to every rank
    assert {ip[1], ip[2]} <= set(done["store_clients"])
    assert done["root_connected_back"] == [by_rank[r]["root_listener"] for r in (0, 1, 2)]

    # every address the pattern used, TCP and UDP, besides the ports served before
    used = []
    for rank, record in by_rank.items():
        for listener in ("root_listener", "ring_listener", *(["root"] if rank == 0 else [])):
            host, port = address(record[listener])
            used.append([f"rank{rank}-{listener}", "tcp", host, port])
            used.append([f"rank{rank}-{listener}-udp", "udp", host, record["udp"][str(port)]])
    targets = served + used
    # the outsiders first, then a pod of the run that took no part in the pattern: every
    # listener still open after the outsiders' tries (a closed one would have refused them too)
    for who, wanted in allowed.items():
        reach.wait_exactly(who, who, "main", targets, wanted)
    orchestrator_name = orchestrator["metadata"]["name"]
    everything = {t[0] for t in targets}
    reach.wait_exactly("run", orchestrator_name, "orchestrator", targets, everything)
