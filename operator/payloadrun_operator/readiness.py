"""Following each run's volume and workloads after its reconcile, without a finalizer.

kopf's timers and daemons put a finalizer on every object, so a run could not be deleted while
the operator is down. Instead, one background task per operator lists, every few seconds and per
watched namespace, the runs and their children (three list calls whatever the number of runs),
recomputes ``VolumeReady`` and ``Ready`` with the pure functions of :mod:`status`, and writes
what changed (guarded by the run's resourceVersion) with an event per transition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from payloadrun_operator.kube import KubeApiError
from payloadrun_operator.models import KIND
from payloadrun_operator.names import (
    API_VERSION,
    CHILD_KINDS,
    MANAGED_SELECTOR,
    WORKLOADS,
    child_name,
)
from payloadrun_operator.runtime import Operator
from payloadrun_operator.status import (
    PHASE_REJECTED,
    READY,
    VOLUME_READY,
    claim_check,
    status_update,
    workloads_check,
)

log = logging.getLogger("payloadrun.readiness")


def follows(run: dict[str, Any]) -> bool:
    """Only runs whose current generation was reconciled and accepted have children to follow."""
    status = run.get("status") or {}
    return status.get("observedGeneration") == run["metadata"].get("generation") and status.get(
        "phase"
    ) not in (None, PHASE_REJECTED)


async def refresh(op: Operator, namespace: str | None, now: str) -> int:
    """One pass over the runs of ``namespace`` (None: every namespace); runs updated."""
    client = op.client
    runs = await client.list_objects(API_VERSION, KIND, namespace)
    children: dict[tuple[str, str, str], dict[str, Any]] = {}
    for api, kind in CHILD_KINDS:
        for obj in await client.list_objects(api, kind, namespace, MANAGED_SELECTOR):
            meta = obj["metadata"]
            children[(meta["namespace"], kind, meta["name"])] = obj
    updated = 0
    for run in runs:
        if not follows(run):
            continue
        run.setdefault("apiVersion", API_VERSION)
        run.setdefault("kind", KIND)
        meta, status = run["metadata"], run["status"]
        ns, name = meta["namespace"], meta["name"]
        claim_name = status.get("claimName") if status.get("payloadMode") == "ByHandle" else None
        claim = children.get((ns, "PersistentVolumeClaim", claim_name or ""))
        if claim_name and claim is None:  # a claim the run brings carries no label of ours
            claim = await client.get("v1", "PersistentVolumeClaim", ns, claim_name)
        workloads = [children.get((ns, kind, child_name(name, c))) for _, kind, c in WORKLOADS]
        update = status_update(
            status,
            meta.get("generation"),
            {VOLUME_READY: claim_check(claim, claim_name), READY: workloads_check(workloads)},
            {},
            now,
        )
        op.metrics.observe_run(ns, name, update.phase, status.get("payloadMode") or "Unknown")
        if update.fields is None:
            continue
        if await client.patch_status(run, update.fields) is None:
            continue  # the run changed since the list: the next pass sees the new one
        updated += 1
        for event_type, reason, message in update.events:
            await client.post_event(run, event_type, reason, message, now)
    return updated


async def follow(
    op: Operator, namespaces: Sequence[str], interval: float, clock: Callable[[], str]
) -> None:
    """Refresh forever, every ``interval`` seconds; errors are logged and retried."""
    scopes: Sequence[str | None] = namespaces or (None,)
    while True:
        await asyncio.sleep(interval)
        for namespace in scopes:
            try:
                await refresh(op, namespace, clock())
            except (KubeApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning(
                    "readiness pass over %s failed: %s", namespace or "every namespace", exc
                )
