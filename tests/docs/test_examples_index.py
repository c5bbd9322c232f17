"""examples/README.md names every file of examples/, and every file it links to exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
INDEX = EXAMPLES / "README.md"
ROW = re.compile(r"^\| \[([^\]]+)\]\(([^)]+)\) \|", re.M)
LINK = re.compile(r"\]\(([^)#]+)(?:#[^)]*)?\)")


def test_every_example_file_has_a_row_of_the_index():
    rows = {name: target for name, target in ROW.findall(INDEX.read_text())}
    files = {p.name for p in EXAMPLES.iterdir() if p.is_file() and p.name != "README.md"}
    assert sorted(files - rows.keys()) == [], "examples missing from examples/README.md"
    assert sorted(rows.keys() - files) == [], "rows of examples/README.md naming no file"
    assert all(rows[name] == name for name in rows), rows


def test_the_index_links_to_files_that_exist():
    for target in LINK.findall(INDEX.read_text()):
        if "://" not in target:
            assert (EXAMPLES / target).resolve().exists(), target


COUNTS = {
    "inference replicas": ("inference", "replicas"),
    "trainer ranks": ("trainer", "replicas"),
}


def test_the_counts_a_row_gives_are_its_files():
    """A row that says 4 inference replicas of a file that runs 2 sizes a reader's cluster wrong."""
    import yaml

    checked = 0
    for line in INDEX.read_text().splitlines():
        if not (row := ROW.match(line)) or not row[2].endswith(".yaml"):
            continue
        docs = yaml.safe_load_all((EXAMPLES / row[2]).read_text())
        runs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "PayloadRun"]
        if len(runs) != 1:
            continue
        spec = runs[0]["spec"]
        for words, (role, field) in COUNTS.items():
            for said in re.findall(rf"\b(\d+) {words}\b", line):
                assert int(said) == spec[role][field], f"{row[1]}: {said} {words}"
                checked += 1
    assert checked >= 2
