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
process (``python -m payloadrun_devcluster.provisioner``), standard library only like the rest of
this package. A pass lists the classes, claims and volumes and acts on them; one runs when a watch
on claims or on volumes reports a change (:class:`Wakeups`), and every ``--resync`` seconds
whatever happens (a class created after its claim, a watch that failed unnoticed). It polled every
half second before: three TLS connections and lists a second, on an idle node 3.2 s of its CPU and
2.1 s of the API server's a minute, about a tenth of a core for as long as a node runs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import ssl
import sys
import threading
import time
import urllib.request
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

    def watch(self, path: str, timeout_s: int, since: str = "") -> http.client.HTTPResponse:
        """An open watch of ``path``: a JSON line an event, until the server ends it after
        ``timeout_s`` seconds. From ``since`` (a resourceVersion) when given, else from now
        with a synthetic ADDED event for each object there."""
        query = f"watch=1&timeoutSeconds={timeout_s}"
        if since:
            query += f"&resourceVersion={since}"
        request = urllib.request.Request(f"{self.server}{path}?{query}", method="GET")
        request.add_header("Accept", "application/json")
        return urllib.request.urlopen(request, timeout=timeout_s + 30, context=self.context)


WATCHED = ("/api/v1/persistentvolumeclaims", "/api/v1/persistentvolumes")
WATCH_TIMEOUT_S = 300  # the server ends a watch after this; it is opened again at once
WATCH_RETRY_S = (0.5, 1.0, 2.0, 5.0)  # a watch that cannot be opened is tried again after these


class Wakeups:
    """Watches of claims and volumes that wake the provisioner's loop: every event (the
    synthetic ADDED of each object when a watch opens, then each change) sets one flag, which
    the loop waits for and clears before its pass, so a change during a pass brings another."""

    def __init__(self, api: Api, paths: tuple[str, ...] = WATCHED) -> None:
        self.api = api
        self.changed = threading.Event()
        self.changed.set()  # the first pass runs at once
        for path in paths:
            threading.Thread(target=self._follow, args=(path,), daemon=True).start()

    def _follow(self, path: str) -> None:
        failures = 0
        while True:
            try:
                with self.api.watch(path, WATCH_TIMEOUT_S) as response:
                    failures = 0
                    for _line in response:
                        self.changed.set()
            except OSError as error:  # urllib's URLError is one
                log(f"watch of {path} failed: {error}")
                time.sleep(WATCH_RETRY_S[min(failures, len(WATCH_RETRY_S) - 1)])
                failures += 1
            self.changed.set()  # what happened while no watch was open: a pass looks

    def wait(self, timeout: float) -> None:
        """Until a watch reports a change, or ``timeout`` seconds (the resync)."""
        self.changed.wait(timeout)
        self.changed.clear()


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
    parser.add_argument(
        "--resync",
        type=float,
        default=10.0,
        help="seconds between passes when no watch reports a change (default 10)",
    )
    args = parser.parse_args(argv)
    args.volumes_dir.mkdir(parents=True, exist_ok=True)
    api = Api(args.kubeconfig)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log(f"serving storage class {STORAGE_CLASS} from {args.volumes_dir}")
    wakeups = Wakeups(api)
    while True:
        wakeups.wait(args.resync)
        try:
            reconcile_once(api, args.volumes_dir.resolve(), args.gluster_volume)
        except (OSError, ValueError) as error:  # API not reachable for a moment: try again
            log(f"pass failed: {error}")
            time.sleep(WATCH_RETRY_S[0])
            wakeups.changed.set()


if __name__ == "__main__":
    os.umask(0)
    sys.exit(main())
