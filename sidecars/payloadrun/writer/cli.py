"""``payloadrun writer``: run the writer sidecar beside vLLM.

Every flag has an environment variable (the operator sets those); a flag wins over its variable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Mapping

from payloadrun.writer.app import WriterConfig, serve

ENV = {
    "upstream": "PAYLOADRUN_WRITER_UPSTREAM",
    "listen": "PAYLOADRUN_WRITER_LISTEN",
    "payload_root": "PAYLOAD_ROOT",
    "metrics_port": "PAYLOADRUN_WRITER_METRICS_PORT",
    "metrics_host": "PAYLOADRUN_WRITER_METRICS_HOST",
    "read_timeout": "PAYLOADRUN_WRITER_READ_TIMEOUT",
    "connect_timeout": "PAYLOADRUN_WRITER_CONNECT_TIMEOUT",
    "workers": "PAYLOADRUN_WRITER_WORKERS",
    "log_level": "PAYLOADRUN_WRITER_LOG_LEVEL",
}
DEFAULTS = {
    "upstream": "http://127.0.0.1:8000",
    "listen": "127.0.0.1:8100",
    "payload_root": None,
    "metrics_port": "9400",
    "metrics_host": None,
    "read_timeout": "1800",
    "connect_timeout": "5",
    "workers": "8",
    "log_level": "INFO",
}


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) to its parts, with an error that says the form."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"listen address {value!r} is not HOST:PORT (for example 127.0.0.1:8100)"
        )
    return host.strip("[]") or "127.0.0.1", int(port)


def _default(name: str, env: Mapping[str, str]) -> str | None:
    return env.get(ENV[name], DEFAULTS[name])


def register(subparsers: argparse._SubParsersAction, env: Mapping[str, str] = os.environ) -> None:
    p = subparsers.add_parser(
        "writer",
        help="run the writer sidecar: a reverse proxy to vLLM that moves payloads by handle",
        description="A reverse proxy in front of vLLM. Requests whose sampling parameters carry "
        "payload_dir get their routed_experts and sampling_mask written to "
        "<payload_dir>/<uuid>.bin and replaced by choices[i].payload segments; everything "
        "else passes through unchanged. Each flag can be set by the environment variable "
        "named in its help.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--upstream",
        default=_default("upstream", env),
        help=f"vLLM's base URL [{ENV['upstream']}]",
    )
    p.add_argument(
        "--listen",
        type=parse_listen,
        default=_default("listen", env),
        help=f"address to serve on, HOST:PORT; use 0.0.0.0 in a pod [{ENV['listen']}]",
    )
    p.add_argument(
        "--payload-root",
        default=_default("payload_root", env),
        help=f"the shared volume's mount; payload_dir must be <root>/v<k> [{ENV['payload_root']}]",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=_default("metrics_port", env),
        help=f"port of the Prometheus /metrics endpoint, 0 for none [{ENV['metrics_port']}]",
    )
    p.add_argument(
        "--metrics-host",
        default=_default("metrics_host", env),
        help=f"address of /metrics (default: the --listen host) [{ENV['metrics_host']}]",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=_default("read_timeout", env),
        help="seconds vLLM may stay silent on a connection (a whole generation when not "
        f"streaming) before the writer answers 504 [{ENV['read_timeout']}]",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=_default("connect_timeout", env),
        help=f"seconds to connect to vLLM [{ENV['connect_timeout']}]",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=_default("workers", env),
        help=f"threads that parse bodies and write payload files [{ENV['workers']}]",
    )
    p.add_argument(
        "--log-level",
        default=_default("log_level", env),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help=f"[{ENV['log_level']}]",
    )
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> WriterConfig:
    if args.workers < 1:
        raise SystemExit(f"--workers must be at least 1, got {args.workers}")
    if args.read_timeout <= 0 or args.connect_timeout <= 0:
        raise SystemExit("--read-timeout and --connect-timeout must be positive seconds")
    return WriterConfig(
        upstream=args.upstream,
        payload_root=args.payload_root,
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        workers=args.workers,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from_args(args)
    host, port = args.listen
    metrics_host = args.metrics_host or host

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, host, port, metrics_host, args.metrics_port, stop)

    asyncio.run(main())
    return 0
