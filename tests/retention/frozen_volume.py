"""A real filesystem whose writes hang: a small ext4 image on a loop device, frozen at will.

``FIFREEZE`` (what ``fsfreeze -f`` does) makes the kernel block every writer of the filesystem
in ``write``, ``fdatasync``, ``unlink`` and ``rename`` until ``FITHAW``, uninterruptibly, as a
GlusterFS client whose brick stopped answering or a hard NFS mount blocks them; reads, ``stat``
and directory listings still answer. So the retention sidecar's journal append hangs in the
kernel for real, and returns (and lands) when the volume is thawed, as on a network volume that
comes back. Needs root and loop devices (``mount -o loop``); otherwise the tests skip, or fail
under ``PAYLOADRUN_REQUIRE_CLUSTER``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from payloadrun_devkit.required import skip_or_fail

# linux/fs.h: _IOWR('X', 119, int) and _IOWR('X', 120, int)
FIFREEZE = 0xC0045877
FITHAW = 0xC0045878
IMAGE_BYTES = 32 << 20


class FrozenVolume:
    """An ext4 filesystem mounted at ``path``; :meth:`freeze` and :meth:`thaw` it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.frozen = False

    def _ioctl(self, request: int) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, request, 0)
        finally:
            os.close(fd)

    def freeze(self) -> None:
        """Every write to the volume blocks from now until :meth:`thaw`."""
        self._ioctl(FIFREEZE)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            self._ioctl(FITHAW)
            self.frozen = False


@contextlib.contextmanager
def frozen_volume(base: Path) -> Iterator[FrozenVolume]:
    """A fresh volume under ``base``; thawed and unmounted at the end whatever happened."""
    if os.geteuid() != 0:
        skip_or_fail("a frozen volume needs root (mount -o loop, FIFREEZE)")
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is not installed (Debian: e2fsprogs, mount)")
    image, mnt = base / "volume.img", base / "volume"
    mnt.mkdir(parents=True)
    with open(image, "wb") as f:
        f.truncate(IMAGE_BYTES)
    made = subprocess.run(
        ["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        skip_or_fail(f"mkfs.ext4 failed: {made.stderr.strip()}")
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        skip_or_fail(f"cannot mount a loop device here: {mounted.stderr.strip()}")
    volume = FrozenVolume(mnt)
    try:
        yield volume
    finally:
        volume.thaw()
        subprocess.run(["umount", "-l", str(mnt)], check=False)
