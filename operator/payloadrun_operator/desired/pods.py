"""Pure functions from a PayloadRun to its pods: each role's pod template with the operator's
parts on top, composed once (:func:`compose_pods`), and the rules no single template shows
(:func:`rule_errors`). :mod:`builders` makes the children (the workloads that hold these pods,
their Services, the claim, the ConfigMap) around them.

What each role's pods get (:func:`common_parts` and the ``*_parts`` functions; :mod:`templates`
has the rules of the composition): every main container ``/dev/shm`` (inference and trainers)
and the run directory unless the template has its own; by handle the writer sidecar beside vLLM
(a native sidecar, so it starts first and stops last), the retention sidecar beside the
orchestrator, and the payload root read-only for the trainers, with torchrun's rendezvous
variables (rank 0 is the master: :func:`env.rendezvous_env`). The pods' env is :mod:`env`'s,
their volumes :mod:`volumes`', the operator's own containers :mod:`sidecars`'.
"""

from __future__ import annotations

from typing import Any

from payloadrun.settings import Env
from payloadrun_operator.api import names
from payloadrun_operator.api.models import (
    Inference,
    Orchestrator,
    PayloadAccess,
    Trainer,
)
from payloadrun_operator.api.names import (
    INFERENCE,
    ORCHESTRATOR,
    TRAINER,
    VOLUME_NAME,
)
from payloadrun_operator.desired.context import WORKER_TEMPLATE_PATH, RunContext
from payloadrun_operator.desired.decisions import (
    run_dir_on_payload_volume,
)
from payloadrun_operator.desired.env import (
    env_list,
    group_env,
    identity_env,
    inference_admin_urls,
    inference_url,
    inference_world_size,
    main_env,
    rendezvous_env,
    retention_url,
    run_env,
    step_env,
    user_env,
)
from payloadrun_operator.desired.shape import LEADER, SINGLE, WORKER, port_errors
from payloadrun_operator.desired.sidecars import (
    resources,
    retention_container,
    writer_container,
)
from payloadrun_operator.desired.templates import (
    Manifest,
    Parts,
    TemplateConflict,
    compose,
    read_only_overlays,
    run_fs_group,
    with_overlays,
)
from payloadrun_operator.desired.volumes import (
    run_directory_mount,
    run_volumes,
    volume_mount,
)

# --- the pods' labels -------------------------------------------------------------------------


def labels(ctx: RunContext, component: str) -> dict[str, str]:
    return {
        names.LABEL_NAME: names.APP,
        names.LABEL_INSTANCE: ctx.name,
        names.LABEL_COMPONENT: component,
        names.LABEL_MANAGED_BY: names.FIELD_MANAGER,
        names.LABEL_RUN: ctx.name,
    }


def selector(ctx: RunContext, component: str) -> dict[str, str]:
    return {names.LABEL_RUN: ctx.name, names.LABEL_COMPONENT: component}


# --- pod templates -------------------------------------------------------------------------------


def short_fields(role: Inference | Orchestrator | Trainer) -> Manifest:
    """The short fields of a role that are set, as container fields (an empty list is unset)."""
    fields: Manifest = {}
    if role.image:
        fields["image"] = role.image
    if role.command:
        fields["command"] = list(role.command)
    if role.args:
        fields["args"] = list(role.args)
    if role.resources is not None:
        fields["resources"] = resources(role.resources)
    return fields


def placement(ctx: RunContext) -> Manifest:
    """spec.placement as pod spec fields (the templates merge with it)."""
    place = ctx.spec.placement
    fields: Manifest = {}
    if place.node_selector:
        fields["nodeSelector"] = dict(place.node_selector)
    if place.tolerations:
        fields["tolerations"] = list(place.tolerations)
    if place.service_account_name:
        fields["serviceAccountName"] = place.service_account_name
    if place.image_pull_secrets:
        fields["imagePullSecrets"] = [{"name": s.name} for s in place.image_pull_secrets]
    return fields


def fs_group(ctx: RunContext) -> int | None:
    """The run's fsGroup, by handle (the sidecars write as this group): see run_fs_group."""
    if not ctx.by_handle:
        return None
    return run_fs_group(ctx.template_sources(), ctx.settings.sidecar_uid)[0]


# A StatefulSet's pods restart in place; a Job's are replaced (and counted) instead.
RESTART_POLICY = {INFERENCE: "Always", ORCHESTRATOR: "Never", TRAINER: "Never"}


def common_parts(ctx: RunContext, component: str) -> dict[str, Any]:
    """What the operator adds to every role's pods (the fields of :class:`Parts` they share)."""
    role = getattr(ctx.spec, component)
    run_dir_mount = run_directory_mount(ctx)
    payloads = ctx.by_handle or run_dir_on_payload_volume(ctx.spec)
    return {
        "role": component,
        "short": short_fields(role),
        "short_env": tuple(user_env(role.env)),
        "identity": tuple(env_list(identity_env(ctx))),
        "mounts": (run_dir_mount,) if run_dir_mount else (),
        "volumes": tuple(run_volumes(ctx, payloads=payloads)),
        "labels": labels(ctx, component),
        "placement": placement(ctx),
        "fs_group": fs_group(ctx),
        "pod": {
            "subdomain": names.headless_name(ctx.name, component),
            "restartPolicy": RESTART_POLICY[component],
        },
        # the pods' DNS names are their hostnames, which the StatefulSet or Job gives them
        "pod_unset": ("hostname",),
    }


def writer_ports(ctx: RunContext) -> dict[int, str]:
    """The writer's ports, by the field that sets each (by handle: inline runs have no writer)."""
    writer = ctx.spec.inference.writer
    if not ctx.by_handle:
        return {}
    return {
        writer.port: "spec.inference.writer.port",
        writer.metrics_port: "spec.inference.writer.metricsPort",
    }


def inference_parts(ctx: RunContext, pod: str = SINGLE) -> Parts:
    """What the operator adds to an inference pod: ``pod`` is the StatefulSet's one pod
    (SINGLE), or a LeaderWorkerSet group's LEADER or WORKER template. A pod that serves (every
    pod but a worker in the ``Leader`` layout) declares its API servers' ports and, by handle,
    has the writer in front of them, with the payload volume."""
    inference, writer = ctx.spec.inference, ctx.spec.inference.writer
    shape = ctx.inference_shape
    serves = shape.serves(pod)
    by_handle = ctx.by_handle and serves
    env = main_env(ctx, env_list({k: v for k, v in run_env(ctx).items() if k != Env.PAYLOAD_ROOT}))
    common = common_parts(ctx, INFERENCE)
    if pod != SINGLE:
        env = (*env, *group_env(ctx, pod))
        common["volumes"] = tuple(
            run_volumes(ctx, payloads=by_handle or run_dir_on_payload_volume(ctx.spec))
        )
        common["pod"] = {**common["pod"], "subdomain": names.inference_groups_name(ctx.name)}
        uses = f"LeaderWorkerSet (the pods of {names.inference_groups_name(ctx.name)})"
        extra: dict[str, Any] = {
            "pod_names": "<run>-vllm-<replica> and <run>-vllm-<replica>-<pod>",
            "refused_env": {name: "LeaderWorkerSet's pod webhook" for name in names.LWS_ENV},
            "refused_label_prefixes": {names.LWS_LABEL_PREFIX: uses},
        }
        if pod == WORKER and inference.worker_template is not None:
            extra["template_path"] = WORKER_TEMPLATE_PATH
    else:
        extra = {}
    ports = tuple(
        {"name": shape.port_name(d), "containerPort": port} for d, port in enumerate(shape.ports)
    )
    reserved = {writer.port: "writer sidecar", writer.metrics_port: "writer sidecar's metrics"}
    return Parts(
        main=names.VLLM_CONTAINER,
        env=env,
        ports=ports if serves else (),
        sidecars=(writer_container(ctx),) if by_handle else (),
        shm=True,
        shm_size=None if inference.shm_size is None else str(inference.shm_size),
        reserved_ports=reserved if by_handle else {},
        **common,
        **extra,
    )


def orchestrator_parts(ctx: RunContext) -> Parts:
    retention = ctx.spec.orchestrator.retention
    env = {
        **run_env(ctx),
        Env.INFERENCE_URL: inference_url(ctx),
        Env.INFERENCE_ADMIN_URLS: inference_admin_urls(ctx),
        Env.INFERENCE_WORLD_SIZE: inference_world_size(ctx),
        Env.RETENTION_URL: retention_url(ctx),
        Env.TRAINER_HOST: ctx.host(TRAINER),
        **step_env(ctx),
    }
    reserved = {
        retention.port: "retention sidecar",
        retention.metrics_port: "retention sidecar's metrics",
    }
    return Parts(
        main=names.ORCHESTRATOR_CONTAINER,
        env=main_env(ctx, env_list(env)),
        sidecars=(retention_container(ctx),) if ctx.by_handle else (),
        reserved_ports=reserved if ctx.by_handle else {},
        **common_parts(ctx, ORCHESTRATOR),
    )


def trainer_parts(ctx: RunContext) -> Parts:
    trainer = ctx.spec.trainer
    common = common_parts(ctx, TRAINER)
    if ctx.by_handle and not run_dir_on_payload_volume(ctx.spec):  # else: the run directory's
        read_only = trainer.payload_access is PayloadAccess.READ_ONLY
        common["mounts"] = (*common["mounts"], volume_mount(ctx, read_only=read_only))
    return Parts(
        main=names.TRAINER_CONTAINER,
        env=main_env(
            ctx,
            env_list({**run_env(ctx), Env.INFERENCE_WORLD_SIZE: inference_world_size(ctx)})
            + rendezvous_env(ctx),
        ),
        ports=({"name": names.TRAINER_DIST_PORT_NAME, "containerPort": names.TRAINER_DIST_PORT},),
        shm=True,
        shm_size=None if trainer.shm_size is None else str(trainer.shm_size),
        **common,
    )


ROLE_PARTS = {INFERENCE: inference_parts, ORCHESTRATOR: orchestrator_parts, TRAINER: trainer_parts}
# The key of a group run's worker template in BuiltRun.pods (its leader's is INFERENCE's).
INFERENCE_WORKER = "inference-worker"


def pod_template(ctx: RunContext, component: str) -> Manifest:
    """``component``'s pod template (a group run's inference: its leader's, and
    INFERENCE_WORKER its workers'); raises :class:`TemplateConflict` on a collision."""
    if component == INFERENCE_WORKER:
        inference = ctx.spec.inference
        template = inference.worker_template or inference.template
        return compose(template, inference_parts(ctx, WORKER))
    if component == INFERENCE and ctx.inference_shape.groups:
        return compose(ctx.spec.inference.template, inference_parts(ctx, LEADER))
    parts = ROLE_PARTS[component](ctx)
    template = ctx.templates()[component]
    pod = compose(template, parts)
    read_only = ctx.spec.trainer.payload_access is PayloadAccess.READ_ONLY
    if component == TRAINER and ctx.by_handle and read_only:
        overlays, errors = read_only_overlays(
            pod["spec"], ctx.claim or "", VOLUME_NAME, ctx.payload_mount_path, ctx.root or ""
        )
        if errors:
            raise TemplateConflict([f"spec.trainer.template: {e}" for e in errors])
        pod["spec"] = with_overlays(pod["spec"], overlays)
    return pod


COMPONENTS = (INFERENCE, ORCHESTRATOR, TRAINER)


def pod_keys(ctx: RunContext) -> tuple[str, ...]:
    """The pod templates a run has: one per role, and a group run's workers'."""
    if ctx.inference_shape.groups:
        return (INFERENCE, INFERENCE_WORKER, ORCHESTRATOR, TRAINER)
    return COMPONENTS


def compose_pods(ctx: RunContext) -> tuple[dict[str, Manifest], list[str]]:
    """Each pod template, composed once, and every collision of every template (a template that
    collides has no entry here). A group's workers that use the leader's template can repeat
    its collisions: each is said once."""
    pods: dict[str, Manifest] = {}
    errors: list[str] = []
    for key in pod_keys(ctx):
        try:
            pods[key] = pod_template(ctx, key)
        except TemplateConflict as conflict:
            errors += [e for e in conflict.errors if e not in errors]
    return pods, errors


def rule_errors(ctx: RunContext) -> list[str]:
    """The reasons a run's pods cannot be built that no single template shows: fsGroups that
    disagree, a run directory on the payload volume's path (checks that need the payload mode)."""
    errors = []
    run_dir = ctx.spec.run_directory
    if (
        ctx.by_handle
        and run_dir is not None
        and run_dir.claim_name is not None
        and run_dir.mount_path == ctx.payload_mount_path
    ):
        errors.append(
            f"spec.runDirectory.mountPath {run_dir.mount_path} is where the payload volume is "
            "mounted: choose another path, or drop spec.runDirectory.claimName to make the "
            "payload volume the run directory"
        )
    if ctx.by_handle or ctx.spec.run_directory is not None:  # pods that share a volume
        errors += run_fs_group(ctx.template_sources(), ctx.settings.sidecar_uid)[1]
    inference = ctx.spec.inference
    errors += port_errors(ctx.inference_shape, writer_ports(ctx), inference.data_parallel_rpc_port)
    return errors
