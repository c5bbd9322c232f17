"""The local node's volume driver: each pod's claim becomes a GlusterFS FUSE client of its own.

The node's ReadWriteMany class ``standard`` stores claims as directories of the node's GlusterFS
volume (:data:`~payloadrun_devcluster.glusterfs.NODE_VOLUME`); the provisioner
(:mod:`provisioner`) makes the directory and a PersistentVolume whose ``flexVolume`` source
names this driver. When a pod starts, the kubelet runs ``<driver> mount <dir> <options>``, and
the driver mounts that directory there as a new client (``glusterfs --subdir-mount``): every
pod of a run (the writer's, the orchestrator's, each trainer's) is then a separate client with
its own attribute and entry caches, as pods on separate nodes are. ``unmount`` ends it.

FlexVolume is the kubelet's exec-based volume plugin interface (deprecated upstream in favour
of CSI, still in kubelet 1.37): a CSI driver would need a node plugin served over gRPC, for no
gain on one node. The kubelet finds the driver at
``<volumePluginDir>/payloadrun.dev~glusterfs/glusterfs`` (:func:`install`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .glusterfs import RUN_DIR, GlusterError, mount_client, unmount

DRIVER = "payloadrun.dev/glusterfs"
_VENDOR_DIR = DRIVER.replace("/", "~")
_EXECUTABLE = DRIVER.split("/")[1]


def install(plugin_dir: Path) -> Path:
    """Write the driver the kubelet runs; its path. It runs this module with this Python."""
    cluster_dir = Path(__file__).resolve().parent.parent
    path = plugin_dir / _VENDOR_DIR / _EXECUTABLE
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = "import sys; from payloadrun_devcluster.flexvolume import main; sys.exit(main())"
    log = RUN_DIR / "logs" / "flexvolume.log"
    # the kubelet parses the driver's output and its errors as one JSON reply: errors to a log
    path.write_text(
        "#!/bin/sh\n"
        f'mkdir -p "{log.parent}"\n'
        f'PYTHONPATH="{cluster_dir}" exec "{sys.executable}" -c "{entry}" "$@" 2>>"{log}"\n'
    )
    path.chmod(0o755)
    return path


def volume_source(volume: str, subdir: str) -> dict:
    """A PersistentVolume's ``flexVolume`` source for directory ``subdir`` of ``volume``."""
    return {"driver": DRIVER, "options": {"volume": volume, "subdir": subdir}}


def answer(args: list[str]) -> tuple[dict, int]:
    """The driver's reply to one call of the kubelet, and its exit code."""
    if not args:
        return {"status": "Failure", "message": "no operation given"}, 1
    operation = args[0]
    if operation == "init":
        capabilities = {"attach": False, "fsGroup": False, "selinuxRelabel": False}
        return {"status": "Success", "capabilities": capabilities}, 0
    if operation == "mount" and len(args) == 3:
        try:  # read-only containers (the trainers) get a read-only bind of it from the kubelet
            options = json.loads(args[2])
            mount_client(options["volume"], Path(args[1]), subdir=options["subdir"])
        except (GlusterError, KeyError, OSError, ValueError) as error:
            return {"status": "Failure", "message": f"mounting {args[2]} at {args[1]}: {error}"}, 1
        return {"status": "Success"}, 0
    if operation == "unmount" and len(args) == 2:
        if os.path.ismount(args[1]):
            unmount(args[1])
        return {"status": "Success"}, 0
    return {"status": "Not supported", "message": f"{operation} is not supported"}, 1


def main() -> int:
    reply, code = answer(sys.argv[1:])
    print(json.dumps(reply))
    return code


if __name__ == "__main__":
    sys.exit(main())
