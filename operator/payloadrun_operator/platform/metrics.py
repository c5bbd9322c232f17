"""The operator's Prometheus metrics (kopf exports none of its own), beside the build info and
process metrics every payloadrun process exports (:mod:`payloadrun.process_metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from payloadrun import process_metrics

RESULTS = ("applied", "rejected", "error", "waiting")
UNKNOWN_MODE = "Unknown"  # the mode label of a run not yet accepted (no status.payloadMode)


class OperatorMetrics:
    """One registry per operator instance, so tests can run several in one process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        process_metrics.register(self.registry, "operator")
        self.reconciles = Counter(
            "payloadrun_operator_reconciles",
            "PayloadRun reconciliations by result (applied, rejected, error, waiting: a "
            "prerequisite such as LeaderWorkerSet is missing, nothing applied).",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "payloadrun_operator_reconcile_duration_seconds",
            "Time to validate, build and apply one PayloadRun's children.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.runs = Gauge(
            "payloadrun_operator_runs",
            "PayloadRuns this operator handles, by phase and payload mode.",
            ["phase", "mode"],
            registry=self.registry,
        )
        self.status_refreshes = Counter(
            "payloadrun_operator_status_refreshes",
            "Passes over a run that computed its status, by outcome (written, unchanged).",
            ["outcome"],
            registry=self.registry,
        )
        # With status_refreshes, what a test (or an operator) waits on instead of sleeping: once
        # the counter has moved past a moment and nothing is pending, every watch event the
        # operator received by then has been acted on.
        self.status_pending = Gauge(
            "payloadrun_operator_status_pending_runs",
            "Runs queued for a pass or in one now (0: the operator has acted on every event it "
            "received).",
            registry=self.registry,
        )
        self.leader = Gauge(
            "payloadrun_operator_leader",
            "1 while this operator acts (it holds the election's Lease, or runs without an "
            "election), 0 on standby.",
            registry=self.registry,
        )
        self._run_labels: dict[tuple[str, str], tuple[str, str]] = {}
        for result in RESULTS:
            self.reconciles.labels(result)
        for outcome in ("written", "unchanged"):
            self.status_refreshes.labels(outcome)

    def observe_run(self, namespace: str, name: str, phase: str, mode: str) -> None:
        """Record a run's phase and mode (it leaves its previous label pair)."""
        key = (namespace, name)
        old = self._run_labels.get(key)
        if old == (phase, mode):
            return
        if old is not None:
            self.runs.labels(*old).dec()
        self.runs.labels(phase, mode).inc()
        self._run_labels[key] = (phase, mode)

    def forget_run(self, namespace: str, name: str) -> None:
        old = self._run_labels.pop((namespace, name), None)
        if old is not None:
            self.runs.labels(*old).dec()
