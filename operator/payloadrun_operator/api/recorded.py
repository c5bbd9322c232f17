"""What a run's status records, read into one typed value (:class:`Recorded`): every module
that decides from a run's status (the pass, readiness, restarts, groups, outcome, finishing, the
queue, the sidecars' pin) reads its attributes, never the status by field name.

Tolerant as a status read must be: a field that is missing, null or of another type (a status
edited by hand, or written by another version of the operator) reads as absent, never as an
error that would stop every pass of the run. Its attributes are the fields of
:class:`api.models.PayloadRunStatus` (the CRD's schema) that decisions read, each under the
model's name (a test holds them to it); what the operator writes is built by
:func:`observed.status.status_update`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from payloadrun_operator.api.conditions import FINAL_PHASES, ConditionType, StatusField
from payloadrun_operator.api.models import ConditionStatus

NOTHING: Mapping[str, Any] = MappingProxyType({})


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _record(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


@dataclass(frozen=True, slots=True)
class Recorded:
    """A run's status as the operator reads it (see the module's docstring)."""

    observed_generation: int | None = None
    phase: str | None = None
    payload_mode: str | None = None
    payload_root: str | None = None
    claim_name: str | None = None
    sidecars: Mapping[str, Any] | None = None  # the pin of the sidecars it was started with
    start_time: str | None = None
    queue: Mapping[str, Any] | None = None  # status.queue: None once it is not queued
    trainer_restarts: int = 0
    last_trainer_restart: Mapping[str, Any] = field(default_factory=lambda: NOTHING)
    inference_group_restarts: int = 0
    last_inference_group_restart: Mapping[str, Any] = field(default_factory=lambda: NOTHING)
    conditions: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, run: Mapping[str, Any]) -> Recorded:
        """What ``run`` (a PayloadRun as the API server has it) records in its status."""
        return cls.of_status(run.get("status"))

    @classmethod
    def of_status(cls, status: Any) -> Recorded:
        """What a run's ``status`` records (None, or anything not a mapping: nothing)."""
        if not isinstance(status, Mapping):
            return cls()
        generation = status.get(StatusField.OBSERVED_GENERATION)
        conditions = status.get(StatusField.CONDITIONS)
        return cls(
            observed_generation=generation if isinstance(generation, int) else None,
            phase=_text(status.get(StatusField.PHASE)),
            payload_mode=_text(status.get(StatusField.PAYLOAD_MODE)),
            payload_root=_text(status.get(StatusField.PAYLOAD_ROOT)),
            claim_name=_text(status.get(StatusField.CLAIM_NAME)),
            sidecars=_record(status.get(StatusField.SIDECARS)) or None,
            start_time=_text(status.get(StatusField.START_TIME)),
            queue=_record(status.get(StatusField.QUEUE)),
            trainer_restarts=_count(status.get(StatusField.TRAINER_RESTARTS)),
            last_trainer_restart=_record(status.get(StatusField.LAST_TRAINER_RESTART)) or NOTHING,
            inference_group_restarts=_count(status.get(StatusField.INFERENCE_GROUP_RESTARTS)),
            last_inference_group_restart=(
                _record(status.get(StatusField.LAST_INFERENCE_GROUP_RESTART)) or NOTHING
            ),
            conditions=tuple(
                c for c in (conditions if isinstance(conditions, list) else ()) if _is_condition(c)
            ),
        )

    @property
    def final(self) -> bool:
        """Whether the run has ended (Succeeded or Failed), for good."""
        return self.phase in FINAL_PHASES

    def condition(self, ctype: ConditionType) -> Mapping[str, Any] | None:
        """The condition of type ``ctype``, as the status holds it (None: it has none)."""
        return next((c for c in self.conditions if c["type"] == ctype), None)

    def holds(self, ctype: ConditionType) -> bool:
        """Whether the condition ``ctype`` is there and True."""
        return (self.condition(ctype) or NOTHING).get("status") == ConditionStatus.TRUE


def _is_condition(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("type"), str)
