"""A Kubernetes structural schema (a CRD's ``openAPIV3Schema``) applied to a document offline,
the way the API server applies it: nulls pruned unless ``nullable``, defaults applied, unknown
fields refused (kubectl's default ``--validate=strict``) except under
``x-kubernetes-preserve-unknown-fields``, then type, enum, bounds, lengths, pattern, required,
``x-kubernetes-int-or-string`` and the uniqueness of ``x-kubernetes-list-type`` map keys and set
items, each error in the server's words (:class:`FieldError`). :mod:`schema_check` applies it to
a whole PayloadRun; why not the ``jsonschema`` library, and what is left unchecked, is said
there.

By the API server's own code (k8s.io/apiextensions-apiserver
``pkg/apiserver/schema/{defaulting,listtype}``; k8s.io/kube-openapi ``pkg/validation/validate``;
k8s.io/apimachinery ``pkg/util/validation/field``, all at v0.37.2), with only the standard
library; a test fails when the CRD uses a keyword it does not know (:data:`KNOWN_KEYWORDS`).
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# field.ErrorType's words (k8s.io/apimachinery/pkg/util/validation/field/errors.go)
INVALID = "Invalid value"
REQUIRED = "Required value"
UNSUPPORTED = "Unsupported value"
DUPLICATE = "Duplicate value"
TOO_LONG = "Too long"
TOO_MANY = "Too many"
UNKNOWN = "Unknown field"  # strict decoding: the server's words are its detail
# The API server checks no CEL rule once one of these is found (strategy.go, hasBlockingErr).
BLOCKING = {UNSUPPORTED, REQUIRED, TOO_LONG, TOO_MANY}
NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; correct the "
    "existing errors to complete validation"
)
# Whose ErrorBody prints no value (field.Error.ErrorBody).
_NO_VALUE = {REQUIRED, TOO_LONG}
_OMIT = object()

# Every schema keyword this module implements or knowingly leaves aside; a test fails when the
# generated CRD uses another.
KNOWN_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "additionalProperties",
        "items",
        "required",
        "enum",
        "default",
        "nullable",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "format",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        # no effect on validation
        "description",
        "x-kubernetes-map-type",
        # checked by admission in the operator's words (decisions.py, builders.py)
        "x-kubernetes-validations",
    }
)
# The formats the check knows: an integer's int32 or int64 bounds its value (numberValidator)
# and words its type errors (_type_error). A string format (date-time, ...) would need a check of
# its own; the CRD's spec has none (a test says so).
INTEGER_FORMATS = frozenset({"int32", "int64"})


@dataclass(frozen=True)
class FieldError:
    """One refusal, as the API server's ``field.Error``: where, what kind, the value it shows,
    why; and the value the document gave when the server shows only its type."""

    path: str
    kind: str
    shown: Any = _OMIT
    detail: str = ""
    given: Any = _OMIT
    wrong_type: bool = False  # field.TypeInvalid: words of Invalid value, blocking as Required

    @property
    def blocking(self) -> bool:
        """Whether the API server would then leave the CEL rules unchecked."""
        return self.kind in BLOCKING or self.wrong_type

    def __str__(self) -> str:
        if self.kind == UNKNOWN:
            text = f"{self.path}: {self.detail}"
        elif self.kind in _NO_VALUE or self.shown is _OMIT:
            text = f"{self.path}: {self.kind}"
        else:
            text = f"{self.path}: {self.kind}: {go_value(self.shown)}"
        if self.detail and self.kind != UNKNOWN:
            text += f": {self.detail}"
        if self.given is not _OMIT:
            text += f" (the value given: {shortened(self.given)})"
        return text


def go_value(value: Any) -> str:
    """A value as ``field.Error.ErrorBody`` prints it: strings quoted, numbers and booleans
    bare, anything else as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return _number(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, default=str)


def shortened(value: Any, limit: int = 120) -> str:
    text = go_value(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))  # Go's %v of 8.0 is 8
    return str(value)


# --- what the API server does to a body before validating it ----------------------------------


def plain(value: Any) -> Any:
    """``value`` as plain JSON data (kopf's bodies are mapping views), copied."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def field_schema(schema: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    if schema is None:
        return None
    props = schema.get("properties") or {}
    if key in props:
        return props[key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else None


def prune_nulls(value: Any, schema: Mapping[str, Any] | None) -> None:
    """Drop, in place, every ``null`` of a field that is neither nullable nor defaulted
    (defaulting/prunenulls.go): the API server reads such a field as absent."""
    if isinstance(value, dict):
        for key in list(value):
            sub = field_schema(schema, key)
            item = value[key]
            if (
                item is None
                and sub is not None
                and not sub.get("nullable")
                and "default" not in sub
            ):
                del value[key]
            else:
                prune_nulls(item, sub)
    elif isinstance(value, list):
        items = schema.get("items") if schema else None
        for item in value:
            prune_nulls(item, items)


def apply_defaults(value: Any, schema: Mapping[str, Any] | None) -> None:
    """Fill, in place, each absent (or non-nullable null) field that has a default, then
    descend (defaulting/algorithm.go)."""
    if schema is None:
        return
    if isinstance(value, dict):
        for key, prop in (schema.get("properties") or {}).items():
            if "default" in prop and (
                key not in value or (value[key] is None and not prop.get("nullable"))
            ):
                value[key] = copy.deepcopy(prop["default"])
        for key, item in value.items():
            sub = field_schema(schema, key)
            if sub is not None and item is None and not sub.get("nullable") and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            apply_defaults(value[key], sub)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                if item is None and not items.get("nullable") and "default" in items:
                    value[i] = copy.deepcopy(items["default"])
                apply_defaults(value[i], items)


# --- validation ----------------------------------------------------------------------------


def json_type(value: Any) -> str:
    """The JSON type kube-openapi names for a value (validate/type.go, schemaInfoForType)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _go_format(value: Any) -> str:
    """kube-openapi's format of a non-string value (what a type error under a format names)."""
    if isinstance(value, bool):
        return ""
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    return ""


def _is_integral(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value.is_integer()


def _type_error(value: Any, schema: Mapping[str, Any], path: str) -> FieldError | None:
    """kube-openapi's type validator (validate/type.go), int-or-string as ``[integer, string]``
    (ConvertJSONSchemaPropsWithPostProcess)."""
    if schema.get("x-kubernetes-int-or-string"):
        types = ["integer", "string"]
    elif "type" in schema:
        types = [schema["type"]]
    else:
        return None
    fmt = schema.get("format", "")
    actual = json_type(value)
    if value is None:
        if schema.get("nullable"):
            return None
        return invalid_type(path, ",".join(types), "null", value)
    float_int = actual == "number" and _is_integral(value) and "integer" in types
    int_float = actual == "integer" and "number" in types
    if actual not in ("string", "array") and fmt:
        value_format = _go_format(value)
        lower_int = fmt == "int64" and value_format == "int32"
        if not (actual in types or value_format == fmt or float_int or int_float or lower_int):
            return invalid_type(path, fmt, value_format, value)
    if "number" not in types and "integer" not in types and fmt and actual in ("string", "array"):
        return None
    if not (actual in types or float_int or int_float):
        return invalid_type(path, ",".join(types), actual, value)
    return None


def _fits(value: float, fmt: str) -> bool:
    """Whether ``value`` parses as an integer of ``fmt`` (values.go, IsValueValidAgainstRange:
    Go's strconv on the number's shortest decimal form)."""
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            return False
        value = int(value)
    bits = 32 if fmt == "int32" else 64
    return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


def invalid_type(path: str, wanted: str, shown: str, given: Any) -> FieldError:
    detail = f"{path} in body must be of type {wanted}: {json.dumps(shown)}"
    return FieldError(path, INVALID, shown, detail, given=given, wrong_type=True)


class Checker:
    """One document's walk; errors in document order."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def add(self, error: FieldError) -> None:
        self.errors.append(error)

    def check(self, value: Any, schema: Mapping[str, Any], path: str) -> None:
        type_error = _type_error(value, schema, path)
        if type_error is not None:
            self.add(type_error)
        if "enum" in schema and value not in schema["enum"]:
            wanted = ", ".join(
                json.dumps(v if isinstance(v, str) else json.dumps(v)) for v in schema["enum"]
            )
            self.add(FieldError(path, UNSUPPORTED, value, f"supported values: {wanted}"))
        if isinstance(value, bool) or value is None:
            return
        if isinstance(value, int | float):
            self.number(value, schema, path)
        elif isinstance(value, str):
            self.string(value, schema, path)
        elif isinstance(value, list):
            self.array(value, schema, path)
        elif isinstance(value, dict):
            self.object(value, schema, path)

    def number(self, value: float, schema: Mapping[str, Any], path: str) -> None:
        """validate/validator.go, numberValidator: an integer field's value must parse as one
        of its format (an int32 field takes no 3000000000), then the bounds."""
        if schema.get("type") == "integer" and not schema.get("x-kubernetes-int-or-string"):
            fmt = schema.get("format") if schema.get("format") in INTEGER_FORMATS else ""
            if not _fits(value, fmt):
                # kube-openapi's plain error: the API server gives it no field path
                wanted = f"with format {fmt}" if fmt else "(default format)"
                detail = f"Checked value must be of type integer {wanted} in {path}"
                self.add(FieldError("<nil>", INVALID, "", detail, given=value))
        if "minimum" in schema:
            low, exclusive = schema["minimum"], bool(schema.get("exclusiveMinimum"))
            if value < low or (exclusive and value == low):
                words = "greater than" if exclusive else "greater than or equal to"
                detail = f"{path} in body should be {words} {_number(low)}"
                self.add(FieldError(path, INVALID, value, detail))
        if "maximum" in schema:
            high, exclusive = schema["maximum"], bool(schema.get("exclusiveMaximum"))
            if value > high or (exclusive and value == high):
                words = "less than" if exclusive else "less than or equal to"
                detail = f"{path} in body should be {words} {_number(high)}"
                self.add(FieldError(path, INVALID, value, detail))

    def string(self, value: str, schema: Mapping[str, Any], path: str) -> None:
        """validate/validator.go, stringValidator (lengths in characters, as Go's runes)."""
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            limit = schema["maxLength"]
            unit = "byte" if limit == 1 else "bytes"
            detail = f"may not be more than {limit} {unit}"
            self.add(FieldError(path, TOO_LONG, detail=detail, given=value))
        if "minLength" in schema and len(value) < schema["minLength"]:
            detail = f"{path} in body should be at least {schema['minLength']} chars long"
            self.add(FieldError(path, INVALID, value, detail))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            detail = f"{path} in body should match '{schema['pattern']}'"
            self.add(FieldError(path, INVALID, value, detail))

    def array(self, value: list[Any], schema: Mapping[str, Any], path: str) -> None:
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            limit = schema["maxItems"]
            detail = f"must have at most {limit} items"
            self.add(FieldError(path, TOO_MANY, len(value), detail))
        if "minItems" in schema and len(value) < schema["minItems"]:
            detail = f"{path} in body should have at least {schema['minItems']} items"
            self.add(FieldError(path, INVALID, len(value), detail))
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                self.check(item, items, f"{path}[{i}]")
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set":
            for i in _repeated(value):
                self.add(FieldError(path + f"[{i}]", DUPLICATE, value[i]))
        elif list_type == "map":
            self.list_map(value, schema.get("x-kubernetes-list-map-keys") or [], path)

    def list_map(self, value: list[Any], keys: list[str], path: str) -> None:
        """listtype/validation.go, validateListMap: objects only, one per key."""
        for i, item in enumerate(value):
            if item is not None and not isinstance(item, dict):
                detail = "must be an object for an array of list-type map"
                self.add(FieldError(f"{path}[{i}]", INVALID, item, detail))
                return
        tuples = [{k: item[k] for k in keys if k in item} if item else {} for item in value]
        for i in _repeated(tuples):
            self.add(FieldError(f"{path}[{i}]", DUPLICATE, tuples[i]))

    def object(self, value: dict[str, Any], schema: Mapping[str, Any], path: str) -> None:
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if key in props:
                self.check(item, props[key], where)
            elif isinstance(extra, Mapping):
                self.check(item, extra, where)
        for key in schema.get("required") or ():
            if key not in value:
                self.add(FieldError(f"{path}.{key}" if path else key, REQUIRED))


def unknown_fields(value: Any, schema: Mapping[str, Any] | None, path: str) -> Iterator[str]:
    """The paths of the fields the schema does not know (pruning/algorithm.go): what the API
    server drops, and refuses under kubectl's default ``--validate=strict``."""
    if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields"):
        if isinstance(value, dict):
            for key, item in value.items():
                sub = field_schema(schema, key)
                if sub is not None:
                    yield from unknown_fields(item, sub, f"{path}.{key}" if path else key)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                yield from unknown_fields(item, schema.get("items"), f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            sub = field_schema(schema, key)
            if sub is None:
                yield where
            else:
                yield from unknown_fields(item, sub, where)
    elif isinstance(value, list):
        items = schema.get("items") if schema is not None else None
        for i, item in enumerate(value):
            yield from unknown_fields(item, items, f"{path}[{i}]")


def _repeated(values: list[Any]) -> Iterator[int]:
    """The index of each value's second occurrence (listtype's validateListSet)."""
    seen: dict[str, int] = {}
    for i, item in enumerate(values):
        key = json.dumps(item, sort_keys=True, default=str)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 2:
            yield i
