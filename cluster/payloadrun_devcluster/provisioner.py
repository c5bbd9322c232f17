"""A dynamic provisioner of ReadWriteMany volumes for the local node (one directory per claim).

Users' runs need a ReadWriteMany claim (NFS, CephFS, EFS, Filestore in real clusters). This
kernel has no NFS client, so the local node serves claims from a GlusterFS volume, provisioned
the way an external CSI provisioner does it, which is what makes the same manifests work run
after run:

- a claim of the storage class ``standard`` (the node's default class, provisioner
  ``payloadrun.dev/local-rwx``) that is not bound gets a PersistentVolume ``pvc-<claim uid>``
  pre-bound to it (``claimRef``), backed by a fresh directory ``pvc-<claim uid>`` of the volume
  (mode 0777, so non-root pods can write, as on an NFS export), made through the provisioner's
  own client mount (``--volumes-dir``). The volume's source is the node's FlexVolume driver
  (:mod:`flexvolume`): each pod mounts the directory as a client of its own. Without
  ``--gluster-volume`` the source is a ``hostPath`` of the directory instead;
- a volume of ours that is ``Released`` with reclaim policy ``Delete`` loses its directory and
  is deleted; ``Retain`` keeps both, as the policy says.

The PersistentVolume controller in kube-controller-manager does the binding. It runs as its own
process (``python -m payloadrun_devcluster.provisioner``), polling every half second; it is
standard library only, like the rest of this package.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import ssl
import sys
import time
from pathlib import Path

from .api import api_request
from .flexvolume import volume_source
from .node import PROVISIONER_NAME, STORAGE_CLASS

PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"


def volume_for_claim(
    claim: dict, volumes_dir: Path, reclaim_policy: str, gluster_volume: str | None = None
) -> dict:
    """The PersistentVolume that serves ``claim`` (pure: no I/O)."""
    meta = claim["metadata"]
    spec = claim["spec"]
    name = f"pvc-{meta['uid']}"
    if gluster_volume:
        source = {"flexVolume": volume_source(gluster_volume, name)}
    else:
        source = {"hostPath": {"path": str(volumes_dir / name), "type": "Directory"}}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {PROVISIONED_BY: PROVISIONER_NAME}},
        "spec": {
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": spec.get("accessModes") or ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": reclaim_policy,
            "storageClassName": spec.get("storageClassName") or STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            **source,
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


def claims_to_provision(claims: list[dict], classes: dict[str, dict]) -> list[dict]:
    """Pending claims that the PersistentVolume controller handed to us.

    The controller names the provisioner in an annotation only when no existing volume fits
    (a static volume pre-bound by ``claimRef`` is bound instead), as for any external
    provisioner.
    """
    wanted = []
    for claim in claims:
        spec = claim.get("spec", {})
        klass = classes.get(spec.get("storageClassName") or "")
        if klass is None or klass.get("provisioner") != PROVISIONER_NAME:
            continue
        if claim["metadata"].get("annotations", {}).get(STORAGE_PROVISIONER) != PROVISIONER_NAME:
            continue
        if spec.get("volumeName") or claim.get("status", {}).get("phase") != "Pending":
            continue
        if claim["metadata"].get("deletionTimestamp"):
            continue
        wanted.append(claim)
    return wanted


def volumes_to_delete(volumes: list[dict]) -> list[dict]:
    """Released volumes of ours whose policy says Delete."""
    return [
        pv
        for pv in volumes
        if pv["metadata"].get("annotations", {}).get(PROVISIONED_BY) == PROVISIONER_NAME
        and pv.get("status", {}).get("phase") in ("Released", "Failed")
        and pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete"
    ]


class Api:
    """The few API calls the provisioner makes, with a kubeconfig's client certificate files."""

    def __init__(self, kubeconfig: Path) -> None:
        config = json.loads(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server = cluster["server"]
        self.context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.context.load_cert_chain(user["client-certificate"], user["client-key"])

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        return api_request(self.server, self.context, method, path, body)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] provisioner: {message}", flush=True)


def reconcile_once(api: Api, volumes_dir: Path, gluster_volume: str | None = None) -> None:
    _, classes_body = api.call("GET", "/apis/storage.k8s.io/v1/storageclasses")
    classes = {c["metadata"]["name"]: c for c in classes_body.get("items", [])}
    _, claims_body = api.call("GET", "/api/v1/persistentvolumeclaims")
    for claim in claims_to_provision(claims_body.get("items", []), classes):
        klass = classes[claim["spec"]["storageClassName"]]
        policy = klass.get("reclaimPolicy", "Delete")
        volume = volume_for_claim(claim, volumes_dir, policy, gluster_volume)
        directory = volumes_dir / volume["metadata"]["name"]
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o777)
        status, body = api.call("POST", "/api/v1/persistentvolumes", volume)
        meta = claim["metadata"]
        if status == 201:
            log(f"provisioned {volume['metadata']['name']} for {meta['namespace']}/{meta['name']}")
        elif status != 409:
            log(
                f"creating {volume['metadata']['name']} failed: HTTP {status} {body.get('message')}"
            )
    _, volumes_body = api.call("GET", "/api/v1/persistentvolumes")
    for volume in volumes_to_delete(volumes_body.get("items", [])):
        name = volume["metadata"]["name"]
        if name.startswith("pvc-") and "/" not in name:  # a directory of ours, nothing else
            shutil.rmtree(volumes_dir / name, ignore_errors=True)
        status, body = api.call("DELETE", f"/api/v1/persistentvolumes/{name}")
        if status in (200, 202, 404):
            log(f"deleted {name} and its directory (claim released, policy Delete)")
        else:
            log(f"deleting {name} failed: HTTP {status} {body.get('message')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m payloadrun_devcluster.provisioner", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--volumes-dir", type=Path, required=True, help="where directories go")
    parser.add_argument(
        "--gluster-volume",
        help="the GlusterFS volume whose client --volumes-dir is: claims get the node's "
        "FlexVolume driver as their source (default: hostPath directories)",
    )
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between passes")
    args = parser.parse_args(argv)
    args.volumes_dir.mkdir(parents=True, exist_ok=True)
    api = Api(args.kubeconfig)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log(f"serving storage class {STORAGE_CLASS} from {args.volumes_dir}")
    while True:
        try:
            reconcile_once(api, args.volumes_dir.resolve(), args.gluster_volume)
        except (OSError, ValueError) as error:  # API not reachable for a moment: try again
            log(f"pass failed: {error}")
        time.sleep(args.interval)


if __name__ == "__main__":
    os.umask(0)
    sys.exit(main())
