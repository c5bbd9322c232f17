"""The operator's wings (docs/operator.md#the-operators-files): no arrow back up.

``payloadrun_operator`` is cut into wings, lowest first: ``api`` (the resource, its CRD, names
and status vocabulary), ``platform`` (the API server client, election, endpoints, settings),
``desired`` (what a run should be), ``observed`` (what it is), and the top level (the reconcile
wiring and the commands). A module may import its own wing and those below it, never one above:
read from the source's imports (at module level and inside functions alike), so a lazy import
cannot hide an arrow. The CRD, generated from the API wing, loads nothing that computes status.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import payloadrun_operator

PACKAGE = "payloadrun_operator"
ROOT = Path(payloadrun_operator.__file__).parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
WINGS = ("api", "platform", "desired", "observed")
TOP = len(WINGS)  # the top level (handlers, render, __main__) may import every wing


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def rank(module: str) -> int | None:
    """A module's wing, lowest 0; None for the package itself (its ``__init__`` imports nothing
    of the operator, checked below, so every wing may read its version)."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    return WINGS.index(parts[0]) if parts[0] in WINGS else TOP


def imports_of(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The operator's modules that ``path`` imports anywhere in it: ``from a.b import c`` names
    module ``a.b.c`` when that is a module, else ``a.b``; relative imports are resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t == PACKAGE or t.startswith(PACKAGE + "."))
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports_of(path, name, known) for name, path in known.items()}


def arrows_up(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import of a module from a higher wing than the importer's own."""
    found = set()
    for importer, targets in graph.items():
        own = rank(importer)
        for target in targets:
            wing = rank(target)
            if own is None or (wing is not None and wing > own):
                found.add((importer, target))
    return found


def transitive_imports(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            # importing a.b.c runs a's and a.b's __init__ too
            parts = target.split(".")
            for depth in range(1, len(parts) + 1):
                step = ".".join(parts[:depth])
                if step not in seen:
                    seen.add(step)
                    todo.append(step)
    return seen


def test_every_module_lies_in_a_wing_or_at_the_top() -> None:
    graph = import_graph()
    assert all(len(name.split(".")) <= 3 for name in graph), sorted(graph)
    for wing in WINGS:
        assert f"{PACKAGE}.{wing}" in graph, f"the {wing} wing has no __init__.py"


def test_no_module_imports_a_higher_wing() -> None:
    found = arrows_up(import_graph())
    assert not found, (
        f"imports back up a wing (order: {' < '.join(WINGS)} < top level): {sorted(found)}; move "
        "what the lower module needs down into its wing (or below), or the importer up"
    )


def test_the_crd_imports_nothing_that_computes_status() -> None:
    crd = f"{PACKAGE}.api.crd"
    reached = transitive_imports(import_graph(), crd)
    observed = sorted(m for m in reached if rank(m) == WINGS.index("observed"))
    assert not observed, f"{crd} imports, through its imports, {observed}"
    outside = sorted(m for m in reached if rank(m) not in (None, 0))
    assert not outside, f"{crd} imports modules outside the api wing: {outside}"


def test_the_crd_loads_nothing_that_computes_status_when_it_runs() -> None:
    """What importing the CRD's generator loads in a fresh interpreter (a dynamic import that
    the source's import statements do not show would show here)."""
    code = (
        "import sys, payloadrun_operator.api.crd\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('payloadrun_operator.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = set(done.stdout.split())
    assert f"{PACKAGE}.api.crd" in loaded, loaded
    assert {m for m in loaded if rank(m) != 0} == set(), sorted(loaded)


@pytest.mark.parametrize(
    ("source", "name", "expected"),
    [
        ("from payloadrun_operator.observed import status\n", "a.b", {"observed.status"}),
        (
            "def f():\n    from payloadrun_operator.observed.status import phase\n",
            "a.b",
            {"observed.status"},
        ),
        ("import payloadrun_operator.platform.kube\n", "a.b", {"platform.kube"}),
        ("from ..observed import status\n", "desired.x", {"observed.status"}),
        ("from . import names\n", "api.crd", {"api.names"}),
    ],
)
def test_the_reader_finds_every_form_of_import(
    tmp_path: Path, source: str, name: str, expected: set[str]
) -> None:
    """The graph's reader sees top-level, lazy, plain and relative imports alike."""
    path = tmp_path / "m.py"
    path.write_text(source)
    known = set(modules())
    found = imports_of(path, f"{PACKAGE}.{name}", dict.fromkeys(known, path))
    assert found == {f"{PACKAGE}.{e}" for e in expected}


def documented_files(text: str) -> dict[str, str]:
    """The map in docs/operator.md's "The operator's files": each entry's path in the package
    (a directory ends with /) and what the line says it is."""
    block = text.split("## The operator's files\n", 1)[1].split("```text\n", 1)[1]
    lines = block.split("```", 1)[0].splitlines()
    assert lines[0] == "operator/payloadrun_operator/", lines[0]
    entries: dict[str, str] = {}
    parents: list[str] = []
    for line in lines[1:]:
        found = re.fullmatch(r"((?:│   |    )*)[├└]── (\S+)\s+(.*)", line)
        assert found, f"a line of the map that is not a tree entry with a meaning: {line!r}"
        depth = len(found.group(1)) // 4
        parents[depth:] = [found.group(2)]
        entries["".join(parents)] = found.group(3).strip()
    return entries


def package_files(root: Path = ROOT) -> set[str]:
    """What the map lists: every module and directory of the package, but a wing's
    ``__init__.py`` (its directory's line says what the wing is)."""
    found = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel:
            continue
        if path.is_dir():
            found.add(rel + "/")
        elif path.suffix == ".py" and not (path.name == "__init__.py" and path.parent != root):
            found.add(rel)
    return found


def test_the_map_in_the_docs_lists_every_module_and_no_other() -> None:
    documented = documented_files(DOC.read_text())
    actual = package_files()
    assert set(documented) == actual, (
        f"docs/operator.md#the-operators-files is out of date: missing "
        f"{sorted(actual - set(documented))}, gone {sorted(set(documented) - actual)}: one line "
        "per module, saying what it is"
    )
    assert all(documented.values()), documented


def test_the_map_reader_reads_nested_entries() -> None:
    text = (
        "## The operator's files\n\n```text\noperator/payloadrun_operator/\n"
        "├── api/        the api\n│   └── models.py   the models\n└── render.py   a command\n```\n"
    )
    assert documented_files(text) == {
        "api/": "the api",
        "api/models.py": "the models",
        "render.py": "a command",
    }
