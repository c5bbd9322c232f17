"""The spec side of a pass: a run's children brought to what admission built, and the API
server's own check of a group run's pod templates; reads come from the follower's cache once it
is synced, and what is applied goes back into it (:mod:`reconcile` calls these)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar, cast

from payloadrun_operator.api.kinds import BY_KIND, FOLLOWED, LEADER_WORKER_SET
from payloadrun_operator.api.names import ACTIVITY_MANAGER, INFERENCE
from payloadrun_operator.desired import group_check
from payloadrun_operator.desired.admission import Admission, admit
from payloadrun_operator.desired.builders import BuiltRun
from payloadrun_operator.observed.following import Follower, live_object
from payloadrun_operator.observed.plan import WorkloadPlan, activity_manifest, workload_plan
from payloadrun_operator.platform.kube import ChildRefused, KubeApiError
from payloadrun_operator.platform.runtime import Operator

T = TypeVar("T")
FOLLOWED_KINDS = frozenset(k.kind for k in FOLLOWED)  # their answers go into the cache


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
    op: Operator, follower: Follower | None, body: Mapping[str, Any], queue_admitted: bool
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
