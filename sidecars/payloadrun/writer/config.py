"""What the writer is configured with: its work (:class:`WriterConfig`) and where it listens.

Every setting has a flag and an environment variable (the operator sets the variables, see
:class:`payloadrun.settings.Env`); a flag wins over its variable. The defaults are the CRD's.
The listen flags are every sidecar's: ``--host``, ``--port``, ``--metrics-host``,
``--metrics-port``. ``--listen HOST:PORT`` (and ``PAYLOADRUN_WRITER_LISTEN``), the writer's
older form, still works for one release and warns: :func:`listen_from` reads it.

The operator's builders import :data:`COMMAND` from here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from payloadrun import serving, settings
from payloadrun.settings import (
    PAYLOAD_ROOT_HELP,
    VLLM_PORT,
    WRITER_METRICS_PORT,
    WRITER_PORT,
    Env,
    parse_bytes,
    parse_float,
    parse_int,
    setting,
)
from payloadrun.writer.upstreams import parse_upstreams

# The subcommand that runs the writer (``payloadrun writer``); the operator's builders start the
# sidecar with it.
COMMAND = "writer"
LISTEN_FLAG_DEPRECATED = "--listen"


def upstream_list(value: str, where: str | None = None) -> str:
    """``--upstream`` checked (each URL, see :func:`~payloadrun.writer.upstreams.parse_upstreams`)
    and written back as given; ``where`` prefixes the error of a config built in code."""
    try:
        parse_upstreams(value)
    except ValueError as exc:
        if where is None:
            raise
        raise settings.SettingsError(f"{where}: {exc}") from None
    return value


@dataclass(frozen=True)
class WriterConfig:
    """Everything the writer's work is configured with (flags and environment, see ``cli.py``)."""

    upstream: str = setting(
        f"http://127.0.0.1:{VLLM_PORT}",
        help="vLLM's base URL, or the base URLs of every vLLM API server of the pod, "
        "comma-separated (http://127.0.0.1:8000,http://127.0.0.1:8001): each request goes to "
        "the one with the fewest requests in flight, ties taking turns; /readyz is ready when "
        "every one is healthy",
        flag="--upstream",
        env=Env.WRITER_UPSTREAM,
        parse=upstream_list,
        metavar="URL[,URL...]",
    )
    payload_root: str | None = setting(
        None,
        help=f"{PAYLOAD_ROOT_HELP}; a request's payload_dir must be <root>/v<k>; unset: "
        "every answer goes inline",
        flag="--payload-root",
        env=Env.PAYLOAD_ROOT,
    )
    connect_timeout: float = setting(
        5.0,
        help="seconds to connect to vLLM",
        flag="--connect-timeout",
        env=Env.WRITER_CONNECT_TIMEOUT,
        parse=parse_float,
        minimum=1e-3,
    )
    read_timeout: float = setting(
        1800.0,
        help="seconds vLLM may stay silent on a connection (a whole generation when not "
        "streaming) before the writer answers 504",
        flag="--read-timeout",
        env=Env.WRITER_READ_TIMEOUT,
        parse=parse_float,
        minimum=1e-3,
    )
    workers: int = setting(
        8,
        help="threads that parse bodies and serialize answers (the volume is touched on "
        "--write-threads, unless --write-deadline is 0)",
        flag="--workers",
        env=Env.WRITER_WORKERS,
        parse=parse_int,
        minimum=1,
    )
    in_flight_budget: int | None = setting(
        None,
        help="bytes of vLLM answers the writer holds at once (each by-handle answer counts "
        "twice its body); when used up, the writer stops reading vLLM's answers until some are "
        "sent. An answer larger than the budget is read alone. Default: 1Gi, or half the "
        "container's memory limit when that is less",
        flag="--in-flight-budget",
        env=Env.WRITER_IN_FLIGHT_BUDGET,
        parse=parse_bytes,
        minimum=1,
        metavar="BYTES",
    )
    write_deadline: float = setting(
        5.0,
        help="seconds a by-handle write (create, write, fsync, close) may take; an answer whose "
        "write is not done by then goes back inline at once (fallback reason write_timeout), "
        "and the file of the late write is removed when the write returns. Also the deadline "
        "of each probe of the payload root. 0: no deadline and no breaker (writes on the "
        "request pool, as in 0.1.0: a hung volume then hangs its requests)",
        flag="--write-deadline",
        env=Env.WRITER_WRITE_DEADLINE,
        parse=parse_float,
        minimum=0.0,
    )
    write_threads: int = setting(
        16,
        help="threads that write payload files and check payload_dir on the volume, apart "
        "from the request pool (--workers); a call blocked "
        "past its deadline holds its thread until the kernel lets go, so this caps what a hung "
        "volume can hold. While every one is held, answers go inline at once (fallback reason "
        "write_threads_full)",
        flag="--write-threads",
        env=Env.WRITER_WRITE_THREADS,
        parse=parse_int,
        minimum=1,
    )
    breaker_cooldown: float = setting(
        5.0,
        help="seconds the writer skips the volume after a write missed its deadline (answers "
        "inline, fallback reason breaker_open); then one request at a time probes it, and the "
        "first volume call (a payload_dir check or a write) done in time closes the breaker",
        flag="--breaker-cooldown",
        env=Env.WRITER_BREAKER_COOLDOWN,
        parse=parse_float,
        minimum=0.0,
    )
    root_probe_interval: float = setting(
        10.0,
        help="seconds between probes of the payload root (a file created and deleted on a "
        "thread of its own, never the request pool; a probe not done within --write-deadline "
        "marks the root not writable). The result is a metric, a log line per change and a "
        "field of /readyz's body: readiness never depends on the volume",
        flag="--root-probe-interval",
        env=Env.WRITER_ROOT_PROBE_INTERVAL,
        parse=parse_float,
        minimum=1e-3,
    )
    health_timeout: float = 2.0
    max_request_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        settings.validate(self)
        upstream_list(self.upstream, where="upstream (--upstream / " + Env.WRITER_UPSTREAM + ")")

    @property
    def upstreams(self) -> tuple[str, ...]:
        """The base URLs of ``upstream``, in order (one, or every API server of the pod)."""
        return parse_upstreams(self.upstream)


def split_listen(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) to its parts, with an error that says the form."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"listen address {value!r} is not HOST:PORT (for example 127.0.0.1:{WRITER_PORT}); "
            f"{LISTEN_FLAG_DEPRECATED} is deprecated: use --host and --port"
        )
    return host.strip("[]") or "127.0.0.1", int(port)


def listen_address(value: str) -> str:
    split_listen(value)
    return value


@dataclass(frozen=True)
class WriterListen:
    """Where the writer serves, and how it logs."""

    host: str = serving.host_setting(
        "127.0.0.1", env=Env.WRITER_HOST, help="address of the proxy; use 0.0.0.0 in a pod"
    )
    port: int = serving.port_setting(
        WRITER_PORT, env=Env.WRITER_PORT, help="port of the proxy, 0 for any free port"
    )
    metrics_host: str | None = serving.metrics_host_setting(
        None, env=Env.WRITER_METRICS_HOST, help="address of /metrics (default: the --host)"
    )
    metrics_port: int = serving.metrics_port_setting(
        WRITER_METRICS_PORT,
        env=Env.WRITER_METRICS_PORT,
        help="port of the Prometheus /metrics endpoint, 0 for none",
    )
    # Deprecated for one release: HOST:PORT in one value. listen_from() turns it into host and
    # port where those are not given at the same level (flag or variable).
    listen: str | None = setting(
        None,
        help="deprecated: use --host and --port",
        flag=LISTEN_FLAG_DEPRECATED,
        env=Env.WRITER_LISTEN,
        parse=listen_address,
        metavar="HOST:PORT",
    )
    log_level: str = settings.log_level(deprecated_env=(Env.WRITER_LOG_LEVEL_DEPRECATED,))
    log_format: str = settings.log_format()

    def __post_init__(self) -> None:
        settings.validate(self)
        if self.listen is not None:
            split_listen(self.listen)

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port


def _with_listen(values: dict[str, object]) -> dict[str, object]:
    """``values`` with a deprecated ``listen`` turned into the host and port it names, unless
    those were given beside it."""
    listen = values.pop("listen", None)
    if isinstance(listen, str):
        host, port = split_listen(listen)
        values.setdefault("host", host)
        values.setdefault("port", port)
    return values


def listen_from(
    args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None
) -> WriterListen:
    """Where the writer listens: flags, then variables, then the defaults.

    The deprecated ``--listen`` / ``PAYLOADRUN_WRITER_LISTEN`` ranks just below the new names at
    its own level: a flag, old or new, still wins over any variable.
    """
    from_env = _with_listen(settings.values_from(WriterListen, None, env))
    from_flags = _with_listen(settings.values_from(WriterListen, args, {}))
    return WriterListen(**{**from_env, **from_flags})


def deprecated_in_use(
    args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None
) -> list[str]:
    """A warning per deprecated name in use: the old log-level variable, ``--listen``, and
    ``PAYLOADRUN_WRITER_LISTEN`` while the variables that replace it are not both set."""
    notes = settings.deprecated_in_use(WriterListen, env)
    if args is not None and getattr(args, "listen", None) is not None:
        notes.append(f"{LISTEN_FLAG_DEPRECATED} is deprecated: use --host and --port")
    env = os.environ if env is None else env
    if Env.WRITER_LISTEN in env and not (Env.WRITER_HOST in env and Env.WRITER_PORT in env):
        notes.append(
            f"{Env.WRITER_LISTEN} is deprecated: set {Env.WRITER_HOST} and {Env.WRITER_PORT}"
        )
    return notes
