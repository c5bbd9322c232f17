"""CHANGELOG.md: every version with its upgrade notes, the package's version among them, and the
docs that name versions rather than history (issue 34: "since pod templates" where every run is
0.1.0's)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from payloadrun_devkit.release import release_version

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


def released_sections() -> dict[str, str]:
    """Every version's section with changes in it: an [Unreleased] just opened after a release
    says only what it will be released as."""
    return {
        version: body
        for version, body in sections().items()
        if version != "Unreleased" or body.strip().count("\n") > 0
    }


def test_every_version_has_its_changes_and_upgrade_notes():
    for version, body in released_sections().items():
        assert "### Upgrading" in body, f"{version} has no upgrade notes"
        assert re.search(r"^### (Added|Changed|Fixed|Removed|Deprecated|Security)$", body, re.M)
        assert f"\n[{version}]: " in CHANGELOG.read_text(), f"no link for [{version}]"


def test_the_package_version_is_the_changelogs_newest():
    """A release's version has the newest section; a development version (0.2.0-dev.0) is
    what [Unreleased], the newest, says it will be released as, with no section of its own."""
    version = release_version(REPO)
    versions = list(sections())
    if "-dev." in version:
        released = version.split("-")[0]
        assert versions[0] == "Unreleased", f"{version} is unreleased: open [Unreleased]"
        assert released not in versions, f"{released} has a section: bump pyproject.toml to it"
        assert f"To be released as {released}," in sections()["Unreleased"]
    else:
        assert versions[0] == version, f"give {version} the newest section"


def upgrade_notes(markdown: str) -> list[str]:
    """The bullets of a list (what precedes the first is not one), each on one line, links
    relative to docs/ as from the repository."""
    bullets = re.split(r"^- ", markdown.strip(), flags=re.M)[1:]
    return [" ".join(b.replace("](docs/", "](").split()) for b in bullets]


def test_operations_repeats_every_versions_upgrade_notes():
    """docs/operations.md#upgrades is where an operator reads what an upgrade asks of them:
    each version's notes there are the CHANGELOG's, none left out or reworded apart."""
    operations = (REPO / "docs" / "operations.md").read_text()
    upgrades = operations[operations.index("## Upgrades\n") : operations.index("\n## Logs\n")]
    headings = list(re.finditer(r"^### (\S+)", upgrades, re.M))
    in_operations = {
        m[1]: upgrades[m.end() : headings[i + 1].start() if i + 1 < len(headings) else None]
        for i, m in enumerate(headings)
    }
    released_next = release_version(REPO).split("-")[0]
    for version, body in released_sections().items():
        name = released_next if version == "Unreleased" else version
        assert name in in_operations, f"docs/operations.md has no '### {name}' under Upgrades"
        notes = body[body.index("### Upgrading\n") + len("### Upgrading\n") :]
        notes = notes.split("\n[Unreleased]: ")[0]
        assert upgrade_notes(in_operations[name]) == upgrade_notes(notes), (
            f"docs/operations.md's {name} notes are not CHANGELOG.md's {version} notes"
        )


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


def test_building_the_previous_releases_images_from_a_shallow_clone_says_what_brings_it(tmp_path):
    """make test's prepare builds the release CHANGELOG.md names from this clone's history
    (``python -m payloadrun_devkit.previous``); a clone without that history gets the command
    that fetches it, not a traceback."""
    shallow = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "--quiet", "--depth", "1", f"file://{REPO}", str(shallow)],
        check=True,
        timeout=120,
    )
    result = subprocess.run(
        [sys.executable, "-m", "payloadrun_devkit.previous", "--repo", str(shallow)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert f"is not in {shallow}" in result.stderr
    assert "git fetch --unshallow --tags" in result.stderr
