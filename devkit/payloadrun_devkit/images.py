"""The project's container images for the end-to-end tests, benchmarks and the demo.

They come from ``hack/images.sh`` of a checkout (never from a wheel: the script is the
repository's). It builds them from the project's Dockerfiles (no Docker, no registry), caches
them by content, and prints one ``<image> <docker-archive tarball>`` line per image.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path


def build_images(
    repo: Path, timeout: float = 1800, env: Mapping[str, str] | None = None
) -> dict[str, Path]:
    """Image name -> tarball, built (or found cached) by ``<repo>/hack/images.sh``, with ``env``
    added to this process's environment (``PAYLOADRUN_IMAGE_TAG``, ``PAYLOADRUN_CACHE``).

    The script's progress goes to this process's stderr; a failure raises with its exit code.
    """
    result = subprocess.run(
        ["bash", str(repo / "hack" / "images.sh")],
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if result.returncode != 0:
        raise RuntimeError(f"hack/images.sh failed with exit code {result.returncode} (see above)")
    lines = (line.split(maxsplit=1) for line in result.stdout.splitlines() if line.strip())
    return {name: Path(path) for name, path in lines}
