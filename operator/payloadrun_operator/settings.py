"""The operator's own settings, from its environment (the Helm chart sets them)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from payloadrun_operator import __version__

DEFAULT_SIDECAR_IMAGE = f"ghcr.io/payloadrun/payloadrun:{__version__}"
DEFAULT_WRITER_RESOURCES = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"memory": "4Gi"},
}
DEFAULT_RETENTION_RESOURCES = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


class SettingsError(ValueError):
    """An operator environment variable has a value the operator cannot use."""


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise SettingsError(f"{name}={value} is outside [{lo}, {hi}]")
    return value


def _json_object(env: Mapping[str, str], name: str, default: dict[str, Any]) -> dict[str, Any]:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name} is not valid JSON ({exc}): {raw!r}") from None
    if not isinstance(value, dict):
        raise SettingsError(f"{name} must be a JSON object, got {raw!r}")
    return value


@dataclass(frozen=True)
class OperatorSettings:
    sidecar_image: str = DEFAULT_SIDECAR_IMAGE
    sidecar_image_pull_policy: str = "IfNotPresent"
    writer_resources: dict[str, Any] = field(default_factory=lambda: DEFAULT_WRITER_RESOURCES)
    retention_resources: dict[str, Any] = field(default_factory=lambda: DEFAULT_RETENTION_RESOURCES)
    sidecar_uid: int = 65532
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    metrics_port: int = 9400
    health_port: int = 8080
    # Watches end after server_timeout on the server side, and a client-side inactivity timeout
    # reconnects a watch that went silent: kopf's most reported failure is a stalled watch.
    watch_server_timeout: int = 300
    watch_client_timeout: int = 330
    watch_inactivity_timeout: int = 600
    readiness_check_seconds: int = 10

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if env is None else env
        namespaces = tuple(
            ns.strip() for ns in env.get("PAYLOADRUN_NAMESPACES", "").split(",") if ns.strip()
        )
        pull = env.get("PAYLOADRUN_SIDECAR_IMAGE_PULL_POLICY", "IfNotPresent")
        if pull not in ("Always", "IfNotPresent", "Never"):
            raise SettingsError(
                f"PAYLOADRUN_SIDECAR_IMAGE_PULL_POLICY={pull!r}: use Always, IfNotPresent or Never"
            )
        return cls(
            sidecar_image=env.get("PAYLOADRUN_SIDECAR_IMAGE") or DEFAULT_SIDECAR_IMAGE,
            sidecar_image_pull_policy=pull,
            writer_resources=_json_object(
                env, "PAYLOADRUN_WRITER_RESOURCES", DEFAULT_WRITER_RESOURCES
            ),
            retention_resources=_json_object(
                env, "PAYLOADRUN_RETENTION_RESOURCES", DEFAULT_RETENTION_RESOURCES
            ),
            sidecar_uid=_int(env, "PAYLOADRUN_SIDECAR_UID", 65532, 1, 2**31 - 1),
            namespaces=namespaces,
            metrics_port=_int(env, "PAYLOADRUN_METRICS_PORT", 9400, 0, 65535),
            health_port=_int(env, "PAYLOADRUN_HEALTH_PORT", 8080, 0, 65535),
            watch_server_timeout=_int(env, "PAYLOADRUN_WATCH_SERVER_TIMEOUT", 300, 10, 3600),
            watch_client_timeout=_int(env, "PAYLOADRUN_WATCH_CLIENT_TIMEOUT", 330, 10, 3900),
            watch_inactivity_timeout=_int(
                env, "PAYLOADRUN_WATCH_INACTIVITY_TIMEOUT", 600, 10, 7200
            ),
            readiness_check_seconds=_int(env, "PAYLOADRUN_READINESS_CHECK_SECONDS", 10, 1, 3600),
        )
