"""Real small file systems for the tests' disk-full and read-only cases (a tmpfs of a few KiB).

A real ``ENOSPC`` or ``EROFS`` comes from the kernel, at whatever call meets it, for every thread
of the process; a patched ``os.write`` fails one call, process-wide, whoever makes it. Mounting
needs root and mount rights: without them the test skips, or fails when
``PAYLOADRUN_REQUIRE_CLUSTER`` is set (``make test``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from payloadrun_devkit.required import skip_or_fail


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on ``path`` (made if missing) with ``options`` (``size=64k``, ``ro``...),
    unmounted afterwards; skips (or fails, see the module) when it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        skip_or_fail(
            f"cannot mount a tmpfs ({options}) on {path} (needs root and mount rights): "
            f"{mounted.stderr.strip()}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(directory: Path, leave: int = 0) -> None:
    """Fill the file system of ``directory`` with one file until at most ``leave`` bytes are
    free (a tmpfs counts in pages: what is left may be less)."""
    free = os.statvfs(directory)
    room = free.f_bavail * free.f_frsize - leave
    if room > 0:
        # unbuffered: nothing left to flush at close; full before ``room`` is full all the same
        with open(directory / ".filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
            f.write(b"\0" * room)
