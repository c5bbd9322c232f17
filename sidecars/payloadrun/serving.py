"""How every server the project runs serves: one shape for the writer, retention, the fake vLLM.

- **Addresses.** A server is one or more aiohttp apps, each on its own address
  (:class:`Listener`), given by the same flags everywhere: ``--host``/``--port`` for the main
  app, ``--metrics-host``/``--metrics-port`` for ``/metrics``.
- **Start-up order.** Each app's own work (thread pools, sessions, a journal replay) starts in
  the app's lifecycle (``app.cleanup_ctx``, see :func:`lifecycle`), which every runner honours:
  it starts before the app's address is bound and stops after the address is closed, whether
  :func:`serve` runs the app or a test's runner does. The command line only parses, builds and
  serves. Work that cannot start is a :class:`StartError`.
- **Probes.** ``GET`` :data:`HEALTH_PATH` answers :func:`health_body` while the process serves;
  :data:`READY_PATH` answers :func:`ready_body`, 200 when ready, else 503. The operator's
  builders import the paths for the kubelet's probes. (The fake vLLM answers vLLM's own
  ``/health``: it stands in for vLLM.)
- **Serving.** :func:`serve` starts the listeners in order, stops on SIGTERM/SIGINT (or an event
  a test sets), then cleans them up in reverse order. An address that cannot be bound is a
  :class:`ListenError` whose message says which port and which flag or variable moves it;
  :func:`run_sidecar` turns it, and a :class:`StartError`, into a one-line exit instead of a
  traceback. Metrics are served by :func:`metrics_app` on their own port, so an upstream's own
  ``/metrics`` still passes through a proxy port.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from payloadrun import logs, settings

log = logging.getLogger("payloadrun.serving")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# The probes every sidecar answers (the operator's builders point the kubelet at them).
HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
# The listen flags every server takes.
HOST_FLAG = "--host"
PORT_FLAG = "--port"
METRICS_HOST_FLAG = "--metrics-host"
METRICS_PORT_FLAG = "--metrics-port"


def host_setting(default: str | None, *, env: str, help: str) -> Any:
    """The ``--host`` setting of a server's main app (a dataclass field, see settings)."""
    return settings.setting(default, help=help, flag=HOST_FLAG, env=env)


def port_setting(default: int, *, env: str, help: str) -> Any:
    """The ``--port`` setting of a server's main app."""
    return settings.port(default, help=help, flag=PORT_FLAG, env=env)


def metrics_host_setting(default: str | None, *, env: str, help: str) -> Any:
    """The ``--metrics-host`` setting: where ``/metrics`` listens."""
    return settings.setting(default, help=help, flag=METRICS_HOST_FLAG, env=env)


def metrics_port_setting(default: int, *, env: str, help: str) -> Any:
    """The ``--metrics-port`` setting."""
    return settings.port(default, help=help, flag=METRICS_PORT_FLAG, env=env)


def health_body(**details: Any) -> dict[str, Any]:
    """What :data:`HEALTH_PATH` answers: ``{"ok": true}`` and what the server adds."""
    return {"ok": True, **details}


def ready_body(ready: bool, **details: Any) -> dict[str, Any]:
    """What :data:`READY_PATH` answers: ``{"ready": ...}`` and, per check, ``"ok"`` or why not."""
    return {"ready": ready, **details}


def health_response(**details: Any) -> web.Response:
    return web.json_response(health_body(**details))


def ready_response(ready: bool, **details: Any) -> web.Response:
    return web.json_response(ready_body(ready, **details), status=200 if ready else 503)


class ListenError(OSError):
    """A sidecar could not bind one of its addresses."""


class StartError(Exception):
    """A sidecar's work could not start (its journal cannot be read, say); the message says
    what failed and what to do."""


def lifecycle(
    start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An ``app.cleanup_ctx`` entry: ``start`` before the app serves, ``stop`` after it closed."""

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        await start()
        try:
            yield
        finally:
            await stop()

    return ctx


@dataclass(frozen=True)
class Listener:
    """One app on one address; ``moved_by`` names the flag and variable that change the port."""

    name: str
    app: web.Application
    host: str
    port: int
    moved_by: str


def url_host(host: str) -> str:
    """The host to put in a URL for a bound address (a wildcard becomes loopback)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


# Options an app needs from the server that runs it (``auto_decompress``,
# ``handler_cancellation``): set by the app's builder, honoured by every runner made here.
RUNNER_OPTIONS = web.AppKey("runner_options", dict)


def app_runner(app: web.Application) -> web.AppRunner:
    """The runner for ``app``, with the server options the app asks for."""
    return web.AppRunner(app, access_log=None, **app.get(RUNNER_OPTIONS, {}))


async def start_site(listener: Listener) -> tuple[web.AppRunner, str]:
    """Set up and bind ``listener``; its runner and the URL it is reachable at."""
    runner = app_runner(listener.app)
    await runner.setup()
    try:
        await web.TCPSite(runner, listener.host, listener.port).start()
    except OSError as exc:
        await runner.cleanup()
        why = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise ListenError(
            exc.errno,
            f"cannot listen on port {listener.port}: {why} (the {listener.name} address "
            f"{listener.host}:{listener.port}); choose another port with {listener.moved_by}",
        ) from exc
    port = runner.addresses[0][1]
    return runner, f"http://{url_host(listener.host)}:{port}"


def metrics_app(
    registry: CollectorRegistry, ready: Callable[[], bool] | None = None
) -> web.Application:
    """``GET /metrics`` of ``registry``; with ``ready``, the probes (:data:`HEALTH_PATH`,
    :data:`READY_PATH`).

    A scrape runs collectors and callbacks only (no directory walk, no upstream call).
    """

    async def metrics(_: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    if ready is not None:

        async def healthz(_: web.Request) -> web.Response:
            return health_response()

        async def readyz(_: web.Request) -> web.Response:
            return ready_response(ready())

        app.router.add_get(HEALTH_PATH, healthz)
        app.router.add_get(READY_PATH, readyz)
    return app


def write_ready_file(path: Path, urls: dict[str, str]) -> None:
    """Publish the bound URLs atomically (tests and the simulator start sidecars on port 0)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(urls))
    os.replace(tmp, path)


async def serve(
    listeners: Sequence[Listener],
    *,
    stop: asyncio.Event | None = None,
    started: Callable[[dict[str, str]], None] | None = None,
    stopped: Callable[[], Awaitable[None] | None] | None = None,
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
) -> None:
    """Serve every listener until one of ``signals`` or ``stop``; ``started`` gets name -> URL.

    A loop outside the main thread cannot take signals: it passes ``signals=()`` and a ``stop``
    (the operator's endpoints, beside kopf).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    runners: list[web.AppRunner] = []
    try:
        urls = {}
        for listener in listeners:
            runner, urls[listener.name] = await start_site(listener)
            runners.append(runner)
        if started is not None:
            started(urls)
        await stop.wait()
    finally:
        for runner in reversed(runners):
            with contextlib.suppress(Exception):
                await runner.cleanup()
        if stopped is not None:
            result = stopped()
            if result is not None:
                await result
        for sig in signals:
            loop.remove_signal_handler(sig)


def configure_logging(level: str, log_format: str = "plain") -> None:
    logs.configure(level, log_format)


def run_sidecar(command: str, main: Coroutine[Any, Any, None]) -> int:
    """Run a sidecar's main coroutine; an address it cannot bind, or work that cannot start, is
    a one-line exit (status 1).

    The line is logged (``payloadrun.<command>``, critical), so it has the format of every other.
    """
    try:
        asyncio.run(main)
    except ListenError as exc:
        logging.getLogger(f"payloadrun.{command}").critical("%s", exc.strerror)
        return 1
    except StartError as exc:
        logging.getLogger(f"payloadrun.{command}").critical("%s", exc)
        return 1
    return 0
