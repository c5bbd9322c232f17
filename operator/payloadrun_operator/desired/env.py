"""What the pods learn: the environment the operator gives every container of a run's pods (the
run's identity and payload mode, its addresses, the step bounds, torchrun's rendezvous).
docs/operator.md#what-every-pod-learns is the table; tests/operator/test_pod_env.py holds the
pods to it."""

from __future__ import annotations

from payloadrun.settings import Env
from payloadrun_operator.api import names
from payloadrun_operator.api.models import ApiServerLayout, EnvVar
from payloadrun_operator.api.names import INFERENCE, ORCHESTRATOR, TRAINER
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.shape import admin_urls
from payloadrun_operator.desired.shape import inference_world_size as shape_world_size
from payloadrun_operator.desired.templates import Manifest


def env_list(values: dict[str, str | None]) -> list[Manifest]:
    return [{"name": k, "value": v} for k, v in values.items() if v is not None]


def user_env(env: list[EnvVar]) -> list[Manifest]:
    return [e.model_dump(by_alias=True, exclude_none=True) for e in env]


def identity_env(ctx: RunContext) -> dict[str, str | None]:
    """Which run a container belongs to and how its payloads move: every container of a run's
    pods is told, the sidecars and the cleanup Job included (docs/operator.md#what-every-pod-learns
    is the table, tests/operator/test_pod_env.py holds the pods to it)."""
    return {Env.RUN: ctx.name, Env.RUN_ID: ctx.uid, Env.PAYLOAD_MODE: str(ctx.decision.mode)}


def run_env(ctx: RunContext) -> dict[str, str | None]:
    """What the main container of every role is told about the run."""
    run_dir = ctx.spec.run_directory
    return {
        **identity_env(ctx),
        Env.PAYLOAD_ROOT: ctx.root,
        Env.RUN_DIRECTORY: run_dir.mount_path if run_dir else None,
        Env.ORCHESTRATOR_HOST: ctx.host(ORCHESTRATOR),
    }


# What pod layout 2 added to the main containers' env. A run started before (layout 1) is not
# given them: its spec may set these names itself, as layout 1 allowed; it gets them when rolled.
LAYOUT_2_ENV = frozenset(
    {
        Env.RUN_DIRECTORY,
        Env.ORCHESTRATOR_HOST,
        Env.TRAINER_HOST,
        Env.INFERENCE_ADMIN_URLS,
        Env.MASTER_ADDR,
        Env.MASTER_PORT,
        Env.NNODES,
        Env.NODE_RANK,
        Env.NPROC_PER_NODE,
        Env.WORLD_SIZE,
        Env.RANK,
        Env.PET_MASTER_ADDR,
        Env.PET_MASTER_PORT,
        Env.PET_NNODES,
        Env.PET_NODE_RANK,
        Env.PET_NPROC_PER_NODE,
    }
)


def main_env(ctx: RunContext, env: list[Manifest]) -> tuple[Manifest, ...]:
    """The operator's env of a main container, as the run's pod layout has it."""
    if ctx.layout.has_addresses:
        return tuple(env)
    return tuple(e for e in env if e["name"] not in LAYOUT_2_ENV)


def step_env(ctx: RunContext) -> dict[str, str | None]:
    """The step bounds, for the orchestrator and its retention sidecar alike."""
    spec = ctx.spec
    return {
        Env.MAX_OFF_POLICY_STEPS: str(spec.max_off_policy_steps),
        Env.MAX_STEPS: None if spec.max_steps is None else str(spec.max_steps),
    }


def inference_url(ctx: RunContext) -> str:
    port = ctx.spec.inference.writer.port if ctx.by_handle else ctx.spec.inference.port
    return f"http://{ctx.child_name(INFERENCE)}.{ctx.namespace}.svc:{port}"


def inference_admin_urls(ctx: RunContext) -> str:
    """Every inference API server's own vLLM, ``http://<pod DNS name>:<port>/v1``, space-separated,
    in order: replica, pod, API server (:func:`shape.admin_urls`); with one pod and one API
    server per replica, one URL per replica.

    Admin calls (pause, weight updates, resume, NCCL setup, metrics) must reach every API
    server, not one behind the load-balanced Service, and they go to vLLM itself, not through the
    writer: they carry no payloads, the writer's health must not block a weight update, and the
    same addresses then serve an inline run. Space-separated, as prime-rl's SLURM template passes
    them: ``--model.client.admin-base-url $PAYLOADRUN_INFERENCE_ADMIN_URLS`` in a shell command
    gives one argument per API server."""
    return " ".join(admin_urls(ctx.inference_shape, ctx.name, ctx.namespace))


def inference_world_size(ctx: RunContext) -> str | None:
    """The inference world size (:func:`shape.world_size`), for the orchestrator and the
    trainers; None where it is not given."""
    size = shape_world_size(ctx.spec.inference)
    return None if size is None else str(size)


def group_env(ctx: RunContext, pod: str) -> list[Manifest]:
    """What the vllm container of a pod of a LeaderWorkerSet group learns (``pod``: LEADER or
    WORKER), after LWS's own ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX``:

    - the replica's and this pod's index, read from the labels LWS gives its pods (the
      downward API: the worker template is one for every worker);
    - the head's address, ``$(LWS_LEADER_ADDRESS)``: LWS's pod webhook puts its variables first
      in every container's env (``addEnvVarsIfNotExists``, pkg/utils/pod/pod_utils.go of
      sigs.k8s.io/lws v0.9.0 and v0.10.0), so a later entry can refer to them;
    - the replica's data-parallel size and RPC port, and on a pod that serves its API servers'
      count and its first DP rank where an env value can say it exactly: ``pod x
      apiServersPerPod`` needs arithmetic, which env values cannot do, so with more than one API
      server per pod only the pod index is given (``$((POD_INDEX * API_SERVERS_PER_POD))`` in a
      shell); in ``Leader`` the leader's first rank is 0."""
    shape = ctx.inference_shape
    inference = ctx.spec.inference

    def label(key: str) -> Manifest:
        return {"fieldRef": {"fieldPath": f"metadata.labels['{key}']"}}

    env: list[Manifest] = [
        {"name": Env.INFERENCE_REPLICA_INDEX, "valueFrom": label(names.LWS_GROUP_INDEX_LABEL)},
        {"name": Env.INFERENCE_POD_INDEX, "valueFrom": label(names.LWS_WORKER_INDEX_LABEL)},
        {"name": Env.INFERENCE_HEAD_ADDRESS, "value": f"$({names.LWS_LEADER_ADDRESS})"},
        {"name": Env.INFERENCE_DP_SIZE, "value": str(shape.servers_per_replica)},
    ]
    if shape.serves(pod):
        if shape.api_servers == ApiServerLayout.LEADER:
            env.append({"name": Env.INFERENCE_DP_START_RANK, "value": "0"})
        elif shape.api_servers_per_pod == 1:
            env.append(
                {
                    "name": Env.INFERENCE_DP_START_RANK,
                    "valueFrom": label(names.LWS_WORKER_INDEX_LABEL),
                }
            )
        env.append(
            {"name": Env.INFERENCE_API_SERVERS_PER_POD, "value": str(shape.api_servers_per_pod)}
        )
    env.append({"name": Env.INFERENCE_DP_RPC_PORT, "value": str(inference.data_parallel_rpc_port)})
    return env


def retention_url(ctx: RunContext) -> str | None:
    if not ctx.by_handle:
        return None
    return f"http://127.0.0.1:{ctx.spec.orchestrator.retention.port}"


def rendezvous_env(ctx: RunContext) -> list[Manifest]:
    """torch.distributed's and torchrun's variables: rank 0 is the master; a pod's rank is its
    Indexed Job completion index. ``RANK``/``WORLD_SIZE`` only with one process per pod (with
    more, torchrun sets them for its workers)."""
    trainer = ctx.spec.trainer
    nodes, procs = str(trainer.replicas), str(trainer.processes_per_node)
    master, port = ctx.host(TRAINER), str(names.TRAINER_DIST_PORT)
    fixed = {
        Env.MASTER_ADDR: master,
        Env.MASTER_PORT: port,
        Env.NNODES: nodes,
        Env.NPROC_PER_NODE: procs,
        Env.PET_MASTER_ADDR: master,
        Env.PET_MASTER_PORT: port,
        Env.PET_NNODES: nodes,
        Env.PET_NPROC_PER_NODE: procs,
    }
    one_process = trainer.processes_per_node == 1
    if one_process:
        fixed[Env.WORLD_SIZE] = nodes
    index = f"metadata.annotations['{names.COMPLETION_INDEX_ANNOTATION}']"
    ranked = [Env.NODE_RANK, Env.PET_NODE_RANK, *([Env.RANK] if one_process else [])]
    return env_list(fixed) + [
        {"name": n, "valueFrom": {"fieldRef": {"fieldPath": index}}} for n in ranked
    ]
