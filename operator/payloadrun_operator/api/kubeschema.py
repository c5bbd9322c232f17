"""Kubernetes' own schema for the pod templates a PayloadRun embeds, as CRD structural schemas.

Each role of a run takes a full ``PodTemplateSpec`` (as KubeRay, JobSet and LeaderWorkerSet do),
validated by the API server with the schema of the Kubernetes version the project pins
(``KUBERNETES_VERSION`` in ``cluster/versions.env``), so ``kubectl explain`` shows every field
and field validation refuses a misspelt one. That schema comes from Kubernetes' OpenAPI v3
document (``api/openapi-spec/v3/api__v1_openapi.json`` in ``k8s.io/kubernetes``, which
``cluster/build.sh`` brings into the Go module cache): :func:`extract` keeps the definitions a
``PodTemplateSpec`` reaches, and ``hack/kubernetes_openapi.py`` writes them to
:data:`OPENAPI_FILE` (committed, so the CRD is generated anywhere; a test compares it with the
pinned version's document). :func:`pod_template_schema` turns them into a structural schema:

- references inlined, ``IntOrString`` and ``Quantity`` as ``x-kubernetes-int-or-string`` (so
  ``nvidia.com/gpu: 8`` is accepted, as in a pod), the ``x-kubernetes-list-type`` and map keys
  kept (``containers`` is one entry per ``name``), patch-strategy extensions dropped;
- no defaults, except where a list's map key needs one (a port's ``protocol``: ``TCP``), which
  the API server requires of a CRD;
- ``metadata`` holds ``labels`` and ``annotations`` only (a template has no name of its own);
- ``ephemeralContainers`` left out: a pod cannot be created with them;
- ``containers`` not required: the role's short fields can make the main container alone, and
  the operator refuses a pod without one (its image missing) with its own message;
- descriptions kept whole (``kubectl explain`` prints them), each paragraph on one line.

Three templates make the CRD large (docs/operations.md#the-crd gives the figures, which
test_templates_api.py measures): above the 256 KiB that client-side ``kubectl apply`` can record
in its annotation, below etcd's default request limit of 1.5 MiB.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from importlib import resources
from typing import Any

ROOT = "io.k8s.api.core.v1.PodTemplateSpec"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
# k8s.io/apimachinery's Quantity regexp, as controller-gen writes it into CRDs.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
OPENAPI_FILE = "openapi/core-v1-podtemplatespec.json"  # inside this package
OPENAPI_DOCUMENT = "api/openapi-spec/v3/api__v1_openapi.json"  # in k8s.io/kubernetes
# Left out of the templates, with the reason (a pod cannot be created with them).
LEFT_OUT = {"io.k8s.api.core.v1.PodSpec": ("ephemeralContainers",)}
# Not required in a template: the operator may make the field (the main container from the
# short fields).
NOT_REQUIRED = {"io.k8s.api.core.v1.PodSpec": ("containers",)}
# The extensions a CRD's structural schema takes from Kubernetes' own.
KEPT_EXTENSIONS = ("x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type")
TEMPLATE_METADATA = ("labels", "annotations")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _references(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        if "$ref" in node:
            found.add(_ref_name(node["$ref"]))
        for value in node.values():
            found |= _references(value)
    elif isinstance(node, list):
        for value in node:
            found |= _references(value)
    return found


def extract(document: dict[str, Any], kubernetes_version: str) -> dict[str, Any]:
    """The definitions of ``document`` (an OpenAPI v3 document of the core API) that a
    ``PodTemplateSpec`` reaches, with where they come from: what :data:`OPENAPI_FILE` holds."""
    schemas = document["components"]["schemas"]
    wanted, todo = set(), [ROOT]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        todo += sorted(_references(schemas[name]) - wanted)
    return {
        "kubernetes": kubernetes_version,
        "source": f"k8s.io/kubernetes@{kubernetes_version}/{OPENAPI_DOCUMENT}",
        "root": ROOT,
        "schemas": {name: schemas[name] for name in sorted(wanted)},
    }


def render_openapi_file(extracted: dict[str, Any]) -> str:
    return json.dumps(extracted, indent=1, sort_keys=True) + "\n"


@functools.cache
def vendored() -> dict[str, Any]:
    """The committed definitions (:data:`OPENAPI_FILE`)."""
    text = resources.files(__package__).joinpath(OPENAPI_FILE).read_text()
    return json.loads(text)


def kubernetes_version() -> str:
    return str(vendored()["kubernetes"])


def paragraphs(text: str) -> str:
    """A Kubernetes field description with each paragraph on one line (kubectl wraps them)."""
    return "\n\n".join(" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()))


def _merged(node: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """``node`` without its ``allOf: [{$ref}]`` wrapper (the v3 document's way of giving a
    reference a description of its own): the bare ``$ref`` beside the node's own keys."""
    node = dict(node)
    if "allOf" in node:
        (only,) = node.pop("allOf")
        node = {**only, **node}
    return node


class _Converter:
    def __init__(self, schemas: dict[str, Any]) -> None:
        self.schemas = schemas

    def convert(self, node: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        node = _merged(node, self.schemas)
        if "$ref" in node:
            target = _ref_name(node.pop("$ref"))
            description = node.get("description")
            if target in (INT_OR_STRING, QUANTITY):
                out: dict[str, Any] = {"x-kubernetes-int-or-string": True}
                if target == QUANTITY:
                    out["pattern"] = QUANTITY_PATTERN
                if description:
                    out["description"] = paragraphs(description)
                return out
            if target == OBJECT_META:
                return self.metadata(description)
            definition = self.schemas[target]
            return self.convert({**definition, **node}, target)
        out = {}
        for key, value in node.items():
            if key == "description":
                out[key] = paragraphs(value)
            elif key == "properties":
                skipped = LEFT_OUT.get(name or "", ())
                out[key] = {p: self.convert(s) for p, s in value.items() if p not in skipped}
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                out[key] = self.convert(value)
            elif key == "required":
                optional = NOT_REQUIRED.get(name or "", ())
                if required := [r for r in value if r not in optional]:
                    out[key] = required
            elif key in KEPT_EXTENSIONS or key in ("type", "format"):
                out[key] = copy.deepcopy(value)
            # default, x-kubernetes-patch-*, x-kubernetes-unions: not for a CRD (see above)
        if "properties" in out:
            out["type"] = "object"
        if out.get("x-kubernetes-list-type") == "map":
            self.default_map_keys(node, out)
        return out

    def default_map_keys(self, node: dict[str, Any], out: dict[str, Any]) -> None:
        """A list-map key must be required or defaulted in a CRD: take Kubernetes' default."""
        items = out["items"]
        raw = _merged(node["items"], self.schemas)
        raw = self.schemas[_ref_name(raw["$ref"])] if "$ref" in raw else raw
        for key in out["x-kubernetes-list-map-keys"]:
            if key in items.get("required", []) or "default" in items["properties"][key]:
                continue
            default = raw["properties"][key].get("default")
            if default is None:
                raise ValueError(
                    f"list-map key {key!r} has neither a default nor is it required: the API "
                    "server would refuse the CRD"
                )
            items["properties"][key]["default"] = default

    def metadata(self, description: str | None) -> dict[str, Any]:
        meta = self.schemas[OBJECT_META]["properties"]
        out: dict[str, Any] = {
            "type": "object",
            "properties": {name: self.convert(meta[name]) for name in TEMPLATE_METADATA},
        }
        if description:
            out["description"] = paragraphs(description)
        return out


@functools.cache
def _pod_template() -> str:
    schemas = vendored()["schemas"]
    return json.dumps(_Converter(schemas).convert(dict(schemas[ROOT]), ROOT))


def pod_template_schema(description: str) -> dict[str, Any]:
    """A ``PodTemplateSpec`` as a structural schema node, with ``description`` as its own."""
    return {**json.loads(_pod_template()), "description": description}
