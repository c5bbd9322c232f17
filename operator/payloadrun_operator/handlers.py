"""kopf handlers: each validates, builds, applies and reports, and nothing more.

Registered on a registry of their own (no module-level handler state), with the operator's client,
settings and metrics passed in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import kopf

from payloadrun_operator.api.conditions import (
    AppliedReason,
    ConditionType,
    ReadyReason,
    ValidatedReason,
)
from payloadrun_operator.api.kinds import FOLLOWED, Kind
from payloadrun_operator.api.models import GROUP, KIND, PLURAL, VERSION
from payloadrun_operator.api.names import (
    ACTIVITY_MANAGER,
    ANNOTATION_PREFIX,
    DIFFBASE_KEY,
    FIELD_MANAGER,
    FINALIZER,
    LABEL_MANAGED_BY,
    WORKLOADS,
)
from payloadrun_operator.desired import context
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.observed import outcome
from payloadrun_operator.observed.following import Follower
from payloadrun_operator.observed.plan import WorkloadPlan, activity_manifest, workload_plan
from payloadrun_operator.observed.status import Check, rfc3339, status_update
from payloadrun_operator.platform import credentials, heap
from payloadrun_operator.platform.diffbase import DigestDiffBaseStorage
from payloadrun_operator.platform.kube import ChildRefused, KubeApiError
from payloadrun_operator.platform.metrics import UNKNOWN_MODE
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings

T = TypeVar("T")
RESOURCE = {"group": GROUP, "version": VERSION, "plural": PLURAL}
SPEC_VALID = Check(True, ValidatedReason.SPEC_VALID, "the spec is valid")
# Ready describes the accepted spec: a refused one leaves the children as they were, not ready.
SPEC_REJECTED = Check(
    False,
    ReadyReason.SPEC_REJECTED,
    "the spec was refused (see the Validated condition): not applied",
)
# Runs reconciled at once (controller-runtime's MaxConcurrentReconciles). The API server is the
# bottleneck of a burst, and this many keep it busy; without a bound, every run of a burst (900
# created in a minute, a resume) builds its 13 children and queues their applies at once, and the
# heap those leave behind is not returned (bench/operator.py: RSS after 1,050 runs).
RECONCILE_CONCURRENCY = 8
RESUME_CONCURRENCY = 2  # of those, runs found at start, re-applied at once
CHILDREN_APPLIED = Check(True, AppliedReason.CHILDREN_APPLIED, "every child was applied")


class QuietWatchHandlers(logging.Filter):
    """Drops kopf's "Handler ... succeeded" line for the watch handlers: one per event of every
    child would drown the log; a failure is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("_event' succeeded" in message and ".follow_" in message)


def utc_now() -> str:
    return rfc3339(datetime.now(UTC))


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: OperatorSettings) -> None:
    kopf_settings.persistence.finalizer = FINALIZER
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    # the last handled spec as a digest, not a second copy of it in every run (diffbase.py)
    kopf_settings.persistence.diffbase_storage = DigestDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key=DIFFBASE_KEY
    )
    kopf_settings.watching.server_timeout = settings.watch_server_timeout
    kopf_settings.watching.client_timeout = settings.watch_client_timeout
    kopf_settings.watching.inactivity_timeout = settings.watch_inactivity_timeout
    kopf_settings.watching.connect_timeout = 30
    kopf_settings.networking.request_timeout = 60
    kopf_settings.posting.reporting_component = FIELD_MANAGER
    # Events are posted for condition transitions; per-handler log lines stay in the log.
    kopf_settings.posting.level = logging.WARNING
    kopf_settings.peering.standalone = True
    # Resources are discovered once at start (the chart installs the CRD first): no watch on
    # CustomResourceDefinitions or Namespaces, so the RBAC needs neither.
    kopf_settings.scanning.disabled = True


def report(
    op: Operator,
    body: kopf.Body,
    patch: kopf.Patch,
    checks: dict[ConditionType, Check],
    fields: dict[str, Any],
) -> str:
    """Write the conditions and fields into status, post an event per transition; the phase."""
    status = body.get("status") or {}
    meta = body["metadata"]
    update = status_update(status, meta.get("generation"), checks, fields, utc_now())
    for key, value in (update.fields or {}).items():
        patch.status[key] = value
    for event_type, reason, message in update.events:
        kopf.event(body, type=event_type, reason=reason, message=message)
    mode = fields.get("payloadMode") or status.get("payloadMode") or UNKNOWN_MODE
    op.metrics.observe_run(meta["namespace"], meta["name"], update.phase, mode)
    return update.phase


async def reconcile(
    op: Operator,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: logging.Logger | logging.LoggerAdapter,
    follower: Follower | None = None,
) -> None:
    started = time.perf_counter()
    meta = body["metadata"]
    generation = meta.get("generation")
    admission = admit(body, op.settings)
    if admission.ctx is None:
        message = "; ".join(admission.errors)
        logger.warning("rejected: %s", message)
        report(
            op,
            body,
            patch,
            {
                ConditionType.VALIDATED: Check(
                    False, ValidatedReason.INVALID_SPEC, message, warning=True
                ),
                ConditionType.READY: SPEC_REJECTED,
            },
            {"observedGeneration": generation},
        )
        op.metrics.reconciles.labels("rejected").inc()
        return
    ctx, pin = admission.ctx, admission.pin
    spec = ctx.spec
    status = body.get("status") or {}
    final = context.is_final(status.get("phase"))
    decision = ctx.decision
    try:
        applied, waiting = await apply_children(op, ctx, final=final, follower=follower)
    except KubeApiError as exc:
        op.metrics.reconciles.labels("error").inc()
        # observedGeneration stays behind: the status follows the children only once every
        # one of them is applied
        refused = Check(
            False,
            AppliedReason.APPLY_FAILED,
            refusal_message(exc, op.settings.apply_retry_seconds),
            warning=True,
        )
        report(
            op,
            body,
            patch,
            {
                ConditionType.VALIDATED: SPEC_VALID,
                ConditionType.APPLIED: refused,
                ConditionType.READY: Check(False, ReadyReason.APPLY_FAILED, refused.message),
            },
            {},
        )
        raise kopf.TemporaryError(
            f"{exc}; retrying", delay=op.settings.apply_retry_seconds
        ) from exc
    if waiting:
        raise kopf.TemporaryError(f"waiting for {', '.join(waiting)} to be deleted", delay=5)
    # VolumeReady and Ready come from the children's watch events (following.py)
    checks = {
        ConditionType.VALIDATED: SPEC_VALID,
        ConditionType.APPLIED: CHILDREN_APPLIED,
        **outcome.suspend_check(spec.suspend, status),
    }
    fields: dict[str, Any] = {"observedGeneration": generation}
    if not final:  # a finished run keeps what it ran with
        fields |= {
            "payloadMode": str(decision.mode),
            "payloadModeReason": decision.reason,
            "payloadModeMessage": decision.message,
            "payloadRoot": ctx.root,
            "claimName": ctx.claim,
            "sidecars": pin,
            "startTime": status.get("startTime") or utc_now(),
        }
    report(op, body, patch, checks, fields)
    op.metrics.reconciles.labels("applied").inc()
    op.metrics.reconcile_seconds.observe(time.perf_counter() - started)
    logger.info(
        "applied %d children, payloads %s (%s)%s",
        len(applied),
        decision.mode,
        decision.reason,
        "" if ctx.active else ", without pods (suspended or finished)",
    )


def refusal_message(exc: KubeApiError, retry_seconds: int) -> str:
    """What the API server said of a child it refused, for the Applied condition."""
    child = f"{exc.child} " if isinstance(exc, ChildRefused) else ""
    return (
        f"the API server refused {child}(HTTP {exc.status} {exc.reason}): {exc.message}; the "
        f"operator retries every {retry_seconds} s"
    )


async def apply_children(
    op: Operator, ctx: RunContext, *, final: bool, follower: Follower | None = None
) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """Bring the children to what ``ctx`` builds, touching no workload whose inputs are unchanged
    beyond whether it has pods. A finished run's children are only stopped, never created.

    Two steps, each child of a step applied at once (a run waits two round trips rather than
    twelve): the claim, settings, network policies and Services, then the workloads whose pods
    use them. The workloads as they are come from ``follower``'s cache once it is synced (no
    request), else from the API server; what is applied goes back into that cache.

    Returns the children applied or kept (the workloads as the API server has them, the others
    empty: their answers are not read), and the Jobs still being deleted before they can be
    created again. A refusal raises once its step is done: the first refused child's, in order.
    """
    workload_kinds = {(kind, ctx.child_name(c)) for _, kind, c in WORKLOADS}
    children = build_children(ctx)
    others = [c for c in children if (c["kind"], c["metadata"]["name"]) not in workload_kinds]
    workloads = [c for c in children if (c["kind"], c["metadata"]["name"]) in workload_kinds]
    applied: dict[tuple[str, str], dict[str, Any]] = {}
    if not final:  # nothing reads their answers: not decoded
        await all_of([op.client.apply(child, answer=False) for child in others])
        applied = {(c["kind"], c["metadata"]["name"]): {} for c in others}
    waiting: list[str] = []
    for child, (plan, obj) in zip(
        workloads,
        await all_of([bring_workload(op, follower, child, final=final) for child in workloads]),
        strict=True,
    ):
        if plan in (WorkloadPlan.RECREATE, WorkloadPlan.WAIT):
            waiting.append(f"{child['kind']} {child['metadata']['name']}")
        elif obj is not None:
            applied[child["kind"], child["metadata"]["name"]] = obj
    return applied, waiting


async def all_of(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``calls`` at once; their results in order, or, once every one has ended, the first
    one's exception in order (a refused child does not cut its siblings' writes short)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(list[T], results)


async def bring_workload(
    op: Operator, follower: Follower | None, child: dict[str, Any], *, final: bool
) -> tuple[WorkloadPlan, dict[str, Any] | None]:
    """Bring one workload to ``child`` (see :func:`plan.workload_plan`); the plan carried
    out, and the workload as the API server has it (None: none, or being deleted)."""
    meta = child["metadata"]
    live = await live_workload(op, follower, child)
    plan = workload_plan(child, live)
    if final and plan != WorkloadPlan.SCALE:
        plan = WorkloadPlan.KEEP
    if plan == WorkloadPlan.APPLY:
        obj = await op.client.apply(child)
    elif plan == WorkloadPlan.SCALE:
        obj = await op.client.apply(activity_manifest(child), manager=ACTIVITY_MANAGER)
    elif plan == WorkloadPlan.RECREATE:
        # Foreground: the Job goes once its pods have, so old and new pods never overlap
        await op.client.delete(
            child["apiVersion"], child["kind"], meta["namespace"], meta["name"], "Foreground"
        )
        return plan, None
    else:
        return plan, None if live is None else {"kind": child["kind"], **live}
    if follower is not None:
        follower.wrote(obj)
    return plan, obj


async def live_workload(
    op: Operator, follower: Follower | None, child: dict[str, Any]
) -> dict[str, Any] | None:
    """The workload ``child`` as it is (None: it does not exist): the follower's copy once its
    cache is synced (watch events and the operator's own writes keep it current), else read."""
    meta = child["metadata"]
    if follower is not None:
        synced, live = follower.live(child["kind"], meta["namespace"], meta["name"])
        if synced:
            return live
    return await op.client.get(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])


def register(registry: kopf.OperatorRegistry, op: Operator) -> None:
    """Attach the operator's handlers to ``registry``."""
    follower = Follower(op, utc_now)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, op.settings)

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo:
        # kopf's kubeconfig login reads static credentials only and leaves exec credential
        # plugins (EKS, GKE, AKS kubeconfigs) to a client library, which the image does not
        # have: credentials.py runs them.
        info = kopf.login_with_service_account(**kwargs) or credentials.login_with_kubeconfig(
            **kwargs
        )
        if info is None:
            raise kopf.LoginError(
                "no credentials: run in a pod with a service account, or set KUBECONFIG"
            )
        op.client.login(info)
        return info

    @kopf.on.cleanup(registry=registry)
    async def close(**_: Any) -> None:
        for task in beating:
            task.cancel()
        await follower.stop()
        await op.client.close()

    reconciling = asyncio.Semaphore(RECONCILE_CONCURRENCY)
    drain = heap.Drain(heap.malloc_trim())  # a burst's heap given back once it is done

    @kopf.on.create(**RESOURCE, registry=registry)
    @kopf.on.update(**RESOURCE, registry=registry)
    async def reconcile_run(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
        with drain.working():
            async with reconciling:
                await reconcile(op, body, patch, logger, follower)

    # Every run found at start (a new leader's, after a restart or a failover) is applied
    # again, a few at a time: the API server's CPU goes to the runs created meanwhile first,
    # instead of to hundreds of unchanged children.
    resuming = asyncio.Semaphore(RESUME_CONCURRENCY)

    @kopf.on.resume(**RESOURCE, registry=registry)
    async def resume_run(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
        with drain.working():
            async with resuming, reconciling:
                await reconcile(op, body, patch, logger, follower)

    beating: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def start_following(**_: Any) -> None:
        follower.start(op.namespaces)
        beating.append(asyncio.create_task(op.heartbeat.beat_forever()))
        beating.append(asyncio.create_task(heap.trim_forever()))

    # Watch handlers: no finalizer, no annotation; each event feeds the follower's cache.
    @kopf.on.event(**RESOURCE, registry=registry)
    async def follow_run_event(event: kopf.RawEvent, **_: Any) -> None:  # async: no thread
        follower.observe(KIND, event)

    for kind in FOLLOWED:  # kopf watches each kind the status reads
        follow_kind(registry, follower, kind)

    @kopf.on.delete(**RESOURCE, optional=True, registry=registry)
    def forget(namespace: str, name: str, **_: Any) -> None:
        op.metrics.forget_run(namespace, name)


def follow_kind(registry: kopf.OperatorRegistry, follower: Follower, kind: Kind) -> None:
    """Feed the follower every event of ``kind`` among the operator's children."""

    @kopf.on.event(
        *kind.api_version.split("/"),
        kind.plural,
        labels={LABEL_MANAGED_BY: FIELD_MANAGER},
        registry=registry,
    )
    async def follow_child_event(event: kopf.RawEvent, **_: Any) -> None:
        follower.observe(kind.kind, event)
