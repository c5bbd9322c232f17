"""The data plane's vocabulary (payloadrun.reasons) is what the docs, the alert rules and the
dashboards name: each lists exactly the enum's values, and no page names a value outside it.

A value is protocol (the ``X-Payloadrun-Fallback`` header, the metrics' labels the alert rules
select on, the journal's field): a member added, renamed or dropped fails here until every
place that lists them says the same.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from payloadrun.reasons import (
    ANSWER_FALLBACKS,
    VOLUME_FALLBACKS,
    DeleteError,
    Deletion,
    Fallback,
    Refusal,
    WriteFailure,
)

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
RULES = REPO / "charts" / "payloadrun" / "alerts" / "payloadrun.rules.yaml"
DASHBOARDS = REPO / "charts" / "payloadrun" / "dashboards"
LABEL = re.compile(r"[a-z][a-z_]*")
CODE = re.compile(r"`([a-z][a-z_]*)`")


def values(enum) -> set[str]:
    return {member.value for member in enum}


def names(text: str) -> set[str]:
    """The bare lowercase names in ``text``, as a comma-separated list writes them."""
    return set(LABEL.findall(text))


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_after(text: str, heading: str) -> list[list[str]]:
    """The body rows of the first Markdown table after ``heading``."""
    blocks = text[text.index(heading) :].split("\n\n")
    table = next(b for b in blocks if b.lstrip().startswith("|"))
    return [cells(line) for line in table.strip().splitlines()[2:]]


def row(text: str, first_cell: str) -> list[str]:
    """The cells of the Markdown table row whose first cell is ``first_cell``."""
    found = [cells(line) for line in text.splitlines() if line.startswith("|")]
    (match,) = [r for r in found if r[0] == first_cell] or [None]
    assert match is not None, f"no table row {first_cell!r}"
    return match


def paragraph(text: str, heading: str) -> str:
    """The first paragraph after ``heading``."""
    after = text[text.index(heading) + len(heading) :].strip()
    return after.split("\n\n", 1)[0]


def selected(expr: str, metric: str, label: str) -> set[str]:
    """The values a PromQL selector of ``metric`` matches on ``label`` (``=`` or ``=~"a|b"``)."""
    found = set()
    for match in re.finditer(re.escape(metric) + r"\{([^}]*)\}", expr):
        for op, value in re.findall(label + r'\s*(=~?)\s*"([^"]*)"', match.group(1)):
            found |= set(value.split("|")) if op == "=~" else {value}
    return found


def pages() -> dict[str, str]:
    """Every page and chart file that may name a reason, by its path in the repository."""
    files = [*DOCS.glob("*.md"), RULES, *DASHBOARDS.glob("*.json"), REPO / "README.md"]
    files += [*(REPO / "tests" / "alerts").glob("*.yaml")]
    return {str(p.relative_to(REPO)): p.read_text() for p in sorted(files)}


def test_the_shared_values_agree():
    """A write failure is a fallback (the writer's answer goes inline) and a delete error (an
    unlink fails the same ways) under the same name; the alert rules' two families cover every
    fallback once."""
    assert values(WriteFailure) <= values(Fallback)
    assert values(WriteFailure) <= values(DeleteError)
    assert {Fallback.of(f) for f in WriteFailure} <= VOLUME_FALLBACKS
    assert {DeleteError.of(f).value for f in WriteFailure} == values(WriteFailure)
    assert set(Fallback) == VOLUME_FALLBACKS | ANSWER_FALLBACKS
    assert not VOLUME_FALLBACKS & ANSWER_FALLBACKS
    for enum in (WriteFailure, Fallback, Deletion, DeleteError, Refusal):
        for member in enum:
            assert LABEL.fullmatch(member.value), member  # a bounded, quotable label value
            assert str(member) == f"{member}" == member.value  # what %s and f-strings write


# The values released in 0.1.0 (dashboards, alert rules and journals in the field name them):
# a member may be added, never renamed or removed.
RELEASED = {
    WriteFailure: {"no_space", "permission", "volume_gone", "io_error"},
    Fallback: {
        *("no_space", "permission", "volume_gone", "io_error", "write_timeout", "breaker_open"),
        *("write_threads_full", "bad_payload", "bad_response", "content_encoding"),
    },
    Deletion: {"consumed", "discarded", "backstop", "wipe"},
    DeleteError: {
        *("no_space", "permission", "volume_gone", "io_error", "not_a_directory"),
        *("is_a_directory", "worker_gone"),
    },
    Refusal: {"bad_request", "discard_conflict"},
}


@pytest.mark.parametrize("enum", list(RELEASED), ids=lambda e: e.__name__)
def test_no_released_value_changes(enum):
    assert RELEASED[enum] <= values(enum)


def test_the_vocabulary_imports_only_the_standard_library():
    """The deletion worker process and anything that only names a reason import it: no arrays,
    no HTTP server, no metrics library, no torch, no operator."""
    heavy = ("numpy", "torch", "aiohttp", "prometheus_client", "payloadrun_operator")
    probe = (
        "import sys, payloadrun.reasons, payloadrun.failures\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert ast.literal_eval(out.stdout.strip()) == []


def test_the_writer_page_lists_every_fallback():
    text = (DOCS / "writer.md").read_text()
    table = table_after(text, "Fallback reasons (`X-Payloadrun-Fallback`")
    listed = [CODE.fullmatch(reason).group(1) for reason, _ in table]
    assert listed == [f.value for f in Fallback]  # the enum's order: the volume's, then vLLM's
    assert names(row(text, "`payloadrun_writer_fallbacks_total`")[1]) - {"reason"} == values(
        Fallback
    )


def test_the_metrics_reference_lists_every_value():
    text = (DOCS / "metrics.md").read_text()

    def listed(metric: str) -> set[str]:
        return set(CODE.findall(row(text, f"`{metric}`")[3]))

    assert listed("payloadrun_writer_fallbacks_total") == values(Fallback)
    assert listed("payloadrun_retention_deleted_files_total") == values(Deletion)
    assert listed("payloadrun_retention_journal_errors_total") == values(WriteFailure)
    assert listed("payloadrun_retention_refused_requests_total") == values(Refusal)


def test_the_retention_page_lists_every_value():
    text = (DOCS / "retention.md").read_text()
    labels = paragraph(text, "## Metrics")

    def label_values(label: str) -> set[str]:
        listed = labels[labels.index(f"`{label}` (") + len(label) + 4 :]
        return set(CODE.findall(listed[: listed.index(")")]))

    assert label_values("reason") == values(Deletion)
    assert label_values("error") == values(DeleteError)
    journal = row(text, "`journal_errors_total{error}`")[2]  # "... `error` is `no_space`, ..."
    assert set(CODE.findall(journal)) - {"error"} == values(WriteFailure)
    assert set(CODE.findall(row(text, "`refused_requests_total{reason}`")[2])) == values(Refusal)


def test_the_alert_rules_split_the_fallbacks_as_the_vocabulary_does():
    rules = {
        rule["alert"]: rule
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    metric, label = "payloadrun_writer_fallbacks_total", "reason"
    volume = rules["PayloadrunWriterVolumeFallbacks"]
    assert selected(volume["expr"], metric, label) == values(VOLUME_FALLBACKS)
    answer = rules["PayloadrunWriterPayloadFallbacks"]
    assert selected(answer["expr"], metric, label) == values(ANSWER_FALLBACKS)
    # the description says what each volume reason means; io_error is its {{ else }}
    explained = set(
        re.findall(r'eq \$labels\.reason "([^"]*)"', volume["annotations"]["description"])
    )
    assert explained | {Fallback.IO_ERROR.value} == values(VOLUME_FALLBACKS)


def test_the_runbooks_list_each_family():
    text = (DOCS / "operations.md").read_text()
    volume = paragraph(text, "### PayloadrunWriterVolumeFallbacks")
    assert set(CODE.findall(volume)) - {"reason"} == values(VOLUME_FALLBACKS)
    answer = text[text.index("### PayloadrunWriterPayloadFallbacks") :]
    query = answer[answer.index("```promql") : answer.index("```", answer.index("```promql") + 3)]
    assert selected(query, "payloadrun_writer_fallbacks_total", "reason") == values(
        ANSWER_FALLBACKS
    )
    journal = paragraph(text, "### PayloadrunRetentionJournalFailing")
    assert set(CODE.findall(journal)) - {"error"} == values(WriteFailure)


def test_the_retention_dashboard_explains_every_deletion_reason():
    panel = row((DOCS / "dashboards.md").read_text(), "Files deleted per second, by reason")
    explained = set(re.findall(r"([a-z_]+):", panel[2]))
    assert explained == values(Deletion)


# (metric, label, its vocabulary): every selector on these, anywhere, names only its values
SELECTORS = [
    ("payloadrun_writer_fallbacks_total", "reason", Fallback),
    ("payloadrun_retention_deleted_files_total", "reason", Deletion),
    ("payloadrun_retention_deleted_bytes_total", "reason", Deletion),
    ("payloadrun_retention_delete_errors_total", "error", DeleteError),
    ("payloadrun_retention_journal_errors_total", "error", WriteFailure),
    ("payloadrun_retention_refused_requests_total", "reason", Refusal),
    ("fallbacks_total", "reason", Fallback),  # docs/writer.md writes the short form too
    ("deleted_files_total", "reason", Deletion),
    ("delete_errors_total", "error", DeleteError),
    ("journal_errors_total", "error", WriteFailure),
]


@pytest.mark.parametrize(
    ("metric", "label", "enum"), SELECTORS, ids=[f"{m}-{label}" for m, label, _ in SELECTORS]
)
def test_no_page_selects_a_value_outside_the_vocabulary(metric, label, enum):
    outside = {
        (path, value)
        for path, text in pages().items()
        for value in selected(text.replace('\\"', '"'), metric, label)
        if value not in values(enum) and not value.startswith("$")  # a template variable
    }
    assert outside == set()


def test_no_page_shows_a_fallback_header_outside_the_vocabulary():
    shown = {
        (path, value)
        for path, text in pages().items()
        for value in re.findall(r"X-Payloadrun-Fallback:\s*([a-z_]+)", text)
    }
    assert shown, "the pages show the header with a value somewhere"
    assert {(path, v) for path, v in shown if v not in values(Fallback)} == set()
