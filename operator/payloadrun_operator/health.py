"""The operator's ``/healthz``, served from its start, on standby too.

kopf's own liveness endpoint exists only once kopf runs, which a standby never does (it waits for
the Lease without starting kopf): its pod would fail its liveness probe and restart forever. This
one answers 200 from the start, saying whether the process leads, stands by or acts alone, and 503
once a leader's event loop has not run for ``STALLED_SECONDS`` (a hung operator is restarted; its
renewals stopped long before, see :class:`election.Heartbeat`).
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from payloadrun_operator.election import Heartbeat

PATH = "/healthz"
STALLED_SECONDS = 30.0


class HealthServer:
    def __init__(self, host: str, port: int, heartbeat: Heartbeat) -> None:
        self.role = "standby"
        self.heartbeat = heartbeat
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != PATH:
                    self._answer(HTTPStatus.NOT_FOUND, f"not found: try {PATH}")
                elif health.heartbeat.stale(STALLED_SECONDS):
                    self._answer(
                        HTTPStatus.SERVICE_UNAVAILABLE,
                        f"stalled: the event loop has not run for over {STALLED_SECONDS:g} s",
                    )
                else:
                    self._answer(HTTPStatus.OK, f"ok {health.role}")

            def _answer(self, status: HTTPStatus, text: str) -> None:
                body = (text + "\n").encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:  # probes every few seconds: no log line
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True

    def start(self) -> HealthServer:
        threading.Thread(target=self._server.serve_forever, name="healthz", daemon=True).start()
        return self
