"""The operator's ``/healthz`` and ``/metrics``, served from its start, on standby too.

kopf's own liveness endpoint exists only once kopf runs, which a standby never does (it waits for
the Lease without starting kopf): its pod would fail its liveness probe and restart forever. This
one answers 200 from the start, saying whether the process leads, stands by or acts alone, and 503
once a leader's event loop has not run for ``STALLED_SECONDS`` (a hung operator is restarted; its
renewals stopped long before, see :class:`election.Heartbeat`).

Both are aiohttp apps served by the sidecars' own :func:`payloadrun.serving.serve`, on an
event loop of their own in a thread (:class:`Endpoints`): a standby has no other loop, and
kopf's, once it runs, is the one ``/healthz`` watches. A port that cannot be bound is the
sidecars' :class:`payloadrun.serving.ListenError`, whose one line names the port and the
variable that moves it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from http import HTTPStatus

from aiohttp import web

from payloadrun.serving import Listener, serve
from payloadrun_operator.platform.election import Heartbeat

PATH = "/healthz"
STALLED_SECONDS = 30.0


class Health:
    """What ``/healthz`` answers: this process's role and whether its event loop still runs."""

    def __init__(self, heartbeat: Heartbeat, role: str = "standby") -> None:
        self.heartbeat = heartbeat
        self.role = role

    def answer(self) -> tuple[HTTPStatus, str]:
        if self.heartbeat.stale(STALLED_SECONDS):
            return (
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"stalled: the event loop has not run for over {STALLED_SECONDS:g} s",
            )
        return HTTPStatus.OK, f"ok {self.role}"


def health_app(health: Health) -> web.Application:
    """``GET /healthz`` of ``health``, as plain text (probes every few seconds: no access log)."""

    async def healthz(_: web.Request) -> web.Response:
        status, text = health.answer()
        return web.Response(status=status, text=text + "\n")

    app = web.Application()
    app.router.add_get(PATH, healthz)
    return app


class Endpoints:
    """Listeners served by :func:`payloadrun.serving.serve` on an event loop of their own, in a
    daemon thread (kopf owns the main thread's loop and its signals)."""

    def __init__(self, listeners: Sequence[Listener]) -> None:
        self._listeners = tuple(listeners)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.urls: dict[str, str] = {}

    def start(self) -> Endpoints:
        """Bind every listener, or raise the :class:`~payloadrun.serving.ListenError` of the
        first that cannot be bound (none stays bound); then serve them until :meth:`stop`."""
        bound: Future[dict[str, str]] = Future()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(bound),), name="endpoints", daemon=True
        )
        self._thread.start()
        try:
            self.urls = bound.result()
        except BaseException:
            self._thread.join()
            raise
        return self

    async def _serve(self, bound: Future[dict[str, str]]) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            await serve(self._listeners, stop=self._stop, started=bound.set_result, signals=())
        except BaseException as exc:
            if not bound.done():
                bound.set_exception(exc)
                return
            raise

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None or not thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        thread.join()
