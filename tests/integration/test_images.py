"""The image tarballs of ``hack/images.sh`` import into containerd, as a real node's would.

The script caches the tarballs by the content of their inputs, so on an unchanged checkout this
costs the import alone (about 10 s); the first run on a machine builds the images (minutes).
The check runs against a throwaway containerd on a private socket, root and state under a
temporary directory: the node's own containerd, if any, is not touched. It needs root and
Debian's containerd (``containerd`` and ``ctr``), and is skipped without them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from payloadrun_devkit.images import build_images
from payloadrun_devkit.required import skip_or_fail

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {"payloadrun:e2e", "payloadrun-operator:e2e"}
# containerd plugins that would write outside the temporary root (opt: /opt/containerd) or are
# not wanted here (cri: the kubelet's API, with its CNI and sandbox image)
DISABLED = [
    "io.containerd.grpc.v1.cri",
    "io.containerd.internal.v1.opt",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.tracing.processor.v1.otlp",
]


def _need_containerd() -> None:
    if os.geteuid() != 0:
        skip_or_fail("needs root (buildah and a throwaway containerd)")
    missing = [name for name in ("containerd", "ctr") if shutil.which(name) is None]
    if missing:
        skip_or_fail(f"{' and '.join(missing)} not installed (Debian: apt-get install containerd)")


@pytest.mark.timeout(1800)  # the first run on a machine builds the images
def test_image_tarballs_import_into_containerd() -> None:
    _need_containerd()
    images = build_images(REPO, timeout=1700)
    assert set(images) == EXPECTED, images
    for tarball in images.values():
        assert tarball.is_file(), tarball

    # a short path: the socket's must fit in sun_path (108 bytes)
    tmp = Path(tempfile.mkdtemp(prefix="payloadrun-ctr-", dir="/tmp"))
    sock = tmp / "containerd.sock"
    config = tmp / "config.toml"
    # JSON strings and arrays are TOML too
    config.write_text(
        "version = 2\n"
        f"root = {json.dumps(str(tmp / 'root'))}\n"
        f"state = {json.dumps(str(tmp / 'state'))}\n"
        f"disabled_plugins = {json.dumps(DISABLED)}\n"
        f"[grpc]\n  address = {json.dumps(str(sock))}\n"
        f"[ttrpc]\n  address = {json.dumps(f'{sock}.ttrpc')}\n"
    )
    log = (tmp / "containerd.log").open("w")
    daemon = subprocess.Popen(
        ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert daemon.poll() is None, (tmp / "containerd.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "containerd did not open its socket in 30 s"
            time.sleep(0.1)
        ctr = ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
        for name, tarball in images.items():
            done = subprocess.run(
                [*ctr, "images", "import", tarball],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, f"importing {name}: {done.stderr}"
        listed = subprocess.run(
            [*ctr, "images", "ls", "--quiet"], capture_output=True, text=True, check=True
        ).stdout.split()
        # what a pod's `image: payloadrun:e2e` resolves to
        for name in EXPECTED:
            assert f"docker.io/library/{name}" in listed, listed
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
