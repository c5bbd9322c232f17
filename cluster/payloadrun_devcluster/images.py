"""Images the node needs without a registry: the pod sandbox (pause) image, made here.

A docker-archive tarball (``manifest.json``, an image config and one layer tar) is what both
``ctr images import`` and ``docker load`` read, so a static binary becomes an image with a few
lines of standard library. The pause binary is compiled from ``pause.c`` with ``gcc -static``
and cached by the source's hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

from .binaries import cache_dir

PAUSE_SOURCE = Path(__file__).with_name("pause.c")
PAUSE_REPOSITORY = "localhost/payloadrun-pause"


class ImageError(RuntimeError):
    """An image could not be made."""


def pause_image_name() -> str:
    """The sandbox image's reference, tagged by the source's hash (a new source, a new tag)."""
    return f"{PAUSE_REPOSITORY}:{_source_key()}"


def _source_key() -> str:
    return hashlib.sha256(PAUSE_SOURCE.read_bytes()).hexdigest()[:12]


def pause_image_tarball() -> Path:
    """Build (once per source version) the pause image and return its docker-archive path."""
    directory = cache_dir() / "images"
    tarball = directory / f"payloadrun-pause-{_source_key()}.tar"
    if tarball.is_file():
        return tarball
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise ImageError("no C compiler (gcc) on PATH: it builds the node's pause image")
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / f"pause-{_source_key()}"
    result = subprocess.run(
        [gcc, "-static", "-Os", "-s", "-o", str(binary), str(PAUSE_SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ImageError(
            f"gcc -static failed for {PAUSE_SOURCE} (Debian: apt-get install libc6-dev):\n"
            + result.stderr
        )
    write_single_binary_image(binary, "/pause", pause_image_name(), tarball)
    binary.unlink()
    return tarball


def write_single_binary_image(
    binary: Path, path_in_image: str, name: str, out: Path, user: str = "65535:65535"
) -> None:
    """A one-layer docker-archive holding ``binary`` at ``path_in_image`` as its entry point,
    run as ``user`` (``uid:gid``) unless a pod says otherwise."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tar.gettarinfo(str(binary), arcname=path_in_image.lstrip("/"))
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        info.mode = 0o755
        with binary.open("rb") as f:
            tar.addfile(info, f)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [path_in_image], "User": user},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": f"payloadrun_devcluster: {binary.name}"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}]
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, mode="w") as archive:
        for member, data in (
            (config_name, config_bytes),
            (layer_name, layer_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    tmp.replace(out)
