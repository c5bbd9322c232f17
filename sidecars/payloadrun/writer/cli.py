"""``payloadrun writer``: run the writer sidecar beside vLLM.

Every flag has an environment variable (the operator sets those, see
:class:`payloadrun.settings.Env`); a flag wins over its variable. The defaults are the CRD's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from payloadrun import serving, settings
from payloadrun.settings import WRITER_METRICS_PORT, WRITER_PORT, Env, setting
from payloadrun.writer.app import WriterConfig, serve

log = logging.getLogger("payloadrun.writer")


def split_listen(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) to its parts, with an error that says the form."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"listen address {value!r} is not HOST:PORT (for example 127.0.0.1:{WRITER_PORT})"
        )
    return host.strip("[]") or "127.0.0.1", int(port)


def listen_address(value: str) -> str:
    split_listen(value)
    return value


@dataclass(frozen=True)
class WriterListen:
    """Where the writer serves, and how it logs."""

    listen: str = setting(
        f"127.0.0.1:{WRITER_PORT}",
        help="address to serve on, HOST:PORT; use 0.0.0.0 in a pod",
        flag="--listen",
        env=Env.WRITER_LISTEN,
        parse=listen_address,
        metavar="HOST:PORT",
    )
    metrics_port: int = settings.port(
        WRITER_METRICS_PORT,
        help="port of the Prometheus /metrics endpoint, 0 for none",
        flag="--metrics-port",
        env=Env.WRITER_METRICS_PORT,
    )
    metrics_host: str | None = setting(
        None,
        help="address of /metrics (default: the --listen host)",
        flag="--metrics-host",
        env=Env.WRITER_METRICS_HOST,
    )
    log_level: str = settings.log_level(deprecated_env=(Env.WRITER_LOG_LEVEL_DEPRECATED,))
    log_format: str = settings.log_format()

    def __post_init__(self) -> None:
        settings.validate(self)
        split_listen(self.listen)

    @property
    def address(self) -> tuple[str, int]:
        return split_listen(self.listen)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "writer",
        help="run the writer sidecar: a reverse proxy to vLLM that moves payloads by handle",
        description="A reverse proxy in front of vLLM. Requests whose sampling parameters carry "
        "payload_dir get their routed_experts and sampling_mask written to "
        "<payload_dir>/<uuid>.bin and replaced by choices[i].payload segments; everything "
        "else passes through unchanged. Each flag can be set by the environment variable "
        "named in its help.",
    )
    settings.add_arguments(p, WriterConfig, WriterListen)
    p.set_defaults(run=run)


def configs(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> tuple[WriterConfig, WriterListen]:
    """The writer's config and address from flags, then the environment, then the defaults."""
    return settings.from_args(WriterConfig, args, env), settings.from_args(WriterListen, args, env)


def run(args: argparse.Namespace) -> int:
    try:
        config, where = configs(args)
    except settings.SettingsError as exc:
        print(f"payloadrun writer: {exc}", file=sys.stderr)
        return 2
    serving.configure_logging(where.log_level, where.log_format)
    for note in settings.deprecated_in_use(WriterListen):
        log.warning("%s", note)
    host, port = where.address
    return serving.run_sidecar(
        "writer", serve(config, host, port, where.metrics_host or host, where.metrics_port)
    )
