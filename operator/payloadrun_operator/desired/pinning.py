"""What a run is built with, as pure functions: its pinned sidecars, its pod layout, and the
hash of each workload's inputs.

- **Pinned sidecars.** A run records in its status, when it starts, the sidecar image and the
  settings the operator injects (:data:`PIN_FIELDS`). Every later reconcile builds from that
  record, so an operator restart or upgrade with new defaults leaves a live run as it is; new
  runs get the new defaults. The annotation ``rollout.payloadrun.dev/sidecars`` set to a new
  value takes the operator's current settings again (an explicit roll).
- **Inputs.** Each workload carries the hash of what its template is built from
  (:func:`inputs_hash`): the part of the spec that concerns it and the pinned settings it uses.
  A reconcile that finds the hash unchanged leaves the template alone, whatever code built it,
  and changing one component's spec rolls that component only.

Whether the pods run is :mod:`context`'s (``RunContext.active``), how the run ends
:mod:`payloadrun_operator.observed.outcome`'s, how a workload is applied
:mod:`payloadrun_operator.observed.plan`'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from payloadrun_operator.api.models import (
    VLLM_DATA_PARALLEL_RPC_PORT,
    ApiServerLayout,
    PayloadRunSpec,
)
from payloadrun_operator.api.names import (
    INFERENCE,
    ORCHESTRATOR,
    ROLLOUT_ANNOTATION,
    TRAINER,
)
from payloadrun_operator.desired.decisions import decide_payload_mode
from payloadrun_operator.desired.shape import inference_world_size
from payloadrun_operator.platform.settings import OperatorSettings

# The layout of the pods the operator builds today (PodLayout says what each one has).
POD_LAYOUT = 2


@dataclass(frozen=True)
class PodLayout:
    """The layout of the pods the operator builds for a run: 1 before pod templates, 2 since
    (templates, the run directory, addresses, rendezvous, /dev/shm, trainers restarted together).

    A run records the layout it started with in status.sidecars.podLayout (absent: 1); its
    workloads' inputs are hashed as that layout's were, so an operator upgrade does not roll it,
    and its trainers fail as that layout's did. The rollout annotation moves it onto the current
    layout. Code asks for what a layout has (a property here), never for its number.
    """

    version: int = POD_LAYOUT

    @classmethod
    def of(cls, layout: PodLayout | int) -> PodLayout:
        return layout if isinstance(layout, PodLayout) else cls(int(layout))

    @property
    def has_pod_templates(self) -> bool:
        """The spec fields that came with pod templates (:data:`LAYOUT_2_FIELDS`) are part of
        its workloads' inputs even at their defaults."""
        return self.version >= 2

    @property
    def has_addresses(self) -> bool:
        """The main containers are told the run directory, each other's hosts, every inference
        replica's admin URL and torchrun's rendezvous (env.LAYOUT_2_ENV); so the orchestrator's
        inputs count the inference replicas its admin URLs list."""
        return self.version >= 2

    @property
    def restarts_trainers_together(self) -> bool:
        """The trainers' Job fails at its first failed rank (backoffLimit 0) and the operator
        restarts every rank together (restarts.py); before, the Job replaced ranks one by one."""
        return self.version >= 2

    @property
    def in_inputs(self) -> bool:
        """The layout's version is part of its workloads' inputs (so a roll onto a new layout
        rolls every workload)."""
        return self.version >= 2


CURRENT_LAYOUT = PodLayout(POD_LAYOUT)
# Spec fields that layout 2 added, as (section or None for the spec, field, default): left out of
# a layout-1 run's inputs while they have their default, as they were before they existed.
LAYOUT_2_FIELDS = (
    (None, "runDirectory", None),
    (INFERENCE, "shmSize", None),
    (INFERENCE, "template", None),
    (ORCHESTRATOR, "template", None),
    (TRAINER, "processesPerNode", 1),
    (TRAINER, "shmSize", None),
    (TRAINER, "payloadAccess", "ReadOnly"),
    (TRAINER, "template", None),
)
# Spec fields added since layout 2 that need no layout of their own, since their defaults build
# the pods layout 2 built (a replica of one pod, one API server): left out of every run's inputs
# while they have their default, so a run created before they existed keeps its workloads.
LATER_FIELDS = (
    (INFERENCE, "podsPerReplica", 1),
    (INFERENCE, "apiServers", ApiServerLayout.EVERY_POD.value),
    (INFERENCE, "apiServersPerPod", 1),
    (INFERENCE, "dataParallelRpcPort", VLLM_DATA_PARALLEL_RPC_PORT),
    (INFERENCE, "workerTemplate", None),
)

# status.sidecars key -> the OperatorSettings field it pins.
PIN_FIELDS = {
    "image": "sidecar_image",
    "imagePullPolicy": "sidecar_image_pull_policy",
    "uid": "sidecar_uid",
    "logFormat": "sidecar_log_format",
    "writerResources": "writer_resources",
    "retentionResources": "retention_resources",
}
# The pinned settings each workload's template uses (the trainers only share the pods' fsGroup).
PINS_USED = {
    INFERENCE: ("image", "imagePullPolicy", "uid", "logFormat", "writerResources"),
    ORCHESTRATOR: ("image", "imagePullPolicy", "uid", "logFormat", "retentionResources"),
    TRAINER: ("uid",),
}
# Spec fields that concern one workload only, or none's template.
COMPONENT_FIELDS = (INFERENCE, ORCHESTRATOR, TRAINER)
NOT_IN_TEMPLATES = ("suspend", "failurePolicy")
# A component's fields that no template uses (its NetworkPolicy's clients): a change rolls no pod.
NOT_IN_COMPONENT_TEMPLATES = {INFERENCE: ("clients",)}


# --- pinned sidecars -------------------------------------------------------------------------


def pin_of(settings: OperatorSettings, rollout: str | None = None) -> dict[str, Any]:
    """The record of ``settings`` a run keeps in ``status.sidecars`` (with today's layout)."""
    pin: dict[str, Any] = {key: getattr(settings, attr) for key, attr in PIN_FIELDS.items()}
    pin["podLayout"] = POD_LAYOUT
    if rollout is not None:
        pin["rollout"] = rollout
    return pin


def current_pin(
    settings: OperatorSettings,
    recorded: Mapping[str, Any] | None,
    annotations: Mapping[str, str],
) -> dict[str, Any]:
    """The record this reconcile builds with: the run's own (``recorded``, its
    ``status.sidecars``), or the operator's current settings for a run that has none yet or
    whose rollout annotation asks for them."""
    wanted = annotations.get(ROLLOUT_ANNOTATION)
    # removing the annotation is no request: the run keeps what it has
    if recorded and (wanted is None or recorded.get("rollout") == wanted):
        return dict(recorded)
    return pin_of(settings, wanted)


def layout_of(pin: Mapping[str, Any]) -> PodLayout:
    """The pod layout a run's record says it was started with (1: recorded before layouts)."""
    return PodLayout(int(pin.get("podLayout") or 1))


def pinned_settings(settings: OperatorSettings, pin: Mapping[str, Any]) -> OperatorSettings:
    """The operator's settings with the run's pinned ones in place of the current defaults."""
    values = {attr: pin[key] for key, attr in PIN_FIELDS.items() if key in pin}
    return dataclasses.replace(settings, **values)


# --- inputs -----------------------------------------------------------------------------------


def inputs_hash(spec: PayloadRunSpec, component: str, pin: Mapping[str, Any]) -> str:
    """What ``component``'s template is built from, hashed: the run-wide spec, the payload mode
    (which inference.disaggregated alone can change), the component's own section and, by
    handle, the pinned settings it uses; the orchestrator also the inference ports it calls and
    (layout 2) the number of replicas its admin URLs list; the orchestrator and the trainers the
    inference world size, where they are told it (replicas of more than one API server or pod:
    the other layout fields are fixed for a run's life). Neither suspend, the failure policy
    nor inference.clients (its NetworkPolicy's) is part of any template. A layout-1 run's
    inputs leave out the fields added since while they are unset (:data:`LAYOUT_2_FIELDS`), so
    they hash as they did then, and every run's leave out :data:`LATER_FIELDS` while unset."""
    data = spec.model_dump(mode="json", by_alias=True)
    layout = layout_of(pin)
    unset_when_default = (
        LATER_FIELDS if layout.has_pod_templates else LAYOUT_2_FIELDS + LATER_FIELDS
    )
    for section, name, default in unset_when_default:
        where = data if section is None else data[section]
        if where.get(name) == default:
            where.pop(name, None)
    for name in NOT_IN_COMPONENT_TEMPLATES.get(component, ()):
        data[component].pop(name, None)
    skipped = (*COMPONENT_FIELDS, *NOT_IN_TEMPLATES)
    by_handle = decide_payload_mode(spec).by_handle
    inputs: dict[str, Any] = {
        "run": {k: v for k, v in data.items() if k not in skipped},
        "byHandle": by_handle,
        component: data[component],
        "sidecars": {key: pin.get(key) for key in PINS_USED[component]} if by_handle else {},
    }
    if component == ORCHESTRATOR:
        inference = data[INFERENCE]
        inputs["inferencePorts"] = [inference["port"], inference["writer"]["port"]]
        if layout.has_addresses:
            inputs["inferenceReplicas"] = inference["replicas"]
    world_size = inference_world_size(spec.inference)  # None for one-server replicas
    if component in (ORCHESTRATOR, TRAINER) and world_size is not None:
        inputs["inferenceWorldSize"] = world_size
    if layout.in_inputs:
        inputs["podLayout"] = layout.version
    encoded = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:20]
