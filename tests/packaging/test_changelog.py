"""CHANGELOG.md: every version with its upgrade notes, the package's version among them, and the
docs that name versions rather than history (issue 34: "since pod templates" where every run is
0.1.0's)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "CHANGELOG.md"
HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\]", re.MULTILINE)
# Upgrade notes by history: a reader cannot tell which version "before pod templates" was.
HISTORY = re.compile(
    r"(since|before) (pod templates|issue \d+)|as before issue|earlier (builds|versions)"
    r"|in this release|older (builds|versions|operators?)",
    re.IGNORECASE,
)
# The pages that give upgrade notes and defaults. docs/operations.md and README.md belong to other
# work of issue 34 this round: add them here once their notes name versions too.
VERSIONED = [
    "CHANGELOG.md",
    "README.md",
    "docs/operations.md",
    "docs/install.md",
    "docs/integration.md",
    "docs/operator.md",
    "docs/writer.md",
    "docs/retention.md",
    "docs/payloadrun-reference.md",
    "charts/payloadrun/values.yaml",
]


def sections() -> dict[str, str]:
    text = CHANGELOG.read_text()
    found = list(HEADING.finditer(text))
    return {
        m["version"]: text[m.end() : (found[i + 1].start() if i + 1 < len(found) else len(text))]
        for i, m in enumerate(found)
    }


def test_every_version_has_its_changes_and_upgrade_notes():
    versions = sections()
    assert next(iter(versions)) == "Unreleased"
    for version, body in versions.items():
        assert "### Upgrading" in body, f"{version} has no upgrade notes"
        assert re.search(r"^### (Added|Changed|Fixed|Removed|Deprecated|Security)$", body, re.M)
        assert f"\n[{version}]: " in CHANGELOG.read_text(), f"no link for [{version}]"


def test_the_package_version_is_released_in_the_changelog():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert version in sections(), f"pyproject.toml says {version}: give it a section"


@pytest.mark.parametrize("page", VERSIONED)
def test_upgrade_notes_name_versions_not_history(page):
    found = [
        f"{page}:{n}: {line.strip()}"
        for n, line in enumerate((REPO / page).read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert found == [], "say which version (0.1.0, a development build before it): " + str(found)


def test_the_history_pattern_catches_what_it_is_for():
    for phrase in ("Since pod templates: a run", "as before issue 33", "Earlier builds used"):
        assert HISTORY.search(phrase)
    assert not HISTORY.search("a development build before 0.1.0")
