"""The retention sidecar's HTTP surface: a JSON API on loopback and ``/metrics`` on its own port.

The API listens on 127.0.0.1 by default: only the orchestrator in the same pod may tell it to
delete files. ``/metrics`` is read-only and served on a separate port so Prometheus can scrape
it from outside the pod. Handlers run the service's journaled calls on threads: each is a
validation, one fsynced journal append and a queue insertion, never an unlink, and waits for its
append at most ``--call-deadline`` (then 503 ``volume_hung``). ``/metrics``, the probes and
``/v1/status`` touch neither the volume nor a lock held across a system call, so they answer
while the volume hangs.

Endpoints (JSON in, JSON out; errors are ``{"error": message, ...}``):

- ``POST /v1/batches``  ``{"step": int, "files": [path], "empty": bool}``
- ``POST /v1/policy``   ``{"step": int}``
- ``POST /v1/discard``  ``{"files": [path]}``  (409: a pending batch holds one)
- ``GET /v1/status``, ``GET /healthz``; ``GET /metrics``, ``/healthz``, ``/readyz`` on the
  metrics port.

Errors: a request the service refuses as sent (:class:`BadRequestError`) is 400, a discard a
batch holds 409, a service not running or a journal that cannot be written 503 (a hung volume:
503 with ``reason: volume_hung``, ``waited_s``, ``deadline_s`` and ``fenced``); anything else
is the service's own failure, 500, logged with its traceback (never a 4xx: that would tell the
client to fix a request that was fine).

The service starts in the API app's lifecycle (:func:`payloadrun.serving.lifecycle`), before
the API's address is bound: its journal is replayed on a thread, and a journal that cannot be
read stops the sidecar with one line (:class:`~payloadrun.serving.StartError`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from payloadrun import serving
from payloadrun.reasons import Refusal
from payloadrun.retention.journal import JournalError
from payloadrun.retention.service import (
    BadRequestError,
    DiscardRefusedError,
    RefusedPathError,
    RetentionService,
    ServiceUnavailableError,
    VolumeHungError,
)
from payloadrun.serving import Listener
from payloadrun.settings import Env

log = logging.getLogger("payloadrun.retention")

# A batch of 4096 rollouts with a few files each is well under this; it bounds a bad client.
MAX_REQUEST_BYTES = 256 << 20

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


async def _body(request: web.Request, required: tuple[str, ...]) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"the request body is not JSON ({exc})"}),
            content_type="application/json",
        ) from exc
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"the request body must be a JSON object, got {body!r:.80}"}),
            content_type="application/json",
        )
    missing = [k for k in required if k not in body]
    if missing:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"the request body lacks {missing}; send {list(required)}"}),
            content_type="application/json",
        )
    return body


def _files(body: dict[str, Any]) -> list[Any]:
    files = body["files"]
    if not isinstance(files, list):
        raise BadRequestError(f"files must be a JSON list of paths, got {type(files).__name__}")
    return files


def build_api_app(service: RetentionService) -> web.Application:
    """The JSON API of ``service``."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except RefusedPathError as exc:
            return _error(400, str(exc), path=exc.path)
        except DiscardRefusedError as exc:
            conflicts = [{"file": f, "step": s} for f, s in exc.conflicts.items()]
            return _error(409, str(exc), conflicts=conflicts)
        except BadRequestError as exc:
            service.metrics.refused.labels(Refusal.BAD_REQUEST.value).inc()
            return _error(400, str(exc))
        except VolumeHungError as exc:
            return _error(503, str(exc), **exc.body())
        except ServiceUnavailableError as exc:
            return _error(503, str(exc))
        except OSError as exc:
            log.exception("retention journal write failed")
            return _error(
                503,
                f"the event was not recorded: writing the journal failed ({exc}); check the "
                "volume and retry",
            )
        except web.HTTPException:
            raise
        except Exception as exc:
            # a bug or a broken deletion worker: the service's failure, not the client's
            log.exception("retention %s %s failed", request.method, request.path)
            return _error(
                500,
                f"the retention sidecar failed on {request.method} {request.path}: "
                f"{type(exc).__name__}: {exc}; see its log",
            )

    # The journaled calls run on threads: each waits for its append at most the service's
    # call deadline, and meanwhile this loop goes on answering the others, /v1/status and
    # the probes (the metrics server shares the loop).
    async def batches(request: web.Request) -> web.Response:
        body = await _body(request, ("step", "files"))
        files, empty = _files(body), body.get("empty", False)
        result = await asyncio.to_thread(service.record_batch, body["step"], files, empty=empty)
        return web.json_response(result)

    async def policy(request: web.Request) -> web.Response:
        body = await _body(request, ("step",))
        return web.json_response(await asyncio.to_thread(service.policy_updated, body["step"]))

    async def discard(request: web.Request) -> web.Response:
        body = await _body(request, ("files",))
        return web.json_response(await asyncio.to_thread(service.discard, _files(body)))

    async def status(_: web.Request) -> web.Response:
        return web.json_response(service.status())

    async def healthz(_: web.Request) -> web.Response:
        return serving.health_response(mode=service.mode and service.mode.value)

    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[errors])
    app.cleanup_ctx.append(serving.lifecycle(lambda: start(service), lambda: stop(service)))
    app.router.add_post("/v1/batches", batches)
    app.router.add_post("/v1/policy", policy)
    app.router.add_post("/v1/discard", discard)
    app.router.add_get("/v1/status", status)
    app.router.add_get(serving.HEALTH_PATH, healthz)
    return app


async def start(service: RetentionService) -> None:
    """Start ``service`` (replay or wipe, on a thread) unless its caller already did; one that
    cannot start is a StartError."""
    if service.mode is not None:
        return
    try:
        await asyncio.to_thread(service.start)
    except (OSError, JournalError, ValueError) as exc:
        raise serving.StartError(
            f"the retention service cannot start on {service.root.path}: {exc}; check the "
            "volume (and the journal under its state directory)"
        ) from exc


async def stop(service: RetentionService) -> None:
    """Close ``service``; queued deletions are not waited for (the journal replays them)."""
    await asyncio.to_thread(service.close)


def listeners(
    service: RetentionService, *, host: str, port: int, metrics_host: str, metrics_port: int
) -> list[Listener]:
    """The API and the metrics server (with the probes) of ``service``.

    The API listens on the pod's loopback, so the kubelet probes the metrics port: ``/healthz``
    says the process serves, ``/readyz`` that the service has started (journal replayed) and is
    not closing.
    """
    return [
        Listener(
            "api",
            build_api_app(service),
            host,
            port,
            f"{serving.PORT_FLAG} or {Env.RETENTION_PORT}",
        ),
        Listener(
            "metrics",
            serving.metrics_app(service.registry, service.ready),
            metrics_host,
            metrics_port,
            f"{serving.METRICS_PORT_FLAG} or {Env.RETENTION_METRICS_PORT}",
        ),
    ]


def log_started(ready_file: Path | None = None) -> Callable[[dict[str, str]], None]:
    """What the sidecar logs once it listens; the URLs go to ``ready_file`` too."""

    def started(urls: dict[str, str]) -> None:
        urls = {"api": urls["api"], "metrics": f"{urls['metrics']}/metrics"}
        log.info("retention API on %s, metrics on %s", urls["api"], urls["metrics"])
        if ready_file is not None:
            serving.write_ready_file(ready_file, urls)

    return started


async def serve(
    service: RetentionService,
    *,
    host: str,
    port: int,
    metrics_host: str,
    metrics_port: int,
    ready_file: Path | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Start ``service``, run the API and the metrics server until SIGTERM/SIGINT (or ``stop``);
    then close. :func:`payloadrun.serving.serve` with this sidecar's listeners."""
    where = {"host": host, "port": port, "metrics_host": metrics_host, "metrics_port": metrics_port}
    await serving.serve(listeners(service, **where), stop=stop, started=log_started(ready_file))
