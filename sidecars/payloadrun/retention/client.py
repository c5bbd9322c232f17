"""Clients for the orchestrator: :class:`RetentionClient` (sync) and :class:`AsyncRetentionClient`.

Each call is one small JSON request to the sidecar on the pod's loopback; the sidecar acknowledges
once the event is journaled, so a returned call is durable. Every call is idempotent (recording a
batch again adds nothing, an old policy step is ignored, a file already gone is fine), so a
connection error is retried a few times with backoff before :class:`RetentionUnavailableError`.
HTTP errors are not retried: 400 (a path outside the root) and 409 (discarding a file a pending
batch holds) are caller bugs, raised as :class:`RetentionError` / :class:`DiscardConflictError`;
a 503 because the shared volume hangs is raised at once, within the sidecar's ``--call-deadline``
(5 s by default, below the clients' 10 s timeout), as :class:`RetentionVolumeHungError`.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Iterable
from typing import Any

from payloadrun.settings import RETENTION_PORT, Env

DEFAULT_URL = f"http://127.0.0.1:{RETENTION_PORT}"
URL_ENV = Env.RETENTION_URL


class RetentionError(RuntimeError):
    """The sidecar refused a request; ``status`` and ``body`` are its HTTP status and JSON."""

    def __init__(self, status: int, body: dict[str, Any], what: str) -> None:
        message = body.get("error") or json.dumps(body)[:300]
        super().__init__(f"retention {what} failed with HTTP {status}: {message}")
        self.status = status
        self.body = body


class DiscardConflictError(RetentionError):
    """409: the discard named files of recorded, unconsumed batches; nothing was deleted."""

    @property
    def conflicts(self) -> dict[str, int]:
        return {c["file"]: c["step"] for c in self.body.get("conflicts", [])}


class RetentionVolumeHungError(RetentionError):
    """503 ``volume_hung``: the sidecar could not journal the event within its deadline because
    the shared volume under its journal hangs (or its journal is fenced after such a call).

    The event was not acknowledged and may or may not have been recorded; every call is
    idempotent, so retry it later with the same arguments. The orchestrator need not wait: a
    ``policy_updated`` not recorded only keeps files longer (the next step's call consumes every
    batch up to it), a ``record_batch`` or ``discard`` should be retried at the next step.
    ``waited_s``, ``deadline_s`` and ``fenced`` say how long it waited, the sidecar's
    ``--call-deadline`` and whether the journal is fenced (by this call or an earlier one: until
    the volume answers and the journal is read back, calls are refused without waiting).
    """

    @property
    def waited_s(self) -> float:
        return float(self.body.get("waited_s", 0.0))

    @property
    def deadline_s(self) -> float:
        return float(self.body.get("deadline_s", 0.0))

    @property
    def fenced(self) -> bool:
        return bool(self.body.get("fenced", False))


# the "reason" of the sidecar's 503 for a hung volume (payloadrun.retention.service.VOLUME_HUNG)
VOLUME_HUNG = "volume_hung"


class RetentionUnavailableError(ConnectionError):
    """The sidecar could not be reached (after the retries)."""


def _paths(files: Iterable[str | os.PathLike[str]]) -> list[str]:
    if isinstance(files, (str, bytes)):
        raise TypeError("files must be a list of paths, not one string")
    return [os.fspath(f) for f in files]


def _raise_for(status: int, payload: bytes, what: str) -> dict[str, Any]:
    try:
        body = json.loads(payload) if payload else {}
    except ValueError:
        body = {"error": payload[:300].decode(errors="replace")}
    if status == 409:
        raise DiscardConflictError(status, body, what)
    if status == 503 and body.get("reason") == VOLUME_HUNG:
        raise RetentionVolumeHungError(status, body, what)
    if status >= 400:
        raise RetentionError(status, body, what)
    return body


class RetentionClient:
    """Synchronous client (stdlib ``http.client``, one kept-alive connection, thread-safe)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.2,
    ) -> None:
        self.url = url or os.environ.get(URL_ENV, DEFAULT_URL)
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"retention URL must be http://host:port, got {self.url!r}")
        self._host = parsed.hostname
        self._port = parsed.port or 80
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def record_batch(
        self, step: int, files: Iterable[str | os.PathLike[str]], *, empty: bool = False
    ) -> dict[str, Any]:
        """Record batch ``step``'s files (every selected trace, shipped or pruned)."""
        body = {"step": step, "files": _paths(files), "empty": empty}
        return self._call("POST", "/v1/batches", body, "record_batch")

    def policy_updated(self, step: int) -> dict[str, Any]:
        """The trainer published ``v{step}``: batches ``<= step`` were read."""
        return self._call("POST", "/v1/policy", {"step": step}, "policy_updated")

    def discard(self, files: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
        """Files no batch will read (dropped groups, pruned samples, stale sweeps)."""
        return self._call("POST", "/v1/discard", {"files": _paths(files)}, "discard")

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status", None, "status")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> RetentionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: Any, what: str) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        last: Exception | None = None
        for attempt in range(self._retries + 1):
            if attempt:
                time.sleep(self._backoff * 2 ** (attempt - 1))
            with self._lock:
                try:
                    if self._conn is None:
                        self._conn = http.client.HTTPConnection(
                            self._host, self._port, timeout=self._timeout
                        )
                    self._conn.request(method, path, body=data, headers=headers)
                    resp = self._conn.getresponse()
                    payload = resp.read()
                except (OSError, http.client.HTTPException) as exc:
                    last = exc
                    if self._conn is not None:
                        self._conn.close()
                        self._conn = None
                    continue
            return _raise_for(resp.status, payload, what)
        raise RetentionUnavailableError(
            f"retention sidecar at {self.url} unreachable for {what} after "
            f"{self._retries + 1} attempts: {last}; is the sidecar running "
            f"(set {URL_ENV} to its address)?"
        ) from last


class AsyncRetentionClient:
    """Asynchronous client (aiohttp); use ``async with`` or call :meth:`close`."""

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.2,
    ) -> None:
        self.url = (url or os.environ.get(URL_ENV, DEFAULT_URL)).rstrip("/")
        if not self.url.startswith("http://"):
            raise ValueError(f"retention URL must be http://host:port, got {self.url!r}")
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._session: Any = None

    async def record_batch(
        self, step: int, files: Iterable[str | os.PathLike[str]], *, empty: bool = False
    ) -> dict[str, Any]:
        body = {"step": step, "files": _paths(files), "empty": empty}
        return await self._call("POST", "/v1/batches", body, "record_batch")

    async def policy_updated(self, step: int) -> dict[str, Any]:
        return await self._call("POST", "/v1/policy", {"step": step}, "policy_updated")

    async def discard(self, files: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
        return await self._call("POST", "/v1/discard", {"files": _paths(files)}, "discard")

    async def status(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/status", None, "status")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncRetentionClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, path: str, body: Any, what: str) -> dict[str, Any]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        last: Exception | None = None
        for attempt in range(self._retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                async with self._session.request(method, self.url + path, json=body) as resp:
                    payload = await resp.read()
                    status = resp.status
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                last = exc
                continue
            return _raise_for(status, payload, what)
        raise RetentionUnavailableError(
            f"retention sidecar at {self.url} unreachable for {what} after "
            f"{self._retries + 1} attempts: {last}; is the sidecar running "
            f"(set {URL_ENV} to its address)?"
        ) from last
