"""Pure decisions about a PayloadRun: is it valid, how do payloads move, where do they live."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from payloadrun.settings import Env
from payloadrun_operator.models import (
    DISAGGREGATED_BY_HANDLE_MESSAGE,
    DeletionPolicy,
    DeploymentType,
    PayloadModeSetting,
    PayloadRunSpec,
)

DEFAULT_CLAIM_SIZE = "100Gi"

# What the operator tells the containers of a run (builders.run_env and the orchestrator's extras).
INJECTED_ENV = frozenset(
    {
        Env.RUN,
        Env.RUN_ID,
        Env.PAYLOAD_MODE,
        Env.PAYLOAD_ROOT,
        Env.INFERENCE_URL,
        Env.RETENTION_URL,
        Env.MAX_OFF_POLICY_STEPS,
        Env.MAX_STEPS,
    }
)


class PayloadMode(StrEnum):
    BY_HANDLE = "ByHandle"
    INLINE = "Inline"


@dataclass(frozen=True)
class ModeDecision:
    mode: PayloadMode
    reason: str  # CamelCase, for status and events
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
    if payloads.root is not None and not payloads.root.startswith(payloads.mount_path + "/"):
        errors.append(
            f"payloads.root {payloads.root!r} must be a directory under payloads.mountPath "
            f"{payloads.mount_path!r}"
        )
    for where, env in (
        ("inference", spec.inference.env),
        ("orchestrator", spec.orchestrator.env),
        ("trainer", spec.trainer.env),
    ):
        names = [e.name for e in env]
        taken = sorted(set(names) & INJECTED_ENV)
        if taken:
            errors.append(
                f"spec.{where}.env sets {', '.join(taken)}, which the operator sets itself: "
                "remove them (the operator's values describe this run)"
            )
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            errors.append(f"spec.{where}.env names {', '.join(repeated)} more than once")
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
        return ModeDecision(PayloadMode.INLINE, "InlineRequested", "spec.payloads.mode is Inline")
    if setting is PayloadModeSetting.BY_HANDLE:
        return ModeDecision(
            PayloadMode.BY_HANDLE, "ByHandleRequested", "spec.payloads.mode is ByHandle"
        )
    if spec.payloads.root is not None:
        return ModeDecision(
            PayloadMode.BY_HANDLE, "PayloadRootSet", "spec.payloads.root is set by hand"
        )
    if not (spec.router_replay or spec.sampling_mask_capture):
        return ModeDecision(
            PayloadMode.INLINE,
            "NoPerTokenPayloads",
            "neither router replay nor sampling-mask capture is on: there is nothing large to move",
        )
    if spec.deployment_type is DeploymentType.SINGLE_NODE:
        return ModeDecision(
            PayloadMode.INLINE,
            "SingleNode",
            "a single-node run keeps payloads in process memory; a shared volume buys nothing",
        )
    if spec.inference.disaggregated:
        return ModeDecision(
            PayloadMode.INLINE,
            "Disaggregated",
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
        "MultiNodePerTokenPayloads",
        f"{what} on a multi-node run without disaggregation: payloads move by handle",
    )


def payload_root(spec: PayloadRunSpec, namespace: str, name: str) -> str:
    """The run's own directory on the shared volume: one subdirectory per run."""
    if spec.payloads.root is not None:
        return spec.payloads.root
    return f"{spec.payloads.mount_path}/{namespace}/{name}/payloads"


def claim_name(spec: PayloadRunSpec, name: str) -> str:
    return spec.payloads.volume.claim_name or f"{name}-payloads"


def manages_claim(spec: PayloadRunSpec) -> bool:
    return spec.payloads.volume.claim_name is None


def claim_owned_by_run(spec: PayloadRunSpec) -> bool:
    """A managed claim with the Delete policy is garbage-collected with the run."""
    return manages_claim(spec) and spec.payloads.volume.deletion_policy is DeletionPolicy.DELETE
