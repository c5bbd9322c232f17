"""The one place the operator writes a run's status (:func:`write_status`), and only when it
changed: the pass (:mod:`reconcile`) computes a :class:`status.StatusUpdate` against what the
run holds and sends it here, guarded by the run's resourceVersion, with an event per transition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import aiohttp

from payloadrun_operator.api.conditions import StatusField
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.observed.status import StatusUpdate
from payloadrun_operator.platform.kube import KubeApiError
from payloadrun_operator.platform.metrics import UNKNOWN_MODE
from payloadrun_operator.platform.runtime import Operator

log = logging.getLogger("payloadrun.writing")


class Write(StrEnum):
    """What :func:`write_status` did."""

    UNCHANGED = "unchanged"  # nothing to write
    WRITTEN = "written"
    CONFLICT = "conflict"  # the run changed since it was read: nothing written
    GONE = "gone"  # the run was deleted since it was read (or its namespace): nothing to write


async def write_status(
    op: Operator, run: Mapping[str, Any], update: StatusUpdate, now: str
) -> Write:
    """Write ``update`` into ``run``'s status. Nothing when nothing changed; else a merge patch
    guarded by the run's resourceVersion (a run changed since it was read is not overwritten:
    :attr:`Write.CONFLICT`, read it again), then an event per condition that changed (one the
    API server refuses is logged: the status holds the transition). The run's phase and mode go
    to the metrics. A run deleted since it was read is :attr:`Write.GONE`, not an error."""
    meta = run["metadata"]
    ns, name = meta["namespace"], meta["name"]
    written = update.fields or {}
    mode = written.get(StatusField.PAYLOAD_MODE) or Recorded.of(run).payload_mode or UNKNOWN_MODE
    op.metrics.observe_run(ns, name, update.phase, mode)
    if update.fields is None:
        return Write.UNCHANGED
    try:
        if not await op.client.patch_status(dict(run), update.fields):
            return Write.CONFLICT
        posted = await asyncio.gather(
            *(
                op.client.post_event(dict(run), event_type, reason, message, now)
                for event_type, reason, message in update.events
            ),
            return_exceptions=True,
        )
    except KubeApiError as exc:
        if exc.status != 404:
            raise
        # Deleted meanwhile (a namespace's deletion takes its runs while a pass is under way):
        # no status to write, no event to post, and no series to keep for it.
        op.metrics.forget_run(ns, name)
        return Write.GONE
    for (_, reason, _), result in zip(update.events, posted, strict=True):
        if isinstance(result, KubeApiError | aiohttp.ClientError | OSError | TimeoutError):
            # an event is a notice: the status holds the transition (a namespace being deleted
            # takes no new event, as kopf's own poster found)
            log.warning("%s/%s: event %s not posted: %s", ns, name, reason, result)
        elif isinstance(result, BaseException):
            raise result
    return Write.WRITTEN
