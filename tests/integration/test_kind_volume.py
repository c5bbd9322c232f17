"""``hack/kind/volume.sh``: the kind end-to-end run's static ReadWriteMany volume serves run
after run (it used to bind once per cluster: a released volume keeps the old claim's uid).

No kind here, but binding is the PersistentVolume controller's business, which the local
control plane runs: the script is run against it exactly as ``hack/kind-e2e.sh`` runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VOLUME = "payloadrun-e2e"
NAMESPACE, CLAIM = "e2e", "e2e-run-payloads"  # what hack/kind/volume.yaml's claimRef names


def claim_manifest() -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM, "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "standard",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )


def wait(what: str, check, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_the_static_kind_volume_binds_the_claim_of_every_run(kube_cluster):
    env = {**os.environ, **kube_cluster.env()}

    def volume_sh() -> None:
        result = subprocess.run(
            ["bash", str(REPO / "hack" / "kind" / "volume.sh")],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr

    def claim_phase() -> str:
        out = kube_cluster.kubectl(
            "get", "pvc", CLAIM, "-n", NAMESPACE, "-o", "jsonpath={.status.phase}"
        )
        return out.stdout

    # the e2e module may have just deleted this namespace: wait until it is gone
    wait("namespace e2e gone", lambda: kube_cluster.kubectl("get", "ns", NAMESPACE).returncode)
    kube_cluster.kubectl("create", "namespace", NAMESPACE, check=True)
    try:
        for run in (1, 2, 3):  # `hack/kind-e2e.sh up` before each run
            volume_sh()
            kube_cluster.kubectl("apply", "-f", "-", input=claim_manifest(), check=True)
            wait(f"run {run}'s claim bound to the static volume", lambda: claim_phase() == "Bound")
            # the static volume itself (on the local node the class "standard" could also be
            # served by the node's provisioner, which must not be what bound it)
            claim = json.loads(
                kube_cluster.kubectl("get", "pvc", CLAIM, "-n", NAMESPACE, "-o", "json").stdout
            )
            assert claim["spec"]["volumeName"] == VOLUME
            # a run that still holds its claim keeps its volume when the script runs again
            volume_sh()
            assert claim_phase() == "Bound"
            kube_cluster.kubectl("delete", "pvc", CLAIM, "-n", NAMESPACE, "--wait=true", check=True)
    finally:
        kube_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
        kube_cluster.kubectl("delete", "pv", VOLUME, "--wait=false")
