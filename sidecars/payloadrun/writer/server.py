"""The writer sidecar's HTTP server: a reverse proxy to vLLM on localhost.

Three paths through it:

- **passthrough**: any request that does not name a ``payload_dir``, every streaming request,
  every other path and method. The body goes to vLLM as sent and vLLM's answer comes back as it
  arrives, chunk by chunk, status, headers and bytes unchanged.
- **handle**: a non-streaming generate / completions / chat request that names a valid
  ``payload_dir``. vLLM's answer is read whole (:mod:`~payloadrun.writer.body`), its inline
  arrays are written to one payload file (fsynced and closed first) and replaced by segments
  (:mod:`~payloadrun.writer.plan`, :mod:`~payloadrun.writer.blocking`).
- **rejected**: a ``payload_dir`` outside the root, not ``v<digits>``, through ``..``, a
  percent-encoded character or a symlink: 400, nothing forwarded, nothing written.

Request bodies go upstream as received, content coding included (the server does not decode
them: see :mod:`payloadrun.writer.content_coding`); headers as a proxy forwards them
(:mod:`payloadrun.writer.forwarding`). A client that hangs up cancels its request: the
upstream connection is closed (vLLM aborts the generation, as it does for a client of its own),
the request is counted as ``disconnected`` with code 499, logged in one line, and a payload file
written for it is deleted.

Parsing, writing and serializing run on a thread pool; the event loop only moves bytes. Each
request takes one pool hop to be admitted (the store looked up and the body planned) and, by
handle, one to be rewritten. The probes are :data:`payloadrun.serving.HEALTH_PATH` and
:data:`~payloadrun.serving.READY_PATH`; metrics are served on their own port so that vLLM's own
``/metrics`` still passes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from yarl import URL

from payloadrun import serving
from payloadrun.reasons import Fallback
from payloadrun.serving import Listener
from payloadrun.settings import Env
from payloadrun.store import PayloadStore
from payloadrun.vllm import HEALTH_PATH as VLLM_HEALTH_PATH
from payloadrun.vllm import error_response
from payloadrun.writer import content_coding
from payloadrun.writer.blocking import (
    Prepared,
    RewriteResult,
    admit_request,
    check_payload_dir,
    inline_instead,
    prepare_response,
    rewrite_response,
    write_prepared,
)
from payloadrun.writer.body import CodedBody, UpstreamAnswer, read_answer
from payloadrun.writer.breaker import Admission, Breaker, BreakerState, admit_write
from payloadrun.writer.budget import (
    InFlightBudget,
    container_memory_limit,
    default_budget,
    response_cost,
)
from payloadrun.writer.config import WriterConfig, WriterListen
from payloadrun.writer.forwarding import is_chunked, request_headers, response_headers
from payloadrun.writer.metrics import WriterMetrics
from payloadrun.writer.payload_root import StoreHolder, probe_root
from payloadrun.writer.plan import Endpoint, Mode, RequestError, RequestPlan, endpoint_of
from payloadrun.writer.root_monitor import RootHealth, RootMonitor
from payloadrun.writer.upstreams import SESSION_HEADER, Upstream, Upstreams
from payloadrun.writer.write_threads import HeldThreads, WriteThreads

log = logging.getLogger("payloadrun.writer")

T = TypeVar("T")

MODE_HEADER = "X-Payloadrun-Mode"
FALLBACK_HEADER = "X-Payloadrun-Fallback"
# The status a request is counted with when its client went away (nginx's "client closed
# request"); never sent.
CLIENT_CLOSED = 499
# The deadline of the root monitor's probes when writes have none (``--write-deadline 0``).
PROBE_DEADLINE_WITHOUT_WRITE_DEADLINE = 5.0
# The server options the proxy needs: request bodies as received (a transparent proxy forwards
# a compressed body untouched), and a handler cancelled when its client hangs up (so that the
# upstream request is cancelled too and nothing is written for nobody).
RUNNER_OPTIONS = {"auto_decompress": False, "handler_cancellation": True}


class Writer:
    """The state one writer app holds: config, store, upstream session, thread pool, metrics."""

    def __init__(self, config: WriterConfig, metrics: WriterMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or WriterMetrics()
        self.holder = StoreHolder(config.payload_root)
        self.monitor = RootMonitor(
            functools.partial(probe_root, self.holder),
            interval=config.root_probe_interval,
            deadline=self.probe_deadline,
            on_probe=self._root_probed,
        )
        self.breaker = Breaker(config.breaker_cooldown)
        self._opened_counted = 0
        self.write_threads = WriteThreads(config.write_threads)
        self.held = HeldThreads(self.metrics.write_threads_held.set)
        self.metrics.write_threads_cap.set(config.write_threads)
        self.metrics.write_deadline.set(config.write_deadline or 0)
        self._breaker_changed()
        self.upstreams = Upstreams(config.upstreams)
        self.metrics.track_upstreams(self.upstreams.all)
        self.session: aiohttp.ClientSession | None = None
        self.executor: ThreadPoolExecutor | None = None
        budget = config.in_flight_budget or default_budget(container_memory_limit())
        self.budget = InFlightBudget(budget, self._budget_changed)
        self.metrics.in_flight_budget.set(budget)

    def _budget_changed(self, in_flight: int, waiting: int) -> None:
        self.metrics.in_flight_bytes.set(in_flight)
        self.metrics.in_flight_peak_bytes.set(self.budget.peak)
        self.metrics.budget_waiting.set(waiting)

    @property
    def probe_deadline(self) -> float:
        return self.config.write_deadline or PROBE_DEADLINE_WITHOUT_WRITE_DEADLINE

    def _root_probed(self, health: RootHealth) -> None:
        self.metrics.root_writable.set(1 if health.writable else 0)
        if health.last_ok is not None:
            self.metrics.root_last_writable.set(health.last_ok)

    # --- lifecycle (serving.lifecycle: before the address is bound, after it closed) ---

    async def start(self) -> None:
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
        # The monitor's first probe opens the store when the root is there; the writer serves
        # after it answered or timed out (a hung mount delays the start by the deadline only).
        if self.config.payload_root is None:  # nothing to watch: every answer goes inline
            self.metrics.root_writable.set(0)
            return
        self.monitor.start()
        await asyncio.to_thread(self.monitor.wait_first, self.probe_deadline + 1.0)

    async def stop(self) -> None:
        await asyncio.to_thread(self.monitor.stop)  # may wait out a probe on a hung mount
        self.write_threads.shutdown()
        if self.session is not None:
            await self.session.close()
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work on the writer's thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args))

    # --- probes ---

    async def healthz(self, _request: web.Request) -> web.Response:
        return serving.health_response()

    async def readyz(self, _request: web.Request) -> web.Response:
        """Ready when the proxy listens (it answers this) and vLLM answers its health check.

        The payload root's health is in the body as information (the monitor's last probe), never
        in the status: a volume outage means inline answers, not a pod out of its Service.
        """
        upstream_problem = await self._upstream_problem()
        return serving.ready_response(
            upstream_problem is None,
            upstream=upstream_problem or "ok",
            payload_root=self._root_health(),
        )

    def _root_health(self) -> str:
        if self.config.payload_root is None:
            return f"not writable: {self.holder.error}"
        return self.monitor.health.describe()

    async def _upstream_problem(self) -> str | None:
        """None when every upstream answers its health check; else what each that does not
        said, in ``--upstream``'s order (checked at the same time)."""
        ups = self.upstreams.all
        if len(ups) == 1:
            return await self._health_problem(ups[0])
        problems = await asyncio.gather(*(self._health_problem(up) for up in ups))
        found = [problem for problem in problems if problem is not None]
        return "; ".join(found) if found else None

    async def _health_problem(self, upstream: Upstream) -> str | None:
        """What is wrong with one upstream's ``/health``, or None when it answered 200 (which
        also puts it back up for requests, see :mod:`~payloadrun.writer.upstreams`)."""
        assert self.session is not None
        url = URL(upstream.url + VLLM_HEALTH_PATH, encoded=True)
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.health_timeout)
            async with self.session.get(url, timeout=timeout) as resp:
                await resp.read()
                if resp.status != 200:
                    return (
                        f"vLLM at {upstream.url} is not healthy: {VLLM_HEALTH_PATH} answered "
                        f"{resp.status}"
                    )
        except TimeoutError:
            return (
                f"vLLM at {upstream.url} did not answer {VLLM_HEALTH_PATH} within "
                f"{self.config.health_timeout} s"
            )
        except aiohttp.ClientError as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                self.upstreams.connect_failed(upstream, time.monotonic())
            return f"vLLM at {upstream.url} is unreachable: {exc}"
        self.upstreams.answered(upstream)
        return None

    # --- the proxy ---

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

    def _admit(
        self, endpoint: Endpoint, body: CodedBody
    ) -> tuple[PayloadStore | None, RequestPlan | None]:
        """The store (looked up once per request) and the request's plan; on the pool."""
        store = self.holder.get()
        return store, admit_request(store, endpoint, body, self.config.max_request_bytes)

    async def _admission(
        self, endpoint: Endpoint, body: CodedBody
    ) -> tuple[PayloadStore | None, RequestPlan | None, Fallback | None]:
        """The request's plan (parsed on the request pool) and, by handle, the store with the
        request's ``payload_dir`` checked on the volume (on the write threads, under the
        deadline and the breaker). A check skipped or late leaves the path to the write, which
        checks it again (a symlink found then sends the answer inline, nothing written).

        The third value is the fallback reason when the volume is not to be touched for this
        request (the check was late, or the breaker or the thread cap said skip): its answer
        then goes inline without a write.
        """
        if not self.config.write_deadline:
            return (*await self.run(self._admit, endpoint, body), None)
        limit = self.config.max_request_bytes
        plan = await self.run(admit_request, None, endpoint, body, limit)
        if plan is None:  # a streaming request's payload_dir is checked too (it then passes)
            return None, plan, None
        skipped, store = await self._on_volume(checked_store, self.holder, plan)
        if skipped is not None:  # not touching the volume: the store if it was opened before
            return self.holder.opened, plan, skipped
        return store, plan, None

    async def _on_volume(
        self,
        fn: Callable[..., T],
        *args: Any,
        when_late: Callable[[Any], None] | None = None,
        when_abandoned: Callable[[Any], None] | None = None,
    ) -> tuple[Fallback | None, T | None]:
        """Run ``fn(*args)``, which touches the payload volume, on the write threads under the
        deadline and the breaker: ``(None, its result)``, ``(WRITE_TIMEOUT, None)`` when it
        missed the deadline (``when_late(result)`` then runs on its thread when it returns,
        before its thread counts as free), or ``(BREAKER_OPEN or WRITE_THREADS_FULL, None)``
        when the breaker or the thread cap said skip. A request cancelled meanwhile leaves the
        call to ``when_abandoned(result)``."""
        loop = asyncio.get_running_loop()
        admission = admit_write(
            self.breaker, self.held.held, self.write_threads.cap, time.monotonic()
        )
        if not isinstance(admission, Admission):
            self._breaker_changed()
            return admission, None
        job = self.write_threads.submit(fn, *args)
        waiter = asyncio.wrap_future(job, loop=loop)
        waiter.add_done_callback(_retrieved)  # a late call's error is no "never retrieved"
        try:
            done, _ = await asyncio.wait({waiter}, timeout=self.config.write_deadline)
        except asyncio.CancelledError:
            self.breaker.abandoned(admission)
            self._breaker_changed()
            if when_abandoned is not None:
                job.add_done_callback(_on_result(when_abandoned))
            raise
        if done:
            self.breaker.returned(admission)
            self._breaker_changed()
            return None, waiter.result()
        self.breaker.missed(admission, time.monotonic())
        self._breaker_changed()
        if not job.cancel():  # it runs: its thread stays blocked until the kernel lets go
            self.held.hold(job, _on_result(when_late) if when_late else _ignore)
        return Fallback.WRITE_TIMEOUT, None

    def _breaker_changed(self) -> None:
        m, breaker = self.metrics, self.breaker
        for state in BreakerState:
            m.breaker_state.labels(state=state.value).set(1 if breaker.state is state else 0)
        if breaker.opened > self._opened_counted:
            m.breaker_opened.inc(breaker.opened - self._opened_counted)
            self._opened_counted = breaker.opened

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        endpoint = endpoint_of(request.method, request.path)
        if endpoint is None or not body:
            return await self._passthrough(request, body)
        coded = CodedBody(body, request.headers.get("Content-Encoding"))
        try:
            store, plan, skip = await self._admission(endpoint, coded)
        except RequestError as exc:
            self.metrics.request(Mode.REJECTED, 400)
            log.warning("refused a request: %s", exc)
            return error_response(400, str(exc), param="payload_dir", value=_jsonable(exc.value))
        except content_coding.TooLarge:
            self.metrics.request(Mode.REJECTED, 413)
            message = (
                f"the request body (Content-Encoding: {coded.encoding}) decodes to more than "
                f"{self.config.max_request_bytes} bytes, the most the writer reads"
            )
            log.warning("refused a request: %s", message)
            return error_response(413, message)
        if plan is None or plan.stream:
            return await self._passthrough(request, body)
        return await self._by_handle(request, body, store, plan, skip)

    # --- upstream ---

    async def _send_upstream(
        self, request: web.Request, body: bytes, *, by_handle: bool
    ) -> Exchange | web.Response:
        """vLLM's response (headers read) with the upstream that sent it, or the 502/504 to
        send instead.

        The upstream is chosen per request (:mod:`~payloadrun.writer.upstreams`: the session's
        when the request names one in ``X-Session-ID``, else the least busy); one that
        fails to connect is marked down and the request goes to the next it has not tried
        (nothing was sent, so nothing runs twice), until none is left.
        """
        assert self.session is not None
        headers = request_headers(request.headers, by_handle=by_handle)
        session_id = request.headers.get(SESSION_HEADER)
        tried: list[Upstream] = []
        failure: BaseException | None = None
        while True:
            upstream = self.upstreams.take(time.monotonic(), tried, session_id)
            if upstream is None:  # every upstream refused: the last failure is the answer
                assert failure is not None
                return self._upstream_error(failure, "sending the request", tried[-1])
            tried.append(upstream)
            try:
                response = await self.session.request(
                    request.method,
                    URL(upstream.url + request.raw_path, encoded=True),
                    headers=headers,
                    data=body if body else None,
                    allow_redirects=False,
                )
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                self.upstreams.release(upstream)
                self.upstreams.connect_failed(upstream, time.monotonic())
                self.metrics.upstream_connect_failed(upstream.url)
                if len(self.upstreams.all) > 1:  # with one, the 502's own line says it
                    log.warning("vLLM at %s did not take a connection: %s", upstream.url, exc)
                failure = exc
                continue
            except BaseException as exc:
                self.upstreams.release(upstream)
                if not isinstance(exc, Exception):  # cancelled: the client went away
                    raise
                return self._upstream_error(exc, "sending the request", upstream)
            self.upstreams.answered(upstream)
            return Exchange(self, upstream, response)

    def _upstream_error(self, exc: BaseException, during: str, upstream: Upstream) -> web.Response:
        if isinstance(exc, TimeoutError):
            kind, status = "timeout", 504
            message = (
                f"vLLM at {upstream.url} did not answer in time while {during} "
                f"(connect timeout {self.config.connect_timeout} s, read timeout "
                f"{self.config.read_timeout} s): check that vLLM is not overloaded or stuck, "
                "or raise --read-timeout"
            )
        elif isinstance(exc, aiohttp.ClientConnectorError | ConnectionRefusedError):
            kind, status = "unreachable", 502
            message = (
                f"vLLM at {upstream.url} is unreachable ({exc}): check that vLLM is running "
                "and that --upstream names its address"
            )
            if len(self.upstreams.all) > 1:
                message += f" (and every other upstream of {self.config.upstream} refused too)"
        elif isinstance(exc, aiohttp.ClientError | OSError):
            kind, status = "broken", 502
            message = f"vLLM at {upstream.url} failed while {during}: {type(exc).__name__}: {exc}"
        else:
            raise exc
        self.metrics.upstream_failures.labels(kind=kind).inc()
        self.metrics.request(Mode.PASSTHROUGH, status)
        log.warning("%s", message)
        return error_response(status, message)

    async def _passthrough(self, request: web.Request, body: bytes) -> web.StreamResponse:
        exchange = await self._send_upstream(request, body, by_handle=False)
        if isinstance(exchange, web.Response):
            return exchange
        async with exchange:
            return await self._stream_back(request, exchange, Mode.PASSTHROUGH)

    async def _stream_back(
        self,
        request: web.Request,
        exchange: Exchange,
        mode: Mode,
        extra_headers: dict[str, str] | None = None,
    ) -> web.StreamResponse:
        """Relay vLLM's response as it arrives; a break mid-body cuts the client connection.

        A client that goes away raises out of here (counted by :meth:`proxy`); vLLM breaking
        off is counted here, logged in one line, and the client's connection is closed so that
        the client sees a cut body, not a complete one.
        """
        upstream = exchange.response
        resp = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=response_headers(upstream.headers),
        )
        resp.headers.update(extra_headers or {})
        if upstream.content_length is not None and not is_chunked(upstream.headers):
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
                    "vLLM at %s broke off a response after %d bytes: %r",
                    exchange.upstream.url,
                    sent,
                    exc,
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

    # --- by handle ---

    async def _by_handle(
        self,
        request: web.Request,
        body: bytes,
        store: PayloadStore | None,
        plan: RequestPlan,
        skip: Fallback | None = None,
    ) -> web.StreamResponse:
        exchange = await self._send_upstream(request, body, by_handle=True)
        if isinstance(exchange, web.Response):
            return exchange
        async with exchange:
            upstream = exchange.response
            if upstream.status != 200:
                # vLLM's errors carry no arrays: relayed unchanged.
                return await self._stream_back(request, exchange, Mode.PASSTHROUGH)
            if upstream.content_type != "application/json":
                reason = Fallback.BAD_RESPONSE
                self._count_fallback(reason, f"the answer is {upstream.content_type}, not JSON")
                fallback = {MODE_HEADER: Mode.INLINE.value, FALLBACK_HEADER: reason.value}
                return await self._stream_back(request, exchange, Mode.INLINE, fallback)
            cost = response_cost(
                None if is_chunked(upstream.headers) else upstream.content_length,
                bool(content_coding.codings(upstream.headers.get("Content-Encoding"))),
                self.budget.budget,
            )
            async with self._reserved(cost):
                try:
                    answer = await read_answer(upstream)
                except Exception as exc:
                    return self._upstream_error(exc, "reading the response", exchange.upstream)
                exchange.finished()  # vLLM is done with it: the write is the writer's own work
                result = await self._rewrite(store, plan, answer, skip)
                return await self._send_result(request, answer, result)

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

    def _count_fallback(self, reason: Fallback, detail: str) -> None:
        """The metric and the log line of an answer sent back inline, named by ``reason``."""
        self.metrics.fallbacks.labels(reason=reason.value).inc()
        log.warning("payload sent back inline (%s): %s", reason.value, detail)

    async def _rewrite(
        self,
        store: PayloadStore | None,
        plan: RequestPlan,
        answer: UpstreamAnswer,
        skip: Fallback | None = None,
    ) -> RewriteResult:
        """The answer rewritten: parsed on the request pool, written on the write threads under
        the deadline; inline at once when the write is late or skipped (``skip``: already
        decided at admission)."""
        if not self.config.write_deadline:
            return await self._rewrite_without_deadline(store, plan, answer)
        prepared = await self.run(prepare_response, store, plan, answer.body)
        if isinstance(prepared, RewriteResult):
            return prepared
        if skip is not None:
            return await self.run(_skipped, prepared, skip, self.config.write_deadline)
        assert store is not None
        skipped, result = await self._on_volume(
            write_prepared,
            store,
            plan,
            prepared,
            when_late=self._late_write_returned,
            when_abandoned=self._discard_now,
        )
        if skipped is None:
            assert result is not None
            return result
        return await self.run(_skipped, prepared, skipped, self.config.write_deadline)

    def _late_write_returned(self, result: RewriteResult) -> None:
        """A write that missed its deadline returned (its answer went inline long ago): its file
        is removed now, on its own thread, so no file outlives its request unnamed."""
        if result.file is None:
            self.metrics.late_writes.labels(outcome="failed").inc()
            return
        _unlink(result.file, "its write missed the deadline; the answer went inline")
        self.metrics.late_writes.labels(outcome="removed").inc()

    def _discard_now(self, result: RewriteResult) -> None:
        if result.file is not None:
            _unlink(result.file, "its client went away before the answer was sent")

    async def _rewrite_without_deadline(
        self, store: PayloadStore | None, plan: RequestPlan, answer: UpstreamAnswer
    ) -> RewriteResult:
        """``rewrite_response`` on the pool; a file it writes for a cancelled request is deleted."""
        loop = asyncio.get_running_loop()
        call = functools.partial(rewrite_response, store, plan, answer.body)
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
        """Delete the payload file of an answer no client will read (not waited for; on the
        write threads, which may block on the volume, unless writes run on the request pool).

        Only this writer knows the file's name, so nothing else can read it or delete it: the
        retention sidecar would never hear of it.
        """
        if result.file is None:
            return
        if self.config.write_deadline:
            self.write_threads.submit(_unlink, result.file)
        elif self.executor is not None:
            self.executor.submit(_unlink, result.file)

    async def _send_result(
        self, request: web.Request, answer: UpstreamAnswer, result: RewriteResult
    ) -> web.StreamResponse:
        """Send a by-handle answer, with vLLM's headers and the coding of the body sent."""
        m = self.metrics
        headers = answer.headers.copy()
        if answer.body.coded and result.encoding is None:  # a new body, or vLLM's decoded
            headers.popall("Content-Encoding", None)
        if result.fallback is not None:
            self._count_fallback(result.fallback, result.detail)
            headers[FALLBACK_HEADER] = result.fallback.value
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
                time.perf_counter() - answer.received
            )
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self._discard(result)
            raise
        if result.reduction:
            m.response_reduction_bytes.inc(result.reduction)
        m.request(result.mode, 200)
        m.sent(result.mode, len(result.body))
        return resp


class Exchange:
    """vLLM's response to one request and the upstream that sent it; ``async with`` it to
    release both: the connection (as the response's own ``async with`` does) and the upstream's
    count of requests in flight, which lasts to the end of vLLM's answer, streamed or not
    (:meth:`finished` ends it early: a by-handle answer read whole, before the writer's work)."""

    __slots__ = ("_done", "_writer", "response", "upstream")

    def __init__(self, writer: Writer, upstream: Upstream, response: aiohttp.ClientResponse):
        self._writer = writer
        self.upstream = upstream
        self.response = response
        self._done = False

    def finished(self) -> None:
        """vLLM's part is over: the upstream's in-flight count given back, its answer counted."""
        if not self._done:
            self._done = True
            self._writer.upstreams.release(self.upstream)
            self._writer.metrics.upstream_answered(self.upstream.url)

    async def __aenter__(self) -> Exchange:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.finished()
        self.response.release()
        await self.response.wait_for_close()


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _unlink(path: str, why: str = "its client went away before the answer was sent") -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("could not delete %s (%s): %s", path, why, exc)
        return
    log.debug("deleted %s: %s", path, why)


def checked_store(holder: StoreHolder, plan: RequestPlan) -> PayloadStore | None:
    """The store, with the request's ``payload_dir`` checked on the volume
    (:func:`~payloadrun.writer.blocking.check_payload_dir`); run on the write threads."""
    store = holder.get()
    if store is not None:
        check_payload_dir(store, plan)
    return store


def _skipped(prepared: Prepared, reason: Fallback, deadline: float) -> RewriteResult:
    """vLLM's answer inline, for a write that was late (``write_timeout``) or never started."""
    if reason is Fallback.WRITE_TIMEOUT:
        detail = (
            f"the payload write did not finish within --write-deadline {deadline:g} s: the "
            "volume hangs or is slow; its file is removed when the write returns"
        )
    elif reason is Fallback.BREAKER_OPEN:
        detail = "a write missed its deadline lately: the volume is skipped until a probe succeeds"
    else:
        detail = "every write thread is held by a write blocked past its deadline"
    return inline_instead(prepared, reason, detail)


def _on_result(then: Callable[[Any], None]) -> Callable[[Any], None]:
    """A done-callback that hands a finished call's result to ``then`` (not an error's)."""

    def callback(job: Any) -> None:
        if not job.cancelled() and job.exception() is None:
            then(job.result())

    return callback


def _ignore(_job: Any) -> None:
    return None


def _jsonable(value: object) -> Any:
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)


WRITER_KEY = web.AppKey("writer", Writer)


def build_app(config: WriterConfig, metrics: WriterMetrics | None = None) -> web.Application:
    """The proxy app; ``app[WRITER_KEY]`` is its :class:`Writer`, started by the app's lifecycle
    (whoever runs the app starts and stops it)."""
    writer = Writer(config, metrics)
    app = web.Application(client_max_size=config.max_request_bytes)
    app[WRITER_KEY] = writer
    app[serving.RUNNER_OPTIONS] = RUNNER_OPTIONS
    app.cleanup_ctx.append(serving.lifecycle(writer.start, writer.stop))
    app.router.add_get(serving.HEALTH_PATH, writer.healthz)
    app.router.add_get(serving.READY_PATH, writer.readyz)
    app.router.add_route("*", "/{tail:.*}", writer.proxy)
    return app


def listeners(config: WriterConfig, where: WriterListen) -> list[Listener]:
    """The proxy and, unless ``where.metrics_port`` is 0, its metrics (on the proxy's host
    unless ``where.metrics_host`` says otherwise)."""
    metrics = WriterMetrics()
    moved_by = f"{serving.PORT_FLAG} or {Env.WRITER_PORT}"
    out = [Listener("proxy", build_app(config, metrics), where.host, where.port, moved_by)]
    if where.metrics_port:
        out.append(
            Listener(
                "metrics",
                serving.metrics_app(metrics.registry),
                where.metrics_host or where.host,
                where.metrics_port,
                f"{serving.METRICS_PORT_FLAG} or {Env.WRITER_METRICS_PORT}",
            )
        )
    return out


def log_started(config: WriterConfig) -> Callable[[dict[str, str]], None]:
    """What the writer logs once it listens (its first line)."""

    def started(urls: dict[str, str]) -> None:
        log.info(
            "writer listening on %s, upstream %s, payload root %s, metrics %s",
            urls["proxy"],
            config.upstream,
            config.payload_root,
            f"{urls['metrics']}/metrics" if "metrics" in urls else "off",
        )

    return started
