"""A run's context: everything the builders read of one run (its identity, spec, payload mode,
the operator's settings with the run's pinned ones, whether its workloads have pods, and the
pod layout it was started with), made once per reconcile by :meth:`RunContext.of`; and the
run's activity: its pods run unless ``spec.suspend`` is set or the run has finished
(:func:`runs_pods`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from payloadrun_operator.api import names
from payloadrun_operator.api.conditions import FINAL_PHASES
from payloadrun_operator.api.models import PayloadRunSpec
from payloadrun_operator.api.names import INFERENCE, ORCHESTRATOR, TRAINER
from payloadrun_operator.desired import pinning
from payloadrun_operator.desired.decisions import (
    ModeDecision,
    claim_name,
    decide_payload_mode,
    needs_payload_volume,
    payload_mount_path,
    payload_root,
)
from payloadrun_operator.desired.shape import InferenceShape
from payloadrun_operator.platform.settings import OperatorSettings

WORKER_TEMPLATE_PATH = "spec.inference.workerTemplate"


@dataclass(frozen=True)
class RunContext:
    """Everything the builders need: the run's identity, spec, mode and the operator settings."""

    name: str
    namespace: str
    uid: str
    spec: PayloadRunSpec
    decision: ModeDecision
    settings: OperatorSettings  # with the run's pinned sidecar settings (pinning.pinned_settings)
    active: bool = True  # whether the workloads have pods (not suspended, not finished)
    layout: pinning.PodLayout = pinning.CURRENT_LAYOUT  # the pod layout the run was started with

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", pinning.PodLayout.of(self.layout))  # 2 is PodLayout(2)

    @classmethod
    def of(
        cls,
        meta: Mapping[str, Any],
        spec: PayloadRunSpec,
        settings: OperatorSettings,
        *,
        active: bool = True,
        layout: pinning.PodLayout | int = pinning.POD_LAYOUT,
    ) -> RunContext:
        """The context of the run whose ``metadata`` is ``meta`` (its mode decided here)."""
        decision = decide_payload_mode(spec)
        return cls(
            meta["name"], meta["namespace"], meta["uid"], spec, decision, settings, active, layout
        )

    @property
    def by_handle(self) -> bool:
        return self.decision.by_handle

    @property
    def root(self) -> str | None:
        return payload_root(self.spec, self.namespace, self.name) if self.by_handle else None

    @property
    def claim(self) -> str | None:
        """The payload volume's claim, when a pod mounts it (by handle, or as the run
        directory)."""
        if not needs_payload_volume(self.spec, self.by_handle):
            return None
        return claim_name(self.spec, self.name)

    @property
    def inference_shape(self) -> InferenceShape:
        return InferenceShape.of(self.spec.inference)

    @property
    def payload_mount_path(self) -> str:
        return payload_mount_path(self.spec)

    def child_name(self, component: str) -> str:
        return names.child_name(self.name, component)

    def host(self, component: str, index: int = 0) -> str:
        """The DNS name of a pod of the run: ``<run>-<component>-<index>.<headless>.<ns>.svc``."""
        return names.pod_host(self.name, self.namespace, component, index)

    def templates(self) -> dict[str, dict[str, Any] | None]:
        spec = self.spec
        return {
            INFERENCE: spec.inference.template,
            ORCHESTRATOR: spec.orchestrator.template,
            TRAINER: spec.trainer.template,
        }

    def template_sources(self) -> dict[str, dict[str, Any] | None]:
        """Each pod template of the run, by its field's path (the inference workers' only where
        a replica spans pods, and only when set: it defaults to the leader's)."""
        sources = {f"spec.{role}.template": t for role, t in self.templates().items()}
        worker = self.spec.inference.worker_template
        if self.inference_shape.groups and worker is not None:
            sources[WORKER_TEMPLATE_PATH] = worker
        return dict(sorted(sources.items()))

    def inputs(self, component: str) -> str:
        pin = {**pinning.pin_of(self.settings), "podLayout": self.layout.version}
        return pinning.inputs_hash(self.spec, component, pin)


# --- activity: pods run unless spec.suspend is set or the run has finished -------------------


def is_final(phase: str | None) -> bool:
    return phase in FINAL_PHASES


def runs_pods(suspend: bool, phase: str | None) -> bool:
    """Whether the run's workloads should have pods."""
    return not suspend and not is_final(phase)
