"""What the operator does when a run ends: stop its pods, read its last step, delete its files.

Every function is idempotent (every pass calls them again until they are done) and takes
the run's children as the pass listed them, so a finished run costs no extra API call once its
payloads are released.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import aiohttp

from payloadrun_operator.api.conditions import (
    JOB_FAILED,
    ConditionType,
    PayloadsReleasedReason,
    Phase,
)
from payloadrun_operator.api.kinds import JOB, POD
from payloadrun_operator.api.models import ConditionStatus, DeletionPolicy, PayloadRunSpec
from payloadrun_operator.api.names import (
    ACTIVITY_MANAGER,
    CLEANUP,
    ORCHESTRATOR,
    child_name,
    job_pods_selector,
    workloads_of,
)
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.desired import pinning
from payloadrun_operator.desired.cleanup import build_cleanup
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.decisions import PayloadMode, claim_owned_by_run
from payloadrun_operator.observed import plan
from payloadrun_operator.observed.outcome import job_outcome
from payloadrun_operator.observed.status import Check
from payloadrun_operator.platform.runtime import Operator

log = logging.getLogger("payloadrun.finishing")
POD_RUNNING = "Running"  # a pod's status.phase
POLICY_STEP = re.compile(rb"^payloadrun_retention_policy_step (\S+)$", re.MULTILINE)
Children = Mapping[tuple[str, str, str], dict[str, Any]]  # (namespace, kind, name) -> object


async def stop(op: Operator, run: Mapping[str, Any], children: Children) -> None:
    """No pod of a finished run runs on: inference scaled to 0, unfinished Jobs suspended."""
    ns = run["metadata"]["namespace"]
    for api_version, kind, child in workloads_of(run):
        live = children.get((ns, kind, child))
        if live is None:
            continue
        stopped = {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": live["metadata"]["name"], "namespace": ns},
            "spec": {"suspend": True} if kind == JOB.kind else {"replicas": 0},
        }
        if plan.needs_scaling(stopped, live):
            await op.client.apply(plan.activity_manifest(stopped), manager=ACTIVITY_MANAGER)


async def last_step(op: Operator, run: Mapping[str, Any]) -> int | None:
    """The policy step the run's retention sidecar last saw, from its /metrics (None when the run
    is inline, the orchestrator's pod is gone, or the endpoint does not answer in 3 s)."""
    if Recorded.of(run).payload_mode != PayloadMode.BY_HANDLE:
        return None
    ns, name = run["metadata"]["namespace"], run["metadata"]["name"]
    spec = PayloadRunSpec.model_validate(run.get("spec") or {})
    port = spec.orchestrator.retention.metrics_port
    selector = job_pods_selector(child_name(name, ORCHESTRATOR))
    for pod in await op.client.list_objects(POD.api_version, POD.kind, ns, selector):
        ip = pod.get("status", {}).get("podIP")
        if not ip or pod["status"].get("phase") != POD_RUNNING:
            continue
        try:
            timeout = aiohttp.ClientTimeout(total=3)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(f"http://{ip}:{port}/metrics") as resp,
            ):
                match = POLICY_STEP.search(await resp.read())
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.info("%s/%s: the retention sidecar's step is unknown: %s", ns, name, exc)
            continue
        if match:
            step = int(float(match.group(1)))
            return step if step >= 0 else None
    return None


async def release(op: Operator, run: Mapping[str, Any], children: Children) -> Check:
    """Delete a finished run's payload files (a cleanup Job) unless the volume's deletionPolicy is
    Retain; the PayloadsReleased condition that says how far it got."""
    recorded = Recorded.of(run)
    released = recorded.condition(ConditionType.PAYLOADS_RELEASED)
    if released is not None and released.get("status") == ConditionStatus.TRUE:
        kept = PayloadsReleasedReason._value2member_map_.get(released.get("reason"))
        if isinstance(kept, PayloadsReleasedReason):  # else (edited by hand): looked at again
            return Check(True, kept, released.get("message", ""))
    if recorded.payload_mode != PayloadMode.BY_HANDLE:
        return Check(
            True,
            PayloadsReleasedReason.NO_PAYLOAD_FILES,
            "payloads moved inline: no file is on a volume",
        )
    if recorded.phase == Phase.FAILED:
        return Check(
            False,
            PayloadsReleasedReason.KEPT_AFTER_FAILURE,
            "the run failed: its payload files and claim stay for debugging; deleting the run "
            "releases them as its deletionPolicy says",
        )
    meta = run["metadata"]
    spec = PayloadRunSpec.model_validate(run.get("spec") or {})
    claim = recorded.claim_name
    if spec.payloads.volume.deletion_policy is DeletionPolicy.RETAIN:
        return Check(
            False,
            PayloadsReleasedReason.RETAINED,
            f"deletionPolicy Retain: claim {claim} and the files stay",
        )
    job_name = child_name(meta["name"], CLEANUP)
    job = children.get((meta["namespace"], JOB.kind, job_name))
    deleting = Check(
        False,
        PayloadsReleasedReason.DELETING_FILES,
        f"Job {job_name} deletes {recorded.payload_root}",
    )
    if job is None:
        pin = recorded.sidecars or {}
        ctx = RunContext.of(
            meta,
            spec,
            pinning.pinned_settings(op.settings, pin),
            active=False,
            layout=pinning.layout_of(pin),
        )
        await op.client.apply(build_cleanup(ctx))
        return deleting
    outcome = job_outcome(job)
    if outcome is None:
        return deleting
    if outcome == JOB_FAILED:
        return Check(
            False,
            PayloadsReleasedReason.CLEANUP_FAILED,
            f"Job {job_name} could not delete the payload files: kubectl logs job/{job_name}; "
            "delete the Job to try again",
            warning=True,
        )
    # The claim follows its deletionPolicy: deleted with the run (its pods, kept for their logs,
    # hold it until then), or the run's own claim, which stays.
    then = (
        "goes when the run is deleted" if claim_owned_by_run(spec) else "stays (the run brought it)"
    )
    return Check(
        True,
        PayloadsReleasedReason.FILES_DELETED,
        f"the payload files were deleted; claim {claim} {then}",
    )
