"""One pass over one run, the operator's only one: as controller-runtime's ``Reconcile``,
JobSet's and KubeRay's, it reads, acts, computes the status once and writes it once.

The work queue (:mod:`platform.workqueue`) calls :class:`Reconciler` with a run's key and what
its adds asked for. A pass:

1. reads the run: kopf's latest full body when its spec side is owed (kopf saw a change, or a
   retry), the API server's copy when the spec side is owed for a child's event (the follower's
   copy has no pod templates), else the follower's cached copy; and its children from the cache;
2. when the spec side is owed, admits the run, builds its children once and brings them to it
   (:mod:`applying`, :mod:`queued`): the spec's verdict and the children applied;
3. when the run's current spec has been handled, observes what its status needs beyond the cache
   (:mod:`observing`) and computes it (:func:`readiness.run_status`, pure), with the spec side's
   part over it;
4. writes the status once, only where it changed, then posts an event per transition
   (:func:`writing.write_status`);
5. carries out what the status records: the trainers' restart, the group restart's event, what a
   queued run owes Kueue, a finished run's workloads stopped;
6. asks to be queued again when something is still owed: a retry, or what no watch reports
   (:attr:`readiness.RunStatus.recheck`: a claim not yet bound, say).

A status write that meets a run changed since it was read (409) ends the pass: the change's own
event queues the run again (and a spec side that ran is owed again, read from the API server).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf

from payloadrun_operator.api.conditions import (
    AppliedReason,
    ConditionType,
    EventReason,
    EventType,
    Phase,
    ReadyReason,
    StatusField,
    ValidatedReason,
)
from payloadrun_operator.api.kinds import JOB, LEADER_WORKER_SET, WORKLOAD
from payloadrun_operator.api.models import KIND
from payloadrun_operator.api.names import ANNOTATION_PREFIX, API_VERSION, DIFFBASE_KEY
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.applying import admitted, apply_children, refusal_message
from payloadrun_operator.desired import context
from payloadrun_operator.observed import (
    finishing,
    observing,
    outcome,
    prerequisites,
    queue,
    readiness,
    restarts,
    writing,
)
from payloadrun_operator.observed.following import Follower
from payloadrun_operator.observed.status import Check, rfc3339, status_update
from payloadrun_operator.platform.diffbase import StatusDigestDiffBaseStorage
from payloadrun_operator.platform.kube import KubeApiError
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.workqueue import Again, RunKey, Work
from payloadrun_operator.queued import bring_queue, queue_gate

log = logging.getLogger("payloadrun.reconcile")
SPEC_VALID = Check(True, ValidatedReason.SPEC_VALID, "the spec is valid")
# Ready describes the accepted spec: a refused one leaves the children as they were, not ready.
SPEC_REJECTED = Check(
    False,
    ReadyReason.SPEC_REJECTED,
    "the spec was refused (see the Validated condition): not applied",
)
CHILDREN_APPLIED = Check(True, AppliedReason.CHILDREN_APPLIED, "every child was applied")
RETRY_SECONDS = 5.0  # after a pass the API server failed (unreachable, say), or Jobs still going
RECHECK_SECONDS = 5.0  # what no watch reports: a claim the run brings, an evicted run's pods
# kopf's record of the last handled spec: a digest the pass writes into the status
RECORD = StatusDigestDiffBaseStorage(
    prefix=ANNOTATION_PREFIX, key=DIFFBASE_KEY, field=StatusField.OBSERVED_DIGEST
)
FAILURES = (KubeApiError, aiohttp.ClientError, OSError, TimeoutError)


def utc_now() -> str:
    return rfc3339(datetime.now(UTC))


def handled(body: Mapping[str, Any]) -> dict[str, Any]:
    """The status fields that record ``body`` as handled: its generation and the digest of its
    spec, labels and annotations (kopf's record, read back by :data:`RECORD`)."""
    return {
        StatusField.OBSERVED_GENERATION: body["metadata"].get("generation"),
        StatusField.OBSERVED_DIGEST: RECORD.digest(body),
    }


@dataclass(frozen=True)
class SpecPart:
    """What the spec side of a pass found and did: its conditions and fields for the status,
    its result (the reconciles metric's label; None: nothing to count yet), the log line that
    says it, and when to try again (an apply refused, Jobs still being deleted)."""

    checks: dict[ConditionType, Check] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)
    result: str | None = None
    said: tuple[int, str, tuple[Any, ...]] | None = None  # (level, message, args)
    retry: float | None = None


class Reconciler:
    """The pass (see the module's docstring), with what every pass shares."""

    def __init__(self, op: Operator, follower: Follower) -> None:
        self.op, self.follower = op, follower
        # the run's log lines as kopf's handlers write them ("[namespace/name] ...", the run's
        # reference in JSON logs), never posted as events
        self._kopf_settings = kopf.OperatorSettings()

    async def __call__(self, key: RunKey, work: Work) -> Again | None:
        # as controller-runtime's workers wait for their caches: what is applied and written
        # is decided from the cache, whole from the first pass on
        await self.follower.synced.wait()
        try:
            return await self._pass(key, work)
        except FAILURES as exc:
            delay = self.op.settings.apply_retry_seconds if work.spec else RETRY_SECONDS
            log.warning("%s/%s: the pass failed (again in %g s): %s", *key, delay, exc)
            if work.spec:
                self.op.metrics.reconciles.labels("error").inc()
            return Again(delay, work)

    async def _pass(self, key: RunKey, work: Work) -> Again | None:
        op, cache = self.op, self.follower.cache
        started = time.perf_counter()
        body = work.body
        if work.spec and body is None:  # the pod templates: the cache's copy has none
            body = await op.client.get(API_VERSION, KIND, *key)
        run = body if work.spec else cache.runs.get(key)
        if run is None or run["metadata"].get("deletionTimestamp") or cache.deleted(KIND, run):
            return None
        if not work.spec and not readiness.follows(run):
            return None  # its spec not handled yet (or refused): no children to follow
        now = utc_now()
        spec = await self._spec_side(run, now) if work.spec else SpecPart()
        meta, status = run["metadata"], run.get("status") or {}
        generation = meta.get("generation")
        # the run as the status side sees it: with the spec side's part written
        proposed = status_update(status, generation, spec.checks, spec.fields, now)
        seen = {**run, "status": {**status, **spec.fields, StatusField.PHASE: proposed.phase}}
        computed = None
        checks, fields, dropped = spec.checks, spec.fields, frozenset[ConditionType]()
        if readiness.follows(seen):
            observed = await observing.observe(op, seen, cache.children)
            computed = readiness.run_status(seen, observed, now)
            while computed.wants:
                observed = await observing.observe_wanted(op, seen, observed, computed.wants)
                computed = readiness.run_status(seen, observed, now)
            checks = {**computed.checks, **spec.checks}  # the spec's verdict over the children's
            fields = {**spec.fields, **computed.fields}
            dropped = computed.dropped
        written = update = None  # nothing to write while Jobs are still going
        if computed is not None or spec.result is not None:
            update = status_update(status, generation, checks, fields, now, dropped=dropped)
            written = await writing.write_status(op, run, update, now)
            if written is writing.Write.GONE:
                return None
            if written is writing.Write.CONFLICT:
                # changed since it was read: its event queues it again; an unrecorded spec side
                # is owed again, from the API server's copy unless kopf's newer one comes first
                return Again(0, Work(spec=True)) if work.spec else None
            op.metrics.status_refreshes.labels(
                "written" if written is writing.Write.WRITTEN else "unchanged"
            ).inc()
        self._said(run, spec, started)
        if computed is not None and update is not None:
            await self._act(seen, computed, update.phase, now)
        if spec.retry is not None:  # the body kept unless the write made it stale
            kept = body if written in (None, writing.Write.UNCHANGED) else None
            return Again(spec.retry, Work(kept, spec=True))
        return Again(RECHECK_SECONDS) if computed is not None and computed.recheck else None

    def _said(self, run: Mapping[str, Any], spec: SpecPart, started: float) -> None:
        """The spec side's log line and metrics, once its status is written."""
        if spec.result is not None:
            self.op.metrics.reconciles.labels(spec.result).inc()
        if spec.result == "applied":
            self.op.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        if spec.said is not None:
            level, message, args = spec.said
            logger = kopf.LocalObjectLogger(body=run, settings=self._kopf_settings)
            logger.log(level, message, *args)

    async def _spec_side(self, body: Mapping[str, Any], now: str) -> SpecPart:
        """Admit ``body``, build its children once and bring them to it; the spec's part of
        the status (kopf's record of the handled spec with it)."""
        op, follower = self.op, self.follower
        meta, record = body["metadata"], handled(body)
        # the label's queue, unless the run's pods started without one (it runs on, unqueued)
        queue_name = queue.queue_in_effect(body)
        gate = await queue_gate(op, follower, meta, queue_name)
        admission = await admitted(op, follower, body, gate.admitted)
        if admission.built is None:
            message = "; ".join(admission.errors)
            rejected = Check(False, ValidatedReason.INVALID_SPEC, message, warning=True)
            return SpecPart(
                {ConditionType.VALIDATED: rejected, ConditionType.READY: SPEC_REJECTED},
                record,
                "rejected",
                (logging.WARNING, "rejected: %s", (message,)),
            )
        built, pin = admission.built, admission.pin
        ctx = built.ctx
        missing = prerequisites.missing_checks(
            ctx.spec.inference.pods_per_replica,
            op.discovery.serves(LEADER_WORKER_SET),
            queue=queue_name,
            kueue_served=op.discovery.serves(WORKLOAD),
            lws_versions=op.discovery.group_versions(LEADER_WORKER_SET),
            kueue_versions=op.discovery.group_versions(WORKLOAD),
        )
        if missing:
            # Valid, and nothing applied: observedGeneration stays behind (the status side
            # leaves the run alone), and the digest records the spec as handled (kopf queues it
            # again on a change of it, and the operator's next start passes over every run).
            applied = missing[ConditionType.APPLIED].message
            return SpecPart(
                {ConditionType.VALIDATED: SPEC_VALID, **missing},
                {StatusField.OBSERVED_DIGEST: record[StatusField.OBSERVED_DIGEST]},
                "waiting",
                (logging.WARNING, "not applied: %s", (applied,)),
            )
        recorded = Recorded.of(body)
        final = recorded.final
        try:
            if queue_name is not None and not final:
                built = await bring_queue(op, follower, body, built, queue_name, gate)
            applied_children, waiting = await apply_children(
                op, built, final=final, follower=follower
            )
        except KubeApiError as exc:
            # observedGeneration stays behind: the status follows the children only once every
            # one of them is applied
            retry = op.settings.apply_retry_seconds
            refused = Check(
                False, AppliedReason.APPLY_FAILED, refusal_message(exc, retry), warning=True
            )
            return SpecPart(
                {
                    ConditionType.VALIDATED: SPEC_VALID,
                    ConditionType.APPLIED: refused,
                    ConditionType.READY: Check(False, ReadyReason.APPLY_FAILED, refused.message),
                },
                result="error",
                said=(logging.WARNING, "%s; again in %d s", (exc, retry)),
                retry=retry,
            )
        if waiting:  # nothing written for the spec until they are gone
            return SpecPart(
                said=(logging.INFO, "waiting for %s to be deleted", (", ".join(waiting),)),
                retry=RETRY_SECONDS,
            )
        decision = ctx.decision
        fields = dict(record)
        if not final:  # a finished run keeps what it ran with
            fields |= {
                StatusField.PAYLOAD_MODE: str(decision.mode),
                StatusField.PAYLOAD_MODE_REASON: str(decision.reason),
                StatusField.PAYLOAD_MODE_MESSAGE: decision.message,
                StatusField.PAYLOAD_ROOT: ctx.root,
                StatusField.CLAIM_NAME: ctx.claim,
                StatusField.SIDECARS: pin,
                StatusField.START_TIME: recorded.start_time or now,
            }
            if queue_name is not None and recorded.queue is None:
                # queued from its start (or while suspended): written with startTime, so that no
                # later pass takes the run for one whose pods started unqueued
                fields[StatusField.QUEUE] = queue.queue_status(
                    queue_name, meta["name"], queue.admission_of(None)
                )
        return SpecPart(
            {
                ConditionType.VALIDATED: SPEC_VALID,
                ConditionType.APPLIED: CHILDREN_APPLIED,
                **outcome.suspend_check(ctx.spec.suspend, recorded),
            },
            fields,
            "applied",
            (
                logging.INFO,
                "applied %d children, payloads %s (%s)%s",
                (
                    len(applied_children),
                    decision.mode,
                    decision.reason,
                    "" if ctx.active else ", without pods (suspended or finished)",
                ),
            ),
        )

    async def _act(
        self, run: Mapping[str, Any], computed: readiness.RunStatus, phase: str, now: str
    ) -> None:
        """What the written status records, carried out: the group restart said, the failed
        Job deleted so every trainer restarts, what a queued run owes Kueue, a finished run
        stopped."""
        client, children = self.op.client, self.follower.cache.children
        meta = run["metadata"]
        ns = meta["namespace"]
        group_restart = computed.fields.get(StatusField.LAST_INFERENCE_GROUP_RESTART)
        if group_restart is not None:  # recorded: said once, as a Warning
            await client.post_event(
                dict(run),
                EventType.WARNING,
                EventReason.INFERENCE_GROUP_RESTARTED,
                group_restart["message"],
                now,
            )
        if computed.restart is not None:  # recorded: now the failed Job goes, and its pods too
            plan, job = computed.restart
            if restarts.ACTIONS[plan].record:
                message = computed.fields[StatusField.LAST_TRAINER_RESTART]["message"]
                await client.post_event(
                    dict(run), EventType.WARNING, EventReason.TRAINERS_RESTARTED, message, now
                )
            job_meta = job["metadata"]
            await client.delete(
                JOB.api_version, JOB.kind, ns, job_meta["name"], "Foreground", uid=job_meta["uid"]
            )
        if computed.queue_duty is not queue.Duty.NONE:  # owed to Kueue: quota back, or Finished
            workload = queue.cached_workload(children, ns, meta["name"])
            assert workload is not None  # a duty is owed only for a Workload there is
            duty = queue.duty_status(
                workload, computed.queue_duty, now, failed=phase == Phase.FAILED
            )
            if not await client.patch_status(dict(workload), duty):
                # Kueue wrote it meanwhile: its event brings the run back here
                log.info("%s/%s: the Workload changed while it was written", ns, meta["name"])
        # Once its end is recorded (the spec side then builds it stopped too), nothing of it
        # runs on: checked at every pass, it costs no write when everything is stopped already.
        if context.is_final(phase):
            await finishing.stop(self.op, run, children)
