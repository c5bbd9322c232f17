"""The Job that deletes a finished run's payload files, ``<run>-cleanup`` (by handle only): the
last child the operator makes, when the run has ended (observed/finishing.py applies it)."""

from __future__ import annotations

from payloadrun_operator.api import names
from payloadrun_operator.api.kinds import JOB
from payloadrun_operator.desired.builders import metadata
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.pods import fs_group, labels, placement
from payloadrun_operator.desired.sidecars import cleanup_container
from payloadrun_operator.desired.templates import Manifest
from payloadrun_operator.desired.volumes import payload_volume


def build_cleanup(ctx: RunContext) -> Manifest:
    """The Job that deletes a finished run's payload files (``payloadrun wipe``), as the sidecars'
    user, with the sidecars' image; by handle only."""
    pod: Manifest = {
        "containers": [cleanup_container(ctx)],
        "volumes": [payload_volume(ctx)],
        "restartPolicy": "Never",
        **{k: v for k, v in placement(ctx).items() if k != "serviceAccountName"},
    }
    group = fs_group(ctx)
    if group is not None:
        pod["securityContext"] = {"fsGroup": group, "fsGroupChangePolicy": "OnRootMismatch"}
    return {
        **JOB.type_meta,
        "metadata": metadata(ctx, ctx.child_name(names.CLEANUP), names.CLEANUP),
        "spec": {
            "backoffLimit": 3,
            "template": {"metadata": {"labels": labels(ctx, names.CLEANUP)}, "spec": pod},
        },
    }
