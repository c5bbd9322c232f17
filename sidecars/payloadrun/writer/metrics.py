"""The writer's Prometheus metrics.

Every metric lives in the registry the app is built with (one per app), so tests and benchmarks
can run several writers in one process. Labels are bounded: ``mode`` is one of
:class:`~payloadrun.writer.transform.Mode`, ``code`` the HTTP status code, ``field`` one of the
two payload fields, ``reason`` one of the fallback reasons, ``kind`` one of three upstream
failures.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from payloadrun import process_metrics
from payloadrun.segments import ROUTED_EXPERTS, SAMPLING_MASK
from payloadrun.writer.rewrite import FALLBACK_REASONS
from payloadrun.writer.transform import Mode

PREFIX = "payloadrun_writer_"
UPSTREAM_FAILURES = ("unreachable", "timeout", "broken")
# Write-and-fsync of one file: from a small response on local disk to tens of MB on NFS.
WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
        for name in (ROUTED_EXPERTS, SAMPLING_MASK):
            self.payload_bytes.labels(field=name)
        for reason in FALLBACK_REASONS:
            self.fallbacks.labels(reason=reason)
        for kind in UPSTREAM_FAILURES:
            self.upstream_failures.labels(kind=kind)
        for mode in Mode:
            self.response_bytes.labels(mode=mode.value)

    def request(self, mode: Mode, status: int) -> None:
        self.requests.labels(mode=mode.value, code=str(status)).inc()

    def sent(self, mode: Mode, nbytes: int) -> None:
        if nbytes:
            self.response_bytes.labels(mode=mode.value).inc(nbytes)
