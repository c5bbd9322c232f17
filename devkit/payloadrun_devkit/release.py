"""The release's version as the checkout writes it: ``pyproject.toml``'s ``[project] version``,
which is both images' tag and the chart's ``version`` and ``appVersion`` (the installed wheel's
metadata holds its PEP 440 normal form instead: ``payloadrun.version``)."""

from __future__ import annotations

import tomllib
from pathlib import Path


def release_version(repo: Path) -> str:
    """The version written in ``repo``'s ``pyproject.toml`` (``0.2.0-dev.0``)."""
    with (repo / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["version"]
