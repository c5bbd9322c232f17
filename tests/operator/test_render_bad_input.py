"""render's bad-input table (issue 33): every run the CRD's schema refuses is refused by
``payloadrun-operator render`` with each error's field path, the value given and what the schema
wants, all at once, exit 1 and no traceback; the operator's admission refuses it with the same
words and never raises; the examples still render byte for byte as before.

``tests/integration/test_render_api.py`` holds the same table against the real API server.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from bad_runs import BAD, BASE_RUN, GOOD, Case

from payloadrun_operator import render
from payloadrun_operator.api import schema_check, structural
from payloadrun_operator.api.crd import build_crd
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.platform.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def render_in_process(text: str, tmp_path: Path) -> tuple[int, str, str]:
    """render's own command function on a file: exit code, stdout, stderr (an exception would
    fail the test, as a traceback would the command)."""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    stdout, stderr = io.StringIO(), io.StringIO()
    code = render.run(argparse.Namespace(filename=[str(path)], namespace="default"), stdout, stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def render_command(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "payloadrun_operator", "render", "-f", "-"],
        capture_output=True,
        text=True,
        input=text,
        env={**os.environ, "PYTHONWARNINGS": "error"},
        timeout=120,
        check=False,
    )


def refusal_lines(stderr: str) -> list[str]:
    return [line[4:] for line in stderr.splitlines() if line.startswith("  - ")]


def assert_says(lines: list[str], expected: tuple[str, ...]) -> None:
    path, *words = expected
    matching = [line for line in lines if line.startswith(f"{path}: ")]
    assert any(all(w in line for w in words) for line in matching), (
        f"no line for {path} with {words}:\n" + "\n".join(lines)
    )


def per_run(stderr: str) -> dict[str, list[str]]:
    """The refusal lines of each run, by its name."""
    found: dict[str, list[str]] = {}
    current = None
    for line in stderr.splitlines():
        if line.startswith("payloadrun-operator render: PayloadRun "):
            current = line.split("PayloadRun ", 1)[1].split(" is refused")[0]
            found[current] = []
        elif line.startswith("  - ") and current:
            found[current].append(line[4:])
    return found


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_render_refuses_a_bad_run_with_each_errors_path_value_and_want(
    case: Case, tmp_path: Path
) -> None:
    code, stdout, stderr = render_in_process(yaml.safe_dump(case.run()), tmp_path)
    assert code == 1, stderr
    assert stdout == ""
    lines = refusal_lines(stderr)
    for expected in case.errors:
        assert_says(lines, expected)


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_the_operators_admission_refuses_it_in_the_same_words_and_never_raises(
    case: Case,
) -> None:
    body = case.run()
    meta = body["metadata"]
    body["metadata"] = {**meta, "namespace": "ml", "uid": "u"}
    verdict = admit(body, OperatorSettings())
    assert verdict.ctx is None
    for expected in case.errors:
        assert_says(verdict.errors, expected)


@pytest.mark.parametrize("case", GOOD, ids=lambda c: c.id)
def test_render_takes_what_the_api_server_takes(case: Case, tmp_path: Path) -> None:
    code, stdout, stderr = render_in_process(yaml.safe_dump(case.run()), tmp_path)
    assert code == 0, stderr
    assert [d for d in yaml.safe_load_all(stdout) if d]


def test_the_command_refuses_the_whole_table_at_once_without_a_traceback() -> None:
    """The table as one file to the real command: exit 1, no traceback, each refused run says
    its own errors under its name, and the good ones still render."""
    docs = []
    for i, case in enumerate(BAD + GOOD):
        run = case.run()
        if run["metadata"].get("name") == "bad":
            run["metadata"]["name"] = f"case-{i}"
        docs.append(run)
    result = render_command(yaml.safe_dump_all(docs))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    refused = per_run(result.stderr)
    for i, case in enumerate(BAD):
        name = f"default/case-{i}" if case.run()["metadata"]["name"] == "bad" else None
        if name is None:
            continue
        for expected in case.errors:
            assert_says(refused[name], expected)
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    owners = {c["metadata"]["ownerReferences"][0]["name"] for c in rendered if c.get("metadata")}
    assert owners == {f"case-{len(BAD) + i}" for i in range(len(GOOD))}


def test_a_valid_example_renders_exactly_as_without_the_schema_check() -> None:
    """The check only refuses: what render prints for a valid run is what the builders make
    of the file as written (no defaults or pruning leak into the output)."""
    for example in EXAMPLES:
        if example.name == "disaggregated-root-rejected.yaml":
            continue
        with_check = render_command(example.read_text())
        assert with_check.returncode == 0, (example.name, with_check.stderr)
        code = (
            "import sys\n"
            "from payloadrun_operator.api import schema_check\n"
            "schema_check.run_errors = lambda body: []\n"
            "from payloadrun_operator.__main__ import main\n"
            "sys.argv = ['payloadrun-operator', 'render', '-f', '-']\n"
            "main()\n"
        )
        without = subprocess.run(
            [sys.executable, "-c", code],
            input=example.read_text(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert without.returncode == 0, without.stderr
        assert with_check.stdout == without.stdout, example.name


def test_every_keyword_of_the_crds_schema_is_one_the_check_knows() -> None:
    crd = build_crd()
    (version,) = crd["spec"]["versions"]
    seen: set[str] = set()
    formats: set[str] = set()
    integer_formats: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        seen.update(node)
        if "format" in node:
            wanted = integer_formats if node.get("type") == "integer" else formats
            wanted.add(node["format"])
        for sub in (node.get("properties") or {}).values():
            walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])

    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    walk(spec)
    assert seen <= structural.KNOWN_KEYWORDS, seen - structural.KNOWN_KEYWORDS
    # a string format would need a check of its own (the API server validates date-time, ...)
    assert formats == set(), formats
    assert integer_formats <= structural.INTEGER_FORMATS, integer_formats


def test_the_schema_check_does_not_change_the_body_it_reads() -> None:
    body = copy.deepcopy(BASE_RUN)
    body["spec"]["trainer"]["template"] = None
    before = json.dumps(body, sort_keys=True)
    assert schema_check.run_errors(body) == []
    assert json.dumps(body, sort_keys=True) == before


def test_unreadable_documents_and_metadata_are_said_plainly(tmp_path: Path) -> None:
    run = copy.deepcopy(BASE_RUN)
    run["metadata"] = ["bad"]
    text = yaml.safe_dump_all([["a", "list"], "a string", run])
    code, _, stderr = render_in_process(text, tmp_path)
    assert code == 1, stderr
    assert "# skipped list ? from" in stderr and "(document 1): not a PayloadRun" in stderr
    assert "# skipped str ? from" in stderr
    assert (
        'metadata: Invalid value: "array": metadata in body must be of type object: "array"'
        in stderr
    )
    nameless = copy.deepcopy(BASE_RUN)
    del nameless["metadata"]
    code, _, stderr = render_in_process(yaml.safe_dump(nameless), tmp_path)
    assert code == 1
    assert "metadata.name: Required value: name or generateName is required" in stderr


def test_a_date_in_yaml_stays_a_string_as_kubectl_sends_it(tmp_path: Path) -> None:
    run = copy.deepcopy(BASE_RUN)
    run["spec"]["trainer"]["template"] = {"metadata": {"annotations": {"since": "2026-12-04"}}}
    text = yaml.safe_dump(run).replace("'2026-12-04'", "2026-12-04")
    assert "since: 2026-12-04\n" in text
    code, stdout, stderr = render_in_process(text, tmp_path)
    assert code == 0, stderr
    (job,) = [
        d
        for d in yaml.safe_load_all(stdout)
        if d and d["kind"] == "Job" and d["metadata"]["name"].endswith("trainer")
    ]
    assert job["spec"]["template"]["metadata"]["annotations"]["since"] == "2026-12-04"


# A value of another type put in each field of the examples, templates included, one at a time.
OTHER_TYPES = ["x", 2.5, True, None, ["x"], {"a": "b"}]


def every_path(node: Any, prefix: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += every_path(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += every_path(value, (*prefix, i))
    return found


@pytest.mark.parametrize("example", ["multinode-by-handle.yaml", "prime-rl.yaml"])
def test_admission_never_raises_whatever_type_a_field_is_given(example: str) -> None:
    """The operator's path: a run the API server let in under an older CRD, or any file render
    reads, is refused with words or built, never a traceback (before the schema check, a
    list where a map belongs raised AttributeError or ValueError in the builders)."""
    from payloadrun_operator.desired.builders import build_children

    docs = yaml.safe_load_all((REPO / "examples" / example).read_text())
    (run,) = [d for d in docs if d and d["kind"] == "PayloadRun"]
    run["metadata"] |= {"namespace": "ml", "uid": "u"}
    settings = OperatorSettings()
    refused = built = 0
    for path in every_path(run["spec"], ("spec",)):
        for other in OTHER_TYPES:
            body = copy.deepcopy(run)
            node = body
            for step in path[:-1]:
                node = node[step]
            node[path[-1]] = copy.deepcopy(other)
            verdict = admit(body, settings)
            if verdict.ctx is None:
                assert verdict.errors, (path, other)
                refused += 1
            else:
                assert build_children(verdict.ctx)
                built += 1
    assert refused > built > 0  # most are refused; a null or a string where either fits is not
