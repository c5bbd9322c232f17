"""Settings the operator and the sidecars share: environment names, defaults, one way to declare.

Every environment variable the operator injects into a run's pods and the sidecars (or the
orchestrator's client) read is named here once, in :class:`Env`; the operator's builders and the
sidecars' command lines import the names, so a rename is one edit and a test, never a broken pod.
The sidecars' default ports are the CRD's defaults (``payloadrun_operator.api.models`` imports
them).

A setting is a field of a frozen dataclass declared with :func:`setting`: its default, flag,
environment variable, parser and bounds in one place. argparse reads the flags
(:func:`add_arguments`), :func:`from_args` takes a flag, else its variable, else the default, and
the dataclass validates every field in ``__post_init__`` (:func:`validate`), so a config built in
code is checked exactly like one built from a command line. Errors name the flag and the variable.

This module imports nothing heavy (no numpy, no aiohttp): the operator imports it.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar


class Env:
    """Every environment variable name the operator sets and the sidecars or clients read."""

    # every container of a run
    RUN = "PAYLOADRUN_RUN"
    RUN_ID = "PAYLOADRUN_RUN_ID"
    PAYLOAD_MODE = "PAYLOADRUN_PAYLOAD_MODE"
    PAYLOAD_ROOT = "PAYLOAD_ROOT"
    RUN_DIRECTORY = "PAYLOADRUN_RUN_DIRECTORY"  # where spec.runDirectory is mounted
    # the run's addresses: the orchestrator's DNS name (every role), rank 0's (orchestrator)
    ORCHESTRATOR_HOST = "PAYLOADRUN_ORCHESTRATOR_HOST"
    TRAINER_HOST = "PAYLOADRUN_TRAINER_HOST"
    # the orchestrator (and the retention sidecar for the step bounds)
    INFERENCE_URL = "PAYLOADRUN_INFERENCE_URL"
    INFERENCE_ADMIN_URLS = "PAYLOADRUN_INFERENCE_ADMIN_URLS"  # each API server's vLLM
    # the orchestrator and the trainers, where a replica has more than one API server or pod:
    # the inference GPUs (the weight broadcast's inference ranks)
    INFERENCE_WORLD_SIZE = "PAYLOADRUN_INFERENCE_WORLD_SIZE"
    # the vLLM containers of a replica that spans pods (a LeaderWorkerSet group), beside the
    # LWS_* variables LeaderWorkerSet's webhook injects (docs/operator.md#multi-node-replicas)
    INFERENCE_REPLICA_INDEX = "PAYLOADRUN_INFERENCE_REPLICA_INDEX"  # the group's index
    INFERENCE_POD_INDEX = "PAYLOADRUN_INFERENCE_POD_INDEX"  # this pod's in its group (leader 0)
    INFERENCE_HEAD_ADDRESS = "PAYLOADRUN_INFERENCE_HEAD_ADDRESS"  # the group's leader
    INFERENCE_DP_SIZE = "PAYLOADRUN_INFERENCE_DP_SIZE"  # API servers (DP ranks) per replica
    INFERENCE_DP_START_RANK = "PAYLOADRUN_INFERENCE_DP_START_RANK"  # this pod's first DP rank
    INFERENCE_API_SERVERS_PER_POD = "PAYLOADRUN_INFERENCE_API_SERVERS_PER_POD"
    INFERENCE_DP_RPC_PORT = "PAYLOADRUN_INFERENCE_DP_RPC_PORT"  # on the head
    RETENTION_URL = "PAYLOADRUN_RETENTION_URL"
    MAX_OFF_POLICY_STEPS = "PAYLOADRUN_MAX_OFF_POLICY_STEPS"
    MAX_STEPS = "PAYLOADRUN_MAX_STEPS"
    # the trainers: torch.distributed's and torchrun's (PET_*: torchrun reads them as its flags)
    MASTER_ADDR = "MASTER_ADDR"
    MASTER_PORT = "MASTER_PORT"
    NNODES = "NNODES"
    NODE_RANK = "NODE_RANK"
    NPROC_PER_NODE = "NPROC_PER_NODE"
    WORLD_SIZE = "WORLD_SIZE"  # with one process per pod
    RANK = "RANK"  # with one process per pod
    PET_MASTER_ADDR = "PET_MASTER_ADDR"
    PET_MASTER_PORT = "PET_MASTER_PORT"
    PET_NNODES = "PET_NNODES"
    PET_NODE_RANK = "PET_NODE_RANK"
    PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
    # both sidecars (and the operator's own process)
    LOG_LEVEL = "PAYLOADRUN_LOG_LEVEL"
    LOG_FORMAT = "PAYLOADRUN_LOG_FORMAT"
    # the writer sidecar
    WRITER_UPSTREAM = "PAYLOADRUN_WRITER_UPSTREAM"
    WRITER_HOST = "PAYLOADRUN_WRITER_HOST"
    WRITER_PORT = "PAYLOADRUN_WRITER_PORT"
    WRITER_LISTEN = "PAYLOADRUN_WRITER_LISTEN"  # deprecated: HOST:PORT, read when those are unset
    WRITER_METRICS_HOST = "PAYLOADRUN_WRITER_METRICS_HOST"
    WRITER_METRICS_PORT = "PAYLOADRUN_WRITER_METRICS_PORT"
    WRITER_READ_TIMEOUT = "PAYLOADRUN_WRITER_READ_TIMEOUT"
    WRITER_CONNECT_TIMEOUT = "PAYLOADRUN_WRITER_CONNECT_TIMEOUT"
    WRITER_WORKERS = "PAYLOADRUN_WRITER_WORKERS"
    WRITER_IN_FLIGHT_BUDGET = "PAYLOADRUN_WRITER_IN_FLIGHT_BUDGET"
    WRITER_WRITE_DEADLINE = "PAYLOADRUN_WRITER_WRITE_DEADLINE"
    WRITER_WRITE_THREADS = "PAYLOADRUN_WRITER_WRITE_THREADS"
    WRITER_BREAKER_COOLDOWN = "PAYLOADRUN_WRITER_BREAKER_COOLDOWN"
    WRITER_ROOT_PROBE_INTERVAL = "PAYLOADRUN_WRITER_ROOT_PROBE_INTERVAL"
    WRITER_LOG_LEVEL_DEPRECATED = "PAYLOADRUN_WRITER_LOG_LEVEL"  # read when LOG_LEVEL is unset
    # the retention sidecar
    RESUME = "PAYLOADRUN_RESUME"
    RETENTION_HOST = "PAYLOADRUN_RETENTION_HOST"
    RETENTION_PORT = "PAYLOADRUN_RETENTION_PORT"
    RETENTION_METRICS_HOST = "PAYLOADRUN_RETENTION_METRICS_HOST"
    RETENTION_METRICS_PORT = "PAYLOADRUN_RETENTION_METRICS_PORT"
    RETENTION_WORKERS = "PAYLOADRUN_RETENTION_WORKERS"
    RETENTION_SCAN_INTERVAL = "PAYLOADRUN_RETENTION_SCAN_INTERVAL"
    RETENTION_STATE_DIR = "PAYLOADRUN_RETENTION_STATE_DIR"
    RETENTION_COMPACT_BYTES = "PAYLOADRUN_RETENTION_COMPACT_BYTES"
    RETENTION_CALL_DEADLINE = "PAYLOADRUN_RETENTION_CALL_DEADLINE"


# Defaults the CRD shares (spec.inference.port, .writer.*, spec.orchestrator.retention.*).
VLLM_PORT = 8000
WRITER_PORT = 8001
WRITER_METRICS_PORT = 9401
RETENTION_PORT = 8002
RETENTION_METRICS_PORT = 9402
RETENTION_WORKERS = 8
RETENTION_SCAN_INTERVAL_S = 60
MAX_OFF_POLICY_STEPS = 8
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("plain", "json")  # payloadrun.logs formats them

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names its flag and variable."""


def parse_int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("not an integer") from None


def parse_float(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError("not a number") from None


_BYTE_UNITS = {"": 1, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


def parse_bytes(raw: str) -> int:
    """A byte count: an integer, or one with a Kubernetes binary suffix (``512Mi``, ``1Gi``)."""
    text = raw.strip()
    digits = text.rstrip("KMGTikmgt")
    unit = text[len(digits) :].lower()
    if unit not in _BYTE_UNITS or not digits.isdigit():
        raise ValueError("not a byte count: use an integer or one with Ki, Mi, Gi or Ti (1Gi)")
    return int(digits) * _BYTE_UNITS[unit]


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("use true or false")


def parse_optional_int(raw: str) -> int | None:
    return None if raw.strip().lower() in ("", "none") else parse_int(raw)


@dataclass(frozen=True)
class Setting:
    """How one config field is set from outside: flag, environment variable, parser, bounds."""

    help: str
    flag: str | None = None
    env: str | None = None
    parse: Callable[[str], Any] = str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    boolean: bool = False  # --flag/--no-flag; the variable takes true/false
    deprecated_env: tuple[str, ...] = ()  # older names, read when ``env`` is unset
    metavar: str | None = None
    missing: str | None = None  # the error when a required setting is given neither way

    def names(self) -> str:
        """``--flag``, ``ENV`` or both: how an error message points at the setting."""
        return " / ".join(n for n in (self.flag, self.env) if n)

    def check(self, name: str, value: Any) -> None:
        if value is None:
            return
        where = f"{name} ({self.names()})" if self.names() else name
        if self.choices and value not in self.choices:
            raise SettingsError(f"{where} must be one of {', '.join(self.choices)}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise SettingsError(f"{where} must be at least {self.minimum:g}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise SettingsError(f"{where} must be at most {self.maximum:g}, got {value!r}")


def setting(default: Any = dataclasses.MISSING, *, help: str, **how: Any) -> Any:
    """A dataclass field settable by flag and/or environment variable (see :class:`Setting`)."""
    meta = {"setting": Setting(help=help, **how)}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    if isinstance(default, dict | list | set):  # a fresh copy for every instance
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def settings_of(cls: type) -> dict[str, tuple[Setting, Any]]:
    """Field name -> (its setting, its default or MISSING) for every declared setting of ``cls``."""
    return {
        f.name: (f.metadata["setting"], _default(f))
        for f in dataclasses.fields(cls)
        if "setting" in f.metadata
    }


def env_of(cls: type, name: str) -> str:
    """The environment variable of the setting ``name`` of ``cls``."""
    env = settings_of(cls)[name][0].env
    if env is None:
        raise KeyError(f"{cls.__name__}.{name} has no environment variable")
    return env


def validate(config: Any) -> None:
    """Check every declared setting of a dataclass instance against its bounds and choices."""
    for name, (s, _) in settings_of(type(config)).items():
        s.check(name, getattr(config, name))


def add_arguments(parser: argparse.ArgumentParser, *classes: type) -> None:
    """One argparse option per flagged setting of ``classes``; the help names default and env."""
    for cls in classes:
        for name, (s, default) in settings_of(cls).items():
            if s.flag is None:
                continue
            shown = "" if default in (dataclasses.MISSING, None) else f" (default: {default})"
            env = f" [env {s.env}]" if s.env else ""
            kwargs: dict[str, Any] = {"dest": name, "default": None, "help": s.help + shown + env}
            if s.boolean:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = _argparse_type(s.parse)
                kwargs["metavar"] = s.metavar
                if s.choices:
                    kwargs["choices"] = s.choices
            parser.add_argument(s.flag, **kwargs)


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(raw: str) -> Any:
        try:
            return parse(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc) or f"invalid value {raw!r}") from exc

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def values_from(
    cls: type, args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The settings of ``cls`` that were given: by flag, else by environment variable.

    Settings given neither way are left out, so the dataclass's defaults apply.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name, (s, _) in settings_of(cls).items():
        given = getattr(args, name, None) if args is not None else None
        if given is not None:
            values[name] = given
            continue
        for var in (s.env, *s.deprecated_env):
            raw = env.get(var) if var else None
            if raw is None:
                continue
            try:
                values[name] = parse_bool(raw) if s.boolean else s.parse(raw)
            except ValueError as exc:
                raise SettingsError(f"environment variable {var}={raw!r}: {exc}") from None
            break
    return values


def from_args(
    cls: type[T], args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None
) -> T:
    """``cls`` built from flags, then environment variables, then its defaults; validated."""
    values = values_from(cls, args, env)
    for name, (s, default) in settings_of(cls).items():
        if default is dataclasses.MISSING and name not in values:
            raise SettingsError(s.missing or f"no {name}: set {s.names()}")
    return cls(**values)


def deprecated_in_use(cls: type, env: Mapping[str, str] | None = None) -> list[str]:
    """A warning per deprecated variable that is set while its new name is not."""
    env = os.environ if env is None else env
    notes = []
    for s, _ in settings_of(cls).values():
        for old in s.deprecated_env:
            if old in env and (s.env is None or s.env not in env):
                notes.append(f"{old} is deprecated: set {s.env} instead")
    return notes


def port(default: int, *, help: str, **how: Any) -> Any:
    """A TCP port setting: 0 to 65535 (what 0 means, the help says)."""
    return setting(default, help=help, parse=parse_int, minimum=0, maximum=65535, **how)


def log_format(default: str = "plain", **how: Any) -> Any:
    """The log-format setting: the same flag and variable in the operator and both sidecars."""
    return setting(
        default,
        help="log lines as plain text or as one JSON object each (docs/operations.md, Logs)",
        flag="--log-format",
        env=Env.LOG_FORMAT,
        choices=LOG_FORMATS,
        **how,
    )


# What "payload root" means in every --help, the docs and the CRD: one directory per run.
PAYLOAD_ROOT_HELP = (
    "the payload root: the directory of this run's v<k> payload directories on the shared "
    "volume (the operator sets <mountPath>/<namespace>/<name>/payloads, or spec.payloads.root)"
)


def payload_root(help: str) -> Any:
    """The payload-root setting: ``--root`` or ``PAYLOAD_ROOT``, required (the retention sidecar,
    ``payloadrun wipe``)."""
    return setting(
        help=help,
        flag="--root",
        env=Env.PAYLOAD_ROOT,
        parse=Path,
        metavar="PATH",
        missing=f"no payload root: pass --root or set {Env.PAYLOAD_ROOT}",
    )


def log_level(**how: Any) -> Any:
    """The log-level setting, the same flag and variable in both sidecars."""
    return setting(
        "INFO",
        help="log level",
        flag="--log-level",
        env=Env.LOG_LEVEL,
        choices=LOG_LEVELS,
        **how,
    )
