"""What a pass reads of a run's children beyond the follower's cache, for the status it computes.

:func:`observe` takes what every pass needs (the cache's children, a claim the run brings, a
finished run's payloads released as it goes) and brings back the trainers' Job a restart
deleted; :func:`observe_wanted` reads just what the computed status asked for
(:attr:`readiness.RunStatus.wants`): a failed Job's pods, a group's pods and the
LeaderWorkerSet's Warning events, an evicted run's pods, the retention sidecar's last step. A
run whose children did not change costs no call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from payloadrun_operator.api.kinds import CLAIM, EVENT, JOB, LEADER_WORKER_SET, POD
from payloadrun_operator.api.models import KIND
from payloadrun_operator.api.names import (
    API_VERSION,
    LABEL_RUN,
    TRAINER,
    child_name,
    job_pods_selector,
    workloads_of,
)
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.desired import pinning
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.observed import finishing, groups
from payloadrun_operator.observed.readiness import (
    GROUP_EVENTS,
    GROUP_PODS,
    LAST_STEP,
    RUN_PODS,
    Observed,
)
from payloadrun_operator.platform.runtime import Operator

ENDED = frozenset({"Succeeded", "Failed"})  # a pod's phases once its containers are done


async def observe(op: Operator, run: Mapping[str, Any], children: finishing.Children) -> Observed:
    """What a pass needs of the children before it computes (acting on them as it goes: a
    finished run's payloads released, the trainers' Job created again after a restart)."""
    meta, recorded = run["metadata"], Recorded.of(run)
    ns = meta["namespace"]
    if recorded.final:
        return Observed(children, released=await finishing.release(op, run, children))
    trainers = children.get((ns, JOB.kind, child_name(meta["name"], TRAINER)))
    if trainers is None and pinning.layout_of(recorded.sidecars or {}).restarts_trainers_together:
        # a restart's deletion is done (or someone deleted it): the same manifest the spec side
        # builds, from the run as the API server has it (the follower's copy has no templates)
        live = await op.client.get(API_VERSION, KIND, ns, meta["name"])
        admission = None if live is None else admit(live, op.settings)  # None: deleted meanwhile
        if admission is not None and admission.built is not None:  # else refused: the spec says
            await op.client.apply(admission.built.workload(TRAINER))
    claim_name = recorded.claim_name
    claim = children.get((ns, CLAIM.kind, claim_name or ""))
    if claim_name and claim is None:  # a claim the run brings carries no label of ours
        claim = await op.client.get(CLAIM.api_version, CLAIM.kind, ns, claim_name)
    return Observed(children, claim=claim)


async def observe_wanted(
    op: Operator, run: Mapping[str, Any], observed: Observed, wants: frozenset[str]
) -> Observed:
    """``observed`` with what :func:`readiness.run_status` asked for read: Jobs' pods, the
    groups' pods and events, an evicted run's pods, the last step."""
    meta = run["metadata"]
    ns, name = meta["namespace"], meta["name"]
    inference = workloads_of(run)[0][2]
    pods = dict(observed.pods)
    for job_name in sorted(wants - {LAST_STEP, GROUP_PODS, GROUP_EVENTS, RUN_PODS}):
        pods[job_name] = await op.client.list_objects(
            POD.api_version, POD.kind, ns, job_pods_selector(job_name)
        )
    observed = replace(observed, pods=pods)
    if GROUP_PODS in wants:
        selector = groups.pods_selector(inference)
        listed = await op.client.list_objects(POD.api_version, POD.kind, ns, selector)
        observed = replace(observed, group_pods=listed)
    if GROUP_EVENTS in wants:
        lws = observed.children[(ns, LEADER_WORKER_SET.kind, inference)]
        selector = groups.events_selector(lws)
        listed = await op.client.list_objects(
            EVENT.api_version, EVENT.kind, ns, field_selector=selector
        )
        observed = replace(observed, group_events=listed)
    if RUN_PODS in wants:
        listed = await op.client.list_objects(POD.api_version, POD.kind, ns, f"{LABEL_RUN}={name}")
        running = [p for p in listed if (p.get("status") or {}).get("phase") not in ENDED]
        observed = replace(observed, run_pods=running)
    if LAST_STEP in wants:  # before its pod stops
        step = await finishing.last_step(op, run)
        observed = replace(observed, last_step=step, last_step_read=True)
    return observed
