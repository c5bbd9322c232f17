"""Whether a PayloadRun is accepted, and what it is built with: one answer for the operator's
reconcile and for ``payloadrun-operator render``, so both refuse the same specs with the same
messages.

Four layers of checks, each with a message that says what was wrong and what to do:

1. the CRD's own schema, as the API server applies it (:mod:`schema_check`): types, required
   fields, enums, bounds, list-map keys and unknown fields, in the whole body, pod templates
   included, each error with its field path in the API server's words. ``render`` has no API
   server to do it, and the operator may read a run an older CRD let in; nothing is built from
   a body that fails it, so no builder meets a value of the wrong type;
2. the pydantic models (the same bounds, the parsed spec the rest works on);
3. the rules the CRD states in CEL (:func:`decisions.validation_errors`, for clusters without
   CEL);
4. what needs the payload mode and the operator's settings: the pod templates against the
   operator's parts (:func:`builders.build_run`).

The last check composes each pod template, so an accepted run's verdict carries its children
as they were built (:class:`builders.BuiltRun`): the reconcile applies them, ``render`` prints
them, and neither composes a template again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from payloadrun_operator.api import schema_check, validation
from payloadrun_operator.api.models import MAX_NAME_LENGTH, NAME_LENGTH_MESSAGE, PayloadRunSpec
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.api.structural import NOT_CHECKED
from payloadrun_operator.desired import context, pinning
from payloadrun_operator.desired.builders import BuiltRun, build_run
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.decisions import validation_errors
from payloadrun_operator.platform.settings import OperatorSettings


def spec_errors(body: Mapping[str, Any]) -> tuple[PayloadRunSpec | None, list[str]]:
    """The parsed spec, or the reasons it is refused: the CRD's schema first, then the rules
    its CEL states. As the API server does, a type error, a missing field or an unsupported
    value leaves the rules unchecked (their words would be about a value that is not there)."""
    found = schema_check.run_errors(body)
    errors = [str(e) for e in found]
    meta = body.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        errors.append(f"{NAME_LENGTH_MESSAGE} ({name!r} has {len(name)})")
    if any(e.blocking for e in found):
        return None, [*errors, NOT_CHECKED]
    try:
        spec = PayloadRunSpec.model_validate(schema_check.spec_as_stored(body.get("spec") or {}))
    except ValidationError as exc:
        if found:  # the schema's errors say it in the API server's words
            return None, errors
        return None, [*errors, *validation.messages(exc)]
    return (None if found else spec), errors + validation_errors(spec)


@dataclass(frozen=True)
class Admission:
    """A run's verdict: its children as built (with its context) and its pinned sidecars when
    accepted, else the errors."""

    built: BuiltRun | None
    pin: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def ctx(self) -> RunContext | None:
        return None if self.built is None else self.built.ctx


def admit(
    body: Mapping[str, Any], settings: OperatorSettings, *, queue_admitted: bool = True
) -> Admission:
    """Check ``body`` (a PayloadRun as the API server has it) and build its children, from its
    context: the sidecars it was started with (unless its rollout annotation asks for the
    operator's current ones) and whether its workloads run pods (``queue_admitted``: False for
    a queued run Kueue has not admitted, :mod:`observed.queue`)."""
    spec, errors = spec_errors(body)
    if errors or spec is None:
        return Admission(None, errors=errors)
    meta = body["metadata"]
    recorded = Recorded.of(body)
    pin = pinning.current_pin(settings, recorded.sidecars, meta.get("annotations") or {})
    ctx = RunContext.of(
        meta,
        spec,
        pinning.pinned_settings(settings, pin),
        active=context.runs_pods(spec.suspend, recorded.phase) and queue_admitted,
        layout=pinning.layout_of(pin),
    )
    built = build_run(ctx)
    if built.errors:
        return Admission(None, errors=list(built.errors))
    return Admission(built, pin)
