"""``payloadrun-operator render -f RUN.yaml``: every child the operator would create, offline.

What `helm template` is to a chart: read what a template became before spending GPUs on it.
The same checks as the operator, the same builders, the operator's settings from the same
PAYLOADRUN_* variables; no cluster. The output is YAML in apply order.

Each run is first checked against the CRD's own schema, as the API server checks it at
`kubectl apply`: the run's fields and each pod template (Kubernetes' own PodTemplateSpec
schema, pinned to the Kubernetes version the CRD is generated from) for types, required fields,
supported values, bounds, list keys (an env entry without a name) and unknown fields, after
dropping nulls and applying the CRD's defaults. Every error of a run is printed at once, in the
API server's words with the value given, for example

  spec.trainer.replicas: Invalid value: "string": spec.trainer.replicas in body must be of
  type integer: "string" (the value given: "two")

Then the CRD's rules (its CEL validations) and the pod templates against the operator's parts,
in the operator's words. A refused run prints why on stderr and exits 1; unreadable input
exits 2.

A run labelled kueue.x-k8s.io/queue-name prints its Kueue Workload first (every pod of the run
as one admission; the operator creates the pods only once Kueue admits it).

Not checked offline: what only the cluster knows (storage classes, claims, quotas, admission
webhooks, Pod Security), and the rules of the children's own kinds that no schema states (the
API server checks a StatefulSet's pod when it is applied): `kubectl apply --dry-run=server -f
RUN.yaml` asks the API server about the run itself.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from payloadrun.helptext import HelpFormatter, plain
from payloadrun_operator.api.models import GROUP, KIND
from payloadrun_operator.desired import queueing
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.observed.queue import queue_name
from payloadrun_operator.platform.settings import OperatorSettings, SettingsError

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
HELP = __doc__.split("\n\n", 1)[1]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "render",
        help="print the children the operator would create for PayloadRun files (no cluster)",
        description=plain(HELP),
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="a YAML file of PayloadRuns (several documents; others are skipped with a note); "
        "- for stdin; repeatable",
    )
    p.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="namespace of runs whose metadata names none",
    )
    p.set_defaults(command="render")


def load(paths: Iterable[str], stdin: TextIO) -> list[tuple[str, Any]]:
    """Every YAML document of ``paths``, with where it came from, as the JSON kubectl would
    send: timestamps stay strings, keys become strings."""
    import yaml

    docs = []
    for path in paths:
        if path == "-":
            text = stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        for i, doc in enumerate(yaml.load_all(text, Loader=json_like_loader())):
            if doc is not None:
                docs.append((f"{path} (document {i + 1})", as_json(doc)))
    return docs


@functools.cache
def json_like_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        """YAML as kubectl reads it (sigs.k8s.io/yaml): a date is a string, not a datetime."""

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return Loader


def as_json(value: Any) -> Any:
    """``value`` with every mapping key a string, as in the JSON kubectl sends."""
    if isinstance(value, dict):
        return {_key(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, bytes | set):  # !!binary, !!set: not JSON
        return str(value)
    return value


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    return "null" if key is None else str(key)


def is_run(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("kind") == KIND
        and str(doc.get("apiVersion", "")).startswith(f"{GROUP}/")
    )


def describe(doc: Any, namespace: str) -> str:
    """A document as a note names it: ``kind name``, or the run's ``namespace/name``."""
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    if is_run(doc):
        return f"{meta.get('namespace', namespace)}/{meta.get('name', '?')}"
    kind = doc.get("kind", "?") if isinstance(doc, dict) else type(doc).__name__
    return f"{kind} {meta.get('name', '?')}"


def render_run(
    doc: dict[str, Any], namespace: str, settings: OperatorSettings
) -> tuple[list[dict[str, Any]], list[str]]:
    """The run's children in apply order, or the reasons it is refused; a run labelled for a
    Kueue queue, its Workload first (without the priority its priority-class label names: the
    cluster's WorkloadPriorityClass holds it)."""
    meta = doc.get("metadata")
    if isinstance(meta, dict):  # else the schema check says what is wrong with it
        meta = {"namespace": namespace, "uid": PLACEHOLDER_UID, **meta}
    body = {**doc, "metadata": meta, "status": {}}
    admission = admit(body, settings)
    if admission.built is None:
        return [], admission.errors
    queue = queue_name(meta)
    workload = [queueing.workload_manifest(admission.built, queue)] if queue else []
    return workload + list(admission.built.children), []


def run(args: argparse.Namespace, stdout: TextIO = sys.stdout, stderr: TextIO = sys.stderr) -> int:
    import yaml

    try:
        settings = OperatorSettings.from_env()
    except SettingsError as exc:
        print(f"payloadrun-operator render: {exc}", file=stderr)
        return 2
    try:
        docs = load(args.filename, sys.stdin)
    except (OSError, yaml.YAMLError) as exc:
        print(f"payloadrun-operator render: cannot read the file: {exc}", file=stderr)
        return 2
    refused = rendered = 0
    for where, doc in docs:
        name = describe(doc, args.namespace)
        if not is_run(doc):
            print(f"# skipped {name} from {where}: not a PayloadRun", file=stderr)
            continue
        children, errors = render_run(doc, args.namespace, settings)
        if errors:
            refused += 1
            print(f"payloadrun-operator render: PayloadRun {name} is refused:", file=stderr)
            for error in errors:
                print(f"  - {error}", file=stderr)
            continue
        rendered += 1
        try:
            write_children(stdout, name, where, children)
        except BrokenPipeError:  # `render ... | head`: the reader has what it wanted
            sys.stdout = None  # type: ignore[assignment]  # no flush error at exit
            return 0
    if not rendered and not refused:
        print("payloadrun-operator render: no PayloadRun in the given files", file=stderr)
        return 1
    return 1 if refused else 0


def write_children(stdout: TextIO, name: str, where: str, children: list[dict[str, Any]]) -> None:
    import yaml

    stdout.write(
        f"# PayloadRun {name} ({where}): {len(children)} children, in apply order. Its uid "
        f"is the API server's; {PLACEHOLDER_UID} stands for it here.\n"
    )
    for child in children:
        stdout.write("---\n")
        stdout.write(yaml.safe_dump(child, sort_keys=False, width=100))
