"""NetworkPolicy is enforced on the local node (kube-router's policy controller, see
``cluster/README.md``): a policy that admits only pods labelled ``role=allowed`` refuses every
other pod, on the server pod's address and through its Service alike, while the node itself (the
kubelet's probes) still reaches it; deleting the policy opens the server again.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from pod_helpers import CONNECT, IMAGE, SLEEP, apply, get, kubectl, wait_for

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
