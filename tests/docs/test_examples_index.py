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
