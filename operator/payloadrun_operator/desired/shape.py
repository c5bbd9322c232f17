"""The shape of a run's inference: replicas of one pod (a StatefulSet) or of a group of pods (a
LeaderWorkerSet), which pods of a replica run vLLM API servers, how many each, on which ports,
what each API server is called, and how many GPUs the inference has. Pure functions of the spec
(docs/operator.md#multi-node-replicas).

A replica's pods are numbered as LeaderWorkerSet numbers them: the leader is pod 0
(``<run>-vllm-<replica>``), its workers 1..podsPerReplica-1 (``<run>-vllm-<replica>-<pod>``),
all on LWS's own headless Service ``<run>-vllm``. A pod that serves runs ``apiServersPerPod``
API servers on consecutive ports from ``spec.inference.port``; with ``apiServers: EveryPod``
every pod serves (data parallelism across nodes: its ranks are ``pod * apiServersPerPod + d``),
with ``Leader`` only the leader does (tensor or pipeline parallelism across nodes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from payloadrun_operator.api import names
from payloadrun_operator.api.models import ApiServerLayout, Inference

GPU_RESOURCE = "nvidia.com/gpu"  # the one resource the inference world size counts

# The pods of a replica, as the builders compose them: the StatefulSet's one pod, or a group's
# leader and workers (one template each).
SINGLE, LEADER, WORKER = "single", "leader", "worker"


@dataclass(frozen=True)
class InferenceShape:
    """A run's inference replicas, pods and API servers (:func:`of`)."""

    replicas: int
    pods_per_replica: int
    api_servers: ApiServerLayout
    api_servers_per_pod: int
    port: int

    @classmethod
    def of(cls, inference: Inference) -> InferenceShape:
        return cls(
            inference.replicas,
            inference.pods_per_replica,
            inference.api_servers,
            inference.api_servers_per_pod,
            inference.port,
        )

    @property
    def groups(self) -> bool:
        """Whether a replica spans pods: a LeaderWorkerSet instead of a StatefulSet."""
        return self.pods_per_replica > 1

    @property
    def one_server_per_replica(self) -> bool:
        """The layout every run had before multi-node replicas (one pod, one API server): its
        pods and their env stay exactly as they were."""
        return self.pods_per_replica == 1 and self.api_servers_per_pod == 1

    def serves(self, pod: str) -> bool:
        """Whether ``pod`` (SINGLE, LEADER or WORKER) runs API servers (and so a writer)."""
        return pod != WORKER or self.api_servers == ApiServerLayout.EVERY_POD

    @property
    def serving_pods_per_replica(self) -> int:
        return self.pods_per_replica if self.api_servers == ApiServerLayout.EVERY_POD else 1

    @property
    def servers_per_replica(self) -> int:
        """API servers per replica: the replica's data-parallel size."""
        return self.serving_pods_per_replica * self.api_servers_per_pod

    @property
    def ports(self) -> tuple[int, ...]:
        """The API servers' ports on a serving pod: ``port`` .. ``port + apiServersPerPod - 1``."""
        return tuple(range(self.port, self.port + self.api_servers_per_pod))

    def port_name(self, server: int) -> str:
        """The name of API server ``server``'s port on the vllm container: ``http`` for the
        first (the name a one-server pod has always had), ``http-<d>`` for the others."""
        return names.HTTP_PORT_NAME if server == 0 else f"{names.HTTP_PORT_NAME}-{server}"


def group_pod_host(run: str, namespace: str, replica: int, pod: int) -> str:
    """The DNS name of pod ``pod`` of replica ``replica`` of a run's LeaderWorkerSet, on LWS's own
    headless Service (named after the LWS, which names the leader StatefulSet ``<lws>`` and the
    workers' ``<lws>-<replica>``, with ordinals from 1)."""
    lws = names.inference_groups_name(run)
    hostname = f"{lws}-{replica}" if pod == 0 else f"{lws}-{replica}-{pod}"
    return f"{hostname}.{lws}.{namespace}.svc"


def serving_hosts(shape: InferenceShape, run: str, namespace: str) -> Iterator[str]:
    """The DNS name of every pod that runs API servers, replica by replica, leader first."""
    for replica in range(shape.replicas):
        if not shape.groups:
            yield names.pod_host(run, namespace, names.INFERENCE, replica)
            continue
        for pod in range(shape.serving_pods_per_replica):
            yield group_pod_host(run, namespace, replica, pod)


def admin_urls(shape: InferenceShape, run: str, namespace: str) -> list[str]:
    """Every API server's own vLLM, ``http://<pod>:<port + d>/v1``, in order: replica, pod
    (leader first), API server."""
    return [
        f"http://{host}:{port}/v1"
        for host in serving_hosts(shape, run, namespace)
        for port in shape.ports
    ]


def upstreams(shape: InferenceShape) -> str:
    """The writer's upstreams: every API server of its pod, on the pod's loopback,
    comma-separated (``PAYLOADRUN_WRITER_UPSTREAM``)."""
    return ",".join(f"http://127.0.0.1:{port}" for port in shape.ports)


def vllm_gpus(template: Mapping[str, Any] | None, short: Mapping[str, Any] | None) -> int:
    """The ``nvidia.com/gpu`` limit of a pod's vllm container: the short field's
    (``spec.inference.resources``), else the template's container named vllm; 0 without one.
    Extended resources are whole numbers, and a limit is how a pod asks for them (a request
    alone is refused by the API server)."""
    limits = dict((short or {}).get("limits") or {})
    if GPU_RESOURCE not in limits:
        for container in ((template or {}).get("spec") or {}).get("containers") or []:
            if container.get("name") == names.VLLM_CONTAINER:
                limits = dict((container.get("resources") or {}).get("limits") or {})
    try:
        return max(int(str(limits.get(GPU_RESOURCE, 0))), 0)
    except ValueError:  # not a whole number: the API server refuses it for an extended resource
        return 0


def world_size(shape: InferenceShape, leader_gpus: int, worker_gpus: int) -> int | None:
    """The inference world size: API servers x GPUs per API server, which is every inference
    pod's vllm GPUs added up (in ``Leader`` an API server spans its group's pods). None when no
    vllm container has an ``nvidia.com/gpu`` limit (a CPU run, or GPUs that come another way:
    another vendor's resource, a resource claim) or the layout is the one-server one (whose
    pods stay as they were)."""
    if shape.one_server_per_replica:
        return None
    per_replica = leader_gpus + (shape.pods_per_replica - 1) * worker_gpus
    total = shape.replicas * per_replica
    return total or None


def port_errors(
    shape: InferenceShape, sidecar_ports: Mapping[int, str], rpc_port: int
) -> list[str]:
    """What keeps the API servers from their ports: a port past 65535, a sidecar's port
    (``sidecar_ports``: port -> the field that sets it) among them; and, where a replica has
    more than one API server (data parallelism), vLLM's data-parallel RPC port on the head among
    either."""
    errors = []
    last = shape.port + shape.api_servers_per_pod - 1
    servers = (
        f"one of the vLLM API servers' ports (spec.inference.port {shape.port} .. {last}, "
        f"spec.inference.apiServersPerPod {shape.api_servers_per_pod})"
        if shape.api_servers_per_pod > 1
        else "spec.inference.port, vLLM's port"
    )
    if last > 65535:
        errors.append(
            f"spec.inference.port {shape.port} with spec.inference.apiServersPerPod "
            f"{shape.api_servers_per_pod} needs ports up to {last}, past 65535: lower "
            "spec.inference.port"
        )
    for port, field in sorted(sidecar_ports.items()):
        if port in shape.ports:
            errors.append(
                f"{field} {port} is {servers}, in the same pod: give one of them another port"
            )
    if shape.servers_per_replica > 1:
        taken = {p: servers for p in shape.ports} | dict(sidecar_ports)
        if rpc_port in taken:
            errors.append(
                f"spec.inference.dataParallelRpcPort {rpc_port} is {taken[rpc_port]} too, on "
                "the replica's head: choose another port"
            )
    return errors


def inference_world_size(inference: Inference) -> int | None:
    """:func:`world_size` of ``spec.inference``: the leader's GPUs from its template (or the
    short ``resources``), the workers' from the worker template (default: the leader's)."""
    short = None if inference.resources is None else inference.resources.model_dump(by_alias=True)
    leader = vllm_gpus(inference.template, short)
    worker = vllm_gpus(inference.worker_template or inference.template, short)
    return world_size(InferenceShape.of(inference), leader, worker)
