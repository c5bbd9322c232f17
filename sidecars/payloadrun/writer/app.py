"""The writer sidecar's HTTP server: a reverse proxy to vLLM on localhost.

Three paths through it:

- **passthrough**: any request that does not name a ``payload_dir``, every streaming request,
  every other path and method. The body goes to vLLM as sent and vLLM's answer comes back as it
  arrives, chunk by chunk, status, headers and bytes unchanged.
- **handle**: a non-streaming generate / completions / chat request that names a valid
  ``payload_dir``. vLLM's answer is read whole, its inline arrays are written to one payload file
  (fsynced and closed first) and replaced by segments (see :mod:`payloadrun.writer.transform`).
- **rejected**: a ``payload_dir`` outside the root, not ``v<digits>``, through ``..``, a
  percent-encoded character or a symlink: 400, nothing forwarded, nothing written.

Request bodies go upstream as received, content coding included (the server does not decode
them: see :mod:`payloadrun.writer.coding`). A client that hangs up cancels its request: the
upstream connection is closed (vLLM aborts the generation, as it does for a client of its own),
the request is counted as ``disconnected`` with code 499, logged in one line, and a payload file
written for it is deleted.

Parsing, writing and serializing run on a thread pool (:mod:`payloadrun.writer.rewrite`); the
event loop only moves bytes. Liveness is ``/healthz``, readiness ``/readyz``; metrics are served
on their own port so that vLLM's own ``/metrics`` still passes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import mmap
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from payloadrun import serving, settings
from payloadrun.paths import PayloadPathError
from payloadrun.serving import Listener
from payloadrun.settings import VLLM_PORT, Env, parse_bytes, parse_float, parse_int, setting
from payloadrun.store import PayloadStore
from payloadrun.vllm import HEALTH_PATH, error_response
from payloadrun.writer import coding
from payloadrun.writer.budget import (
    InFlightBudget,
    container_memory_limit,
    default_budget,
    response_cost,
)
from payloadrun.writer.metrics import WriterMetrics
from payloadrun.writer.rewrite import RewriteResult, admit_request, rewrite_response
from payloadrun.writer.transform import Mode, RequestError, RequestPlan, endpoint_of

log = logging.getLogger("payloadrun.writer")

T = TypeVar("T")

# Headers that belong to one connection, not to the message (RFC 9110 section 7.6.1), and those
# aiohttp computes itself from the body it sends.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)
_REQUEST_DROP = _HOP_BY_HOP | {"host", "content-length"}
_RESPONSE_DROP = _HOP_BY_HOP | {"content-length"}
MODE_HEADER = "X-Payloadrun-Mode"
FALLBACK_HEADER = "X-Payloadrun-Fallback"
# The status a request is counted with when its client went away (nginx's "client closed
# request"); never sent.
CLIENT_CLOSED = 499
# The server options the proxy needs: request bodies as received (a transparent proxy forwards
# a compressed body untouched), and a handler cancelled when its client hangs up (so that the
# upstream request is cancelled too and nothing is written for nobody).
RUNNER_OPTIONS = {"auto_decompress": False, "handler_cancellation": True}


@dataclass(frozen=True)
class WriterConfig:
    """Everything the writer is configured with (flags and environment, see ``cli.py``)."""

    upstream: str = setting(
        f"http://127.0.0.1:{VLLM_PORT}",
        help="vLLM's base URL",
        flag="--upstream",
        env=Env.WRITER_UPSTREAM,
    )
    payload_root: str | None = setting(
        None,
        help="the shared volume's mount; payload_dir must be <root>/v<k>",
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
        help="threads that parse bodies and write payload files",
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
    health_timeout: float = 2.0
    max_request_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        settings.validate(self)


class StoreHolder:
    """The payload store, opened on first use and reopened while the root is missing.

    The root may not be mounted yet when the sidecar starts (or may go away): the writer still
    serves, sends responses inline, and reports not ready, instead of crash-looping. ``get`` runs
    on worker threads only (it stats the root, which can hang on a dead NFS mount).
    """

    def __init__(self, root: str | None) -> None:
        self.root = root
        self._store: PayloadStore | None = None
        self._lock = threading.Lock()
        self.error = f"no payload root configured: set --payload-root or {Env.PAYLOAD_ROOT}"

    def get(self) -> PayloadStore | None:
        if self._store is not None or self.root is None:
            return self._store
        with self._lock:
            if self._store is None:
                try:
                    self._store = PayloadStore(self.root)
                except PayloadPathError as exc:
                    self.error = str(exc)
        return self._store


def probe_root(holder: StoreHolder) -> str | None:
    """None when a file can be created and deleted in the payload root, else what failed."""
    store = holder.get()
    if store is None:
        return holder.error
    path = store.root.path / f".payloadrun-writer-probe-{uuid.uuid4().hex}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
        os.unlink(path)
    except OSError as exc:
        return f"payload root {str(store.root.path)!r} is not writable: {exc}"
    return None


# A by-handle response at least this big is read into one buffer sized by its Content-Length.
PREALLOCATE_FROM = 1 << 20


def body_buffer(size: int) -> mmap.mmap:
    """A private anonymous mapping of ``size`` bytes, backed by huge pages when the kernel can.

    Reading 45 MB into fresh 4 KiB pages costs about 11,000 page faults (20-25 ms measured);
    with huge pages a few dozen. The mapping has ``find`` and the buffer protocol, which is all
    :mod:`payloadrun.writer.inline` needs, and it is unmapped when the last reference goes.
    """
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no MADV_HUGEPAGE: 4 KiB pages then
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


async def read_body(upstream: aiohttp.ClientResponse) -> bytes | mmap.mmap:
    """vLLM's whole response body, copied once, chunk by chunk, into one preallocated buffer.

    ``ClientResponse.read`` keeps every chunk until the end and then joins them: the chunks and
    the joined copy are all fresh memory, and the join (one 45 MB memcpy) runs on the event loop
    in one go. Here each chunk is copied as it arrives and then freed. A body without a
    Content-Length, or a small one, is read the usual way.
    """
    size = upstream.content_length
    chunked = "chunked" in upstream.headers.get("Transfer-Encoding", "").lower()
    if size is None or chunked or size < PREALLOCATE_FROM:
        return await upstream.read()
    buf = body_buffer(size)
    view = memoryview(buf)
    filled = 0
    try:
        async for chunk in upstream.content.iter_any():
            end = filled + len(chunk)
            if end > size:
                raise aiohttp.ClientPayloadError(
                    f"response body is longer than its Content-Length of {size} bytes"
                )
            view[filled:end] = chunk
            filled = end
    finally:
        view.release()
    if filled != size:
        raise aiohttp.ClientPayloadError(
            f"response body ended after {filled} of its Content-Length of {size} bytes"
        )
    return buf


def _forward_headers(headers: Any, *, drop: frozenset[str]) -> CIMultiDict[str]:
    """The end-to-end headers of a message: ``drop`` and every header ``Connection`` names
    (a proxy must remove those too, RFC 9110 section 7.6.1) are left out."""
    named = {
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
    }
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        lower = key.lower()
        if lower not in drop and lower not in named:
            out.add(key, value)
    return out


class Writer:
    """The state one writer app holds: config, store, upstream session, thread pool, metrics."""

    def __init__(self, config: WriterConfig, metrics: WriterMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or WriterMetrics()
        self.holder = StoreHolder(config.payload_root)
        self.upstream = URL(config.upstream.rstrip("/"))
        self.session: aiohttp.ClientSession | None = None
        self.executor: ThreadPoolExecutor | None = None
        budget = config.in_flight_budget or default_budget(container_memory_limit())
        self.budget = InFlightBudget(budget, self._budget_changed)
        self.metrics.in_flight_budget.set(budget)

    def _budget_changed(self, in_flight: int, waiting: int) -> None:
        self.metrics.in_flight_bytes.set(in_flight)
        self.metrics.in_flight_peak_bytes.set(self.budget.peak)
        self.metrics.budget_waiting.set(waiting)

    # --- lifecycle ---

    async def start(self, _app: web.Application) -> None:
        self.executor = ThreadPoolExecutor(
            max_workers=self.config.workers, thread_name_prefix="payloadrun-writer"
        )
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=self.config.connect_timeout,
                sock_read=self.config.read_timeout,
            ),
            auto_decompress=False,  # passthrough is byte for byte, compressed or not
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
        )
        await self.run(self.holder.get)  # open the store now when the root is there

    async def stop(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work on the writer's thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args))

    # --- handlers ---

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def readyz(self, _request: web.Request) -> web.Response:
        upstream_problem, root_problem = await asyncio.gather(
            self._upstream_problem(), self.run(probe_root, self.holder)
        )
        ready = upstream_problem is None and root_problem is None
        body = {
            "ready": ready,
            "upstream": upstream_problem or "ok",
            "payload_root": root_problem or "ok",
        }
        return web.json_response(body, status=200 if ready else 503)

    async def _upstream_problem(self) -> str | None:
        assert self.session is not None
        url = self.upstream / HEALTH_PATH.lstrip("/")
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.health_timeout)
            async with self.session.get(url, timeout=timeout) as resp:
                await resp.read()
                if resp.status != 200:
                    return f"vLLM at {self.upstream} is not healthy: /health answered {resp.status}"
        except TimeoutError:
            return (
                f"vLLM at {self.upstream} did not answer /health within "
                f"{self.config.health_timeout} s"
            )
        except aiohttp.ClientError as exc:
            return f"vLLM at {self.upstream} is unreachable: {exc}"
        return None

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        self.metrics.in_flight.inc()
        try:
            return await self._proxy(request)
        except asyncio.CancelledError:
            self._gone(request, "cancelled")
            raise
        except ConnectionError as exc:  # writing to a client whose connection has closed
            self._gone(request, str(exc) or type(exc).__name__)
            raise asyncio.CancelledError from None  # aiohttp ends it quietly, no traceback
        finally:
            self.metrics.in_flight.dec()

    def _gone(self, request: web.Request, why: str) -> None:
        """Count and log (one line) a request whose client will not read the answer."""
        self.metrics.request(Mode.DISCONNECTED, CLIENT_CLOSED)
        closed = request.transport is None or request.transport.is_closing()
        log.info(
            "%s %s from %s ended before its answer was sent: %s",
            request.method,
            request.path,
            request.remote,
            "the client closed the connection" if closed else why,
        )

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        endpoint = endpoint_of(request.method, request.path)
        plan: RequestPlan | None = None
        if endpoint is not None and body:
            store = await self.run(self.holder.get)
            encoding = request.headers.get("Content-Encoding")
            limit = self.config.max_request_bytes
            try:
                plan = await self.run(admit_request, store, endpoint, body, encoding, limit)
            except RequestError as exc:
                self.metrics.request(Mode.REJECTED, 400)
                log.warning("refused a request: %s", exc)
                return error_response(
                    400, str(exc), param="payload_dir", value=_jsonable(exc.value)
                )
            except coding.TooLarge:
                self.metrics.request(Mode.REJECTED, 413)
                message = (
                    f"the request body (Content-Encoding: {encoding}) decodes to more than "
                    f"{limit} bytes, the most the writer reads"
                )
                log.warning("refused a request: %s", message)
                return error_response(413, message)
        if plan is None or plan.stream:
            return await self._passthrough(request, body)
        return await self._by_handle(request, body, plan)

    # --- upstream ---

    def _upstream_url(self, request: web.Request) -> URL:
        return URL(str(self.upstream) + request.raw_path, encoded=True)

    async def _send_upstream(
        self, request: web.Request, body: bytes, headers: CIMultiDict[str]
    ) -> aiohttp.ClientResponse | web.Response:
        """vLLM's response (headers read), or the 502/504 to send instead."""
        assert self.session is not None
        try:
            return await self.session.request(
                request.method,
                self._upstream_url(request),
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
            )
        except Exception as exc:  # every failure becomes a clear 502/504
            return self._upstream_error(exc, "sending the request")

    def _upstream_error(self, exc: BaseException, during: str) -> web.Response:
        if isinstance(exc, TimeoutError):
            kind, status = "timeout", 504
            message = (
                f"vLLM at {self.upstream} did not answer in time while {during} "
                f"(connect timeout {self.config.connect_timeout} s, read timeout "
                f"{self.config.read_timeout} s): check that vLLM is not overloaded or stuck, "
                "or raise --read-timeout"
            )
        elif isinstance(exc, aiohttp.ClientConnectorError | ConnectionRefusedError):
            kind, status = "unreachable", 502
            message = (
                f"vLLM at {self.upstream} is unreachable ({exc}): check that vLLM is running "
                "and that --upstream names its address"
            )
        elif isinstance(exc, aiohttp.ClientError | OSError):
            kind, status = "broken", 502
            message = f"vLLM at {self.upstream} failed while {during}: {type(exc).__name__}: {exc}"
        else:
            raise exc
        self.metrics.upstream_failures.labels(kind=kind).inc()
        self.metrics.request(Mode.PASSTHROUGH, status)
        log.warning("%s", message)
        return error_response(status, message)

    async def _passthrough(self, request: web.Request, body: bytes) -> web.StreamResponse:
        headers = _forward_headers(request.headers, drop=_REQUEST_DROP)
        upstream = await self._send_upstream(request, body, headers)
        if isinstance(upstream, web.Response):
            return upstream
        async with upstream:
            return await self._stream_back(request, upstream, Mode.PASSTHROUGH)

    async def _stream_back(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        mode: Mode,
        extra_headers: dict[str, str] | None = None,
    ) -> web.StreamResponse:
        """Relay vLLM's response as it arrives; a break mid-body cuts the client connection.

        A client that goes away raises out of here (counted by :meth:`proxy`); vLLM breaking
        off is counted here, logged in one line, and the client's connection is closed so that
        the client sees a cut body, not a complete one.
        """
        resp = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=_forward_headers(upstream.headers, drop=_RESPONSE_DROP),
        )
        resp.headers.update(extra_headers or {})
        chunked = "chunked" in upstream.headers.get("Transfer-Encoding", "").lower()
        if upstream.content_length is not None and not chunked:
            resp.content_length = upstream.content_length
        await resp.prepare(request)
        sent = 0
        while True:
            try:
                chunk = await upstream.content.readany()
            except (TimeoutError, aiohttp.ClientError) as exc:
                kind = "timeout" if isinstance(exc, TimeoutError) else "broken"
                self.metrics.upstream_failures.labels(kind=kind).inc()
                self.metrics.request(mode, upstream.status)
                self.metrics.sent(mode, sent)
                log.warning(
                    "vLLM at %s broke off a response after %d bytes: %r", self.upstream, sent, exc
                )
                if request.transport is not None:
                    request.transport.close()
                return resp
            if not chunk:
                break
            await resp.write(chunk)
            sent += len(chunk)
        await resp.write_eof()
        self.metrics.request(mode, upstream.status)
        self.metrics.sent(mode, sent)
        return resp

    async def _by_handle(
        self, request: web.Request, body: bytes, plan: RequestPlan
    ) -> web.StreamResponse:
        # The writer has to read the answer: ask for it uncompressed. Leaving Accept-Encoding
        # out would not do: no Accept-Encoding means any coding is acceptable (RFC 9110 12.5.3).
        headers = _forward_headers(request.headers, drop=_REQUEST_DROP | {"accept-encoding"})
        headers["Accept-Encoding"] = coding.IDENTITY
        upstream = await self._send_upstream(request, body, headers)
        if isinstance(upstream, web.Response):
            return upstream
        async with upstream:
            if upstream.status != 200:
                # vLLM's errors carry no arrays: relayed unchanged.
                return await self._stream_back(request, upstream, Mode.PASSTHROUGH)
            if upstream.content_type != "application/json":
                self._count_fallback(
                    "bad_response", f"the answer is {upstream.content_type}, not JSON"
                )
                fallback = {MODE_HEADER: Mode.INLINE.value, FALLBACK_HEADER: "bad_response"}
                return await self._stream_back(request, upstream, Mode.INLINE, fallback)
            encoding = upstream.headers.get("Content-Encoding")
            chunked = "chunked" in upstream.headers.get("Transfer-Encoding", "").lower()
            cost = response_cost(
                None if chunked else upstream.content_length,
                bool(coding.codings(encoding)),
                self.budget.budget,
            )
            async with self._reserved(cost):
                try:
                    raw = await read_body(upstream)
                except Exception as exc:
                    return self._upstream_error(exc, "reading the response")
                received = time.perf_counter()
                upstream.release()  # read to the end: the connection may serve another request
                response_headers = _forward_headers(
                    upstream.headers, drop=_RESPONSE_DROP | {"content-type"}
                )
                return await self._answer(request, plan, raw, encoding, response_headers, received)

    @contextlib.asynccontextmanager
    async def _reserved(self, cost: int) -> AsyncIterator[None]:
        """Hold ``cost`` bytes of the in-flight budget; until they are free, vLLM's answer is
        not read (see :mod:`payloadrun.writer.budget`)."""
        started = time.perf_counter()
        if await self.budget.acquire(cost):
            self.metrics.budget_waits.inc()
            self.metrics.budget_wait_seconds.inc(time.perf_counter() - started)
        try:
            yield
        finally:
            self.budget.release(cost)

    async def _answer(
        self,
        request: web.Request,
        plan: RequestPlan,
        raw: bytes | mmap.mmap,
        encoding: str | None,
        response_headers: CIMultiDict[str],
        received: float,
    ) -> web.StreamResponse:
        """Take the arrays off vLLM's answer ``raw`` (its last byte came at ``received``) and
        send the client what is left."""
        if coding.codings(encoding):
            try:
                raw = await self.run(coding.decode, raw, encoding, 1 << 40)
            except (coding.CodingError, coding.TooLarge) as exc:
                # Sent back as received, coding and all: the client may read what we cannot.
                result = RewriteResult(
                    Mode.INLINE,
                    bytes(raw),
                    "content_encoding",
                    f"Content-Encoding {encoding}: {exc}",
                )
                return await self._send_result(request, raw, result, response_headers, received)
            del response_headers["Content-Encoding"]  # the body sent is a new one, identity
        store = await self.run(self.holder.get)
        result = await self._rewrite(store, plan, raw)
        return await self._send_result(request, raw, result, response_headers, received)

    def _count_fallback(self, reason: str, detail: str) -> None:
        self.metrics.fallbacks.labels(reason=reason).inc()
        log.warning("payload sent back inline (%s): %s", reason, detail)

    async def _rewrite(
        self, store: PayloadStore | None, plan: RequestPlan, raw: bytes | mmap.mmap
    ) -> RewriteResult:
        """``rewrite_response`` on the pool; a file it writes for a cancelled request is deleted."""
        loop = asyncio.get_running_loop()
        call = functools.partial(rewrite_response, store, plan, raw)
        job = loop.run_in_executor(self.executor, call)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(self._discard_when_written)
            raise

    def _discard_when_written(self, job: asyncio.Future[RewriteResult]) -> None:
        if not job.cancelled() and job.exception() is None:
            self._discard(job.result())

    def _discard(self, result: RewriteResult) -> None:
        """Delete the payload file of an answer no client will read (on the pool, not waited for).

        Only this writer knows the file's name, so nothing else can read it or delete it: the
        retention sidecar would never hear of it.
        """
        if result.file is not None and self.executor is not None:
            self.executor.submit(_unlink, result.file)

    async def _send_result(
        self,
        request: web.Request,
        raw: bytes | mmap.mmap,
        result: RewriteResult,
        headers: CIMultiDict[str],
        received: float,
    ) -> web.StreamResponse:
        """Send a by-handle answer; ``received`` is when its last byte came from vLLM."""
        m = self.metrics
        if result.fallback is not None:
            self._count_fallback(result.fallback, result.detail)
            headers[FALLBACK_HEADER] = result.fallback
        if result.write_seconds is not None:
            m.write_seconds.observe(result.write_seconds)
        for name, nbytes in result.written.items():
            if nbytes:
                m.payload_bytes.labels(field=name).inc(nbytes)
        headers[MODE_HEADER] = result.mode.value
        resp = web.Response(
            status=200, body=result.body, headers=headers, content_type="application/json"
        )
        try:  # sent here, not by aiohttp after we return, to know whether the client took it
            await resp.prepare(request)
            m.response_work_seconds.labels(mode=result.mode.value).observe(
                time.perf_counter() - received
            )
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self._discard(result)
            raise
        if result.mode is Mode.HANDLE:
            m.response_reduction_bytes.inc(max(0, len(raw) - len(result.body)))
        m.request(result.mode, 200)
        m.sent(result.mode, len(result.body))
        return resp


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("could not delete %s, written for a client that went away: %s", path, exc)
        return
    log.debug("deleted %s: its client went away before the answer was sent", path)


def _jsonable(value: object) -> Any:
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)


WRITER_KEY = web.AppKey("writer", Writer)


def build_app(config: WriterConfig, metrics: WriterMetrics | None = None) -> web.Application:
    """The proxy app; ``app[WRITER_KEY]`` is its :class:`Writer`."""
    writer = Writer(config, metrics)
    app = web.Application(client_max_size=config.max_request_bytes)
    app[WRITER_KEY] = writer
    app[serving.RUNNER_OPTIONS] = RUNNER_OPTIONS
    app.on_startup.append(writer.start)
    app.on_cleanup.append(writer.stop)
    app.router.add_get("/healthz", writer.healthz)
    app.router.add_get("/readyz", writer.readyz)
    app.router.add_route("*", "/{tail:.*}", writer.proxy)
    return app


async def serve(
    config: WriterConfig,
    host: str,
    port: int,
    metrics_host: str,
    metrics_port: int,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve the proxy (and metrics, unless ``metrics_port`` is 0) until SIGTERM or ``stop``."""
    metrics = WriterMetrics()
    listeners = [
        Listener(
            "proxy", build_app(config, metrics), host, port, f"--listen or {Env.WRITER_LISTEN}"
        )
    ]
    if metrics_port:
        listeners.append(
            Listener(
                "metrics",
                serving.metrics_app(metrics.registry),
                metrics_host,
                metrics_port,
                f"--metrics-port or {Env.WRITER_METRICS_PORT}",
            )
        )

    def started(urls: dict[str, str]) -> None:
        log.info(
            "writer listening on %s, upstream %s, payload root %s, metrics %s",
            urls["proxy"],
            config.upstream,
            config.payload_root,
            f"{urls['metrics']}/metrics" if metrics_port else "off",
        )

    await serving.serve(listeners, stop=stop, started=started)
