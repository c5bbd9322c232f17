"""Pure functions from a PayloadRun to the manifests of its children.

Children: the ReadWriteMany claim (unless the run names an existing one), a ConfigMap with the
run's effective settings, and three workloads with their Services:

- inference: a StatefulSet of vLLM pods. By handle, the writer sidecar runs beside vLLM (a native
  sidecar, so it starts first and stops last) and the ``<run>-inference`` Service targets it;
  inline, the Service targets vLLM itself. It serves until the run ends.
- orchestrator: a Job of one pod. By handle, the retention sidecar runs beside it.
- trainer: an Indexed Job, one pod per rank (``<run>-trainer-<rank>`` on its headless Service,
  as a StatefulSet's would be); by handle it mounts the volume read-only. Its completion is the
  run's success.

Both Jobs replace a failed pod (``restartPolicy: Never``, so the failed one and its logs stay)
up to ``spec.failurePolicy.backoffLimit`` times, and never run a replacement beside the pod it
replaces (``podReplacementPolicy: Failed``). Every workload carries the hash of its inputs
(:func:`lifecycle.inputs_hash`) and has pods only while the run is active (``RunContext.active``).
A finished run's ``<run>-cleanup`` Job deletes its payload files (:func:`build_cleanup`).

Every child carries an owner reference to the run (garbage-collected with it), except a managed
claim with the ``Retain`` policy, which outlives the run and is adopted by name when a run of the
same name returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from payloadrun.settings import Env
from payloadrun_operator import lifecycle, names
from payloadrun_operator.decisions import (
    DEFAULT_CLAIM_SIZE,
    ModeDecision,
    claim_name,
    claim_owned_by_run,
    decide_payload_mode,
    manages_claim,
    payload_root,
)
from payloadrun_operator.models import KIND, EnvVar, PayloadRunSpec, Resources
from payloadrun_operator.names import (
    INFERENCE,
    ORCHESTRATOR,
    TRAINER,
    VOLUME_NAME,
)
from payloadrun_operator.settings import OperatorSettings

Manifest = dict[str, Any]


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

    @classmethod
    def of(
        cls,
        meta: Mapping[str, Any],
        spec: PayloadRunSpec,
        settings: OperatorSettings,
        *,
        active: bool = True,
    ) -> RunContext:
        """The context of the run whose ``metadata`` is ``meta`` (its mode decided here)."""
        decision = decide_payload_mode(spec)
        return cls(meta["name"], meta["namespace"], meta["uid"], spec, decision, settings, active)

    @property
    def by_handle(self) -> bool:
        return self.decision.by_handle

    @property
    def root(self) -> str | None:
        return payload_root(self.spec, self.namespace, self.name) if self.by_handle else None

    @property
    def claim(self) -> str | None:
        return claim_name(self.spec, self.name) if self.by_handle else None

    def child_name(self, component: str) -> str:
        return names.child_name(self.name, component)

    def inputs(self, component: str) -> str:
        return lifecycle.inputs_hash(self.spec, component, lifecycle.pin_of(self.settings))


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


def run_env(ctx: RunContext) -> dict[str, str | None]:
    """What every container of the run is told about it (the operator's values win)."""
    return {
        Env.RUN: ctx.name,
        Env.RUN_ID: ctx.uid,
        Env.PAYLOAD_MODE: str(ctx.decision.mode),
        Env.PAYLOAD_ROOT: ctx.root,
    }


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


def retention_url(ctx: RunContext) -> str | None:
    if not ctx.by_handle:
        return None
    return f"http://127.0.0.1:{ctx.spec.orchestrator.retention.port}"


def volume(ctx: RunContext) -> Manifest:
    return {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": ctx.claim}}


def volume_mount(ctx: RunContext, *, read_only: bool) -> Manifest:
    return {
        "name": VOLUME_NAME,
        "mountPath": ctx.spec.payloads.mount_path,
        "readOnly": read_only,
    }


def pod_spec(ctx: RunContext, containers: list[Manifest], sidecars: list[Manifest]) -> Manifest:
    placement = ctx.spec.placement
    spec: Manifest = {"containers": containers}
    if sidecars:
        spec["initContainers"] = sidecars
    if ctx.by_handle:
        spec["volumes"] = [volume(ctx)]
        # The sidecars write and delete as this group; the volume's files stay shared with it.
        spec["securityContext"] = {
            "fsGroup": ctx.settings.sidecar_uid,
            "fsGroupChangePolicy": "OnRootMismatch",
        }
    if placement.node_selector:
        spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        spec["tolerations"] = list(placement.tolerations)
    if placement.service_account_name:
        spec["serviceAccountName"] = placement.service_account_name
    if placement.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s.name} for s in placement.image_pull_secrets]
    return spec


def main_container(
    name: str,
    image: str,
    command: list[str] | None,
    args: list[str],
    env: list[EnvVar],
    res: Resources | None,
    injected: dict[str, str | None],
) -> Manifest:
    container: Manifest = {
        "name": name,
        "image": image,
        "args": list(args),
        "env": user_env(env) + env_list(injected),
        "resources": resources(res),
    }
    if command:
        container["command"] = list(command)
    return container


def http_probe(path: str, port: int, period: int = 10) -> Manifest:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": 5}


def startup_probe(port: int) -> Manifest:
    """A native sidecar is "started" once it answers: only then does the kubelet start the main
    container, so vLLM never takes traffic before its writer serves (and the orchestrator never
    calls a retention sidecar that is not listening). Up to 60 s to start."""
    return {
        "httpGet": {"path": "/healthz", "port": port},
        "periodSeconds": 1,
        "timeoutSeconds": 2,
        "failureThreshold": 60,
    }


# --- children ------------------------------------------------------------------------------------


def build_claim(ctx: RunContext) -> Manifest | None:
    """The managed ReadWriteMany claim, or None when the run brings its own (or is inline)."""
    if not ctx.by_handle or not manages_claim(ctx.spec):
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
        "retentionUrl": retention_url(ctx),
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
        "args": ["writer", *writer.args],
        "env": env_list(
            {
                Env.WRITER_UPSTREAM: f"http://127.0.0.1:{inference.port}",
                Env.WRITER_LISTEN: f"0.0.0.0:{writer.port}",
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
        "startupProbe": startup_probe(writer.port),
        "readinessProbe": http_probe("/readyz", writer.port, period=5),
        "livenessProbe": http_probe("/healthz", writer.port),
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
        "args": ["retention", *retention.args],
        "env": env_list(
            {
                Env.PAYLOAD_ROOT: ctx.root,
                Env.RUN_ID: ctx.uid,
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
        "startupProbe": startup_probe(retention.metrics_port),
        "readinessProbe": http_probe("/readyz", retention.metrics_port, period=5),
        "livenessProbe": http_probe("/healthz", retention.metrics_port),
        "resources": resources(retention.resources, ctx.settings.retention_resources),
        "securityContext": sidecar_security_context(ctx),
        "volumeMounts": [volume_mount(ctx, read_only=False)],
    }


def headless_service(ctx: RunContext, component: str, ports: list[Manifest]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ctx, names.headless_name(ctx.name, component), component),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # peers find each other while starting
            "selector": selector(ctx, component),
            "ports": ports,
        },
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
            "template": {"metadata": {"labels": labels(ctx, component)}, "spec": pod},
        },
    }


def job(ctx: RunContext, component: str, pods: int, pod: Manifest, **spec: Any) -> Manifest:
    """A Job of ``pods`` pods at once that replaces failed ones, one for one, up to the limit."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": workload_metadata(ctx, component),
        "spec": {
            "suspend": not ctx.active,
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": ctx.spec.failure_policy.backoff_limit,
            "podReplacementPolicy": "Failed",
            **spec,
            "template": {
                "metadata": {"labels": labels(ctx, component)},
                "spec": {**pod, "restartPolicy": "Never"},
            },
        },
    }


def build_inference(ctx: RunContext) -> list[Manifest]:
    inference = ctx.spec.inference
    vllm = main_container(
        names.VLLM_CONTAINER,
        inference.image,
        inference.command,
        inference.args,
        inference.env,
        inference.resources,
        {k: v for k, v in run_env(ctx).items() if k != Env.PAYLOAD_ROOT},
    )
    vllm["ports"] = [{"name": names.HTTP_PORT_NAME, "containerPort": inference.port}]
    sidecars = [writer_container(ctx)] if ctx.by_handle else []
    front_port = inference.writer.port if ctx.by_handle else inference.port
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
    return [
        headless_service(ctx, INFERENCE, ports),
        service,
        stateful_set(ctx, INFERENCE, inference.replicas, pod_spec(ctx, [vllm], sidecars)),
    ]


def build_orchestrator(ctx: RunContext) -> list[Manifest]:
    spec = ctx.spec
    orch = spec.orchestrator
    container = main_container(
        names.ORCHESTRATOR_CONTAINER,
        orch.image,
        orch.command,
        orch.args,
        orch.env,
        orch.resources,
        {
            **run_env(ctx),
            Env.INFERENCE_URL: inference_url(ctx),
            Env.RETENTION_URL: retention_url(ctx),
            **step_env(ctx),
        },
    )
    sidecars = [retention_container(ctx)] if ctx.by_handle else []
    # One pod; a replacement only once the failed one has stopped (podReplacementPolicy), since
    # two orchestrators would both drive the retention of one root.
    return [job(ctx, ORCHESTRATOR, 1, pod_spec(ctx, [container], sidecars))]


def build_trainer(ctx: RunContext) -> list[Manifest]:
    trainer = ctx.spec.trainer
    container = main_container(
        names.TRAINER_CONTAINER,
        trainer.image,
        trainer.command,
        trainer.args,
        trainer.env,
        trainer.resources,
        run_env(ctx),
    )
    if ctx.by_handle:
        container["volumeMounts"] = [volume_mount(ctx, read_only=True)]
    port = names.TRAINER_DIST_PORT
    ports = [{"name": names.TRAINER_DIST_PORT_NAME, "port": port, "targetPort": port}]
    pod = pod_spec(ctx, [container], [])
    # <run>-trainer-<rank>.<run>-trainer-headless, as a StatefulSet's pods are named; the rank is
    # also in JOB_COMPLETION_INDEX.
    pod["subdomain"] = names.headless_name(ctx.name, TRAINER)
    return [
        headless_service(ctx, TRAINER, ports),
        job(ctx, TRAINER, trainer.replicas, pod, completionMode="Indexed"),
    ]


def build_children(ctx: RunContext) -> list[Manifest]:
    """Every child, in the order to apply them (the claim before the pods that mount it)."""
    claim = build_claim(ctx)
    return [
        *([claim] if claim else []),
        build_config_map(ctx),
        *build_inference(ctx),
        *build_orchestrator(ctx),
        *build_trainer(ctx),
    ]


CLEANUP_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


def build_cleanup(ctx: RunContext) -> Manifest:
    """The Job that deletes a finished run's payload files (``payloadrun wipe``), as the sidecars'
    user, with the sidecars' image; by handle only."""
    container = {
        "name": names.CLEANUP_CONTAINER,
        "image": ctx.settings.sidecar_image,
        "imagePullPolicy": ctx.settings.sidecar_image_pull_policy,
        "args": ["wipe", "--root", ctx.root, "--json"],
        "env": env_list({Env.LOG_FORMAT: ctx.settings.sidecar_log_format}),
        "resources": CLEANUP_RESOURCES,
        "securityContext": sidecar_security_context(ctx),
        "volumeMounts": [volume_mount(ctx, read_only=False)],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(ctx, ctx.child_name(names.CLEANUP), names.CLEANUP),
        "spec": {
            "backoffLimit": 3,
            "template": {
                "metadata": {"labels": labels(ctx, names.CLEANUP)},
                "spec": {**pod_spec(ctx, [container], []), "restartPolicy": "Never"},
            },
        },
    }
