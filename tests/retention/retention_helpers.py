"""Helpers shared by the retention tests (files on disk)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from payloadrun_devkit.required import skip_or_fail


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


@contextlib.contextmanager
def immutable(paths: list[str]):
    """``paths`` immutable (``chattr +i``: even root's unlink fails, EPERM) until the block ends
    or :func:`mutable` is called: a deletion that really fails, in the deletion worker's process
    too, where no test can inject an unlink. Skipped (failed under CI) without root or chattr."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        skip_or_fail("an immutable file needs root and chattr (e2fsprogs)")
    made = subprocess.run(["chattr", "+i", *paths], capture_output=True, text=True, check=False)
    if made.returncode:
        skip_or_fail(f"chattr +i is not supported here: {made.stderr.strip()}")
    try:
        yield
    finally:
        mutable(paths)


def mutable(paths: list[str]) -> None:
    existing_paths = [p for p in paths if Path(p).exists()]
    if existing_paths:
        subprocess.run(["chattr", "-i", *existing_paths], check=True)
