"""The writer's Prometheus metrics.

Every metric lives in the registry the app is built with (one per app), so tests and benchmarks
can run several writers in one process. Labels are bounded: ``mode`` is one of
:class:`~payloadrun.writer.plan.Mode`, ``code`` the HTTP status code, ``field`` one of the
two payload fields, ``reason`` one of the fallback reasons, ``kind`` one of three upstream
failures, ``upstream`` one of the base URLs ``--upstream`` lists (the pod's local vLLM API
servers: a handful).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from payloadrun import process_metrics
from payloadrun.reasons import Fallback
from payloadrun.segments import ROUTED_EXPERTS, SAMPLING_MASK
from payloadrun.writer.plan import Mode
from payloadrun.writer.upstreams import Upstream

PREFIX = "payloadrun_writer_"
UPSTREAM_FAILURES = ("unreachable", "timeout", "broken")
LATE_WRITE_OUTCOMES = ("removed", "failed")
# Write-and-fsync of one file: from a small response on local disk to tens of MB on NFS.
WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# The writer's work on one answer: 1 ms (a small one) to seconds (tens of MB on a slow volume).
# About 1.25x apart below a second, so that a quantile read from them (bench/writer.py, or
# histogram_quantile) is within a few percent, not a bucket's width.
WORK_BUCKETS = (
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010, 0.0125, 0.015, 0.0175, 0.020,
    0.025, 0.030, 0.035, 0.040, 0.045, 0.050, 0.060, 0.070, 0.080, 0.090, 0.100, 0.125, 0.150,
    0.175, 0.200, 0.250, 0.300, 0.400, 0.500, 0.750, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)  # fmt: skip


class WriterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        process_metrics.register(r, "writer")
        self.requests = Counter(
            PREFIX + "requests",
            "Requests served, by mode (handle, inline, passthrough, rejected) and the HTTP "
            "status sent to the client.",
            ["mode", "code"],
            registry=r,
        )
        self.payload_bytes = Counter(
            PREFIX + "payload_written_bytes",
            "Payload bytes written to payload files, by field.",
            ["field"],
            registry=r,
        )
        self.write_seconds = Histogram(
            PREFIX + "payload_write_seconds",
            "Time to write, fsync and close one payload file.",
            buckets=WRITE_BUCKETS,
            registry=r,
        )
        self.response_bytes = Counter(
            PREFIX + "response_bytes",
            "Response body bytes sent to clients, by mode.",
            ["mode"],
            registry=r,
        )
        self.response_reduction_bytes = Counter(
            PREFIX + "response_reduction_bytes",
            "Response body bytes not sent because the arrays went by handle "
            "(upstream body size minus the body sent).",
            registry=r,
        )
        self.fallbacks = Counter(
            PREFIX + "fallbacks",
            "By-handle responses sent back inline instead, by reason.",
            ["reason"],
            registry=r,
        )
        self.upstream_failures = Counter(
            PREFIX + "upstream_failures",
            "Requests vLLM did not answer: unreachable (502), timeout (504), broken (502).",
            ["kind"],
            registry=r,
        )
        self.in_flight = Gauge(PREFIX + "requests_in_flight", "Requests being served.", registry=r)
        self.response_work_seconds = Histogram(
            PREFIX + "response_work_seconds",
            "The writer's own work on one by-handle answer: from the last byte of vLLM's answer "
            "to the first byte sent to the client (parse, decode, write, fsync, serialize), by "
            "mode (handle, or inline when the arrays went back inline).",
            ["mode"],
            buckets=WORK_BUCKETS,
            registry=r,
        )
        self.in_flight_budget = Gauge(
            PREFIX + "in_flight_budget_bytes",
            "The in-flight budget: bytes of vLLM answers the writer holds at once.",
            registry=r,
        )
        self.in_flight_bytes = Gauge(
            PREFIX + "in_flight_bytes",
            "Bytes of the in-flight budget reserved by the answers being read, parsed and sent.",
            registry=r,
        )
        self.in_flight_peak_bytes = Gauge(
            PREFIX + "in_flight_peak_bytes",
            "The most bytes of the budget reserved at once since the writer started.",
            registry=r,
        )
        self.budget_waiting = Gauge(
            PREFIX + "budget_waiting_responses",
            "Answers waiting for the in-flight budget (not read from vLLM until it is free).",
            registry=r,
        )
        self.budget_waits = Counter(
            PREFIX + "budget_waits",
            "Answers that waited for the in-flight budget before being read.",
            registry=r,
        )
        self.budget_wait_seconds = Counter(
            PREFIX + "budget_wait_seconds",
            "Seconds answers spent waiting for the in-flight budget, summed.",
            registry=r,
        )
        self.root_writable = Gauge(
            PREFIX + "payload_root_writable",
            "1 when the last probe of the payload root created and deleted a file in time, 0 "
            "when it failed or hung, -1 before the first probe. Information only: readiness "
            "never depends on it.",
            registry=r,
        )
        self.root_writable.set(-1)
        self.root_last_writable = Gauge(
            PREFIX + "payload_root_last_writable_timestamp_seconds",
            "Unix time of the last probe that found the payload root writable (0: none yet).",
            registry=r,
        )
        self.write_deadline = Gauge(
            PREFIX + "write_deadline_seconds",
            "--write-deadline: seconds a by-handle write may take before its answer goes "
            "inline (0: no deadline).",
            registry=r,
        )
        self.write_threads_cap = Gauge(
            PREFIX + "write_threads_max",
            "--write-threads: the most threads volume calls may hold at once.",
            registry=r,
        )
        self.write_threads_held = Gauge(
            PREFIX + "write_threads_held",
            "Volume calls still blocked past their deadline: threads a hung volume holds. At "
            "write_threads_max, answers go inline at once (write_threads_full).",
            registry=r,
        )
        self.breaker_state = Gauge(
            PREFIX + "write_breaker_state",
            "The write breaker: 1 for its state now (closed, open, half_open), 0 for the others.",
            ["state"],
            registry=r,
        )
        self.breaker_opened = Counter(
            PREFIX + "write_breaker_opened",
            "Times the write breaker opened: a volume call missed its deadline.",
            registry=r,
        )
        self.late_writes = Counter(
            PREFIX + "late_writes",
            "Writes that returned after their deadline (their answers went inline): removed "
            "(written, then its file removed) or failed (returned an error, nothing to remove).",
            ["outcome"],
            registry=r,
        )
        self.upstream_requests = Counter(
            PREFIX + "upstream_requests",
            "Requests each vLLM API server answered (to the end of its answer), by upstream: "
            "its base URL as --upstream lists it.",
            ["upstream"],
            registry=r,
        )
        self.upstream_in_flight = Gauge(
            PREFIX + "upstream_requests_in_flight",
            "Requests sent to each vLLM API server whose answers have not ended, by upstream.",
            ["upstream"],
            registry=r,
        )
        self.upstream_connect_failures = Counter(
            PREFIX + "upstream_connect_failures",
            "Connections to each vLLM API server that failed (refused, or not accepted within "
            "--connect-timeout), by upstream; the request went on to another upstream if one "
            "was left.",
            ["upstream"],
            registry=r,
        )
        self._answered: dict[str, Counter] = {}
        self._refused: dict[str, Counter] = {}
        for outcome in LATE_WRITE_OUTCOMES:
            self.late_writes.labels(outcome=outcome)
        for name in (ROUTED_EXPERTS, SAMPLING_MASK):
            self.payload_bytes.labels(field=name)
        for reason in Fallback:
            self.fallbacks.labels(reason=reason.value)
        for kind in UPSTREAM_FAILURES:
            self.upstream_failures.labels(kind=kind)
        for mode in Mode:
            self.response_bytes.labels(mode=mode.value)
        for mode in (Mode.HANDLE, Mode.INLINE):
            self.response_work_seconds.labels(mode=mode.value)
            # from 0, so that the share of answers sent inline (an alert) counts the first ones
            self.requests.labels(mode=mode.value, code="200")

    def track_upstreams(self, upstreams: Sequence[Upstream]) -> None:
        """Series for each upstream from 0; its in-flight gauge reads its count when scraped
        (nothing on the request path)."""
        for up in upstreams:
            self._answered[up.url] = self.upstream_requests.labels(upstream=up.url)
            self._refused[up.url] = self.upstream_connect_failures.labels(upstream=up.url)
            gauge = self.upstream_in_flight.labels(upstream=up.url)
            gauge.set_function(lambda up=up: up.in_flight)

    def upstream_answered(self, url: str) -> None:
        self._answered[url].inc()

    def upstream_connect_failed(self, url: str) -> None:
        self._refused[url].inc()

    def request(self, mode: Mode, status: int) -> None:
        self.requests.labels(mode=mode.value, code=str(status)).inc()

    def sent(self, mode: Mode, nbytes: int) -> None:
        if nbytes:
            self.response_bytes.labels(mode=mode.value).inc(nbytes)
