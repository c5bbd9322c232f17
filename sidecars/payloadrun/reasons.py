"""The data plane's bounded vocabulary: why an answer went back inline, why a payload file was
deleted, why a call on the volume failed, why a retention request was refused.

Each value is protocol, named from here alone: the writer's ``X-Payloadrun-Fallback`` header,
the ``reason`` and ``error`` labels of both sidecars' metrics (which the chart's alert rules and
dashboards query), the retention journal's ``reason`` field, the log lines, and the tables of
``docs/writer.md``, ``docs/retention.md`` and ``docs/metrics.md``
(``tests/docs/test_reasons.py`` holds the docs and the alert rules to these members).
A value never changes once released: dashboards and alerts select on it.

The members are ``StrEnum``: each equals its string, so a label, a header or a JSON field reads
the same as before; the edges write ``.value`` all the same, so nothing depends on how a library
formats an enum. Only the standard library: the retention sidecar's deletion worker process
imports it, and ``payloadrun`` imports without torch or the operator.
"""

from __future__ import annotations

from enum import StrEnum


class WriteFailure(StrEnum):
    """Why a write to the payload volume failed (:func:`payloadrun.failures.failure_reason`):
    the store's ``PayloadWriteError.reason`` and the retention journal's ``error`` label."""

    NO_SPACE = "no_space"  # ENOSPC / EDQUOT
    PERMISSION = "permission"  # EACCES / EPERM / EROFS
    VOLUME_GONE = "volume_gone"  # missing, stale, unmounted, or its server away
    IO_ERROR = "io_error"  # any other error


class Fallback(StrEnum):
    """Why a by-handle answer went back inline (vLLM's answer, nothing lost): the writer's
    ``X-Payloadrun-Fallback`` header and ``payloadrun_writer_fallbacks_total{reason}``."""

    # the volume: a write failed (the four WriteFailure values) ...
    NO_SPACE = "no_space"
    PERMISSION = "permission"  # also: v<k> became a symlink since the request came in
    VOLUME_GONE = "volume_gone"
    IO_ERROR = "io_error"
    # ... or was not waited for
    WRITE_TIMEOUT = "write_timeout"  # not done within --write-deadline
    BREAKER_OPEN = "breaker_open"  # writes hung lately: skipped until a probe returns in time
    WRITE_THREADS_FULL = "write_threads_full"  # every write thread held by a hung write
    # vLLM's answer: not what the writer can take apart
    BAD_PAYLOAD = "bad_payload"  # an inline array could not be decoded or placed
    BAD_RESPONSE = "bad_response"  # the 200 is not a JSON completion
    CONTENT_ENCODING = "content_encoding"  # in a content coding the writer cannot read

    @classmethod
    def of(cls, failure: WriteFailure) -> Fallback:
        """The fallback of an answer whose write failed with ``failure``."""
        return cls(failure.value)


# The two families, as the chart's alert rules split them: the volume (critical: every inline
# answer carries tens of MB to the orchestrator) and vLLM's answer (a version or request the
# writer does not know).
VOLUME_FALLBACKS = frozenset(
    {
        Fallback.NO_SPACE,
        Fallback.PERMISSION,
        Fallback.VOLUME_GONE,
        Fallback.IO_ERROR,
        Fallback.WRITE_TIMEOUT,
        Fallback.BREAKER_OPEN,
        Fallback.WRITE_THREADS_FULL,
    }
)
ANSWER_FALLBACKS = frozenset(Fallback) - VOLUME_FALLBACKS


class Deletion(StrEnum):
    """Why the retention sidecar deleted a payload file: the ``reason`` label of
    ``payloadrun_retention_deleted_{files,bytes}_total`` and the journal's ``delete`` records."""

    CONSUMED = "consumed"  # its batch was read: a policy update at or past its step
    DISCARDED = "discarded"  # no batch will read it (empty or past max_steps, or discard())
    BACKSTOP = "backstop"  # its v<k> is older than any future batch may read
    WIPE = "wipe"  # a fresh run's start cleared the root


class DeleteError(StrEnum):
    """Why an unlink failed: ``payloadrun_retention_delete_errors_total{error}``."""

    NO_SPACE = "no_space"
    PERMISSION = "permission"
    VOLUME_GONE = "volume_gone"
    IO_ERROR = "io_error"
    NOT_A_DIRECTORY = "not_a_directory"  # a v<k> that is a symlink or a file
    IS_A_DIRECTORY = "is_a_directory"  # a payload name that is a directory
    WORKER_GONE = "worker_gone"  # the deletion worker process exited before answering

    @classmethod
    def of(cls, failure: WriteFailure) -> DeleteError:
        """The delete error of an unlink that failed with ``failure``."""
        return cls(failure.value)


class Refusal(StrEnum):
    """Why the retention sidecar refused a request:
    ``payloadrun_retention_refused_requests_total{reason}``."""

    BAD_REQUEST = "bad_request"  # 400: a path outside the root, a body that is not a call
    DISCARD_CONFLICT = "discard_conflict"  # 409: discard named files of a pending batch
