"""The run's NetworkPolicies: who may connect to which of its pods' ports, and nobody else.

One policy per component (a NetworkPolicy's rules apply alike to every pod it selects, and the
three components admit different peers), each selecting that component's pods of this run only:

- inference pods: the writer's port (by handle) from the run's orchestrator; vLLM's port
  (generate and admin calls, weight updates) from the run's own pods; every other port but the
  writer's two from the run's trainers (an NCCL weight broadcast opens ports of its own); the
  writer's metrics port from the scrapers (``PAYLOADRUN_METRICS_SCRAPERS``).
- orchestrator pods: the ports its template declares from the run's own pods; the retention
  sidecar's metrics port from the scrapers.
- trainer pods: every port from the run's trainers (the rendezvous port and NCCL's).

Nothing else comes in: another run's pods, another namespace, the inference Service's clients at
large. Traffic inside a pod (the writer to vLLM, the orchestrator to its retention sidecar, on
localhost) is no network traffic and needs no rule; the kubelet's probes come from the node,
which NetworkPolicies do not restrict. Egress is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from payloadrun_operator import names
from payloadrun_operator.names import ORCHESTRATOR, TRAINER

Manifest = dict[str, Any]
MAX_PORT = 65535


def port_ranges_except(excluded: Iterable[int]) -> list[Manifest]:
    """TCP port rules covering 1-65535 but the ``excluded`` ports (NetworkPolicy ``endPort``)."""
    rules: list[Manifest] = []
    start = 1
    for port in sorted(set(excluded)):
        if port > start:
            rules.append(tcp_range(start, port - 1))
        start = port + 1
    if start <= MAX_PORT:
        rules.append(tcp_range(start, MAX_PORT))
    return rules


def tcp_range(first: int, last: int) -> Manifest:
    rule: Manifest = {"protocol": "TCP", "port": first}
    if last > first:
        rule["endPort"] = last
    return rule


def tcp(*ports: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": port} for port in sorted(set(ports))]


def declared_ports(pod: Manifest, skip: Iterable[str]) -> list[Manifest]:
    """The ports the pod's containers declare, those of containers named in ``skip`` left out."""
    skipped = set(skip)
    ports = []
    seen = set()
    for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        if container["name"] in skipped:
            continue
        for port in container.get("ports") or []:
            key = (port["containerPort"], port.get("protocol", "TCP"))
            if key not in seen:
                seen.add(key)
                ports.append({"protocol": key[1], "port": key[0]})
    return sorted(ports, key=lambda p: (p["port"], p["protocol"]))


def network_policy(
    run: str,
    namespace: str,
    component: str,
    labels: Manifest,
    owner: Manifest,
    rules: list[Manifest],
) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": names.child_name(run, component),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "podSelector": {
                "matchLabels": {names.LABEL_RUN: run, names.LABEL_COMPONENT: component}
            },
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def peers(run: str, *components: str) -> list[Manifest]:
    """The pods of ``run`` (of those components; every pod of the run when none is named)."""
    if not components:
        return [{"podSelector": {"matchLabels": {names.LABEL_RUN: run}}}]
    return [
        {"podSelector": {"matchLabels": {names.LABEL_RUN: run, names.LABEL_COMPONENT: c}}}
        for c in components
    ]


def rule(sources: list[Manifest], ports: list[Manifest] | None) -> Manifest:
    """An ingress rule; ``ports`` None: every port."""
    return {"from": sources, "ports": ports}


def finish(rules: list[Manifest]) -> list[Manifest]:
    """The rules as the API takes them: no ``ports`` for every port, none with no port at all
    (an empty ``ports`` would mean every port)."""
    out = []
    for r in rules:
        if r["ports"] is None:
            out.append({"from": r["from"]})
        elif r["ports"]:
            out.append(r)
    return out


def inference_rules(
    run: str,
    *,
    by_handle: bool,
    vllm_port: int,
    writer_port: int,
    writer_metrics_port: int,
    scrapers: list[Manifest],
) -> list[Manifest]:
    rules = [rule(peers(run), tcp(vllm_port))]
    writer_ports = (writer_port, writer_metrics_port) if by_handle else ()
    if by_handle:
        rules.insert(0, rule(peers(run, ORCHESTRATOR), tcp(writer_port)))
        rules.append(rule(scrapers, tcp(writer_metrics_port)))
    rules.append(rule(peers(run, TRAINER), port_ranges_except(writer_ports)))
    return finish(rules)


def orchestrator_rules(
    run: str, *, declared: list[Manifest], metrics_port: int | None, scrapers: list[Manifest]
) -> list[Manifest]:
    rules = [rule(peers(run), declared)]
    if metrics_port is not None:
        rules.append(rule(scrapers, tcp(metrics_port)))
    return finish(rules)


def trainer_rules(run: str) -> list[Manifest]:
    return finish([rule(peers(run, TRAINER), None)])
