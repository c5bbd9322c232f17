"""Pure functions from a PayloadRun to the manifests of its children.

Children: the ReadWriteMany claim (unless the run names an existing one, or needs none), a
ConfigMap with the run's effective settings, and three workloads with their Services. Each
workload's pods are the role's template (``spec.<role>.template``, a PodTemplateSpec) with the
operator's parts on top, composed once by :mod:`pods`:

- inference: a StatefulSet of vLLM pods, ``<run>-inference-<i>`` on its headless Service (every
  replica addressable: :func:`env.inference_admin_urls`). By handle, the writer sidecar runs beside
  vLLM (a native sidecar, so it starts first and stops last) and the ``<run>-inference``
  Service targets it; inline, the Service targets vLLM itself. It serves until the run ends.
- orchestrator: an Indexed Job of one pod, ``<run>-orchestrator-0`` on a headless Service with
  the ports its template declares. By handle, the retention sidecar runs beside it.
- trainer: an Indexed Job, one pod per rank (``<run>-trainer-<rank>``), with torchrun's
  rendezvous variables (rank 0 is the master: :func:`env.rendezvous_env`). Any rank's failure fails
  the Job, and the operator restarts all ranks together. Its completion is the run's success.

Both Jobs use ``restartPolicy: Never`` (a failed pod stays, with its logs) and never run a
replacement beside the pod it replaces (``podReplacementPolicy: Failed``). Every workload carries
the hash of its inputs (:func:`pinning.inputs_hash`) and has pods only while the run is active
(``RunContext.active``, :mod:`context`). A finished run's ``<run>-cleanup`` Job deletes its
payload files (:func:`cleanup.build_cleanup`).

Every child carries an owner reference to the run (garbage-collected with it), except a managed
claim with the ``Retain`` policy, which outlives the run and is adopted by name when a run of the
same name returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from payloadrun_operator.api import names
from payloadrun_operator.api.kinds import (
    CLAIM,
    CONFIG_MAP,
    JOB,
    LEADER_WORKER_SET,
    SERVICE,
    STATEFUL_SET,
)
from payloadrun_operator.api.models import KIND, ApiServerLayout
from payloadrun_operator.api.names import INFERENCE, ORCHESTRATOR, TRAINER
from payloadrun_operator.desired import networkpolicy as netpol
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.decisions import (
    DEFAULT_CLAIM_SIZE,
    claim_owned_by_run,
    manages_claim,
)
from payloadrun_operator.desired.env import (
    inference_admin_urls,
    inference_url,
    inference_world_size,
    retention_url,
)
from payloadrun_operator.desired.pods import (
    INFERENCE_WORKER,
    compose_pods,
    labels,
    rule_errors,
    selector,
)
from payloadrun_operator.desired.templates import Manifest, TemplateConflict

# --- shared pieces -------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class BuiltRun:
    """A run's children as one pass builds them: each pod template composed once, then checked
    (admission), applied (the reconcile), printed (``render``) or taken apart (the trainers'
    Job a restart creates again) from here, never composed again in the same pass.

    ``children``: every child, in the order to apply them; ``workloads``: those of them that
    hold pods, by component (:func:`workload_of`, decided once, when it is built). ``errors`` are
    every reason the run cannot be built; with any, there are no children."""

    ctx: RunContext
    pods: Mapping[str, Manifest]  # component -> its pod template (absent: it collided)
    network_policies: tuple[Manifest, ...] = ()
    children: tuple[Manifest, ...] = ()  # every child, in the order to apply them
    errors: tuple[str, ...] = ()
    workloads: Mapping[str, Manifest] = field(default_factory=dict)

    def workload(self, component: str) -> Manifest:
        """``component``'s StatefulSet, LeaderWorkerSet or Job."""
        return self.workloads[component]

    def is_workload(self, child: Manifest) -> bool:
        """Whether ``child`` is one of the run's workloads."""
        return any(child is workload for workload in self.workloads.values())

    def with_children(self, children: Iterable[Manifest]) -> BuiltRun:
        """The same run with ``children`` in place of its own (the same children, changed: a
        queued run's placed where Kueue admitted it), its workloads found among them again."""
        return built_run(self.ctx, self.pods, self.network_policies, tuple(children))


def built_run(
    ctx: RunContext,
    pods: Mapping[str, Manifest],
    policies: tuple[Manifest, ...],
    children: tuple[Manifest, ...],
) -> BuiltRun:
    """A :class:`BuiltRun` of ``children``, its workloads among them by kind and name."""
    names_of = {workload_of(ctx, component): component for _, _, component in names.WORKLOADS}
    workloads = {
        names_of[key]: child
        for child in children
        if (key := (child["kind"], child["metadata"]["name"])) in names_of
    }
    return BuiltRun(ctx, pods, policies, children, workloads=workloads)


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
    return built_run(ctx, pods, policies, tuple(assemble(ctx, pods, policies)))


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
        **CLAIM.type_meta,
        "metadata": metadata(ctx, ctx.claim, names.PAYLOADS, owned=claim_owned_by_run(ctx.spec)),
        "spec": spec,
    }


def effective_settings(ctx: RunContext) -> dict[str, str]:
    spec = ctx.spec
    values = {
        "payloadMode": str(ctx.decision.mode),
        "payloadModeReason": str(ctx.decision.reason),
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
        **CONFIG_MAP.type_meta,
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
        **SERVICE.type_meta,
        "metadata": metadata(ctx, names.headless_name(ctx.name, component), component),
        "spec": spec,
    }


def workload_metadata(ctx: RunContext, component: str) -> Manifest:
    meta = metadata(ctx, ctx.child_name(component), component)
    meta["annotations"] = {names.INPUTS_ANNOTATION: ctx.inputs(component)}
    return meta


def stateful_set(ctx: RunContext, component: str, replicas: int, pod: Manifest) -> Manifest:
    return {
        **STATEFUL_SET.type_meta,
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
        **JOB.type_meta,
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
        **SERVICE.type_meta,
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
    # together (restarts.py), as JobSet and LeaderWorkerSet do, since a replacement rank alone
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
