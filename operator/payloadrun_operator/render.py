"""``payloadrun-operator render -f RUN.yaml``: every child the operator would create, offline.

What ``helm template`` is to a chart: read what a template became before spending GPUs on it.
The same checks as the operator (:func:`admission.admit`: the schema, the CRD's rules, the pod
templates against the operator's parts), the same builders, the operator's settings from the
same ``PAYLOADRUN_*`` variables; no cluster. The output is YAML in apply order; a refused run
prints why on stderr and exits 1.

Not checked offline: the fields of a pod template against Kubernetes' schema (the API server
does that at ``kubectl apply``; ``kubectl apply --dry-run=server -f RUN.yaml`` asks it), and
anything that depends on the cluster (storage classes, claims, quotas).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from payloadrun_operator.admission import admit
from payloadrun_operator.builders import build_children
from payloadrun_operator.models import GROUP, KIND
from payloadrun_operator.settings import OperatorSettings, SettingsError

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
HELP = __doc__.split("\n\n", 1)[1]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "render",
        help="print the children the operator would create for PayloadRun files (no cluster)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        help="namespace of runs whose metadata names none (default: default)",
    )
    p.set_defaults(command="render")


def load(paths: Iterable[str], stdin: TextIO) -> list[tuple[str, dict[str, Any]]]:
    """Every YAML document of ``paths``, with where it came from."""
    import yaml

    docs = []
    for path in paths:
        if path == "-":
            text = stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        for i, doc in enumerate(yaml.safe_load_all(text)):
            if doc is not None:
                docs.append((f"{path} (document {i + 1})", doc))
    return docs


def is_run(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("kind") == KIND
        and str(doc.get("apiVersion", "")).startswith(f"{GROUP}/")
    )


def render_run(
    doc: dict[str, Any], namespace: str, settings: OperatorSettings
) -> tuple[list[dict[str, Any]], list[str]]:
    """The run's children in apply order, or the reasons it is refused."""
    meta = dict(doc.get("metadata") or {})
    if not meta.get("name"):
        return [], ["metadata.name is missing: a PayloadRun needs a name"]
    meta.setdefault("namespace", namespace)
    meta.setdefault("uid", PLACEHOLDER_UID)
    body = {**doc, "metadata": meta, "status": {}}
    admission = admit(body, settings)
    if admission.ctx is None:
        return [], admission.errors
    return build_children(admission.ctx), []


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
        if not is_run(doc):
            what = f"{doc.get('kind', '?')} {(doc.get('metadata') or {}).get('name', '?')}"
            print(f"# skipped {what} from {where}: not a PayloadRun", file=stderr)
            continue
        meta = doc.get("metadata") or {}
        name = f"{meta.get('namespace', args.namespace)}/{meta.get('name', '?')}"
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
