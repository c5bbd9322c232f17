"""``import payloadrun``: one listing, by role, that stays true.

``payloadrun/__init__.py`` lists its exports once (``_PUBLIC``, role by role) and derives
``__all__`` and the lazy ``__getattr__`` from it; the TYPE_CHECKING imports repeat it for type
checkers. These tests keep the copies equal, the writer's internals out, the package light for the
operator, and the example on the public names alone.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import payloadrun

REPO = Path(__file__).resolve().parents[2]
PACKAGE_INIT = Path(payloadrun.__file__)
EXAMPLE = REPO / "examples" / "orchestrator_trainer.py"

# What only the writer uses: vLLM's arrays compacted into payload rows, and the store that writes
# them. They live in payloadrun.codec and payloadrun.store, not at the package root.
WRITER_INTERNALS = {
    "PositionedRows",
    "compact_routed_experts",
    "routing_rows",
    "routing_pos",
    "mask_rows",
    "mask_rows_from_csr",
    "csr_from_mask_rows",
    "encode_npy_base64",
    "encode_prime_rl",
    "encode_sampling_mask_csr",
    "PayloadStore",
    "PayloadWriteError",
}

# What the package root exported before it was organised by role, and where each now lives.
DEPRECATED = {
    "PositionedRows": "payloadrun.codec",
    "compact_routed_experts": "payloadrun.codec",
    "mask_rows": "payloadrun.codec",
    "mask_rows_from_csr": "payloadrun.codec",
    "routing_pos": "payloadrun.codec",
    "routing_rows": "payloadrun.codec",
    "PayloadFile": "payloadrun.paths",
    "PayloadRoot": "payloadrun.paths",
    "PayloadStore": "payloadrun.store",
    "PayloadWriteError": "payloadrun.store",
}

# Each role's names, as the issue asks for them (the listing may hold more, never fewer).
ROLES = {
    "orchestrator": {
        "choice_segments",
        "sample_segments",
        "final_token_row",
        "payload_dir",
        "files_of",
        "RetentionClient",
        "AsyncRetentionClient",
        "TracePayload",
        "Node",
        "attribute_turn",
        "branch_segments",
    },
    "trainer": {"PayloadReader", "ShortReadError", "SegmentOverlapError", "PayloadPathError"},
    "formats": {"Segment", "ROUTED_EXPERTS", "SAMPLING_MASK", "ROUTING_FILL", "MASK_PAD"},
}


def type_checking_imports() -> dict[str, str]:
    """``name: module`` of every import under ``if TYPE_CHECKING:`` in ``payloadrun/__init__``."""
    tree = ast.parse(PACKAGE_INIT.read_text())
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]
    assert len(blocks) == 1, "payloadrun/__init__.py should have one TYPE_CHECKING block"
    found: dict[str, str] = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        for alias in node.names:
            assert alias.asname is None, f"{alias.name} is imported under another name"
            assert alias.name not in found, f"{alias.name} is imported twice"
            found[alias.name] = node.module
    return found


def test_every_exported_name_resolves_to_its_home_modules_object():
    assert len(payloadrun.__all__) == len(set(payloadrun.__all__)), "a name is listed twice"
    assert sorted(payloadrun._HOME_OF) == sorted(payloadrun.__all__)
    for name in payloadrun.__all__:
        home = importlib.import_module(payloadrun._HOME_OF[name])
        assert getattr(payloadrun, name) is getattr(home, name), name
    namespace: dict[str, object] = {}
    exec("from payloadrun import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(payloadrun.__all__)


def test_the_type_checking_block_imports_exactly_all():
    """Type checkers see what runtime serves: the same names, from the same modules."""
    assert type_checking_imports() == payloadrun._HOME_OF


def test_the_listing_is_by_role():
    assert list(payloadrun._PUBLIC) == ["orchestrator", "trainer", "formats"]
    listed = {
        role: {name for names in modules.values() for name in names}
        for role, modules in payloadrun._PUBLIC.items()
    }
    for role, names in ROLES.items():
        assert names <= listed[role], f"{role} lacks {sorted(names - listed[role])}"


def test_help_reads_as_a_guide_to_every_name():
    doc = inspect.getdoc(payloadrun)
    heads = [doc.index(head) for head in ("The orchestrator", "The trainer", "The formats")]
    assert heads == sorted(heads), "the docstring's roles are out of order"
    missing = [name for name in payloadrun.__all__ if f"``{name}" not in doc]
    assert not missing, f"help(payloadrun) does not mention {missing}"


def test_nothing_writer_internal_is_exported():
    assert not WRITER_INTERNALS & set(payloadrun.__all__)
    homes = set(payloadrun._HOME_OF.values())
    assert not {m for m in homes if m.startswith(("payloadrun.writer", "payloadrun.store"))}
    for name in WRITER_INTERNALS:  # still where the writer imports them from
        module = "payloadrun.store" if name.startswith("Payload") else "payloadrun.codec"
        assert hasattr(importlib.import_module(module), name), name


@pytest.mark.parametrize(("name", "module"), sorted(DEPRECATED.items()))
def test_names_that_left_the_root_warn_for_one_release(name, module):
    assert name not in payloadrun.__all__
    assert name not in dir(payloadrun)
    with pytest.warns(DeprecationWarning, match=rf"payloadrun\.{name} .* import it from {module}"):
        value = getattr(payloadrun, name)
    assert value is getattr(importlib.import_module(module), name)
    with pytest.warns(DeprecationWarning):  # every use warns, not only the first
        exec(f"from payloadrun import {name}", {})


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'payloadrun' has no attribute 'nope'"):
        _ = payloadrun.nope
    with warnings.catch_warnings():  # a name nobody ever exported does not warn
        warnings.simplefilter("error")
        assert not hasattr(payloadrun, "segments_of")


def light(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has imported after ``code``."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in ('numpy', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip())


def test_the_package_and_its_settings_do_not_import_numpy():
    """The operator imports payloadrun.settings; the package root must stay that light."""
    assert light("import payloadrun; payloadrun.settings.Env") == []
    assert light("import payloadrun.settings") == []
    assert light("import payloadrun; payloadrun.Env") == []


def test_the_orchestrators_plumbing_does_not_import_numpy():
    """Naming the directory and talking to the retention sidecar need no arrays."""
    code = "import payloadrun as p; p.payload_dir('/r', 1); p.RetentionClient; p.Env"
    assert light(code) == []
    assert light("import payloadrun as p; p.AsyncRetentionClient") == []


def example_imports() -> list[ast.Import | ast.ImportFrom]:
    tree = ast.parse(EXAMPLE.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_the_example_imports_only_the_public_api():
    public = set(payloadrun.__all__)
    taken = []
    for node in example_imports():
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("payloadrun"), (
                    f"the example imports {alias.name}: take names from `payloadrun` instead"
                )
            continue
        if node.module and node.module.split(".")[0] == "payloadrun":
            assert node.module == "payloadrun", (
                f"the example imports from {node.module}: export what it needs from payloadrun"
            )
            taken += [alias.name for alias in node.names]
    assert taken, "the example takes nothing from payloadrun"
    assert set(taken) <= public, f"not public: {sorted(set(taken) - public)}"


def test_the_example_writes_no_wire_name_it_can_import():
    """A field or variable name the package exports is used by name, never retyped."""
    wire = {
        value: name
        for name in payloadrun.__all__
        if isinstance(value := getattr(payloadrun, name), str) and name != "__version__"
    }
    wire |= {value: f"Env.{key}" for key, value in vars(payloadrun.Env).items() if key.isupper()}
    tree = ast.parse(EXAMPLE.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    retyped = [
        f"line {node.lineno}: {node.value!r} (use {wire[node.value]})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and id(node) not in docstrings
        and isinstance(node.value, str)
        and node.value in wire
    ]
    assert not retyped, retyped


def test_the_docs_import_only_public_names():
    """The Python the docs show takes from ``payloadrun`` only what it exports."""
    public, shown = set(payloadrun.__all__), []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", doc.read_text(), re.DOTALL):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.ImportFrom) and node.module == "payloadrun":
                    names = {alias.name for alias in node.names}
                    assert names <= public, f"{doc.name} imports {sorted(names - public)}"
                    shown.append(doc.name)
    assert "integration.md" in shown
