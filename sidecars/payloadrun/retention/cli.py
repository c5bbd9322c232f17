"""``payloadrun retention``: the retention sidecar beside the orchestrator.

It deletes the payload files under the payload root (the directory of the run's ``v<k>``
directories on the shared volume) once the trainer has consumed them. Every flag has an
environment variable, named in its help (the operator sets them: :class:`payloadrun.settings.Env`
lists them); a flag given on the command line wins. The API binds 127.0.0.1 (only the orchestrator
in the pod may delete); ``/metrics`` binds 0.0.0.0 so Prometheus can scrape the pod. The default
ports are the CRD's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from payloadrun import serving, settings
from payloadrun.helptext import HelpFormatter, plain
from payloadrun.retention.config import COMMAND, RetentionConfig
from payloadrun.settings import RETENTION_METRICS_PORT, RETENTION_PORT, Env, setting

SWITCH_INTERVAL_S = 0.0005
log = logging.getLogger("payloadrun.retention")


@dataclass(frozen=True)
class RetentionListen:
    """Where the retention sidecar serves, and how it logs (every sidecar's listen flags)."""

    host: str = serving.host_setting("127.0.0.1", env=Env.RETENTION_HOST, help="API address")
    port: int = serving.port_setting(
        RETENTION_PORT, env=Env.RETENTION_PORT, help="API port, 0 for any free port"
    )
    metrics_host: str = serving.metrics_host_setting(
        "0.0.0.0", env=Env.RETENTION_METRICS_HOST, help="metrics address"
    )
    metrics_port: int = serving.metrics_port_setting(
        RETENTION_METRICS_PORT,
        env=Env.RETENTION_METRICS_PORT,
        help="metrics port, 0 for any free port",
    )
    ready_file: Path | None = setting(
        None,
        help="write the bound API and metrics URLs here as JSON once listening",
        flag="--ready-file",
        parse=Path,
    )
    log_level: str = settings.log_level()
    log_format: str = settings.log_format()

    def __post_init__(self) -> None:
        settings.validate(self)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        COMMAND,
        help="run the retention sidecar (delete payload files once the trainer consumed them)",
        description=plain(__doc__),
        formatter_class=HelpFormatter,
    )
    settings.add_arguments(p, RetentionConfig, RetentionListen)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from payloadrun.retention.app import listeners, log_started
    from payloadrun.retention.service import RetentionService

    try:
        where = settings.from_args(RetentionListen, args)
        config = settings.from_args(RetentionConfig, args)
    except settings.SettingsError as exc:
        print(f"payloadrun {COMMAND}: {exc}", file=sys.stderr)
        return 2
    serving.configure_logging(where.log_level, where.log_format)
    try:
        # The sidecar owns the directory's lifecycle: on a new volume its run directory may not
        # exist yet (a path that exists and is not a directory is still an error).
        if not config.root.exists():
            config.root.mkdir(parents=True, exist_ok=True)
        service = RetentionService(config)
    except (ValueError, OSError) as exc:
        log.critical("%s", exc)
        return 1
    # The unlinks run in the deletion worker process, but this process's threads still hand it
    # the chunks and read its answers; with the default 5 ms switch interval the event loop can
    # wait that long behind one of them. A shorter interval keeps API calls in the millisecond
    # range while a step's files are being deleted.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # the service starts in the API app's lifecycle, before its address is bound
    served = listeners(
        service,
        host=where.host,
        port=where.port,
        metrics_host=where.metrics_host,
        metrics_port=where.metrics_port,
    )
    return serving.run_sidecar(
        COMMAND, serving.serve(served, started=log_started(where.ready_file))
    )
