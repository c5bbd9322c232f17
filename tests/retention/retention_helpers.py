"""Helpers shared by the retention tests (files on disk)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path


def make_files(root: Path, version: int, n: int, size: int = 100) -> list[str]:
    """``n`` files of ``size`` bytes in ``root/v<version>``; absolute paths, as prime-rl sends."""
    d = root / f"v{version}"
    d.mkdir(exist_ok=True)
    out = []
    data = b"x" * size
    for _ in range(n):
        path = d / f"{uuid.uuid4().hex}.bin"
        path.write_bytes(data)
        out.append(str(path))
    return out


def existing(files: list[str]) -> list[str]:
    return [f for f in files if Path(f).exists()]


def wait_for(predicate, timeout: float = 20.0):
    """Poll ``predicate`` until it returns something true, and return that; fail on timeout."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
    return value
