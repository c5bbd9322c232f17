"""The `kubectl get payloadruns` transcripts of the docs show the columns the CRD prints: a
column added to the CRD (QUEUE) and missing from a page's example misleads whoever reads the page
beside their own terminal."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "payloadrun.dev_payloadruns.yaml"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
GET = re.compile(r"^\$ kubectl get payloadruns?\b(?P<args>.*)$")


def printed_columns(wide: bool) -> list[str]:
    """kubectl's header for a PayloadRun: NAME, the printer columns (priority 1 only with
    ``-o wide``), AGE (the server's own last column) unless the CRD names one."""
    (version,) = yaml.load(CRD.read_text(), Loader=yaml.CSafeLoader)["spec"]["versions"]
    columns = [
        c["name"].upper()
        for c in version["additionalPrinterColumns"]
        if wide or c.get("priority", 0) == 0
    ]
    return ["NAME", *columns]


def transcripts() -> list[tuple[str, bool, list[str]]]:
    """Every header printed after a `$ kubectl get payloadrun(s)` line that prints a table."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for n, line in enumerate(lines[:-1]):
            if (m := GET.match(line)) and " -o " not in m["args"].replace("-o wide", ""):
                header = lines[n + 1]
                if header.startswith("NAME "):
                    cells = re.split(r" {2,}", header.strip())
                    found.append((f"{page.name}:{n + 2}", "-o wide" in m["args"], cells))
    return found


def test_the_docs_show_a_transcript_to_check():
    assert sum(wide for _, wide, _ in transcripts()) >= 3


def test_every_transcripts_header_is_the_crds_columns():
    for where, wide, cells in transcripts():
        want = printed_columns(wide)
        if cells[-1] == "...":  # a header cut short on purpose
            assert cells[:-1] == want[: len(cells) - 1], where
        else:
            assert cells == want, f"{where}: {cells}, the CRD prints {want}"
