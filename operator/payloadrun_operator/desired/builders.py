"""Pure functions from a PayloadRun to the manifests of its children.

Children: the ReadWriteMany claim (unless the run names an existing one, or needs none), a
ConfigMap with the run's effective settings, and three workloads with their Services. Each
workload's pods are the role's template (``spec.<role>.template``, a PodTemplateSpec) with the
operator's parts on top (:mod:`templates` has the rules, :func:`common_parts` and the
``*_parts`` functions what is added):

- inference: a StatefulSet of vLLM pods, ``<run>-inference-<i>`` on its headless Service (every
  replica addressable: :func:`env.inference_admin_urls`). By handle, the writer sidecar runs beside
  vLLM (a native sidecar, so it starts first and stops last) and the ``<run>-inference``
  Service targets it; inline, the Service targets vLLM itself. It serves until the run ends.
- orchestrator: an Indexed Job of one pod, ``<run>-orchestrator-0`` on a headless Service with
  the ports its template declares. By handle, the retention sidecar runs beside it.
- trainer: an Indexed Job, one pod per rank (``<run>-trainer-<rank>``), with torchrun's
  rendezvous variables (rank 0 is the master: :func:`env.rendezvous_env`). Any rank's failure fails
  the Job, and the operator restarts all ranks together. Its completion is the run's success.

Every main container gets ``/dev/shm`` (inference and trainers) and the run directory unless
the template has its own; by handle the trainers see the payload root read-only. Both Jobs use
``restartPolicy: Never`` (a failed pod stays, with its logs) and never run a replacement beside
the pod it replaces (``podReplacementPolicy: Failed``). Every workload carries the hash of its
inputs (:func:`pinning.inputs_hash`) and has pods only while the run is active
(``RunContext.active``, :mod:`context`). A finished run's ``<run>-cleanup`` Job deletes its
payload files (:func:`build_cleanup`). The pods' env is :mod:`env`'s, their volumes
:mod:`volumes`', the operator's own containers :mod:`sidecars`'.

Every child carries an owner reference to the run (garbage-collected with it), except a managed
claim with the ``Retain`` policy, which outlives the run and is adopted by name when a run of the
same name returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from payloadrun.settings import Env
from payloadrun_operator.api import names
from payloadrun_operator.api.kinds import LEADER_WORKER_SET
from payloadrun_operator.api.models import (
    KIND,
    ApiServerLayout,
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
from payloadrun_operator.desired import networkpolicy as netpol
from payloadrun_operator.desired.context import WORKER_TEMPLATE_PATH, RunContext
from payloadrun_operator.desired.decisions import (
    DEFAULT_CLAIM_SIZE,
    claim_owned_by_run,
    manages_claim,
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
    cleanup_container,
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
    payload_volume,
    run_directory_mount,
    run_volumes,
    volume_mount,
)

# --- shared pieces -------------------------------------------------------------------------------


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


def owner_reference(ctx: RunContext) -> Manifest:
    return {
        "apiVersion": names.API_VERSION,
        "kind": KIND,
        "name": ctx.name,
        "uid": ctx.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(ctx: RunContext, name: str, component: str, *, owned: bool = True) -> Manifest:
    meta: Manifest = {"name": name, "namespace": ctx.namespace, "labels": labels(ctx, component)}
    if owned:
        meta["ownerReferences"] = [owner_reference(ctx)]
    return meta


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


@dataclass(frozen=True)
class BuiltRun:
    """A run's children as one pass builds them: each pod template composed once, then checked
    (admission), applied (the reconcile), printed (``render``) or taken apart (the trainers'
    Job a restart creates again) from here, never composed again in the same pass.

    ``errors`` are every reason the run cannot be built; with any, there are no children."""

    ctx: RunContext
    pods: Mapping[str, Manifest]  # component -> its pod template (absent: it collided)
    network_policies: tuple[Manifest, ...] = ()
    children: tuple[Manifest, ...] = ()  # every child, in the order to apply them
    errors: tuple[str, ...] = ()

    def workload(self, component: str) -> Manifest:
        """``component``'s StatefulSet, LeaderWorkerSet or Job."""
        kind, name = workload_of(self.ctx, component)
        (found,) = [c for c in self.children if c["kind"] == kind and c["metadata"]["name"] == name]
        return found


def workload_of(ctx: RunContext, component: str) -> tuple[str, str]:
    """The kind and name of ``component``'s workload: a StatefulSet or a Job named
    ``<run>-<component>``, except a group run's inference: its LeaderWorkerSet, ``<run>-vllm``."""
    workloads = names.run_workloads(ctx.name, ctx.spec.inference.pods_per_replica)
    (found,) = [
        (kind, name)
        for (_, kind, name), (_, _, c) in zip(workloads, names.WORKLOADS, strict=True)
        if c == component
    ]
    return found


def build_run(ctx: RunContext) -> BuiltRun:
    """The run's children, or every reason they cannot be built (template collisions, fsGroups
    that disagree, a run directory on the payload volume's path)."""
    pods, conflicts = compose_pods(ctx)
    errors = rule_errors(ctx) + conflicts
    if errors:
        return BuiltRun(ctx, pods, errors=tuple(errors))
    policies = tuple(build_network_policies(ctx))
    return BuiltRun(ctx, pods, policies, tuple(assemble(ctx, pods, policies)))


def run_errors(ctx: RunContext) -> list[str]:
    """Every reason the run's pods cannot be built: template collisions, fsGroups that disagree,
    a run directory on the payload volume's path (the checks that need the payload mode)."""
    return list(build_run(ctx).errors)


def service_ports(pod: Manifest, extra: list[Manifest] = ()) -> list[Manifest]:  # type: ignore[assignment]
    """Service ports for the ports the pod's containers declare (the sidecars' excluded), after
    ``extra``; unnamed ones get ``port-<number>``."""
    ports = list(extra)
    seen = {(p["port"], p.get("protocol", "TCP")) for p in ports}
    for container in pod["spec"].get("containers") or []:
        for port in container.get("ports") or []:
            key = (port["containerPort"], port.get("protocol", "TCP"))
            if key in seen:
                continue
            seen.add(key)
            protocol = port.get("protocol", "TCP")
            unnamed = f"port-{port['containerPort']}" + (
                "" if protocol == "TCP" else "-" + protocol
            )
            entry = {
                "name": port.get("name") or unnamed.lower(),
                "port": port["containerPort"],
                "targetPort": port["containerPort"],
            }
            if port.get("protocol", "TCP") != "TCP":
                entry["protocol"] = port["protocol"]
            ports.append(entry)
    return ports


# --- children ------------------------------------------------------------------------------------


def build_claim(ctx: RunContext) -> Manifest | None:
    """The managed ReadWriteMany claim, or None when the run brings its own (or needs none)."""
    if ctx.claim is None or not manages_claim(ctx.spec):
        return None
    vol = ctx.spec.payloads.volume
    spec: Manifest = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": str(vol.size or DEFAULT_CLAIM_SIZE)}},
    }
    if vol.storage_class_name:
        spec["storageClassName"] = vol.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(ctx, ctx.claim, names.PAYLOADS, owned=claim_owned_by_run(ctx.spec)),
        "spec": spec,
    }


def effective_settings(ctx: RunContext) -> dict[str, str]:
    spec = ctx.spec
    values = {
        "payloadMode": str(ctx.decision.mode),
        "payloadModeReason": ctx.decision.reason,
        "payloadModeMessage": ctx.decision.message,
        "payloadRoot": ctx.root,
        "claimName": ctx.claim,
        "runId": ctx.uid,
        "resume": str(spec.resume).lower(),
        "maxOffPolicySteps": str(spec.max_off_policy_steps),
        "maxSteps": None if spec.max_steps is None else str(spec.max_steps),
        "routerReplay": str(spec.router_replay).lower(),
        "samplingMaskCapture": str(spec.sampling_mask_capture).lower(),
        "inferenceUrl": inference_url(ctx),
        "inferenceAdminUrls": inference_admin_urls(ctx),
        "inferenceWorldSize": inference_world_size(ctx),
        "retentionUrl": retention_url(ctx),
        "orchestratorHost": ctx.host(ORCHESTRATOR),
        "trainerHost": ctx.host(TRAINER),
        "runDirectory": spec.run_directory.mount_path if spec.run_directory else None,
    }
    return {k: v for k, v in values.items() if v is not None}


def build_config_map(ctx: RunContext) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(ctx, ctx.child_name(names.SETTINGS), names.SETTINGS),
        "data": effective_settings(ctx),
    }


def headless_service(ctx: RunContext, component: str, ports: list[Manifest]) -> Manifest:
    spec: Manifest = {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,  # peers find each other while starting
        "selector": selector(ctx, component),
    }
    if ports:
        spec["ports"] = ports
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ctx, names.headless_name(ctx.name, component), component),
        "spec": spec,
    }


def workload_metadata(ctx: RunContext, component: str) -> Manifest:
    meta = metadata(ctx, ctx.child_name(component), component)
    meta["annotations"] = {names.INPUTS_ANNOTATION: ctx.inputs(component)}
    return meta


def stateful_set(ctx: RunContext, component: str, replicas: int, pod: Manifest) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": workload_metadata(ctx, component),
        "spec": {
            "replicas": replicas if ctx.active else 0,
            "serviceName": names.headless_name(ctx.name, component),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(ctx, component)},
            "template": pod,
        },
    }


def job(ctx: RunContext, component: str, pods: int, pod: Manifest, backoff_limit: int) -> Manifest:
    """An Indexed Job of ``pods`` pods at once (pod ``i`` is ``<job>-<i>`` on the component's
    headless Service); a failed pod is replaced (once it has stopped) up to ``backoff_limit``
    times."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": workload_metadata(ctx, component),
        "spec": {
            "suspend": not ctx.active,
            "completions": pods,
            "parallelism": pods,
            "completionMode": "Indexed",
            "backoffLimit": backoff_limit,
            "podReplacementPolicy": "Failed",
            "template": pod,
        },
    }


def inference_service_port(ctx: RunContext) -> int:
    """The inference Service's port, on the pods too: the writer's by handle, vLLM's inline."""
    inference = ctx.spec.inference
    return inference.writer.port if ctx.by_handle else inference.port


def build_inference(
    ctx: RunContext, pod: Manifest, worker: Manifest | None = None
) -> list[Manifest]:
    """The inference Services and workload around ``pod`` (its composed template): a
    StatefulSet, or for a group run a LeaderWorkerSet whose leaders run ``pod`` and workers
    ``worker``."""
    inference = ctx.spec.inference
    front_port = inference_service_port(ctx)
    ports = [{"name": names.HTTP_PORT_NAME, "port": front_port, "targetPort": front_port}]
    if ctx.by_handle:
        ports.append(
            {
                "name": names.WRITER_METRICS_PORT_NAME,
                "port": inference.writer.metrics_port,
                "targetPort": inference.writer.metrics_port,
            }
        )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ctx, ctx.child_name(INFERENCE), INFERENCE),
        "spec": {"selector": inference_service_selector(ctx), "ports": ports},
    }
    if ctx.inference_shape.groups:
        # Each pod's DNS name comes from LWS's own headless Service, <run>-vllm (its pods'
        # subdomain), which LWS creates; a second one would give them none.
        assert worker is not None
        return [service, leader_worker_set(ctx, pod, worker)]
    # The headless Service names each replica (the admin URLs); by handle it also lists vLLM's
    # own port, which the admin calls use.
    vllm = [{"name": names.VLLM_PORT_NAME, "port": inference.port, "targetPort": inference.port}]
    return [
        headless_service(ctx, INFERENCE, ports + (vllm if ctx.by_handle else [])),
        service,
        stateful_set(ctx, INFERENCE, inference.replicas, pod),
    ]


def inference_service_selector(ctx: RunContext) -> dict[str, str]:
    """The pods the load-balanced Service reaches: every inference pod that serves (in the
    ``Leader`` layout a group's leaders only, which LWS labels worker-index 0)."""
    selected = selector(ctx, INFERENCE)
    shape = ctx.inference_shape
    if shape.groups and shape.api_servers == ApiServerLayout.LEADER:
        selected[names.LWS_WORKER_INDEX_LABEL] = "0"
    return selected


# LeaderWorkerSet's group semantics for a run's replicas (docs/operator.md#multi-node-replicas):
# - RecreateGroupOnPodRestart: a restarted container or a lost pod anywhere in a group
#   recreates the whole group (a vLLM rank that comes back alone would join collectives its
#   peers have left), and the other replicas keep serving. The writer sidecar's restarts count
#   too (LWS reads init containers' restart counts): accepted, since the writer no longer
#   restarts on volume trouble (it answers inline, its readiness does not read the volume),
#   so a writer restart means its process died, and a group restart is LWS's one mechanism
#   for vLLM's own failures anyway (None would leave a hung group to the operator).
# - LeaderCreated: workers are created with their leader, not once it is ready: vLLM's head is
#   ready only after its workers joined (LeaderReady would never start them).
GROUP_RESTART_POLICY = "RecreateGroupOnPodRestart"
GROUP_STARTUP_POLICY = "LeaderCreated"


def leader_worker_set(ctx: RunContext, leader: Manifest, worker: Manifest) -> Manifest:
    """The run's LeaderWorkerSet, ``<run>-vllm``: ``replicas`` groups of ``podsPerReplica``
    pods. Its labels are the run's inference labels (the operator's watches find it by them;
    LWS v0.10.0 copies them onto the StatefulSets it makes, which also carry
    ``leaderworkerset.sigs.k8s.io/name``); its pods carry the run's pod labels, so the Services
    and network policies select them as they select a StatefulSet's."""
    inference = ctx.spec.inference
    meta = metadata(ctx, names.inference_groups_name(ctx.name), INFERENCE)
    meta["annotations"] = {names.INPUTS_ANNOTATION: ctx.inputs(INFERENCE)}
    return {
        "apiVersion": LEADER_WORKER_SET.api_version,
        "kind": LEADER_WORKER_SET.kind,
        "metadata": meta,
        "spec": {
            "replicas": inference.replicas if ctx.active else 0,
            "startupPolicy": GROUP_STARTUP_POLICY,
            "networkConfig": {"subdomainPolicy": "Shared"},  # <run>-vllm names every pod
            "leaderWorkerTemplate": {
                "size": inference.pods_per_replica,
                "restartPolicy": GROUP_RESTART_POLICY,
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def build_orchestrator(ctx: RunContext, pod: Manifest) -> list[Manifest]:
    """The orchestrator's headless Service and Job around ``pod`` (its composed template)."""
    # One pod, <run>-orchestrator-0 on its headless Service (the ports its template declares);
    # a replacement only once the failed one has stopped (podReplacementPolicy), since two
    # orchestrators would both drive the retention of one root.
    backoff = ctx.spec.failure_policy.backoff_limit
    return [
        headless_service(ctx, ORCHESTRATOR, service_ports(pod)),
        job(ctx, ORCHESTRATOR, 1, pod, backoff),
    ]


def build_trainer(ctx: RunContext, pod: Manifest) -> list[Manifest]:
    """The trainers' headless Service and Job around ``pod`` (its composed template)."""
    trainer = ctx.spec.trainer
    port = names.TRAINER_DIST_PORT
    dist = [{"name": names.TRAINER_DIST_PORT_NAME, "port": port, "targetPort": port}]
    # Any rank's failure fails the Job (backoffLimit 0): the operator then restarts every rank
    # together (readiness.py), as JobSet and LeaderWorkerSet do, since a replacement rank alone
    # would join a group whose collective hangs.
    # (A run started before pod layout 2 keeps a Job that replaces ranks one by one.)
    backoff = 0 if ctx.layout.restarts_trainers_together else ctx.spec.failure_policy.backoff_limit
    return [
        headless_service(ctx, TRAINER, service_ports(pod, dist)),
        job(ctx, TRAINER, trainer.replicas, pod, backoff_limit=backoff),
    ]


def build_network_policies(ctx: RunContext) -> list[Manifest]:
    """The run's NetworkPolicies (:mod:`networkpolicy`), unless the operator makes none."""
    if not ctx.settings.network_policies:
        return []
    inference, retention = ctx.spec.inference, ctx.spec.orchestrator.retention
    scrapers = list(ctx.settings.metrics_scrapers)
    clients = netpol.unique(
        [*ctx.settings.inference_clients, *(peer.manifest() for peer in inference.clients)]
    )
    rules = {
        INFERENCE: netpol.inference_rules(
            ctx.name,
            service_port=inference_service_port(ctx),
            writer_metrics_port=inference.writer.metrics_port if ctx.by_handle else None,
            clients=clients,
            scrapers=scrapers,
        ),
        ORCHESTRATOR: netpol.orchestrator_rules(
            ctx.name,
            retention_metrics_port=retention.metrics_port if ctx.by_handle else None,
            scrapers=scrapers,
        ),
        TRAINER: netpol.trainer_rules(ctx.name),
    }
    return [
        netpol.network_policy(
            ctx.name, ctx.namespace, c, labels(ctx, c), owner_reference(ctx), component_rules
        )
        for c, component_rules in rules.items()
    ]


def assemble(
    ctx: RunContext, pods: Mapping[str, Manifest], policies: tuple[Manifest, ...]
) -> list[Manifest]:
    """Every child around the composed ``pods``, in the order to apply them (the claim before
    the pods that mount it; the network policies before the pods they admit traffic to)."""
    claim = build_claim(ctx)
    return [
        *([claim] if claim else []),
        build_config_map(ctx),
        *policies,
        *build_inference(ctx, pods[INFERENCE], pods.get(INFERENCE_WORKER)),
        *build_orchestrator(ctx, pods[ORCHESTRATOR]),
        *build_trainer(ctx, pods[TRAINER]),
    ]


def build_children(ctx: RunContext) -> list[Manifest]:
    """Every child, in the order to apply them (:func:`assemble`), for a context built outside
    admission (tests, tools); the operator and ``render`` take :attr:`BuiltRun.children`.

    Raises :class:`TemplateConflict` when a template collides (see :func:`run_errors`)."""
    pods, conflicts = compose_pods(ctx)
    if conflicts:
        raise TemplateConflict(conflicts)
    return assemble(ctx, pods, tuple(build_network_policies(ctx)))


def build_cleanup(ctx: RunContext) -> Manifest:
    """The Job that deletes a finished run's payload files (``payloadrun wipe``), as the sidecars'
    user, with the sidecars' image; by handle only."""
    pod: Manifest = {
        "containers": [cleanup_container(ctx)],
        "volumes": [payload_volume(ctx)],
        "restartPolicy": "Never",
        **{k: v for k, v in placement(ctx).items() if k != "serviceAccountName"},
    }
    group = fs_group(ctx)
    if group is not None:
        pod["securityContext"] = {"fsGroup": group, "fsGroupChangePolicy": "OnRootMismatch"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(ctx, ctx.child_name(names.CLEANUP), names.CLEANUP),
        "spec": {
            "backoffLimit": 3,
            "template": {"metadata": {"labels": labels(ctx, names.CLEANUP)}, "spec": pod},
        },
    }
