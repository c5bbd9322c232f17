"""A PayloadRun checked against the CRD's own schema, offline, the way the API server checks it.

``payloadrun-operator render`` runs where there is no API server, and the operator may read a
run that an older CRD let in: both check the body against the ``openAPIV3Schema`` that
:func:`crd.build_crd` generates (the one ``crds/`` holds: the run's own fields from the pydantic
models, each pod template Kubernetes' own ``PodTemplateSpec``), before anything is built from
it, so a mistyped field is refused with its path instead of crashing a builder.

Why not the ``jsonschema`` library: a CRD's schema is a Kubernetes *structural* schema, not plain
JSON Schema, and most of what the API server does with it is outside JSON Schema:
``x-kubernetes-int-or-string``, null values pruned before validation unless ``nullable``,
defaults applied before validation, unknown fields refused (kubectl's default
``--validate=strict``) except under ``x-kubernetes-preserve-unknown-fields``, the uniqueness of
``x-kubernetes-list-type: map`` keys and ``set`` items, and the field paths and words of its
messages. The JSON Schema part that remains (type, enum, bounds, lengths, pattern, required) is
a few lines each, so :mod:`structural` implements the whole of it by the API server's own code,
with only the standard library, and a test fails when the CRD uses a keyword it does not know
(:data:`structural.KNOWN_KEYWORDS`). This module applies it to a run as
``pkg/registry/customresource/strategy.go`` does at create, with the run's ``metadata``.

Each error prints as the API server prints it (``field.Error``), followed by the value the
document gave where the server's line names only its type::

    spec.trainer.replicas: Invalid value: "string": spec.trainer.replicas in body must be of
    type integer: "string" (the value given: "two")

What it does not check: the CEL rules (``x-kubernetes-validations``), which
:func:`decisions.validation_errors` and the builders state in the operator's own words, and
their transition rules (``oldSelf``), which need the stored object; the status (the API server
drops it on create); ``metadata`` beyond the run's name and namespace.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from payloadrun_operator.api.structural import (
    INVALID,
    REQUIRED,
    UNKNOWN,
    Checker,
    FieldError,
    apply_defaults,
    field_schema,
    invalid_type,
    json_type,
    plain,
    prune_nulls,
    unknown_fields,
)

# k8s.io/apimachinery/pkg/util/validation: IsDNS1123Subdomain, IsDNS1123Label
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


# --- a whole PayloadRun ----------------------------------------------------------------------


def _without_description(node: dict[str, Any]) -> dict[str, Any]:
    node.pop("description", None)
    return node


@functools.cache
def run_schema() -> dict[str, Any]:
    """The CRD's ``openAPIV3Schema`` with the schema of the pod templates the CRD leaves to the
    operator (``crd.CHECKED_BY_OPERATOR``) filled in (built once per process: about half a
    second), a copy of its own without the descriptions, which no check reads: they were half
    of what the operator held for it (4.2 MiB with them and their JSON, 2.3 without:
    tracemalloc, each in a fresh process)."""
    from payloadrun_operator.api.crd import build_crd

    (version,) = build_crd(full_templates=True)["spec"]["versions"]
    text = json.dumps(version["schema"]["openAPIV3Schema"])
    return json.loads(text, object_hook=_without_description)


def metadata_errors(meta: Any) -> list[FieldError]:
    """The run's name and namespace, as the API server checks every object's (ObjectMeta)."""
    if not isinstance(meta, dict):
        return [invalid_type("metadata", "object", json_type(meta), meta)]
    errors = []
    name = meta.get("name")
    if name is None or name == "":
        errors.append(
            FieldError("metadata.name", REQUIRED, detail="name or generateName is required")
        )
    elif not isinstance(name, str):
        errors.append(invalid_type("metadata.name", "string", json_type(name), name))
    elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        errors.append(FieldError("metadata.name", INVALID, name, SUBDOMAIN_MESSAGE))
    namespace = meta.get("namespace")
    if namespace is not None:
        if not isinstance(namespace, str):
            errors.append(
                invalid_type("metadata.namespace", "string", json_type(namespace), namespace)
            )
        elif len(namespace) > 63 or not DNS1123_LABEL.match(namespace):
            errors.append(FieldError("metadata.namespace", INVALID, namespace, LABEL_MESSAGE))
    for field in ("labels", "annotations"):
        found = meta.get(field)
        if found is None:
            continue
        if not isinstance(found, dict):
            errors.append(invalid_type(f"metadata.{field}", "object", json_type(found), found))
            continue
        for key, item in found.items():
            if not isinstance(item, str):
                where = f"metadata.{field}.{key}"
                errors.append(invalid_type(where, "string", json_type(item), item))
    return errors


def spec_as_stored(spec: Any) -> Any:
    """A copy of a run's spec with its nulls as the API server stores them: dropped, or the
    field's default where it has one. Nothing else is defaulted, so what the operator builds
    from a file is the file (an API server would also add the template's defaults, such as a
    port's protocol; the operator reads them from the run it stores)."""
    doc = plain(spec)
    schema = run_schema()["properties"]["spec"]
    _nulls_as_stored(doc, schema)
    return doc


def _nulls_as_stored(value: Any, schema: Mapping[str, Any] | None) -> None:
    if schema is None:
        return
    if isinstance(value, dict):
        for key in list(value):
            sub = field_schema(schema, key)
            if sub is None:
                continue
            if value[key] is None and not sub.get("nullable"):
                if "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                else:
                    del value[key]
                    continue
            _nulls_as_stored(value[key], sub)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                if item is None and not items.get("nullable") and "default" in items:
                    value[i] = copy.deepcopy(items["default"])
                _nulls_as_stored(value[i], items)


def run_errors(body: Mapping[str, Any]) -> list[FieldError]:
    """Every error of a PayloadRun body against the CRD's schema, as the API server would
    refuse it at create: nulls pruned and defaults applied to a copy first, the status left
    out (the status subresource drops it), no CEL rule (see the module's docstring)."""
    schema = run_schema()
    doc = plain({k: v for k, v in body.items() if k != "status"})
    meta = doc.pop("metadata", None)
    errors = metadata_errors({} if meta is None else meta)
    props = {k: v for k, v in schema["properties"].items() if k not in ("metadata", "status")}
    top = {**schema, "properties": props, "required": schema.get("required", [])}
    top = {k: v for k, v in top.items() if k != "x-kubernetes-validations"}
    # metadata is checked above, the status is dropped: neither is an unknown field
    known = {**top, "properties": {**props, "metadata": {}, "status": {}}}
    errors += [
        FieldError(where, UNKNOWN, detail=f'unknown field "{where}"')
        for where in unknown_fields(doc, known, "")
    ]
    prune_nulls(doc, top)
    apply_defaults(doc, top)
    checker = Checker()
    checker.object(doc, top, "")
    return errors + checker.errors
