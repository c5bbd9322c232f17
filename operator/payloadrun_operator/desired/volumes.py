"""The volumes a run's pods mount: the payload volume's claim, and the run directory (on the
payload volume, or on a claim of its own)."""

from __future__ import annotations

from payloadrun_operator.api import names
from payloadrun_operator.api.names import VOLUME_NAME
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.templates import Manifest


def payload_volume(ctx: RunContext) -> Manifest:
    return {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": ctx.claim}}


def volume_mount(ctx: RunContext, *, read_only: bool) -> Manifest:
    return {"name": VOLUME_NAME, "mountPath": ctx.payload_mount_path, "readOnly": read_only}


def run_directory_volume(ctx: RunContext) -> Manifest | None:
    """The run directory's own claim (none when it is the payload volume, or there is none)."""
    run_dir = ctx.spec.run_directory
    if run_dir is None or run_dir.claim_name is None:
        return None
    return {
        "name": names.RUN_DIRECTORY_VOLUME,
        "persistentVolumeClaim": {"claimName": run_dir.claim_name},
    }


def run_directory_mount(ctx: RunContext) -> Manifest | None:
    run_dir = ctx.spec.run_directory
    if run_dir is None:
        return None
    volume = VOLUME_NAME if run_dir.claim_name is None else names.RUN_DIRECTORY_VOLUME
    return {"name": volume, "mountPath": run_dir.mount_path}


def run_volumes(ctx: RunContext, *, payloads: bool) -> list[Manifest]:
    """The claims a role's pods mount: the payload volume where they use it, the run
    directory's own claim."""
    volumes = [payload_volume(ctx)] if payloads and ctx.claim else []
    own = run_directory_volume(ctx)
    return [*volumes, *([own] if own else [])]
