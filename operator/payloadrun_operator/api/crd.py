"""The PayloadRun CustomResourceDefinition, generated from the pydantic models.

``python -m payloadrun_operator.api.crd`` prints it; ``crds/`` and the chart hold the printed copy,
and a test fails when they drift from the models.

Pydantic's JSON schema is turned into a Kubernetes *structural* schema: references inlined,
``Optional`` unwrapped, ``int | str`` marked ``x-kubernetes-int-or-string``, free-form maps marked
``x-kubernetes-preserve-unknown-fields``, titles dropped, and ``default: {}`` on optional objects so
the API server applies their nested defaults. Each role's ``template`` is Kubernetes' own
``PodTemplateSpec`` schema (:mod:`kubeschema`).
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from enum import Enum
from typing import Any

from pydantic import BaseModel

from payloadrun_operator.api.conditions import MEANINGS, REASONS, TRUE_REASONS, ConditionType
from payloadrun_operator.api.kubeschema import pod_template_schema
from payloadrun_operator.api.models import (
    CHECKED_BY_OPERATOR,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    NAME_LENGTH_MESSAGE,
    NO_CRD_DEFAULT,
    PLURAL,
    POD_TEMPLATE_MARKER,
    RUN_DESCRIPTION,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    PayloadRunSpec,
    PayloadRunStatus,
)

CRD_FILE = f"crds/{GROUP}_{PLURAL}.yaml"
# The chart installs the CRD from a template, so `helm upgrade` upgrades it too (Helm never
# touches what a chart keeps in crds/ after the first install).
CHART_CRD_FILE = "charts/payloadrun/templates/crd.yaml"
_DROP = {"title"}


def _is_null(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "null"


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return schema


def structural(
    schema: dict[str, Any], defs: dict[str, Any], full_templates: bool = False
) -> dict[str, Any]:
    """A pydantic JSON schema node as a Kubernetes structural schema node.

    ``full_templates``: give the pod templates the operator checks itself
    (:data:`CHECKED_BY_OPERATOR`) their whole schema too, as :mod:`schema_check` reads it; the
    CRD stores them as plain objects, since each PodTemplateSpec schema adds about 270 kB to what
    etcd holds (at most 1.5 MiB)."""
    schema = _resolve(schema, defs)
    marker = schema.get(POD_TEMPLATE_MARKER)
    if marker:
        description = _unwrap(schema["description"])
        if marker == CHECKED_BY_OPERATOR and not full_templates:
            return {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "description": description,
            }
        return pod_template_schema(description)
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if not _is_null(o)]
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        types = {_resolve(o, defs).get("type") for o in options}
        if types == {"integer", "string"}:
            return _clean({**rest, "x-kubernetes-int-or-string": True})
        if len(options) != 1:
            raise ValueError(f"cannot express {schema} as a structural schema")
        return structural({**_resolve(options[0], defs), **rest}, defs, full_templates)

    out = _clean(schema)
    if out.pop(NO_CRD_DEFAULT, False):
        out.pop("default", None)
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    if "properties" in out:
        out["type"] = "object"
        required = set(out.get("required", []))
        out["properties"] = {
            name: _without_null_default(
                structural(prop, defs, full_templates)
                if _resolve(prop, defs).get(POD_TEMPLATE_MARKER)  # absent unless set
                else _default_empty_object(structural(prop, defs, full_templates), name in required)
            )
            for name, prop in out["properties"].items()
        }
        out.pop("additionalProperties", None)
    elif "additionalProperties" in out:
        extra = out["additionalProperties"]
        if extra is True or extra == {}:
            out.pop("additionalProperties")
            out["x-kubernetes-preserve-unknown-fields"] = True
        else:
            out["additionalProperties"] = structural(extra, defs, full_templates)
    if out.get("type") == "array" and "items" in out:
        out["items"] = structural(out["items"], defs, full_templates)
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
        out["type"] = "object"
    return out


def _clean(schema: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in schema.items() if k not in _DROP and k != "$defs"}
    if "description" in out:
        out["description"] = _unwrap(out["description"])
    return out


def _unwrap(text: str) -> str:
    """A docstring's wrapped lines as one line per paragraph (kubectl explain wraps them)."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _default_empty_object(prop: dict[str, Any], required: bool) -> dict[str, Any]:
    """``default: {}`` on an optional object whose own fields are all optional."""
    if (
        not required
        and prop.get("type") == "object"
        and "properties" in prop
        and not prop.get("required")
        and "default" not in prop
    ):
        return {**prop, "default": {}}
    return prop


def _without_null_default(prop: dict[str, Any]) -> dict[str, Any]:
    """Optional fields are simply absent: a ``null`` default is not valid in a CRD."""
    if "default" in prop and prop["default"] is None:
        return {k: v for k, v in prop.items() if k != "default"}
    return prop


def defaults_left_to_the_operator(model: type = PayloadRunSpec, path: str = "spec") -> dict:
    """The defaults the CRD leaves out (fields marked ``ADDED_AFTER_RELEASE``), by field path
    (``spec.inference.podsPerReplica``): the operator applies them, the reference shows them."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        field = f"{path}.{info.alias or name}"
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.get(NO_CRD_DEFAULT):
            out[field] = info.default.value if isinstance(info.default, Enum) else info.default
        for inner in _models_in(info.annotation):
            out |= defaults_left_to_the_operator(inner, field)
    return out


def _models_in(annotation: Any) -> list[type]:
    """The pydantic models a field holds directly (itself, or in an Optional/Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def model_schema(model: type, full_templates: bool = False) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}), full_templates)


def printer_columns() -> list[dict[str, Any]]:
    """The columns of ``kubectl get payloadruns`` (priority 1: only with ``-o wide``)."""
    return [
        {
            "name": "Mode",
            "type": "string",
            "jsonPath": ".status.payloadMode",
            "description": "How per-token payloads move: ByHandle or Inline.",
        },
        {
            "name": "Phase",
            "type": "string",
            "jsonPath": ".status.phase",
            "description": "Provisioning, Running, Suspended, Queued, Succeeded, Failed or "
            "Rejected.",
        },
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": f'.status.conditions[?(@.type=="{ConditionType.READY}")].status',
            "description": "The Ready condition: True when every pod of the accepted spec's "
            "workloads is ready (the phase is then Running).",
        },
        {
            "name": "Claim",
            "type": "string",
            "jsonPath": ".status.claimName",
            "description": "The ReadWriteMany claim of the payload volume: by handle, or an "
            "inline run whose run directory is on it (the operator provisions it then too).",
        },
        {
            "name": "Queue",
            "type": "string",
            "jsonPath": ".status.queue.name",
            "description": "The Kueue LocalQueue the run waits in or was admitted through "
            "(labelled kueue.x-k8s.io/queue-name); the Admitted condition says where it stands.",
            "priority": 1,
        },
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": ".status.payloadModeReason",
            "description": "Why the payload mode.",
            "priority": 1,
        },
        {
            "name": "Root",
            "type": "string",
            "jsonPath": ".status.payloadRoot",
            "description": "The payload root: the directory of the run's v<k> payload "
            "directories (by handle only).",
            "priority": 1,
        },
        {
            "name": "Restarts",
            "type": "integer",
            "jsonPath": ".status.trainerRestarts",
            "description": "How often the trainers were restarted together after a rank failed.",
            "priority": 1,
        },
        {
            "name": "Last Step",
            "type": "integer",
            "jsonPath": ".status.lastStep",
            "description": "The last policy step of a finished run (by handle).",
            "priority": 1,
        },
        {
            "name": "Finished",
            "type": "date",
            "jsonPath": ".status.completionTime",
            "description": "When the run Succeeded or Failed.",
            "priority": 1,
        },
        {
            "name": "Age",
            "type": "date",
            "jsonPath": ".metadata.creationTimestamp",
            "description": "Since the run was created.",
        },
    ]


# The Kubernetes API conventions for the fields every object has. metadata takes nothing but
# its type: the API server refuses anything else there and publishes ObjectMeta's own schema.
TYPE_META_DESCRIPTIONS = {
    "apiVersion": "The versioned schema of this object: payloadrun.dev/v1alpha1.",
    "kind": "The kind of object: PayloadRun.",
}


def reasons_of(ctype: ConditionType, ok: bool) -> list[str]:
    """The reasons of condition ``ctype`` that go with status True (``ok``) or False."""
    return [str(r) for r in REASONS[ctype] if (r in TRUE_REASONS) == ok]


def _reasons_text(ctype: ConditionType) -> str:
    return "; ".join(
        f"{status}: {', '.join(found)}"
        for status, found in (
            ("True", reasons_of(ctype, True)),
            ("False", reasons_of(ctype, False)),
        )
        if found
    )


def with_condition_vocabulary(status: dict[str, Any]) -> dict[str, Any]:
    """The status schema with the operator's condition types and reasons in its descriptions,
    from the one vocabulary (:mod:`status`), so ``kubectl explain`` and the reference list
    exactly what the operator sets."""
    conditions = status["properties"]["conditions"]
    item = conditions["items"]["properties"]
    types = ", ".join(map(str, ConditionType))
    conditions["description"] = " ".join(
        [conditions["description"], *(f"{c}: {MEANINGS[c]}." for c in ConditionType)]
    )
    item["type"]["description"] = f"{types}. {item['type']['description']}"
    item["reason"]["description"] = " ".join(
        [item["reason"]["description"], *(f"{c}: {_reasons_text(c)}." for c in ConditionType)]
    )
    return status


def build_crd(full_templates: bool = False) -> dict[str, Any]:
    """The CRD; ``full_templates``: with every pod template's schema (see :func:`structural`)."""
    spec = model_schema(PayloadRunSpec, full_templates)
    status = with_condition_vocabulary(model_schema(PayloadRunStatus))
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["payloadrun"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": RUN_DESCRIPTION,
                            "required": ["spec"],
                            "x-kubernetes-validations": [
                                {
                                    "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
                                    "message": NAME_LENGTH_MESSAGE,
                                }
                            ],
                            "properties": {
                                **{
                                    name: {"type": "string", "description": description}
                                    for name, description in TYPE_META_DESCRIPTIONS.items()
                                },
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def _dump(obj: Any) -> str:
    import yaml

    # libyaml's dumper where PyYAML has it: the same text as the pure-Python one (the drift tests
    # compare the committed file with this), eight times faster on the 1.6 MB CRD
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(json.loads(json.dumps(obj)), Dumper=dumper, sort_keys=False, width=100)


def render_yaml() -> str:
    """The CRD as YAML, with a header that says where it comes from."""
    header = (
        "# Generated by `python -m payloadrun_operator.api.crd` from "
        "payloadrun_operator/api/models.py.\n"
        "# Do not edit: change the models and regenerate (a test fails when this file drifts).\n"
    )
    return header + _dump(build_crd())


def render_chart_template() -> str:
    """The CRD as the chart's template: installed and upgraded with the release unless
    ``crds.install`` is false, and kept when the release is uninstalled (deleting a CRD
    deletes every PayloadRun) unless ``crds.keep`` is false."""
    crd = build_crd()
    body = _dump({k: v for k, v in crd.items() if k != "metadata"})
    if "{{" in body:
        raise ValueError("the CRD contains '{{', which Helm would read as a template action")
    api, kind, rest = body.split("\n", 2)
    return (
        "{{- /* Generated by `python -m payloadrun_operator.api.crd --chart` from the models. "
        "Do not\n"
        "edit: regenerate (a test fails when this file drifts). */ -}}\n"
        "{{- if .Values.crds.install }}\n"
        f"{api}\n{kind}\n"
        "metadata:\n"
        f"  name: {crd['metadata']['name']}\n"
        "  labels:\n"
        '    {{- include "payloadrun.labels" . | nindent 4 }}\n'
        "  {{- if .Values.crds.keep }}\n"
        "  annotations:\n"
        "    helm.sh/resource-policy: keep\n"
        "  {{- end }}\n"
        f"{rest}"
        "{{- end }}\n"
    )


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m payloadrun_operator.api.crd",
        description=f"Print the PayloadRun CRD ({CRD_FILE}), or the chart's template of it.",
    )
    parser.add_argument(
        "--chart", action="store_true", help=f"print the chart's template ({CHART_CRD_FILE})"
    )
    args = parser.parse_args(argv)
    sys.stdout.write(render_chart_template() if args.chart else render_yaml())


if __name__ == "__main__":
    main()
