"""``payloadrun retention``: the retention sidecar beside the orchestrator.

Every flag has an environment variable (the operator sets those); a flag given on the command line
wins. The API binds 127.0.0.1 (only the orchestrator in the pod may delete); ``/metrics`` binds
0.0.0.0 so Prometheus can scrape the pod.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_PORT = 8002
DEFAULT_METRICS_PORT = 9402
SWITCH_INTERVAL_S = 0.0005

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _env(name: str, default: Any, cast: Callable[[str], Any] = str) -> Any:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return cast(raw)
    except ValueError as exc:
        raise SystemExit(f"environment variable {name}={raw!r} is invalid: {exc}") from exc


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("use true or false")


def _optional_int(raw: str) -> int | None:
    return None if raw.strip().lower() in ("", "none") else int(raw)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "retention",
        help="run the retention sidecar (delete payload files once the trainer consumed them)",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--root",
        type=Path,
        default=_env("PAYLOAD_ROOT", None, Path),
        help="payload root, the shared volume's run directory [env PAYLOAD_ROOT]",
    )
    p.add_argument(
        "--run-id",
        default=_env("PAYLOADRUN_RUN_ID", None),
        help="this run's identity; a journal of another run id is not replayed "
        "[env PAYLOADRUN_RUN_ID]",
    )
    p.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=_env("PAYLOADRUN_RESUME", False, _bool),
        help="a new run id resuming a checkpoint keeps the root (else a new run wipes it) "
        "[env PAYLOADRUN_RESUME]",
    )
    p.add_argument(
        "--max-off-policy-steps",
        type=int,
        default=_env("PAYLOADRUN_MAX_OFF_POLICY_STEPS", 8, int),
        help="the trainer's staleness bound m; the backstop removes v<k> for k < step - m "
        "[env PAYLOADRUN_MAX_OFF_POLICY_STEPS]",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=_env("PAYLOADRUN_MAX_STEPS", None, _optional_int),
        help="batches past this step are never trained: their files go at once "
        "[env PAYLOADRUN_MAX_STEPS]",
    )
    p.add_argument(
        "--host",
        default=_env("PAYLOADRUN_RETENTION_HOST", "127.0.0.1"),
        help="API address [env PAYLOADRUN_RETENTION_HOST]",
    )
    p.add_argument(
        "--port",
        type=int,
        default=_env("PAYLOADRUN_RETENTION_PORT", DEFAULT_PORT, int),
        help="API port, 0 for any free port [env PAYLOADRUN_RETENTION_PORT]",
    )
    p.add_argument(
        "--metrics-host",
        default=_env("PAYLOADRUN_RETENTION_METRICS_HOST", "0.0.0.0"),
        help="metrics address [env PAYLOADRUN_RETENTION_METRICS_HOST]",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=_env("PAYLOADRUN_RETENTION_METRICS_PORT", DEFAULT_METRICS_PORT, int),
        help="metrics port, 0 for any free port [env PAYLOADRUN_RETENTION_METRICS_PORT]",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=_env("PAYLOADRUN_RETENTION_WORKERS", 8, int),
        help="deletion threads [env PAYLOADRUN_RETENTION_WORKERS]",
    )
    p.add_argument(
        "--scan-interval",
        type=float,
        default=_env("PAYLOADRUN_RETENTION_SCAN_INTERVAL", 60.0, float),
        help="seconds between scans that correct the directory metrics "
        "[env PAYLOADRUN_RETENTION_SCAN_INTERVAL]",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=_env("PAYLOADRUN_RETENTION_STATE_DIR", None, Path),
        help="journal directory (default <root>/.retention, on the shared volume) "
        "[env PAYLOADRUN_RETENTION_STATE_DIR]",
    )
    p.add_argument(
        "--compact-bytes",
        type=int,
        default=_env("PAYLOADRUN_RETENTION_COMPACT_BYTES", 4 << 20, int),
        help="compact the journal once it grows past this size",
    )
    p.add_argument(
        "--ready-file",
        type=Path,
        help="write the bound API and metrics URLs here as JSON once listening",
    )
    p.add_argument(
        "--log-level",
        default=_env("PAYLOADRUN_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from payloadrun.retention.app import serve
    from payloadrun.retention.service import RetentionConfig, RetentionService

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.root is None:
        raise SystemExit("no payload root: pass --root or set PAYLOAD_ROOT")
    if not args.run_id:
        raise SystemExit(
            "no run id: pass --run-id or set PAYLOADRUN_RUN_ID (a new id wipes the root unless "
            "--resume; the same id after a restart replays the journal)"
        )
    try:
        # The sidecar owns the directory's lifecycle: on a new volume its run directory may not
        # exist yet (a path that exists and is not a directory is still an error).
        if not args.root.exists():
            args.root.mkdir(parents=True, exist_ok=True)
        config = RetentionConfig(
            root=args.root,
            run_id=args.run_id,
            resume=args.resume,
            max_off_policy_steps=args.max_off_policy_steps,
            max_steps=args.max_steps,
            workers=args.workers,
            scan_interval_s=args.scan_interval,
            state_dir=args.state_dir,
            compact_bytes=args.compact_bytes,
        )
        service = RetentionService(config)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"retention: {exc}") from exc
    # Deletion threads hold the GIL between their system calls; with the default 5 ms switch
    # interval the event loop can wait that long several times per request. A shorter interval
    # keeps API calls in the millisecond range while a step's files are being unlinked.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    service.start()
    asyncio.run(
        serve(
            service,
            host=args.host,
            port=args.port,
            metrics_host=args.metrics_host,
            metrics_port=args.metrics_port,
            ready_file=args.ready_file,
        )
    )
    return 0
