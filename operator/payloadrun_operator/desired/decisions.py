"""Pure decisions about a PayloadRun: is it valid, how do payloads move, where do they live."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from payloadrun_operator.api.models import (
    DEFAULT_MOUNT_PATH,
    DISAGGREGATED_BY_HANDLE_MESSAGE,
    TWO_MOUNT_PATHS_MESSAGE,
    DeletionPolicy,
    DeploymentType,
    PayloadModeReason,
    PayloadModeSetting,
    PayloadRunSpec,
)

DEFAULT_CLAIM_SIZE = "100Gi"


class PayloadMode(StrEnum):
    BY_HANDLE = "ByHandle"
    INLINE = "Inline"


@dataclass(frozen=True)
class ModeDecision:
    mode: PayloadMode
    reason: PayloadModeReason  # for the status and the log
    message: str  # a sentence for humans

    @property
    def by_handle(self) -> bool:
        return self.mode is PayloadMode.BY_HANDLE


def validation_errors(spec: PayloadRunSpec) -> list[str]:
    """What the operator refuses, mirroring the CRD's CEL rules for clusters that lack them."""
    errors = []
    payloads = spec.payloads
    if spec.inference.disaggregated and (
        payloads.mode is PayloadModeSetting.BY_HANDLE or payloads.root is not None
    ):
        errors.append(DISAGGREGATED_BY_HANDLE_MESSAGE)
    mount = payload_mount_path(spec)
    if payloads.root is not None and not payloads.root.startswith(mount + "/"):
        errors.append(
            f"spec.payloads.root {payloads.root!r} must be a directory under the payload "
            f"volume's mount path {mount!r} (spec.payloads.mountPath, or spec.runDirectory."
            "mountPath when the run directory is the payload volume)"
        )
    run_dir = spec.run_directory
    if (
        run_dir is not None
        and run_dir.claim_name is None
        and payloads.mount_path not in (None, run_dir.mount_path)
    ):
        errors.append(TWO_MOUNT_PATHS_MESSAGE)
    volume = payloads.volume
    if volume.claim_name and (volume.size is not None or volume.storage_class_name):
        errors.append(
            "set either volume.claimName (an existing ReadWriteMany claim) or volume.size and "
            "volume.storageClassName (a claim the operator manages), not both"
        )
    return errors


def decide_payload_mode(spec: PayloadRunSpec) -> ModeDecision:
    """By handle or inline, and why. Call after :func:`validation_errors` found nothing."""
    setting = spec.payloads.mode
    if setting is PayloadModeSetting.INLINE:
        return ModeDecision(
            PayloadMode.INLINE, PayloadModeReason.INLINE_REQUESTED, "spec.payloads.mode is Inline"
        )
    if setting is PayloadModeSetting.BY_HANDLE:
        return ModeDecision(
            PayloadMode.BY_HANDLE,
            PayloadModeReason.BY_HANDLE_REQUESTED,
            "spec.payloads.mode is ByHandle",
        )
    if spec.payloads.root is not None:
        return ModeDecision(
            PayloadMode.BY_HANDLE,
            PayloadModeReason.PAYLOAD_ROOT_SET,
            "spec.payloads.root is set by hand",
        )
    if not (spec.router_replay or spec.sampling_mask_capture):
        return ModeDecision(
            PayloadMode.INLINE,
            PayloadModeReason.NO_PER_TOKEN_PAYLOADS,
            "neither router replay nor sampling-mask capture is on: there is nothing large to move",
        )
    if spec.deployment_type is DeploymentType.SINGLE_NODE:
        return ModeDecision(
            PayloadMode.INLINE,
            PayloadModeReason.SINGLE_NODE,
            "a single-node run keeps payloads in process memory; a shared volume buys nothing",
        )
    if spec.inference.disaggregated:
        return ModeDecision(
            PayloadMode.INLINE,
            PayloadModeReason.DISAGGREGATED,
            "prefill/decode-disaggregated inference: the P/D router does not stitch by-handle "
            "routing segments, so payloads stay inline",
        )
    what = " and ".join(
        name
        for name, on in (
            ("router replay", spec.router_replay),
            ("sampling-mask capture", spec.sampling_mask_capture),
        )
        if on
    )
    return ModeDecision(
        PayloadMode.BY_HANDLE,
        PayloadModeReason.MULTI_NODE_PER_TOKEN_PAYLOADS,
        f"{what} on a multi-node run without disaggregation: payloads move by handle",
    )


def run_dir_on_payload_volume(spec: PayloadRunSpec) -> bool:
    """Whether the run directory is the payload volume (it names no claim of its own)."""
    return spec.run_directory is not None and spec.run_directory.claim_name is None


def payload_mount_path(spec: PayloadRunSpec) -> str:
    """Where the payload volume is mounted, one path in every container that mounts it."""
    if run_dir_on_payload_volume(spec):
        assert spec.run_directory is not None
        return spec.run_directory.mount_path
    return spec.payloads.mount_path or DEFAULT_MOUNT_PATH


def needs_payload_volume(spec: PayloadRunSpec, by_handle: bool) -> bool:
    """By handle, or when the run directory is the payload volume (an inline run too)."""
    return by_handle or run_dir_on_payload_volume(spec)


def payload_root(spec: PayloadRunSpec, namespace: str, name: str) -> str:
    """The run's own directory on the shared volume: one subdirectory per run."""
    if spec.payloads.root is not None:
        return spec.payloads.root
    return f"{payload_mount_path(spec)}/{namespace}/{name}/payloads"


def claim_name(spec: PayloadRunSpec, name: str) -> str:
    return spec.payloads.volume.claim_name or f"{name}-payloads"


def manages_claim(spec: PayloadRunSpec) -> bool:
    return spec.payloads.volume.claim_name is None


def claim_owned_by_run(spec: PayloadRunSpec) -> bool:
    """A managed claim with the Delete policy is garbage-collected with the run."""
    return manages_claim(spec) and spec.payloads.volume.deletion_policy is DeletionPolicy.DELETE
