"""kopf's side: its settings, and handlers that only add a run's key to the one work queue
(:mod:`platform.workqueue`), whose one pass is :mod:`reconcile`'s.

Registered on a registry of their own (no module-level handler state), with the operator's client,
settings and metrics passed in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from payloadrun_operator.api.models import GROUP, KIND, PLURAL, VERSION
from payloadrun_operator.api.names import ANNOTATION_PREFIX, FIELD_MANAGER, FINALIZER
from payloadrun_operator.observed.following import Follower
from payloadrun_operator.platform import credentials, heap
from payloadrun_operator.platform.diffbase import QuietProgressStorage
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings
from payloadrun_operator.platform.workqueue import Again, RunKey, Work, WorkQueue
from payloadrun_operator.reconcile import RECORD, Reconciler

RESOURCE = {"group": GROUP, "version": VERSION, "plural": PLURAL}
# Runs passed over at once (controller-runtime's MaxConcurrentReconciles). The API server is the
# bottleneck of a burst, and this many keep it busy; without a bound, every run of a burst (900
# created in a minute, a resume) builds its 13 children and queues their applies at once, and the
# heap those leave behind is not returned (bench/operator.py: RSS after 1,050 runs).
RECONCILE_CONCURRENCY = 8
RESUME_CONCURRENCY = 2  # of those, runs found at start, passed over at once
IDLE_WORKER_SECONDS = 0.5  # kopf's per-object worker exits after this long without an event


class QuietWatchHandlers(logging.Filter):
    """Drops kopf's "Handler ... succeeded" line for the runs' watch handler: one per event of
    every run would drown the log; a failure is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("_event' succeeded" in message and ".follow_" in message)


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


def register(registry: kopf.OperatorRegistry, op: Operator) -> None:
    """Attach the operator's handlers to ``registry``: each adds the run's key to the one work
    queue, which runs the one pass (:class:`reconcile.Reconciler`)."""
    follower = Follower(op)
    reconciler = Reconciler(op, follower)
    # a burst's heap given back once its runs are applied (kopf's handlers and the passes that
    # apply: the child events' passes that follow would put it off by up to DRAIN_TRIM_SECONDS)
    drain = heap.Drain(heap.malloc_trim())

    async def one_pass(key: RunKey, work: Work) -> Again | None:
        if not work.spec:  # a child's event: the trickle after a burst, not the burst
            return await reconciler(key, work)
        with drain.working():
            return await reconciler(key, work)

    passes = WorkQueue(one_pass, workers=RECONCILE_CONCURRENCY, resume_workers=RESUME_CONCURRENCY)
    op.metrics.status_pending.set_function(passes.pending)

    def notify(key: RunKey, spec: bool) -> None:
        passes.add(key, Work(spec=spec))

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
        await passes.stop()
        await follower.stop()
        await op.client.close()

    # kopf's handlers of the runs only queue the run, with the body kopf's latest event gave
    # (the follower's copy has no pod templates), and return once a pass has acted on it.
    @kopf.on.create(**RESOURCE, registry=registry)
    @kopf.on.update(**RESOURCE, registry=registry)
    async def reconcile_run(body: kopf.Body, **_: Any) -> None:
        with drain.working():  # waiting for its pass too: a burst's heap goes back at its end
            await passes.process(run_key(body), Work(dict(body), spec=True))

    # Every run found at start (a new leader's, after a restart or a failover) is passed over
    # again, a few at a time, behind the runs created meanwhile: the API server's CPU goes to
    # those first, instead of to hundreds of unchanged children.
    @kopf.on.resume(**RESOURCE, registry=registry)
    async def resume_run(body: kopf.Body, **_: Any) -> None:
        with drain.working():
            await passes.process(run_key(body), Work(dict(body), spec=True, resume=True))

    beating: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def start_following(**_: Any) -> None:
        # the children's watches are the follower's (observed/watching.py), not kopf's
        follower.start(op.namespaces, notify)
        passes.start()
        beating.append(asyncio.create_task(op.heartbeat.beat_forever()))
        beating.append(asyncio.create_task(heap.trim_forever()))

    # The runs' watch handler: no finalizer, no annotation; each event feeds the follower's cache.
    @kopf.on.event(**RESOURCE, registry=registry)
    async def follow_run_event(event: kopf.RawEvent, **_: Any) -> None:  # async: no thread
        follower.observe(KIND, event)

    @kopf.on.delete(**RESOURCE, optional=True, registry=registry)
    def forget(namespace: str, name: str, **_: Any) -> None:
        passes.discard((namespace, name))
        op.metrics.forget_run(namespace, name)


def run_key(body: Mapping[str, Any]) -> tuple[str, str]:
    return body["metadata"]["namespace"], body["metadata"]["name"]
