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

from pydantic import ValidationError

from payloadrun import settings
from payloadrun.settings import SettingsError, parse_bool, parse_int, setting
from payloadrun.version import __release__
from payloadrun_operator.api import validation
from payloadrun_operator.api.models import NetworkPolicyPeer

DEFAULT_SIDECAR_IMAGE = f"ghcr.io/payloadrun/payloadrun:{__release__}"
DEFAULT_WRITER_RESOURCES = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"memory": "4Gi"},
}
DEFAULT_RETENTION_RESOURCES = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
# Prometheus as the Prometheus Operator runs it (the chart's PodMonitor), in any namespace.
DEFAULT_METRICS_SCRAPERS: tuple[dict[str, Any], ...] = (
    {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    },
)

__all__ = ["DEFAULT_SIDECAR_IMAGE", "OperatorSettings", "SettingsError"]


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    return value


def _peers(raw: str) -> tuple[dict[str, Any], ...]:
    """A JSON list of NetworkPolicy peers, each checked as a run's spec.inference.clients are."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    example = (
        '[{"namespaceSelector": {}, "podSelector": {"matchLabels": '
        '{"app.kubernetes.io/name": "prometheus"}}}]'
    )
    if not isinstance(value, list):
        raise ValueError(f"must be a JSON list of NetworkPolicy peers, e.g. {example}")
    peers = []
    for i, peer in enumerate(value):
        try:
            peers.append(NetworkPolicyPeer.model_validate(peer).manifest())
        except ValidationError as exc:
            problems = "; ".join(validation.messages(exc, prefix="", where="the peer"))
            raise ValueError(
                f"peer {i} ({json.dumps(peer)}) is not a NetworkPolicy peer of "
                f"podSelector/namespaceSelector/ipBlock ({problems}), e.g. {example}"
            ) from None
    return tuple(peers)


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
    network_policies: bool = setting(
        True,
        help="NetworkPolicies for every run: its pods reach each other, outsiders only the "
        "metrics ports (scrapers) and the inference Service (clients); off for CNIs that "
        "enforce none",
        env="PAYLOADRUN_NETWORK_POLICIES",
        parse=parse_bool,
    )
    metrics_scrapers: tuple[dict[str, Any], ...] = setting(
        DEFAULT_METRICS_SCRAPERS,
        help="who may scrape the sidecars' metrics ports: a JSON list of NetworkPolicy peers",
        env="PAYLOADRUN_METRICS_SCRAPERS",
        parse=_peers,
    )
    inference_clients: tuple[dict[str, Any], ...] = setting(
        (),
        help="who may call every run's inference Service port (beside each run's "
        "spec.inference.clients): a JSON list of NetworkPolicy peers",
        env="PAYLOADRUN_INFERENCE_CLIENTS",
        parse=_peers,
    )
    apply_retry_seconds: int = _seconds(
        "PAYLOADRUN_APPLY_RETRY_SECONDS", 15, 1, 3600, "retry a refused child after this long"
    )
    # Status follows watch events on the children; this resync only repairs a missed one.
    resync_seconds: int = _seconds(
        "PAYLOADRUN_RESYNC_SECONDS", 300, 10, 86400, "how often every run's status is recomputed"
    )
    # Leader election on a Lease (election.py): one active operator, the others standing by.
    leader_election: bool = setting(
        True,
        help="elect one active operator on a Lease (off: this process acts at once, alone)",
        env="PAYLOADRUN_LEADER_ELECTION",
        parse=parse_bool,
    )
    lease_name: str = setting(
        "payloadrun-operator", help="the election's Lease", env="PAYLOADRUN_LEASE_NAME"
    )
    lease_namespace: str = setting(
        "",
        help="the Lease's namespace; empty: the pod's own, else the first watched namespace, "
        "else default",
        env="PAYLOADRUN_LEASE_NAMESPACE",
    )
    lease_duration_seconds: int = _seconds(
        "PAYLOADRUN_LEASE_DURATION_SECONDS", 15, 3, 600, "how long a lease lasts unrenewed"
    )
    lease_renew_deadline_seconds: int = _seconds(
        "PAYLOADRUN_LEASE_RENEW_DEADLINE_SECONDS", 10, 2, 599, "a leader gives up after this"
    )
    lease_retry_seconds: int = _seconds(
        "PAYLOADRUN_LEASE_RETRY_SECONDS", 2, 1, 300, "how often the Lease is renewed or tried"
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
        if not (
            self.lease_retry_seconds
            < self.lease_renew_deadline_seconds
            < self.lease_duration_seconds
        ):
            raise SettingsError(
                "PAYLOADRUN_LEASE_RETRY_SECONDS < PAYLOADRUN_LEASE_RENEW_DEADLINE_SECONDS < "
                "PAYLOADRUN_LEASE_DURATION_SECONDS must hold (a leader must give up before a "
                f"standby may take over), got {self.lease_retry_seconds}, "
                f"{self.lease_renew_deadline_seconds} and {self.lease_duration_seconds}"
            )

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, args: argparse.Namespace | None = None
    ) -> OperatorSettings:
        """The settings the environment sets (an empty variable means its default); a flag
        in ``args`` (the few settings that have one, such as ``--log-format``) wins."""
        env = os.environ if env is None else env
        return settings.from_args(cls, args, {k: v for k, v in env.items() if v != ""})
