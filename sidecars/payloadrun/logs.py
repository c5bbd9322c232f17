"""How every payloadrun process logs: ``plain`` for people, ``json`` for log pipelines.

One JSON shape for the operator and both sidecars, one object per line on stderr. It is kopf's
own (``kopf.LogFormat.JSON``: its key names, its ``severity`` words, its timestamp), so the
operator's kopf messages and the sidecars' lines parse the same way, plus the logger's name,
which kopf's leaves out and which tells a sidecar's lines from aiohttp's or kopf's own::

    {"timestamp": "2026-12-01T10:15:21.592378+00:00", "severity": "info",
     "logger": "payloadrun.writer", "message": "writer listening on http://0.0.0.0:8001, ..."}

- ``timestamp``: RFC 3339 in UTC with microseconds (always six digits).
- ``severity``: ``debug``, ``info``, ``warn``, ``error`` or ``fatal`` (kopf's words).
- ``logger``, ``message``: the logger's name and the formatted message.
- ``object``: the Kubernetes object a message is about (operator only; kopf's object
  reference: ``apiVersion``, ``kind``, ``name``, ``uid``, ``namespace``).
- ``exc_info``, ``stack_info``: the traceback as one string, when there is one.
- any ``extra={...}`` fields a call passes, under their own names.

The reference for operators is docs/operations.md (Logs). This module imports only the standard
library: the operator imports it too.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from payloadrun.settings import LOG_FORMATS

__all__ = ["LOG_FORMATS", "PLAIN_FORMAT", "JsonFormatter", "configure", "use_format"]

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# kopf's object reference, and what kopf's logger adapter attaches beside it (never logged).
OBJECT_ATTR = "k8s_ref"
_KOPF_ATTRS = frozenset({"k8s_ref", "k8s_skip", "settings"})
# The attributes every LogRecord has; whatever else a record carries came from ``extra``.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", logging.INFO, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def severity(levelno: int) -> str:
    """kopf's severity word for a level."""
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warn"
    if levelno <= logging.ERROR:
        return "error"
    return "fatal"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, in the shape the module docstring describes."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="microseconds"
            ),
            "severity": severity(record.levelno),
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, OBJECT_ATTR, None)
        if ref is not None:
            entry["object"] = ref
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in _KOPF_ATTRS and key not in entry:
                entry[key] = value
        return json.dumps(entry, default=str, ensure_ascii=False)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of a ``--log-format`` value (``plain``: the sidecars' text lines)."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "plain":
        return logging.Formatter(PLAIN_FORMAT)
    raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")


def use_format(log_format: str, logger: logging.Logger | None = None) -> None:
    """Format every handler of ``logger`` (the root logger) as ``log_format``.

    With ``json``, Python's warnings go through logging too, so every line on stderr is JSON.
    """
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        handler.setFormatter(formatter(log_format))
    logging.captureWarnings(log_format == "json")


def configure(level: str, log_format: str = "plain") -> None:
    """A sidecar's logging: a handler on stderr at ``level``, in ``log_format``.

    As :func:`logging.basicConfig`, it leaves a root logger that already has handlers alone
    (a test harness's).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler])
    logging.captureWarnings(log_format == "json")
