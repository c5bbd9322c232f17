"""The conditions' vocabulary (payloadrun_operator.api.conditions): the only types and reasons the
operator sets, and the docs list exactly these (issue 34: the reference lacked
Applied/ApplyFailed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from payloadrun_operator.api.conditions import (
    MEANINGS,
    REASONS,
    TRUE_REASONS,
    ConditionType,
    ReadyReason,
    ValidatedReason,
)
from payloadrun_operator.api.models import REASON_PATTERN
from payloadrun_operator.observed.status import Check, set_condition

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "operator" / "payloadrun_operator"
CODE = re.compile(r"`([A-Za-z]+)`")


def vocabulary() -> dict[str, tuple[set[str], set[str]]]:
    """Condition type -> (its reasons with True, its reasons with False)."""
    return {
        str(ctype): (
            {str(r) for r in REASONS[ctype] if r in TRUE_REASONS},
            {str(r) for r in REASONS[ctype] if r not in TRUE_REASONS},
        )
        for ctype in ConditionType
    }


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading`` (a Markdown table, header row dropped)."""
    section = text[text.index(heading) :]
    rows = []
    for line in section.splitlines():
        if line.strip().startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def test_every_type_has_a_meaning_and_reasons_the_api_server_accepts():
    assert set(MEANINGS) == set(ConditionType) == set(REASONS)
    for ctype, reasons in REASONS.items():
        assert list(reasons), ctype
        for reason in reasons:
            assert re.fullmatch(REASON_PATTERN, reason), reason
    assert {str(r) for r in TRUE_REASONS} <= {str(r) for rs in REASONS.values() for r in rs}
    # TRUE_REASONS holds values (StrEnum members equal their strings): a reason spelt alike in
    # two types must go with the same status in both
    by_value: dict[str, set[bool]] = {}
    for reasons in REASONS.values():
        for reason in reasons:
            by_value.setdefault(str(reason), set()).add(reason in TRUE_REASONS)
    assert all(len(statuses) == 1 for statuses in by_value.values()), by_value


def test_the_reference_lists_every_condition_and_reason():
    rows = table_rows((REPO / "docs" / "payloadrun-reference.md").read_text(), "## Conditions")
    listed = {
        CODE.search(ctype).group(1): (set(CODE.findall(true)), set(CODE.findall(false)))
        for ctype, _, true, false in rows
    }
    assert listed == vocabulary()
    applied = ({"ChildrenApplied"}, {"ApplyFailed", "LeaderWorkerSetMissing", "KueueMissing"})
    assert {"Applied": applied}.items() <= listed.items()


def test_the_operator_page_lists_every_condition_and_reason():
    text = (REPO / "docs" / "operator.md").read_text()
    rows = table_rows(text, "| condition | `True` when | reasons |")
    listed = {
        CODE.search(ctype).group(1): set(CODE.findall(reasons)) - {"True", "False"}
        for ctype, _, reasons in rows
    }
    assert listed == {ctype: true | false for ctype, (true, false) in vocabulary().items()}


def test_a_type_reason_or_status_outside_the_vocabulary_is_refused():
    ok = Check(True, ValidatedReason.SPEC_VALID, "m")
    with pytest.raises(ValueError, match="not a ConditionType"):
        set_condition([], "Validated", ok, generation=1, now="t")
    with pytest.raises(ValueError, match="Ready has no reason 'SpecValid'"):
        set_condition([], ConditionType.READY, ok, generation=1, now="t")
    with pytest.raises(ValueError, match="Ready has no reason 'Waiting'"):
        set_condition([], ConditionType.READY, Check(False, "Waiting", "m"), generation=1, now="t")
    with pytest.raises(ValueError, match="goes with status False, not True"):
        ready = Check(True, ReadyReason.WORKLOADS_NOT_READY, "m")
        set_condition([], ConditionType.READY, ready, generation=1, now="t")


def literal_reasons(source: str, filename: str) -> list[str]:
    """Every ``Check(...)`` whose reason is written as a string (a literal or an f-string)
    rather than taken from the vocabulary, as ``file:line``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Check"):
            continue
        reason = node.args[1] if len(node.args) > 1 else None
        reason = next((k.value for k in node.keywords if k.arg == "reason"), reason)
        if isinstance(reason, ast.Constant | ast.JoinedStr | ast.BinOp):
            found.append(f"{filename}:{node.lineno}")
    return found


def test_the_operator_writes_no_reason_outside_the_vocabulary():
    """set_condition refuses one at run time; this finds it before anything runs."""
    found = [
        hit
        for path in sorted(OPERATOR.glob("*.py"))
        for hit in literal_reasons(path.read_text(), path.name)
    ]
    assert found == [], f"condition reasons written as strings (use status.*Reason): {found}"
    assert literal_reasons('Check(False, "Waiting", "m")\nCheck(True, f"C{x}", "m")', "t.py") == [
        "t.py:1",
        "t.py:2",
    ]
