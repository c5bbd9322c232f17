"""The operator's own settings, from its environment (the Helm chart sets them).

Declared the way the sidecars declare theirs (:func:`payloadrun.settings.setting`): each field
names its environment variable, parser and bounds, and ``__post_init__`` validates them.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from payloadrun import settings
from payloadrun.settings import SettingsError, parse_int, setting
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
PULL_POLICIES = ("Always", "IfNotPresent", "Never")

__all__ = ["DEFAULT_SIDECAR_IMAGE", "OperatorSettings", "SettingsError"]


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    return value


def _names(raw: str) -> tuple[str, ...]:
    return tuple(ns.strip() for ns in raw.split(",") if ns.strip())


def _seconds(name: str, default: int, lo: int, hi: int, help: str) -> Any:
    return setting(default, help=help, env=name, parse=parse_int, minimum=lo, maximum=hi)


@dataclass(frozen=True)
class OperatorSettings:
    sidecar_image: str = setting(
        DEFAULT_SIDECAR_IMAGE, help="image of both sidecars", env="PAYLOADRUN_SIDECAR_IMAGE"
    )
    sidecar_image_pull_policy: str = setting(
        "IfNotPresent",
        help="the sidecars' imagePullPolicy",
        env="PAYLOADRUN_SIDECAR_IMAGE_PULL_POLICY",
        choices=PULL_POLICIES,
    )
    writer_resources: dict[str, Any] = setting(
        DEFAULT_WRITER_RESOURCES,
        help="the writer's resources, JSON",
        env="PAYLOADRUN_WRITER_RESOURCES",
        parse=_json_object,
    )
    retention_resources: dict[str, Any] = setting(
        DEFAULT_RETENTION_RESOURCES,
        help="the retention sidecar's resources, JSON",
        env="PAYLOADRUN_RETENTION_RESOURCES",
        parse=_json_object,
    )
    sidecar_uid: int = setting(
        65532,
        help="the sidecars' user and the pods' fsGroup",
        env="PAYLOADRUN_SIDECAR_UID",
        parse=parse_int,
        minimum=1,
        maximum=2**31 - 1,
    )
    namespaces: tuple[str, ...] = setting(
        (),
        help="namespaces to watch, comma-separated; empty: all",
        env="PAYLOADRUN_NAMESPACES",
        parse=_names,
    )
    metrics_port: int = settings.port(
        9400, help="Prometheus /metrics, 0 for none", env="PAYLOADRUN_METRICS_PORT"
    )
    health_port: int = settings.port(
        8080, help="liveness /healthz, 0 for none", env="PAYLOADRUN_HEALTH_PORT"
    )
    # Watches end after server_timeout on the server side, and a client-side inactivity timeout
    # reconnects a watch that went silent: kopf's most reported failure is a stalled watch.
    watch_server_timeout: int = _seconds(
        "PAYLOADRUN_WATCH_SERVER_TIMEOUT", 300, 10, 3600, "server-side watch timeout"
    )
    watch_client_timeout: int = _seconds(
        "PAYLOADRUN_WATCH_CLIENT_TIMEOUT", 330, 10, 3900, "client-side watch timeout"
    )
    watch_inactivity_timeout: int = _seconds(
        "PAYLOADRUN_WATCH_INACTIVITY_TIMEOUT", 600, 10, 7200, "reconnect a silent watch"
    )
    readiness_check_seconds: int = _seconds(
        "PAYLOADRUN_READINESS_CHECK_SECONDS", 10, 1, 3600, "how often readiness is checked"
    )
    # The operator's own lines; plain (kopf's text lines) unless the chart or --log-format says.
    log_format: str = settings.log_format()
    # The sidecars run in a cluster, where log pipelines (Fluent Bit, Vector, Loki, Cloud
    # Logging) parse one JSON object per line: json unless the chart says otherwise. A run's
    # writer.args or retention.args (--log-format plain) overrides it for one run.
    sidecar_log_format: str = setting(
        "json",
        help="the sidecars' log format (injected as PAYLOADRUN_LOG_FORMAT)",
        env="PAYLOADRUN_SIDECAR_LOG_FORMAT",
        choices=settings.LOG_FORMATS,
    )

    def __post_init__(self) -> None:
        settings.validate(self)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, args: argparse.Namespace | None = None
    ) -> OperatorSettings:
        """The settings the environment sets (an empty variable means its default); a flag
        in ``args`` (the few settings that have one, such as ``--log-format``) wins."""
        env = os.environ if env is None else env
        return settings.from_args(cls, args, {k: v for k, v in env.items() if v != ""})
