"""The retention sidecar's Prometheus metrics, in a registry of their own per service.

Names follow the project's convention: prefix ``payloadrun_retention_``, base units, ``_total``
on counters; the only labels are ``reason`` (:class:`~payloadrun.reasons.Deletion` or
:class:`~payloadrun.reasons.Refusal`), ``error`` (:class:`~payloadrun.reasons.DeleteError`,
:class:`~payloadrun.reasons.WriteFailure`) and ``call`` (the three journaled calls), so every
series is bounded. Values that live in the service
(policy step, pending batches, directory size) are read at scrape time through callbacks, never by
walking the tree: the directory figures come from accounting corrected by a periodic scan. The
step gauges (newest recorded, oldest pending, and the configured ``max_off_policy_steps``) let an
alert compare how far behind the orchestrator the oldest unconsumed batch is with the run's own
off-policy window.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from payloadrun import process_metrics
from payloadrun.reasons import DeleteError, Deletion, Refusal, WriteFailure

PREFIX = "payloadrun_retention_"
# the API calls that journal an event (the "call" label of volume_hung_answers)
CALLS = ("record_batch", "policy_updated", "discard")


class RetentionMetrics:
    """Every metric of one retention service, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        process_metrics.register(registry, "retention")
        p = PREFIX

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(p + name, doc, registry=registry)

        self.directory_bytes = gauge(
            "directory_bytes", "Bytes of payload files under the root (accounting + last scan)."
        )
        self.directory_files = gauge(
            "directory_files", "Payload files under the root (accounting + last scan)."
        )
        self.version_directories = gauge(
            "version_directories", "v<k> directories under the payload root."
        )
        self.policy_step = gauge("policy_step", "Last policy step reported (-1 before any).")
        self.recorded_step = gauge(
            "recorded_step", "Highest batch step recorded, any disposition (-1 before any)."
        )
        self.oldest_pending_step = gauge(
            "oldest_pending_step", "Step of the oldest recorded batch not yet consumed (-1: none)."
        )
        self.max_off_policy_steps = gauge(
            "max_off_policy_steps", "The run's max_off_policy_steps (the backstop's m)."
        )
        self.pending_batches = gauge("pending_batches", "Recorded batches not yet consumed.")
        self.pending_files = gauge("pending_files", "Files of recorded batches not yet consumed.")
        self.queue_files = gauge("delete_queue_files", "Files queued for deletion.")
        self.deferred_files = gauge(
            "delete_deferred_files",
            "Files whose deletion failed after every attempt, waiting for the next round.",
        )
        self.journal_bytes = gauge("journal_bytes", "Size of the retention journal.")
        self.deleted_files = Counter(
            p + "deleted_files",
            "Payload files deleted, by reason.",
            ["reason"],
            registry=registry,
        )
        self.deleted_bytes = Counter(
            p + "deleted_bytes",
            "Bytes of payload files deleted, by reason.",
            ["reason"],
            registry=registry,
        )
        self.delete_errors = Counter(
            p + "delete_errors",
            "Failed unlink attempts (each retry counts), by error class.",
            ["error"],
            registry=registry,
        )
        self.delete_given_up = Counter(
            p + "delete_given_up_files",
            "Files still there after the last attempt of a round (deferred: tried again).",
            registry=registry,
        )
        self.refused = Counter(
            p + "refused_requests",
            "Requests refused: bad_request (400) or discard_conflict (409).",
            ["reason"],
            registry=registry,
        )
        self.policy_update_delete_seconds = Histogram(
            p + "policy_update_delete_seconds",
            "From policy_updated to the last of its files deleted (consumed and backstop).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320),
            registry=registry,
        )
        self.scan_seconds = Histogram(
            p + "scan_duration_seconds",
            "Duration of the periodic scan that corrects the directory accounting.",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.worker_restarts = Counter(
            p + "worker_restarts",
            "Deletion worker processes started again after one exited unexpectedly.",
            registry=registry,
        )
        self.compactions = Counter(
            p + "journal_compactions",
            "Journal rewrites that dropped settled events.",
            registry=registry,
        )
        self.journal_errors = Counter(
            p + "journal_errors",
            "Failed journal writes, by error class: an append (the call was answered 503 and "
            "not recorded) or a compaction (the journal keeps growing).",
            ["error"],
            registry=registry,
        )
        self.volume_hung = Counter(
            p + "volume_hung_answers",
            "API calls answered 503 because the journal's volume hung: the call outlived "
            "--call-deadline, or the journal was fenced after one that did; by call.",
            ["call"],
            registry=registry,
        )
        self.journal_fenced = gauge(
            "journal_fenced",
            "1 while the journal takes no appends (an append outlived its deadline and the "
            "journal has not been read back yet), else 0.",
        )
        self.journal_replays = Counter(
            p + "journal_fence_replays",
            "Times the journal was read back and the state rebuilt from it to lift a fence.",
            registry=registry,
        )
        for call in CALLS:
            self.volume_hung.labels(call)
        for reason in Deletion:
            self.deleted_files.labels(reason.value)
            self.deleted_bytes.labels(reason.value)
        for error in DeleteError:  # payloadrun.retention.deleter.error_reason, and worker_gone
            self.delete_errors.labels(error.value)
        for failure in WriteFailure:  # a journal append or rewrite that failed
            self.journal_errors.labels(failure.value)
        for refusal in Refusal:
            self.refused.labels(refusal.value)

    def bind(self, **sources: Callable[[], float]) -> None:
        """Read the named gauges from the service at scrape time (cheap callbacks only)."""
        for name, fn in sources.items():
            getattr(self, name).set_function(fn)
