"""kopf handlers: each validates, builds, applies and reports, and nothing more.

Registered on a registry of their own (no module-level handler state), with the operator's client,
settings and metrics passed in.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import aiohttp
import kopf

from payloadrun_operator.api.conditions import (
    AppliedReason,
    ConditionType,
    ReadyReason,
    StatusField,
    ValidatedReason,
)
from payloadrun_operator.api.kinds import (
    BY_KIND,
    FOLLOWED,
    LEADER_WORKER_SET,
    WORKLOAD,
)
from payloadrun_operator.api.models import GROUP, KIND, PLURAL, VERSION
from payloadrun_operator.api.names import (
    ACTIVITY_MANAGER,
    ANNOTATION_PREFIX,
    API_VERSION,
    DIFFBASE_KEY,
    FIELD_MANAGER,
    FINALIZER,
    INFERENCE,
)
from payloadrun_operator.desired import context, group_check
from payloadrun_operator.desired.admission import Admission, admit
from payloadrun_operator.desired.builders import BuiltRun
from payloadrun_operator.observed import outcome, prerequisites, queue, readiness
from payloadrun_operator.observed.following import Follower, live_object
from payloadrun_operator.observed.plan import WorkloadPlan, activity_manifest, workload_plan
from payloadrun_operator.observed.status import Check, rfc3339, status_update
from payloadrun_operator.platform import credentials, heap
from payloadrun_operator.platform.diffbase import QuietProgressStorage, StatusDigestDiffBaseStorage
from payloadrun_operator.platform.kube import ChildRefused, KubeApiError
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings
from payloadrun_operator.queued import bring_queue, queue_gate

T = TypeVar("T")
log = logging.getLogger("payloadrun.handlers")
RESOURCE = {"group": GROUP, "version": VERSION, "plural": PLURAL}
FOLLOWED_KINDS = frozenset(k.kind for k in FOLLOWED)  # their answers go into the cache
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
IDLE_WORKER_SECONDS = 0.5  # kopf's per-object worker exits after this long without an event
CONFLICT_RETRIES = 3  # status writes over a run that changed meanwhile, before kopf retries
# kopf's record of the last handled spec: a digest the reconcile writes into the status
RECORD = StatusDigestDiffBaseStorage(
    prefix=ANNOTATION_PREFIX, key=DIFFBASE_KEY, field=StatusField.OBSERVED_DIGEST
)


class QuietWatchHandlers(logging.Filter):
    """Drops kopf's "Handler ... succeeded" line for the runs' watch handler: one per event of
    every run would drown the log; a failure is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("_event' succeeded" in message and ".follow_" in message)


def utc_now() -> str:
    return rfc3339(datetime.now(UTC))


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: OperatorSettings) -> None:
    kopf_settings.persistence.finalizer = FINALIZER
    # No write of kopf's own after a reconcile that succeeds (diffbase.py): its record of the
    # last handled spec is a digest in the status the reconcile writes, and its progress
    # records (and their prefix's marker) are written only while a handler is retried.
    kopf_settings.persistence.progress_storage = QuietProgressStorage(prefix=ANNOTATION_PREFIX)
    kopf_settings.persistence.diffbase_storage = RECORD
    kopf_settings.watching.server_timeout = settings.watch_server_timeout
    kopf_settings.watching.client_timeout = settings.watch_client_timeout
    kopf_settings.watching.inactivity_timeout = settings.watch_inactivity_timeout
    kopf_settings.watching.connect_timeout = 30
    kopf_settings.networking.request_timeout = 60
    kopf_settings.posting.reporting_component = FIELD_MANAGER
    # Events are posted for condition transitions; per-handler log lines stay in the log.
    kopf_settings.posting.level = logging.WARNING
    kopf_settings.peering.standalone = True
    # kopf keeps a worker for each run that had an event, holding that event's whole body until
    # the next one or until it has been idle this long (its default, 5 s, made a burst's bodies
    # the heap's high-water mark when kopf watched the children too: bench/operator.py, RSS
    # after 1,050 runs). A worker is cheap to start again.
    kopf_settings.queueing.idle_timeout = IDLE_WORKER_SECONDS
    # Resources are discovered once at start (the chart installs the CRD first): no watch on
    # CustomResourceDefinitions or Namespaces, so the RBAC needs neither. LeaderWorkerSet's API
    # too: one installed later is followed after a restart (platform/discovery.py).
    kopf_settings.scanning.disabled = True


async def report(
    op: Operator,
    body: Mapping[str, Any],
    checks: dict[ConditionType, Check],
    fields: dict[str, Any],
) -> str:
    """Set the conditions and fields in the run's status, writing only what changed, with an
    event per transition (:func:`readiness.write_status`, the operator's one status writer); the
    phase. A run changed since kopf read it (the follower wrote its part of the status) is read
    again, and the same checks and fields are set over what it holds then."""
    run = body
    meta = body["metadata"]
    generation = meta.get("generation")
    for _ in range(CONFLICT_RETRIES):
        now = utc_now()
        update = status_update(run.get("status") or {}, generation, checks, fields, now)
        if await readiness.write_status(op, run, update, now) is not readiness.Write.CONFLICT:
            return update.phase
        again = await op.client.get(API_VERSION, KIND, meta["namespace"], meta["name"])
        if again is None:
            return update.phase  # deleted meanwhile: no status to write
        run = again
    raise kopf.TemporaryError(
        f"the run changed {CONFLICT_RETRIES} times while its status was written; retrying",
        delay=1,
    )


async def reconcile(
    op: Operator,
    body: kopf.Body,
    logger: logging.Logger | logging.LoggerAdapter,
    follower: Follower | None = None,
) -> None:
    started = time.perf_counter()
    if follower is not None:
        # as controller-runtime's workers wait for their caches: what is applied and written
        # next is decided from the cache, whole from the first reconcile on
        await follower.synced.wait()
    meta = body["metadata"]
    # the label's queue, unless the run's pods started without one (it runs on, unqueued)
    queue_name = queue.queue_in_effect(body)
    gate = await queue_gate(op, follower, meta, queue_name)
    admission = await admitted(op, follower, body, gate.admitted)
    if admission.built is None:
        message = "; ".join(admission.errors)
        logger.warning("rejected: %s", message)
        await report(
            op,
            body,
            {
                ConditionType.VALIDATED: Check(
                    False, ValidatedReason.INVALID_SPEC, message, warning=True
                ),
                ConditionType.READY: SPEC_REJECTED,
            },
            handled(body),
        )
        op.metrics.reconciles.labels("rejected").inc()
        return
    built, pin = admission.built, admission.pin
    ctx = built.ctx
    spec = ctx.spec
    missing = prerequisites.missing_checks(
        spec.inference.pods_per_replica,
        op.discovery.serves(LEADER_WORKER_SET),
        queue=queue_name,
        kueue_served=op.discovery.serves(WORKLOAD),
        lws_versions=op.discovery.group_versions(LEADER_WORKER_SET),
        kueue_versions=op.discovery.group_versions(WORKLOAD),
    )
    if missing:
        # Valid, and nothing applied: observedGeneration stays behind (the follower leaves the
        # run alone), and the digest records the spec as handled (kopf calls again on a change
        # of it, and the operator's next start reconciles every run).
        logger.warning("not applied: %s", missing[ConditionType.APPLIED].message)
        await report(
            op,
            body,
            {ConditionType.VALIDATED: SPEC_VALID, **missing},
            {StatusField.OBSERVED_DIGEST: RECORD.digest(body)},
        )
        op.metrics.reconciles.labels("waiting").inc()
        return
    status = body.get("status") or {}
    final = context.is_final(status.get(StatusField.PHASE))
    decision = ctx.decision
    try:
        if queue_name is not None and not final:
            built = await bring_queue(op, follower, body, built, queue_name, gate)
        applied, waiting = await apply_children(op, built, final=final, follower=follower)
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
        await report(
            op,
            body,
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
    fields = handled(body)
    if not final:  # a finished run keeps what it ran with
        fields |= {
            StatusField.PAYLOAD_MODE: str(decision.mode),
            StatusField.PAYLOAD_MODE_REASON: str(decision.reason),
            StatusField.PAYLOAD_MODE_MESSAGE: decision.message,
            StatusField.PAYLOAD_ROOT: ctx.root,
            StatusField.CLAIM_NAME: ctx.claim,
            StatusField.SIDECARS: pin,
            StatusField.START_TIME: status.get(StatusField.START_TIME) or utc_now(),
        }
        if queue_name is not None and status.get(StatusField.QUEUE) is None:
            # queued from its start (or while suspended): written with startTime, so that no
            # later pass takes the run for one whose pods started unqueued
            fields[StatusField.QUEUE] = queue.queue_status(
                queue_name, meta["name"], queue.admission_of(None)
            )
        # What the follower computes from the children once this is written, written with it
        # (one status write where there were two): from its cache, which has what was applied.
        if follower is not None:
            cached = readiness.cached_status(body, follower.cache.children, fields, utc_now())
            if cached is not None:
                checks = {**cached.checks, **checks}
                fields |= cached.fields  # a queued run's status.queue
    await report(op, body, checks, fields)
    op.metrics.reconciles.labels("applied").inc()
    op.metrics.reconcile_seconds.observe(time.perf_counter() - started)
    logger.info(
        "applied %d children, payloads %s (%s)%s",
        len(applied),
        decision.mode,
        decision.reason,
        "" if ctx.active else ", without pods (suspended or finished)",
    )


def handled(body: Mapping[str, Any]) -> dict[str, Any]:
    """The status fields that record ``body`` as handled: its generation and the digest of its
    spec, labels and annotations (kopf's record, read back by :data:`RECORD`)."""
    return {
        StatusField.OBSERVED_GENERATION: body["metadata"].get("generation"),
        StatusField.OBSERVED_DIGEST: RECORD.digest(body),
    }


def refusal_message(exc: KubeApiError, retry_seconds: int) -> str:
    """What the API server said of a child it refused, for the Applied condition."""
    child = f"{exc.child} " if isinstance(exc, ChildRefused) else ""
    return (
        f"the API server refused {child}(HTTP {exc.status} {exc.reason}): {exc.message}; the "
        f"operator retries every {retry_seconds} s"
    )


async def apply_children(
    op: Operator, built: BuiltRun, *, final: bool, follower: Follower | None = None
) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """Bring the children to ``built``'s (as admission built them), touching no workload whose
    inputs are unchanged beyond whether it has pods. A finished run's children are only stopped,
    never created.

    Two steps, each child of a step applied at once (a run waits two round trips rather than
    twelve): the claim, settings, network policies and Services, then the workloads whose pods
    use them. The workloads as they are come from ``follower``'s cache once it is synced (no
    request), else from the API server; what is applied goes back into that cache.

    Returns the children applied or kept (the workloads as the API server has them, the others
    empty: their answers are not read), and the Jobs still being deleted before they can be
    created again. A refusal raises once its step is done: the first refused child's, in order.
    """
    children = built.children
    others = [c for c in children if not built.is_workload(c)]
    workloads = [c for c in children if built.is_workload(c)]
    applied: dict[tuple[str, str], dict[str, Any]] = {}
    if not final:  # only the followed kinds' answers are read (into the cache): not decoded
        answers = await all_of(
            [op.client.apply(child, answer=child["kind"] in FOLLOWED_KINDS) for child in others]
        )
        for answer in answers:
            if answer and follower is not None:
                follower.wrote(answer)
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


async def admitted(
    op: Operator, follower: Follower | None, body: kopf.Body, queue_admitted: bool
) -> Admission:
    """:func:`admit`, and for a group run the API server's own check of its pod templates."""
    admission = admit(body, op.settings, queue_admitted=queue_admitted)
    if admission.built is not None:
        refused = await refused_group_templates(op, follower, admission.built)
        if refused:
            return Admission(None, errors=refused)
    return admission


async def refused_group_templates(
    op: Operator, follower: Follower | None, built: BuiltRun
) -> list[str]:
    """A group run's pod templates the API server refuses as StatefulSets' pods (dry runs,
    :mod:`desired.group_check`), checked when its LeaderWorkerSet is to be applied (new, or its
    inputs changed): nobody else checks them before LeaderWorkerSet's controller fails on them."""
    if built.ctx.spec.inference.pods_per_replica == 1 or not op.discovery.serves(LEADER_WORKER_SET):
        return []
    lws = built.workload(INFERENCE)
    if workload_plan(lws, await live_workload(op, follower, lws)) != WorkloadPlan.APPLY:
        return []
    has_worker = built.ctx.spec.inference.worker_template is not None
    refused: dict[str, str] = {}  # one refusal a template path
    for path, check in group_check.checks(lws, has_worker):
        if path in refused:
            continue
        try:
            await op.client.dry_run_create(check)
        except KubeApiError as exc:
            if exc.status != 422:  # not the template's fault (quota, a webhook away): applied
                continue
            refused[path] = group_check.refusal(exc.message, path, check)
    return list(refused.values())


async def live_workload(
    op: Operator, follower: Follower | None, child: dict[str, Any]
) -> dict[str, Any] | None:
    """The workload ``child`` as it is (None: it does not exist): :func:`live_object`."""
    meta = child["metadata"]
    kind = BY_KIND[child["apiVersion"], child["kind"]]
    return await live_object(op, follower, kind, meta["namespace"], meta["name"])


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
        # Before kopf has credentials, so before its own scan of the cluster's resources:
        # the add-on APIs the operator uses are ones kopf watches (platform/discovery.py).
        await op.discovery.discover(op.client)
        return info

    @kopf.on.cleanup(registry=registry)
    async def close(**_: Any) -> None:
        # kopf runs this once its own handlers are done, but not the tasks the operator started
        # itself (kopf waits up to 5 s for those, then cancels them): each is stopped before
        # the client closes, or a pass still running would fail on the closed session and kopf
        # would re-raise that at exit (a traceback, exit status 1).
        for task in beating:
            task.cancel()
        await requeue.stop()
        await follower.stop()
        await op.client.close()

    reconciling = asyncio.Semaphore(RECONCILE_CONCURRENCY)
    drain = heap.Drain(heap.malloc_trim())  # a burst's heap given back once it is done
    locks = RunLocks()  # one reconcile of a run at a time: kopf's, or a Workload's requeue

    @kopf.on.create(**RESOURCE, registry=registry)
    @kopf.on.update(**RESOURCE, registry=registry)
    async def reconcile_run(body: kopf.Body, logger: Any, **_: Any) -> None:
        with drain.working():
            async with locks.hold(run_key(body)), reconciling:
                await reconcile(op, body, logger, follower)

    requeue = Requeue(op, follower, locks, reconciling, drain)

    # Every run found at start (a new leader's, after a restart or a failover) is applied
    # again, a few at a time: the API server's CPU goes to the runs created meanwhile first,
    # instead of to hundreds of unchanged children.
    resuming = asyncio.Semaphore(RESUME_CONCURRENCY)

    @kopf.on.resume(**RESOURCE, registry=registry)
    async def resume_run(body: kopf.Body, logger: Any, **_: Any) -> None:
        with drain.working():
            async with resuming, locks.hold(run_key(body)), reconciling:
                await reconcile(op, body, logger, follower)

    beating: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def start_following(**_: Any) -> None:
        # the children's watches are the follower's (observed/watching.py), not kopf's
        follower.start(op.namespaces, requeue)
        beating.append(asyncio.create_task(op.heartbeat.beat_forever()))
        beating.append(asyncio.create_task(heap.trim_forever()))

    # The runs' watch handler: no finalizer, no annotation; each event feeds the follower's cache.
    @kopf.on.event(**RESOURCE, registry=registry)
    async def follow_run_event(event: kopf.RawEvent, **_: Any) -> None:  # async: no thread
        follower.observe(KIND, event)

    @kopf.on.delete(**RESOURCE, optional=True, registry=registry)
    def forget(namespace: str, name: str, **_: Any) -> None:
        op.metrics.forget_run(namespace, name)


class Requeue:
    """Reconciles a run again, from the API server's copy, when a child's event calls for it
    (:func:`child_event_requeues`: a child deleted, a Workload's admission changed); as kopf's
    handlers do, one at a time per run, within the reconciles' bound, retried after a temporary
    failure. A run already waiting for its turn is not queued twice: the pass it waits for reads
    the run and its children when it starts."""

    def __init__(
        self,
        op: Operator,
        follower: Follower,
        locks: RunLocks,
        reconciling: asyncio.Semaphore,
        drain: heap.Drain,
    ) -> None:
        self.op, self.follower, self.locks = op, follower, locks
        self.reconciling, self.drain = reconciling, drain
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: set[tuple[str, str]] = set()  # queued, their pass not started yet
        self._stopped = False
        # the run's log lines as kopf's handlers write them ("[namespace/name] ...", the run's
        # reference in JSON logs), never posted as events
        self._kopf_settings = kopf.OperatorSettings()

    def __call__(self, key: tuple[str, str], delay: float = 0.0) -> None:
        if self._stopped:  # a retry's timer, or a child's event, after the operator stopped
            return
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self, key)
            return
        if key in self._waiting:
            return
        self._waiting.add(key)
        task = asyncio.create_task(self._reconcile(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def passes(self) -> int:
        """Passes queued or running."""
        return len(self._tasks)

    async def stop(self) -> None:
        """End every pass queued or running, and start none from now on."""
        self._stopped = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _reconcile(self, key: tuple[str, str]) -> None:
        op = self.op
        with self.drain.working():
            try:
                async with self.locks.hold(key), self.reconciling:
                    self._waiting.discard(key)  # an event from now on needs a pass of its own
                    body = await op.client.get(API_VERSION, KIND, *key)
                    if body is None or body["metadata"].get("deletionTimestamp"):
                        return
                    logger = kopf.LocalObjectLogger(body=body, settings=self._kopf_settings)
                    await reconcile(op, body, logger, self.follower)
            except kopf.TemporaryError as exc:
                self(key, exc.delay or op.settings.apply_retry_seconds)
            except (KubeApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("%s/%s: reconcile after a child's event failed: %s", *key, exc)
                self(key, op.settings.apply_retry_seconds)


class RunLocks:
    """One lock per run, kept only while held or awaited."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def hold(self, key: tuple[str, str]) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock


def run_key(body: Mapping[str, Any]) -> tuple[str, str]:
    return body["metadata"]["namespace"], body["metadata"]["name"]
