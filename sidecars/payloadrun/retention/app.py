"""The retention sidecar's HTTP surface: a JSON API on loopback and ``/metrics`` on its own port.

The API listens on 127.0.0.1 by default: only the orchestrator in the same pod may tell it to
delete files. ``/metrics`` is read-only and served on a separate port so Prometheus can scrape
it from outside the pod. Handlers run the service's calls directly: each is a validation, one
fsynced journal append and a queue insertion, never an unlink.

Endpoints (JSON in, JSON out; errors are ``{"error": message, ...}``):

- ``POST /v1/batches``  ``{"step": int, "files": [path], "empty": bool}``
- ``POST /v1/policy``   ``{"step": int}``
- ``POST /v1/discard``  ``{"files": [path]}``  (409: a pending batch holds one)
- ``GET /v1/status``, ``GET /healthz``; ``GET /metrics`` on the metrics port.
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
from payloadrun.retention.service import DiscardRefusedError, RefusedPathError, RetentionService
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
        raise ValueError(f"files must be a JSON list of paths, got {type(files).__name__}")
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
        except ValueError as exc:
            service.metrics.refused.labels("bad_request").inc()
            return _error(400, str(exc))
        except RuntimeError as exc:
            return _error(503, str(exc))
        except OSError as exc:
            log.exception("retention journal write failed")
            return _error(
                503,
                f"the event was not recorded: writing the journal failed ({exc}); check the "
                "volume and retry",
            )

    async def batches(request: web.Request) -> web.Response:
        body = await _body(request, ("step", "files"))
        result = service.record_batch(body["step"], _files(body), empty=body.get("empty", False))
        return web.json_response(result)

    async def policy(request: web.Request) -> web.Response:
        body = await _body(request, ("step",))
        return web.json_response(service.policy_updated(body["step"]))

    async def discard(request: web.Request) -> web.Response:
        body = await _body(request, ("files",))
        return web.json_response(service.discard(_files(body)))

    async def status(_: web.Request) -> web.Response:
        return web.json_response(service.status())

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True, "mode": service.mode and service.mode.value})

    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[errors])
    app.router.add_post("/v1/batches", batches)
    app.router.add_post("/v1/policy", policy)
    app.router.add_post("/v1/discard", discard)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/healthz", healthz)
    return app


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
    """Run the API and the metrics server until SIGTERM/SIGINT (or ``stop``); then close.

    Queued deletions are not waited for at shutdown: the journal replays them at the next start.
    The API listens on the pod's loopback, so the kubelet probes the metrics port: ``/healthz``
    says the process serves, ``/readyz`` that the service has started (journal replayed) and is
    not closing.
    """
    listeners = [
        Listener(
            "api",
            build_api_app(service),
            host,
            port,
            f"--port or {Env.RETENTION_PORT}",
        ),
        Listener(
            "metrics",
            serving.metrics_app(service.registry, service.ready),
            metrics_host,
            metrics_port,
            f"--metrics-port or {Env.RETENTION_METRICS_PORT}",
        ),
    ]

    def started(urls: dict[str, str]) -> None:
        urls = {"api": urls["api"], "metrics": f"{urls['metrics']}/metrics"}
        log.info("retention API on %s, metrics on %s", urls["api"], urls["metrics"])
        if ready_file is not None:
            serving.write_ready_file(ready_file, urls)

    await serving.serve(listeners, stop=stop, started=started, stopped=service.close)
