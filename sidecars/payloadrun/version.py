"""The version of this build, read once from the installed distribution's metadata.

``pyproject.toml`` is the one place a version is written; every process (``payloadrun``,
``payloadrun-operator``), the ``--version`` flags, the default sidecar image tag and the
``payloadrun_build_info`` metric read it from here. A checkout run without being installed has no
metadata: its version is ``unknown`` rather than a number that may be wrong.
"""

from __future__ import annotations

import argparse
from importlib import metadata

DISTRIBUTION = "payloadrun"


def _installed_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


__version__ = _installed_version()


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``<prog> <version>`` and exit, as ``payloadrun-operator`` does."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
