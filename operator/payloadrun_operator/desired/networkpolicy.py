"""The run's NetworkPolicies: its pods trust each other, and nothing else gets in.

Frameworks open ports that no template declares: NCCL's bootstrap (every rank to rank 0's root
listener, the root back to each rank, each rank to the next one's ring listener, all on ports the
kernel picks), Gloo's, NIXL's, vLLM's data-parallel coordinator. prime-rl's NCCL weight broadcast
joins trainer rank 0 and every inference worker in one such group (rank 0 hosts its store on port
29501). So every pod of a run may reach every port, of every protocol (TCP, UDP, SCTP: a rule
without ``ports``), of every other pod of the same run. From outside the run only:

- the scrapers (``PAYLOADRUN_METRICS_SCRAPERS``) reach the sidecars' metrics ports: the writer's
  on inference pods, the retention sidecar's on the orchestrator's (by handle: inline runs have
  no sidecars);
- the inference clients (``PAYLOADRUN_INFERENCE_CLIENTS``, for every run, and the run's own
  ``spec.inference.clients``) reach the inference Service's port on the inference pods (the
  writer's by handle, vLLM's inline): an eval job, a router.

One policy per component, ``<run>-inference``, ``<run>-orchestrator``, ``<run>-trainer`` (the
names of earlier versions, so an upgraded run's policies are replaced in place), each with the
run's trust rule and that component's outside rules: a policy's rules hold for every pod it
selects, and one run-wide policy would open the writer's metrics port number on the trainers too.
Each is applied even when it has only the trust rule, so an outside rule that goes from the spec
goes from the cluster too (the operator does not delete children it stops building).

A rule with no peers is left out: an empty ``from`` would admit every source. Traffic inside a
pod (the writer to vLLM, the orchestrator to its retention sidecar, on localhost) is no network
traffic; the kubelet's probes come from the node, which NetworkPolicies do not restrict. Egress is
left alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from payloadrun_operator.api import names
from payloadrun_operator.api.kinds import NETWORK_POLICY

Manifest = dict[str, Any]


def network_policy(
    run: str,
    namespace: str,
    component: str,
    labels: Manifest,
    owner: Manifest,
    rules: list[Manifest],
) -> Manifest:
    """The policy selecting ``component``'s pods of ``run``, admitting what ``rules`` say."""
    return {
        **NETWORK_POLICY.type_meta,
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


def run_pods(run: str) -> Manifest:
    """Every pod of ``run`` (its namespace's, since a podSelector alone means that)."""
    return {"podSelector": {"matchLabels": {names.LABEL_RUN: run}}}


def trust_rule(run: str) -> Manifest:
    """Every pod of the run, on every port of every protocol."""
    return {"from": [run_pods(run)]}


def tcp(port: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": port}]


def unique(peers: Iterable[Manifest]) -> list[Manifest]:
    """The peers in order, each once."""
    out: list[Manifest] = []
    for peer in peers:
        if peer not in out:
            out.append(peer)
    return out


def outside_rule(peers: Sequence[Manifest], port: int | None) -> list[Manifest]:
    """``peers`` on TCP ``port``, as a list of at most one rule: none without peers (an empty
    ``from`` would admit everyone) or without a port (the sidecar is not there)."""
    if not peers or port is None:
        return []
    return [{"from": list(peers), "ports": tcp(port)}]


def inference_rules(
    run: str,
    *,
    service_port: int,
    writer_metrics_port: int | None,
    clients: Sequence[Manifest],
    scrapers: Sequence[Manifest],
) -> list[Manifest]:
    """The run's pods anywhere; ``clients`` on the inference Service's port; ``scrapers`` on the
    writer's metrics port (None: no writer, an inline run)."""
    return [
        trust_rule(run),
        *outside_rule(clients, service_port),
        *outside_rule(scrapers, writer_metrics_port),
    ]


def orchestrator_rules(
    run: str, *, retention_metrics_port: int | None, scrapers: Sequence[Manifest]
) -> list[Manifest]:
    """The run's pods anywhere; ``scrapers`` on the retention sidecar's metrics port (None: no
    sidecar, an inline run)."""
    return [trust_rule(run), *outside_rule(scrapers, retention_metrics_port)]


def trainer_rules(run: str) -> list[Manifest]:
    """The run's pods anywhere (torchrun's rendezvous, NCCL's, the weight broadcast's store)."""
    return [trust_rule(run)]
