"""``payloadrun-operator``: run the operator (kopf) with its metrics and health endpoints;
``payloadrun-operator render``: print what it would create for a PayloadRun file (:mod:`render`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import textwrap
import threading
from pathlib import Path

import kopf

from payloadrun import logs, settings
from payloadrun.helptext import HelpFormatter
from payloadrun.serving import Listener, ListenError, metrics_app
from payloadrun.settings import env_of
from payloadrun.version import add_version_flag
from payloadrun_operator import render
from payloadrun_operator.handlers import QuietWatchHandlers, register
from payloadrun_operator.platform import credentials, election, heap
from payloadrun_operator.platform.health import Endpoints, Health, health_app
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings, SettingsError


def shown_default(value: object) -> str:
    """A setting's default as its variable would be written: JSON for lists and objects,
    comma-separated names, true/false, "empty" for an empty string or list."""
    if value in ("", ()):
        return "empty"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    if isinstance(value, dict | tuple | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def settings_help(width: int = 78) -> str:
    """Every environment variable the operator reads, with its default and what it does, made
    from :class:`OperatorSettings` (so the list is the settings, not a copy of them)."""
    lines = ["settings (environment variables; the chart's values set them):"]
    for f in dataclasses.fields(OperatorSettings):
        s = f.metadata["setting"]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        flag = f" (also {s.flag})" if s.flag else ""
        choices = f"; one of {', '.join(s.choices)}" if s.choices else ""
        lines.append(f"  {s.env}{flag}")
        lines.append(
            textwrap.fill(
                f"{s.help}{choices} (default: {shown_default(default)})",
                width,
                initial_indent="      ",
                subsequent_indent="      ",
                break_on_hyphens=False,
                break_long_words=False,
            )
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="payloadrun-operator",
        description="Reconcile PayloadRun resources: the shared payload volume, the payload mode, "
        "the inference/orchestrator/trainer workloads and their sidecars. Credentials come from "
        "the pod's service account, else from KUBECONFIG. Settings come from the environment "
        "variables listed below (docs/operator.md, Settings). `payloadrun-operator render -f "
        "RUN.yaml` prints what it would create for a PayloadRun, without a cluster.",
        epilog=settings_help(),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable); default: "
        f"{env_of(OperatorSettings, 'namespaces')}, else all",
    )
    parser.add_argument(
        "--host",
        default="0.0.0.0",
        help="address of the metrics and liveness endpoints (use 127.0.0.1 outside a pod)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every API call")
    settings.add_arguments(parser, OperatorSettings)  # --log-format
    add_version_flag(parser)
    commands = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        help="without one, run the operator; render: what it would create, offline",
    )
    render.register(commands)
    return parser


def operator_identity() -> str:
    """Who this operator process is, for kopf (its peering and logs).

    kopf's default asks ``getpass.getuser()``, which raises ``KeyError`` for a uid without a
    passwd entry, such as the image's 65532: every pod of the chart crash-looped at start.
    """
    return f"payloadrun-operator@{socket.gethostname()}/{os.getpid()}"


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
log = logging.getLogger("payloadrun.operator")


def lease_namespace(config: OperatorSettings, namespaces: tuple[str, ...]) -> str:
    """Where the election's Lease lives: as set, else the pod's own namespace, else the first
    watched one (an operator outside a pod), else ``default``."""
    if config.lease_namespace:
        return config.lease_namespace
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return namespaces[0] if namespaces else "default"


def login() -> kopf.ConnectionInfo | None:
    """The credentials kopf's login handler uses (handlers.py), for the election's own calls."""
    how = {"logger": log, "settings": kopf.OperatorSettings()}
    return kopf.login_with_service_account(**how) or credentials.login_with_kubeconfig(**how)


def elector_of(
    config: OperatorSettings, namespaces: tuple[str, ...], identity: str
) -> election.Elector:
    timing = election.Timing(
        config.lease_duration_seconds,
        config.lease_renew_deadline_seconds,
        config.lease_retry_seconds,
    )
    api = election.LeaseApi(login, lease_namespace(config, namespaces), config.lease_name)
    return election.Elector(api, identity, timing)


def lost(why: str) -> None:
    """A leader that cannot renew stops at once, before any standby can take over (client-go's
    managers exit too): the next start campaigns again from scratch."""
    log.error("leader election lost: %s; exiting so that no two operators act", why)
    logging.shutdown()
    os._exit(1)


def listeners(host: str, config: OperatorSettings, op: Operator, health: Health) -> list[Listener]:
    """The operator's metrics and liveness endpoints, each unless its port is 0."""
    found = []
    if config.metrics_port:
        found.append(
            Listener(
                "metrics",
                metrics_app(op.metrics.registry),
                host,
                config.metrics_port,
                f"{env_of(OperatorSettings, 'metrics_port')} (0 turns metrics off)",
            )
        )
    if config.health_port:
        found.append(
            Listener(
                "liveness",
                health_app(health),
                host,
                config.health_port,
                f"{env_of(OperatorSettings, 'health_port')} (0 turns /healthz off)",
            )
        )
    return found


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "render":
        return render.run(args)
    try:
        config = OperatorSettings.from_env(args=args)
    except SettingsError as exc:
        print(f"payloadrun-operator: {exc}", file=sys.stderr)
        return 2
    namespaces = tuple(args.namespace) or config.namespaces

    # kopf's handler and levels; with json, the one shape of every payloadrun process
    # (payloadrun.logs: kopf's own JSON keys plus the logger's name).
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.FULL, log_prefix=True)
    if config.log_format != "plain":
        logs.use_format(config.log_format)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").addFilter(QuietWatchHandlers())
    op = Operator(config, KubeClient(), OperatorMetrics(), namespaces)
    registry = kopf.OperatorRegistry()
    register(registry, op)
    identity = operator_identity()
    heartbeat = op.heartbeat
    health = Health(heartbeat)
    try:
        endpoints = Endpoints(listeners(args.host, config, op, health)).start()
    except ListenError as exc:
        print(f"payloadrun-operator: {exc.strerror}", file=sys.stderr)
        return 2
    elector = None
    stop = threading.Event()
    if config.leader_election:
        elector = elector_of(config, namespaces, identity)
        # a standby told to stop stops (kopf installs its own handlers once it runs)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        if not elector.acquire(stop):
            return 0
        threading.Thread(
            target=elector.keep, args=(stop, heartbeat, lost), name="lease-renewal", daemon=True
        ).start()
    op.metrics.leader.set(1)  # acting: the Lease's holder, or alone without an election
    heap.settle()
    health.role = "leader" if elector else "alone"
    try:
        kopf.run(
            registry=registry,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            identity=identity,
        )
    finally:
        stop.set()
        op.metrics.leader.set(0)
        endpoints.stop()
        if elector is not None:
            elector.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
