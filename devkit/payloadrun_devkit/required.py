"""What the tests need from the machine: skipped when it is missing, unless CI requires it.

``make test`` installs everything the tests use (the control plane, helm, Prometheus and
promtool, the dashboard schema check) and sets ``PAYLOADRUN_REQUIRE_CLUSTER``: then a missing
piece is a failure, never a silent skip. Without it (a developer's ``pytest``), the tests that
need the piece skip and say what installs it.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE_ENV = "PAYLOADRUN_REQUIRE_CLUSTER"


def required() -> bool:
    """Whether everything must run (CI sets ``PAYLOADRUN_REQUIRE_CLUSTER``)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it when everything must run."""
    if required():
        pytest.fail(f"{REQUIRE_ENV} is set and {reason}", pytrace=False)
    pytest.skip(f"{reason} (set {REQUIRE_ENV}=1 to make this a failure)")


def tool(name: str, hint: str) -> str:
    """The path of command ``name`` on PATH; else skip (or fail), saying ``hint``."""
    found = shutil.which(name)
    if found:
        return found
    skip_or_fail(f"{name} is not installed ({hint})")
