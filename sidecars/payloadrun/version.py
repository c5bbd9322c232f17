"""The version of this build, read once from the installed distribution's metadata.

``pyproject.toml`` is the one place a version is written; every process (``payloadrun``,
``payloadrun-operator``), the ``--version`` flags, the default sidecar image tag and the
``payloadrun_build_info`` metric read it from here. A checkout run without being installed has no
metadata: its version is ``unknown`` rather than a number that may be wrong.

The version is written in the one form every artifact takes: ``MAJOR.MINOR.PATCH`` for a release,
``MAJOR.MINOR.PATCH-(dev|alpha|beta|rc).N`` before it (``0.2.0-dev.0``: SemVer, which Helm's chart
versions and OCI tags accept; Helm refuses PEP 440's ``0.2.0.dev0``). The wheel's metadata holds
PEP 440's normal form of it (``0.2.0.dev0``): ``__version__`` is that form, ``__release__`` the
written one, the images' tag.
"""

from __future__ import annotations

import argparse
import re
from importlib import metadata

DISTRIBUTION = "payloadrun"
RELEASE_FORM = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:-(dev|alpha|beta|rc)\.(\d+))?")
_PYTHON_FORM = re.compile(r"(\d+\.\d+\.\d+)(?:(\.dev|a|b|rc)(\d+))?")
# SemVer's pre-release label and PEP 440's spelling of it
_PRE = {"dev": ".dev", "alpha": "a", "beta": "b", "rc": "rc"}


def python_version(release: str) -> str:
    """PEP 440's normal form of a written version: ``0.2.0-dev.0`` is ``0.2.0.dev0``."""
    if not (m := RELEASE_FORM.fullmatch(release)):
        raise ValueError(
            f"version {release!r} is not MAJOR.MINOR.PATCH or MAJOR.MINOR.PATCH-LABEL.N with "
            f"LABEL one of {', '.join(_PRE)} (e.g. 0.2.0 or 0.2.0-dev.0)"
        )
    major, minor, patch, label, number = m.groups()
    return f"{major}.{minor}.{patch}" + (f"{_PRE[label]}{number}" if label else "")


def release_version(python: str) -> str:
    """The written form of a PEP 440 version this project uses: ``0.2.0.dev0`` is
    ``0.2.0-dev.0``; anything else (``unknown``, a local build) comes back as it is."""
    if not (m := _PYTHON_FORM.fullmatch(python)):
        return python
    base, pre, number = m.groups()
    labels = {spelling: label for label, spelling in _PRE.items()}
    return base + (f"-{labels[pre]}.{number}" if pre else "")


def _installed_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


__version__ = _installed_version()
__release__ = release_version(__version__)


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``<prog> <version>`` and exit, as ``payloadrun-operator`` does."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
