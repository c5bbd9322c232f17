"""The retention service's settings: each with its flag, environment variable, default and bounds.

``payloadrun retention`` reads them from flags and the environment the operator sets
(:mod:`payloadrun.settings`); tests and the simulator build them in code. Either way
``__post_init__`` validates them, in the one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from payloadrun import settings
from payloadrun.retention.deleter import Retry
from payloadrun.settings import (
    MAX_OFF_POLICY_STEPS,
    RETENTION_SCAN_INTERVAL_S,
    RETENTION_WORKERS,
    Env,
    parse_float,
    parse_int,
    parse_optional_int,
    setting,
)

# The subcommand that runs the retention sidecar (``payloadrun retention``); the operator's
# builders start the sidecar with it.
COMMAND = "retention"
# What the retention sidecar keeps directly under the payload root, beside the ``v<k>``
# directories (``payloadrun wipe`` removes exactly these and the ``v<k>``).
STATE_DIR = ".retention"  # the journal's directory, unless --state-dir puts it elsewhere
TRASH_DIR = ".retention-trash"  # version directories a fresh run moved aside, being deleted
# How long an API call may wait on the journal's volume before it is answered 503: a healthy
# fdatasync on a network volume takes milliseconds (hundreds under load), and the clients' own
# timeout is 10 s, so the caller always gets the sidecar's reason rather than its own timeout.
CALL_DEADLINE_S = 5.0


@dataclass(frozen=True)
class RetentionConfig:
    """What one retention service is configured with."""

    root: Path = settings.payload_root(f"{settings.PAYLOAD_ROOT_HELP}; created if missing")
    run_id: str = setting(
        help="this run's identity; a journal of another run id is not replayed",
        flag="--run-id",
        env=Env.RUN_ID,
        missing=f"no run id: pass --run-id or set {Env.RUN_ID} (a new id wipes the root unless "
        "--resume; the same id after a restart replays the journal)",
    )
    resume: bool = setting(
        False,
        help="a new run id resuming a checkpoint keeps the root (else a new run wipes it)",
        flag="--resume",
        env=Env.RESUME,
        boolean=True,
    )
    max_off_policy_steps: int = setting(
        MAX_OFF_POLICY_STEPS,
        help="the trainer's staleness bound m; the backstop removes v<k> for k < step - m",
        flag="--max-off-policy-steps",
        env=Env.MAX_OFF_POLICY_STEPS,
        parse=parse_int,
        minimum=0,
    )
    max_steps: int | None = setting(
        None,
        help="batches past this step are never trained: their files go at once",
        flag="--max-steps",
        env=Env.MAX_STEPS,
        parse=parse_optional_int,
        minimum=0,
    )
    workers: int = setting(
        RETENTION_WORKERS,
        help="deletion threads (at most 2 of them in one directory at once)",
        flag="--workers",
        env=Env.RETENTION_WORKERS,
        parse=parse_int,
        minimum=1,
    )
    scan_interval_s: float = setting(
        float(RETENTION_SCAN_INTERVAL_S),
        help="seconds between scans that correct the directory metrics",
        flag="--scan-interval",
        env=Env.RETENTION_SCAN_INTERVAL,
        parse=parse_float,
        metavar="SECONDS",
        minimum=1e-3,
    )
    state_dir: Path | None = setting(
        None,
        help=f"journal directory (default <root>/{STATE_DIR}, on the shared volume)",
        flag="--state-dir",
        env=Env.RETENTION_STATE_DIR,
        parse=Path,
    )
    compact_bytes: int = setting(
        4 << 20,
        help="compact the journal once it grows past this size",
        flag="--compact-bytes",
        env=Env.RETENTION_COMPACT_BYTES,
        parse=parse_int,
        minimum=0,
    )
    call_deadline_s: float = setting(
        CALL_DEADLINE_S,
        help="seconds an API call may wait on the journal's volume; past it the call is answered "
        "503 (volume_hung) and the journal is fenced until it has been read back",
        flag="--call-deadline",
        env=Env.RETENTION_CALL_DEADLINE,
        parse=parse_float,
        metavar="SECONDS",
        minimum=1e-3,
    )
    # files per message to the deletion worker: large enough that a message's round trip is
    # small beside its unlinks (bench/retention.py), small enough to spread a step over threads
    chunk_files: int = 1024
    retry: Retry = field(default_factory=Retry)

    def __post_init__(self) -> None:
        if not self.run_id:
            raise settings.SettingsError(
                "run id is empty: pass --run-id (the orchestrator's run name)"
            )
        settings.validate(self)
        if self.chunk_files < 1:
            raise settings.SettingsError(f"chunk_files must be >= 1, got {self.chunk_files}")
