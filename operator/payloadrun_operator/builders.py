"""Pure functions from a PayloadRun to the manifests of its children.

Children: the ReadWriteMany claim (unless the run names an existing one, or needs none), a
ConfigMap with the run's effective settings, and three workloads with their Services. Each
workload's pods are the role's template (``spec.<role>.template``, a PodTemplateSpec) with the
operator's parts on top (:mod:`templates` has the rules, :func:`common_parts` and the
``*_parts`` functions what is added):

- inference: a StatefulSet of vLLM pods, ``<run>-inference-<i>`` on its headless Service (every
  replica addressable: :func:`inference_admin_urls`). By handle, the writer sidecar runs beside
  vLLM (a native sidecar, so it starts first and stops last) and the ``<run>-inference``
  Service targets it; inline, the Service targets vLLM itself. It serves until the run ends.
- orchestrator: an Indexed Job of one pod, ``<run>-orchestrator-0`` on a headless Service with
  the ports its template declares. By handle, the retention sidecar runs beside it.
- trainer: an Indexed Job, one pod per rank (``<run>-trainer-<rank>``), with torchrun's
  rendezvous variables (rank 0 is the master: :func:`rendezvous_env`). Any rank's failure fails
  the Job, and the operator restarts all ranks together. Its completion is the run's success.

Every main container gets ``/dev/shm`` (inference and trainers) and the run directory unless
the template has its own; by handle the trainers see the payload root read-only. Both Jobs use
``restartPolicy: Never`` (a failed pod stays, with its logs) and never run a replacement beside
the pod it replaces (``podReplacementPolicy: Failed``). Every workload carries the hash of its
inputs (:func:`lifecycle.inputs_hash`) and has pods only while the run is active
(``RunContext.active``). A finished run's ``<run>-cleanup`` Job deletes its payload files
(:func:`build_cleanup`).

Every child carries an owner reference to the run (garbage-collected with it), except a managed
claim with the ``Retain`` policy, which outlives the run and is adopted by name when a run of the
same name returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from payloadrun import serving, wipe
from payloadrun.retention import config as retention_config
from payloadrun.settings import Env
from payloadrun.writer import config as writer_config
from payloadrun_operator import lifecycle, names
from payloadrun_operator import networkpolicy as netpol
from payloadrun_operator.decisions import (
    DEFAULT_CLAIM_SIZE,
    ModeDecision,
    claim_name,
    claim_owned_by_run,
    decide_payload_mode,
    manages_claim,
    needs_payload_volume,
    payload_mount_path,
    payload_root,
    run_dir_on_payload_volume,
)
from payloadrun_operator.models import (
    KIND,
    EnvVar,
    Inference,
    Orchestrator,
    PayloadAccess,
    PayloadRunSpec,
    Resources,
    Trainer,
)
from payloadrun_operator.names import (
    INFERENCE,
    ORCHESTRATOR,
    TRAINER,
    VOLUME_NAME,
)
from payloadrun_operator.settings import OperatorSettings
from payloadrun_operator.templates import (
    Manifest,
    Parts,
    TemplateConflict,
    compose,
    read_only_overlays,
    run_fs_group,
    with_overlays,
)


@dataclass(frozen=True)
class RunContext:
    """Everything the builders need: the run's identity, spec, mode and the operator settings."""

    name: str
    namespace: str
    uid: str
    spec: PayloadRunSpec
    decision: ModeDecision
    settings: OperatorSettings  # with the run's pinned sidecar settings (lifecycle.pinned_settings)
    active: bool = True  # whether the workloads have pods (not suspended, not finished)
    layout: int = lifecycle.POD_LAYOUT  # the pod layout the run was started with

    @classmethod
    def of(
        cls,
        meta: Mapping[str, Any],
        spec: PayloadRunSpec,
        settings: OperatorSettings,
        *,
        active: bool = True,
        layout: int = lifecycle.POD_LAYOUT,
    ) -> RunContext:
        """The context of the run whose ``metadata`` is ``meta`` (its mode decided here)."""
        decision = decide_payload_mode(spec)
        return cls(
            meta["name"], meta["namespace"], meta["uid"], spec, decision, settings, active, layout
        )

    @property
    def by_handle(self) -> bool:
        return self.decision.by_handle

    @property
    def root(self) -> str | None:
        return payload_root(self.spec, self.namespace, self.name) if self.by_handle else None

    @property
    def claim(self) -> str | None:
        """The payload volume's claim, when a pod mounts it (by handle, or as the run
        directory)."""
        if not needs_payload_volume(self.spec, self.by_handle):
            return None
        return claim_name(self.spec, self.name)

    @property
    def payload_mount_path(self) -> str:
        return payload_mount_path(self.spec)

    def child_name(self, component: str) -> str:
        return names.child_name(self.name, component)

    def host(self, component: str, index: int = 0) -> str:
        """The DNS name of a pod of the run: ``<run>-<component>-<index>.<headless>.<ns>.svc``."""
        return names.pod_host(self.name, self.namespace, component, index)

    def templates(self) -> dict[str, dict[str, Any] | None]:
        spec = self.spec
        return {
            INFERENCE: spec.inference.template,
            ORCHESTRATOR: spec.orchestrator.template,
            TRAINER: spec.trainer.template,
        }

    def inputs(self, component: str) -> str:
        pin = {**lifecycle.pin_of(self.settings), "podLayout": self.layout}
        return lifecycle.inputs_hash(self.spec, component, pin)


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


def env_list(values: dict[str, str | None]) -> list[Manifest]:
    return [{"name": k, "value": v} for k, v in values.items() if v is not None]


def user_env(env: list[EnvVar]) -> list[Manifest]:
    return [e.model_dump(by_alias=True, exclude_none=True) for e in env]


def resources(res: Resources | None, default: dict[str, Any] | None = None) -> Manifest:
    if res is None:
        return dict(default or {})
    return res.model_dump(by_alias=True, exclude_none=True)


def sidecar_security_context(ctx: RunContext) -> Manifest:
    """The sidecars' and the cleanup Job's container: Pod Security's ``restricted`` level on
    its own, whatever the pod's template sets (every field is the container's), plus a
    read-only root filesystem. tests/integration/test_pod_security.py has the API server admit
    it, and refuse it with any one field less."""
    uid = ctx.settings.sidecar_uid
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# --- what the pods learn -------------------------------------------------------------------------


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
    if ctx.layout >= 2:
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
    """Every inference replica's own vLLM, ``http://<pod DNS name>:<port>/v1``, space-separated.

    Admin calls (pause, weight updates, resume, NCCL setup, metrics) must reach every replica,
    not one behind the load-balanced Service, and they go to vLLM itself, not through the writer:
    they carry no payloads, the writer's health must not block a weight update, and the same
    addresses then serve an inline run. Space-separated, as prime-rl's SLURM template passes
    them: ``--model.client.admin-base-url $PAYLOADRUN_INFERENCE_ADMIN_URLS`` in a shell command
    gives one argument per replica."""
    port = ctx.spec.inference.port
    return " ".join(
        f"http://{ctx.host(INFERENCE, i)}:{port}/v1" for i in range(ctx.spec.inference.replicas)
    )


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


# --- volumes -------------------------------------------------------------------------------------


def payload_volume(ctx: RunContext) -> Manifest:
    return {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": ctx.claim}}


def volume_mount(ctx: RunContext, *, read_only: bool) -> Manifest:
    return {"name": VOLUME_NAME, "mountPath": ctx.payload_mount_path, "readOnly": read_only}


def run_directory_volume(ctx: RunContext) -> Manifest | None:
    """The run directory's own claim (none when it is the payload volume, or there is none)."""
    run_dir = ctx.spec.run_directory
    if run_dir is None or run_dir.claim_name is None:
        return None
    return {
        "name": names.RUN_DIRECTORY_VOLUME,
        "persistentVolumeClaim": {"claimName": run_dir.claim_name},
    }


def run_directory_mount(ctx: RunContext) -> Manifest | None:
    run_dir = ctx.spec.run_directory
    if run_dir is None:
        return None
    volume = VOLUME_NAME if run_dir.claim_name is None else names.RUN_DIRECTORY_VOLUME
    return {"name": volume, "mountPath": run_dir.mount_path}


def run_volumes(ctx: RunContext, *, payloads: bool) -> list[Manifest]:
    """The claims a role's pods mount: the payload volume where they use it, the run
    directory's own claim."""
    volumes = [payload_volume(ctx)] if payloads and ctx.claim else []
    own = run_directory_volume(ctx)
    return [*volumes, *([own] if own else [])]


def http_probe(path: str, port: int, period: int = 10) -> Manifest:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": 5}


def sidecar_probes(port: int) -> Manifest:
    """A sidecar's probes, on the paths every sidecar serves (:mod:`payloadrun.serving`)."""
    return {
        "startupProbe": startup_probe(port),
        "readinessProbe": http_probe(serving.READY_PATH, port, period=5),
        "livenessProbe": http_probe(serving.HEALTH_PATH, port),
    }


def startup_probe(port: int) -> Manifest:
    """A native sidecar is "started" once it answers: only then does the kubelet start the main
    container, so vLLM never takes traffic before its writer serves (and the orchestrator never
    calls a retention sidecar that is not listening). Up to 60 s to start."""
    return {
        "httpGet": {"path": serving.HEALTH_PATH, "port": port},
        "periodSeconds": 1,
        "timeoutSeconds": 2,
        "failureThreshold": 60,
    }


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
    return run_fs_group(ctx.templates(), ctx.settings.sidecar_uid)[0]


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


def inference_parts(ctx: RunContext) -> Parts:
    inference, writer = ctx.spec.inference, ctx.spec.inference.writer
    by_handle = ctx.by_handle
    return Parts(
        main=names.VLLM_CONTAINER,
        env=main_env(
            ctx, env_list({k: v for k, v in run_env(ctx).items() if k != Env.PAYLOAD_ROOT})
        ),
        ports=({"name": names.HTTP_PORT_NAME, "containerPort": inference.port},),
        sidecars=(writer_container(ctx),) if by_handle else (),
        shm=True,
        shm_size=None if inference.shm_size is None else str(inference.shm_size),
        reserved_ports=(
            {writer.port: "writer sidecar", writer.metrics_port: "writer sidecar's metrics"}
            if by_handle
            else {}
        ),
        **common_parts(ctx, INFERENCE),
    )


def orchestrator_parts(ctx: RunContext) -> Parts:
    retention = ctx.spec.orchestrator.retention
    env = {
        **run_env(ctx),
        Env.INFERENCE_URL: inference_url(ctx),
        Env.INFERENCE_ADMIN_URLS: inference_admin_urls(ctx),
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
        env=main_env(ctx, env_list(run_env(ctx)) + rendezvous_env(ctx)),
        ports=({"name": names.TRAINER_DIST_PORT_NAME, "containerPort": names.TRAINER_DIST_PORT},),
        shm=True,
        shm_size=None if trainer.shm_size is None else str(trainer.shm_size),
        **common,
    )


ROLE_PARTS = {INFERENCE: inference_parts, ORCHESTRATOR: orchestrator_parts, TRAINER: trainer_parts}


def pod_template(ctx: RunContext, component: str) -> Manifest:
    """``component``'s pod template; raises :class:`TemplateConflict` on a collision."""
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


def compose_pods(ctx: RunContext) -> tuple[dict[str, Manifest], list[str]]:
    """Each role's pod template, composed once, and every collision of every role (a role that
    collides has no template here)."""
    pods: dict[str, Manifest] = {}
    errors: list[str] = []
    for component in COMPONENTS:
        try:
            pods[component] = pod_template(ctx, component)
        except TemplateConflict as conflict:
            errors += conflict.errors
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
        errors += run_fs_group(ctx.templates(), ctx.settings.sidecar_uid)[1]
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
        """``component``'s StatefulSet or Job."""
        name = self.ctx.child_name(component)
        (found,) = [
            c
            for c in self.children
            if c["kind"] in ("StatefulSet", "Job") and c["metadata"]["name"] == name
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


def writer_container(ctx: RunContext) -> Manifest:
    inference = ctx.spec.inference
    writer = inference.writer
    return {
        "name": names.WRITER_CONTAINER,
        "image": writer.image or ctx.settings.sidecar_image,
        "imagePullPolicy": ctx.settings.sidecar_image_pull_policy,
        "restartPolicy": "Always",  # a native sidecar: up before vLLM, down after it
        "args": [writer_config.COMMAND, *writer.args],
        "env": env_list(
            {
                **identity_env(ctx),
                Env.WRITER_UPSTREAM: f"http://127.0.0.1:{inference.port}",
                Env.WRITER_HOST: "0.0.0.0",
                Env.WRITER_PORT: str(writer.port),
                Env.WRITER_METRICS_HOST: "0.0.0.0",
                Env.WRITER_METRICS_PORT: str(writer.metrics_port),
                Env.PAYLOAD_ROOT: ctx.root,
                Env.LOG_FORMAT: ctx.settings.sidecar_log_format,
            }
        ),
        "ports": [
            {"name": names.WRITER_PORT_NAME, "containerPort": writer.port},
            {"name": names.WRITER_METRICS_PORT_NAME, "containerPort": writer.metrics_port},
        ],
        **sidecar_probes(writer.port),
        "resources": resources(writer.resources, ctx.settings.writer_resources),
        "securityContext": sidecar_security_context(ctx),
        "volumeMounts": [volume_mount(ctx, read_only=False)],
    }


def retention_container(ctx: RunContext) -> Manifest:
    spec = ctx.spec
    retention = spec.orchestrator.retention
    return {
        "name": names.RETENTION_CONTAINER,
        "image": retention.image or ctx.settings.sidecar_image,
        "imagePullPolicy": ctx.settings.sidecar_image_pull_policy,
        "restartPolicy": "Always",
        "args": [retention_config.COMMAND, *retention.args],
        "env": env_list(
            {
                **identity_env(ctx),
                Env.PAYLOAD_ROOT: ctx.root,
                Env.RESUME: str(spec.resume).lower(),
                **step_env(ctx),
                Env.RETENTION_PORT: str(retention.port),
                Env.RETENTION_METRICS_PORT: str(retention.metrics_port),
                Env.RETENTION_WORKERS: str(retention.workers),
                Env.RETENTION_SCAN_INTERVAL: str(retention.scan_interval_seconds),
                Env.LOG_FORMAT: ctx.settings.sidecar_log_format,
            }
        ),
        "ports": [
            {"name": names.RETENTION_METRICS_PORT_NAME, "containerPort": retention.metrics_port}
        ],
        # The API listens on the pod's loopback only, so the kubelet probes the metrics port.
        **sidecar_probes(retention.metrics_port),
        "resources": resources(retention.resources, ctx.settings.retention_resources),
        "securityContext": sidecar_security_context(ctx),
        "volumeMounts": [volume_mount(ctx, read_only=False)],
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


def build_inference(ctx: RunContext, pod: Manifest) -> list[Manifest]:
    """The inference Services and StatefulSet around ``pod`` (its composed template)."""
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
        "spec": {"selector": selector(ctx, INFERENCE), "ports": ports},
    }
    # The headless Service names each replica (the admin URLs); by handle it also lists vLLM's
    # own port, which the admin calls use.
    vllm = [{"name": names.VLLM_PORT_NAME, "port": inference.port, "targetPort": inference.port}]
    return [
        headless_service(ctx, INFERENCE, ports + (vllm if ctx.by_handle else [])),
        service,
        stateful_set(ctx, INFERENCE, inference.replicas, pod),
    ]


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
    backoff = 0 if ctx.layout >= 2 else ctx.spec.failure_policy.backoff_limit
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
        *build_inference(ctx, pods[INFERENCE]),
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


CLEANUP_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


def build_cleanup(ctx: RunContext) -> Manifest:
    """The Job that deletes a finished run's payload files (``payloadrun wipe``), as the sidecars'
    user, with the sidecars' image; by handle only."""
    container = {
        "name": names.CLEANUP_CONTAINER,
        "image": ctx.settings.sidecar_image,
        "imagePullPolicy": ctx.settings.sidecar_image_pull_policy,
        "args": wipe.command_line(ctx.root),
        "env": env_list({**identity_env(ctx), Env.LOG_FORMAT: ctx.settings.sidecar_log_format}),
        "resources": CLEANUP_RESOURCES,
        "securityContext": sidecar_security_context(ctx),
        "volumeMounts": [volume_mount(ctx, read_only=False)],
    }
    pod: Manifest = {
        "containers": [container],
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
