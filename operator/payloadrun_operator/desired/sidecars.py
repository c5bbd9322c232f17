"""The operator's own containers in a run's pods: the writer beside vLLM, the retention sidecar
beside the orchestrator (native sidecars, by handle only) and the cleanup Job's container. One
shape for all three (:func:`sidecar_container`): the sidecars' image and user, Pod Security's
``restricted`` level, the run's identity and log format, the payload volume."""

from __future__ import annotations

import copy
from typing import Any

from payloadrun import serving, wipe
from payloadrun.retention import config as retention_config
from payloadrun.settings import Env
from payloadrun.writer import config as writer_config
from payloadrun_operator.api import names
from payloadrun_operator.api.models import Resources
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.env import env_list, identity_env, step_env
from payloadrun_operator.desired.shape import upstreams
from payloadrun_operator.desired.templates import Manifest
from payloadrun_operator.desired.volumes import volume_mount


def resources(res: Resources | None, default: dict[str, Any] | None = None) -> Manifest:
    if res is None:  # a copy of its own: pods of one run do not share the settings' dicts
        return copy.deepcopy(dict(default or {}))
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


def http_probe(path: str, port: int, period: int = 10) -> Manifest:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": 5}


def sidecar_probes(port: int) -> Manifest:
    """A sidecar's probes, on the paths every sidecar serves (:mod:`payloadrun.serving`)."""
    return {
        "startupProbe": startup_probe(port),
        "readinessProbe": readiness_probe(port),
        "livenessProbe": http_probe(serving.HEALTH_PATH, port),
    }


def readiness_probe(port: int) -> Manifest:
    """Probed every second: the writer's ``/readyz`` answers 200 once vLLM's ``/health`` does,
    and vLLM starts only after the writer (its startup probe), so the pod joins its Service
    within a second of vLLM answering (a 5 s period left up to 5 s between). Unready after the
    same 15 s of failures as before (3 failures 5 s apart)."""
    return {**http_probe(serving.READY_PATH, port, period=1), "failureThreshold": 15}


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


def sidecar_container(
    ctx: RunContext,
    name: str,
    *,
    args: list[str],
    env: dict[str, str | None],
    resources: Manifest,
    image: str | None = None,
    ports: list[Manifest] | None = None,
    probe_port: int | None = None,
) -> Manifest:
    """One of the operator's own containers: the sidecars' image (unless the run names one) and
    user (:func:`sidecar_security_context`), the run's identity, then ``env``, then the log
    format, and the payload volume, read-write.

    With ``probe_port`` it is a native sidecar (``restartPolicy: Always``: up before the main
    container, down after it), probed on that port (:func:`sidecar_probes`); without, a plain
    container (the cleanup Job's)."""
    settings = ctx.settings
    container: Manifest = {
        "name": name,
        "image": image or settings.sidecar_image,
        "imagePullPolicy": settings.sidecar_image_pull_policy,
    }
    if probe_port is not None:
        container["restartPolicy"] = "Always"
    container["args"] = args
    container["env"] = env_list(
        {**identity_env(ctx), **env, Env.LOG_FORMAT: settings.sidecar_log_format}
    )
    if ports:
        container["ports"] = ports
    if probe_port is not None:
        container.update(sidecar_probes(probe_port))
    container["resources"] = resources
    container["securityContext"] = sidecar_security_context(ctx)
    container["volumeMounts"] = [volume_mount(ctx, read_only=False)]
    return container


def writer_container(ctx: RunContext) -> Manifest:
    """The writer, beside vLLM: it takes the inference Service's traffic and writes payloads.
    One per pod that serves, in front of every API server of its pod (its upstreams)."""
    inference = ctx.spec.inference
    writer = inference.writer
    return sidecar_container(
        ctx,
        names.WRITER_CONTAINER,
        image=writer.image,
        args=[writer_config.COMMAND, *writer.args],
        env={
            Env.WRITER_UPSTREAM: upstreams(ctx.inference_shape),
            Env.WRITER_HOST: "0.0.0.0",
            Env.WRITER_PORT: str(writer.port),
            Env.WRITER_METRICS_HOST: "0.0.0.0",
            Env.WRITER_METRICS_PORT: str(writer.metrics_port),
            Env.PAYLOAD_ROOT: ctx.root,
        },
        ports=[
            {"name": names.WRITER_PORT_NAME, "containerPort": writer.port},
            {"name": names.WRITER_METRICS_PORT_NAME, "containerPort": writer.metrics_port},
        ],
        probe_port=writer.port,
        resources=resources(writer.resources, ctx.settings.writer_resources),
    )


def retention_container(ctx: RunContext) -> Manifest:
    """The retention sidecar, beside the orchestrator: it deletes payloads the run is done with."""
    spec = ctx.spec
    retention = spec.orchestrator.retention
    return sidecar_container(
        ctx,
        names.RETENTION_CONTAINER,
        image=retention.image,
        args=[retention_config.COMMAND, *retention.args],
        env={
            Env.PAYLOAD_ROOT: ctx.root,
            Env.RESUME: str(spec.resume).lower(),
            **step_env(ctx),
            Env.RETENTION_PORT: str(retention.port),
            Env.RETENTION_METRICS_PORT: str(retention.metrics_port),
            Env.RETENTION_WORKERS: str(retention.workers),
            Env.RETENTION_SCAN_INTERVAL: str(retention.scan_interval_seconds),
        },
        ports=[
            {"name": names.RETENTION_METRICS_PORT_NAME, "containerPort": retention.metrics_port}
        ],
        # The API listens on the pod's loopback only, so the kubelet probes the metrics port.
        probe_port=retention.metrics_port,
        resources=resources(retention.resources, ctx.settings.retention_resources),
    )


CLEANUP_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


def cleanup_container(ctx: RunContext) -> Manifest:
    """The cleanup Job's container: ``payloadrun wipe`` of the run's payload root."""
    return sidecar_container(
        ctx,
        names.CLEANUP_CONTAINER,
        args=wipe.command_line(ctx.root),
        env={},
        resources=CLEANUP_RESOURCES,
    )
