"""The chart's dashboards against Grafana's own schema (npm @grafana/schema, checked by tsc).

hack/dashboard-schema.sh installs the pinned packages into the cache (``make test`` runs it
first); without them these tests skip, or fail under PAYLOADRUN_REQUIRE_CLUSTER. And the check
must catch what it claims to: each broken copy of a dashboard below fails, naming its file, line
and key.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import CHART, REPO

sys.path.insert(0, str(REPO / "hack" / "dashboard-schema"))
import check_dashboards  # hack/dashboard-schema/check_dashboards.py

from payloadrun_devkit import required

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))


@pytest.fixture(scope="module")
def schema_env() -> Path:
    try:
        return check_dashboards.installed()
    except check_dashboards.NotInstalled as exc:
        required.skip_or_fail(str(exc))


def test_chart_dashboards_match_grafanas_schema(schema_env):
    assert DASHBOARDS
    problems = check_dashboards.check(DASHBOARDS, schema_env)
    assert not problems, "\n".join(map(str, problems))


def _parent(board: dict, path: str) -> tuple[Any, str]:
    """The object holding the last key of a path like panels[0].options.legend, and that key."""
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    node: Any = board
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    return node, last


def _set(board: dict, path: str, value: Any) -> None:
    node, key = _parent(board, path)
    node[key] = value


def _rename(board: dict, path: str, new_key: str) -> None:
    node, key = _parent(board, path)
    node[new_key] = node.pop(key)


# (case, how to break the writer dashboard, the JSON path reported, words of the message)
BROKEN = [
    (
        "misspelt-panel-key",
        lambda b: _rename(b, "panels[0].gridPos", "gridPoss"),
        "panels[0].gridPoss",
        "'\"gridPoss\"' does not exist",
    ),
    (
        "refresh-not-a-string",
        lambda b: _set(b, "refresh", 5),
        "refresh",
        "not assignable to type 'string'",
    ),
    (
        "unknown-dashboard-key",
        lambda b: _set(b, "graphTooltipMode", 1),
        "graphTooltipMode",
        "does not exist",
    ),
    (
        "variable-without-a-current-value",
        lambda b: _set(b, "templating.list[1].current", {}),
        "templating.list[1].current",
        "missing the following properties",
    ),
    (
        "variable-hide-out-of-range",
        lambda b: _set(b, "templating.list[1].hide", 7),
        "templating.list[1].hide",
        "not assignable to type 'VariableHide",
    ),
    (
        "legend-placement-not-in-enum",
        lambda b: _set(b, "panels[1].options.legend.placement", "top"),
        "panels[1].options.legend.placement",
        "'\"top\"' is not assignable",
    ),
    (
        "misspelt-field-config-custom-key",
        lambda b: _set(b, "panels[0].fieldConfig.defaults.custom.lineWidht", 2),
        "panels[0].fieldConfig.defaults.custom.lineWidht",
        "does not exist",
    ),
    (
        "stacking-mode-not-in-enum",
        lambda b: _set(b, "panels[0].fieldConfig.defaults.custom.stacking.mode", "sideways"),
        "panels[0].fieldConfig.defaults.custom.stacking.mode",
        "'\"sideways\"' is not assignable",
    ),
    (
        "misspelt-prometheus-target-key",
        lambda b: _set(b, "panels[2].targets[0].legendFromat", "{{mode}}"),
        "panels[2].targets[0].legendFromat",
        "does not exist",
    ),
    (
        "target-expr-not-a-string",
        lambda b: _set(b, "panels[2].targets[0].expr", ["up"]),
        "panels[2].targets[0].expr",
        "not assignable to type 'string'",
    ),
    (
        "no-schema-version",
        lambda b: b.pop("schemaVersion"),
        "(top level)",
        "Property 'schemaVersion' is missing",
    ),
    (
        "unknown-panel-type",
        lambda b: _set(b, "panels[3].type", "graph"),
        "panels[3].type",
        "'\"graph\"' is not assignable",
    ),
]


@pytest.fixture(scope="module")
def broken_results(schema_env, tmp_path_factory) -> dict[str, tuple[Path, list, list[str]]]:
    """All broken copies checked in one compiler run: {case: (file, problems, its lines)}."""
    source = json.loads((CHART / "dashboards" / "payloadrun-writer.json").read_text())
    tmp = tmp_path_factory.mktemp("broken-dashboards")
    files = {}
    for case, breaks, _, _ in BROKEN:
        board = copy.deepcopy(source)
        breaks(board)
        path = tmp / f"{case}.json"
        path.write_text(json.dumps(board, indent=2) + "\n")
        files[case] = path
    problems = check_dashboards.check(list(files.values()), schema_env)
    return {
        case: (path, [p for p in problems if p.file == path], path.read_text().splitlines())
        for case, path in files.items()
    }


@pytest.mark.parametrize(
    ("case", "json_path", "words"),
    [(c, p, w) for c, _, p, w in BROKEN],
    ids=[c for c, *_ in BROKEN],
)
def test_a_broken_dashboard_fails_naming_file_line_and_key(broken_results, case, json_path, words):
    path, problems, lines = broken_results[case]
    assert problems, f"{case}: the schema check found nothing wrong"
    report = "\n".join(map(str, problems))
    problem = next((p for p in problems if p.path == json_path), None)
    assert problem is not None, f"{case}: no problem at {json_path}:\n{report}"
    assert words in problem.message, report
    text = str(problem)
    assert text.startswith(f"{path}:{problem.line}: {json_path}: "), text
    if json_path != "(top level)":  # the line reported is the key's
        key = json_path.rsplit(".", 1)[-1].split("[")[0]
        assert f'"{key}"' in lines[problem.line - 1], (text, lines[problem.line - 1])


def test_json_lines_is_json_dumps_with_a_path_per_line():
    board = json.loads(DASHBOARDS[0].read_text())
    lines = check_dashboards.json_lines(board)
    assert "\n".join(text for text, _ in lines) == json.dumps(board, indent=2)
    assert {path for text, path in lines if text.startswith('  "schemaVersion": ')} == {
        "schemaVersion"
    }
    assert any(path == "panels[0].gridPos.w" for _, path in lines)
    assert check_dashboards.json_lines({"a": [], "b": {}}) == [
        ("{", ""),
        ('  "a": [],', "a"),
        ('  "b": {}', "b"),
        ("}", ""),
    ]


def test_a_file_not_laid_out_by_json_dumps_still_names_the_key(schema_env, tmp_path):
    board = json.loads(DASHBOARDS[0].read_text())
    board["refresh"] = 5
    path = tmp_path / "compact.json"
    path.write_text(json.dumps(board))
    (problem,) = check_dashboards.check([path], schema_env)
    assert problem.line is None and problem.path == "refresh"
    assert str(problem).startswith(f"{path}: refresh: ")


def test_invalid_json_is_a_problem_not_a_crash(schema_env, tmp_path):
    path = tmp_path / "truncated.json"
    path.write_text('{\n  "title": "x",\n')
    (problem,) = check_dashboards.check([path], schema_env)
    assert problem.file == path and problem.path == "(not JSON)" and problem.line == 3
