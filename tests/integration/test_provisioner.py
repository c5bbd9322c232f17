"""The local node's volume provisioner against a real API server and its PersistentVolume
controller: a pass runs when a watch reports a change, not on a timer, so a claim is provisioned
and its released volume deleted at once while an idle provisioner lists nothing."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from payloadrun_devcluster import node, provisioner

pytestmark = pytest.mark.integration

IDLE_S = 6.0  # the old provisioner listed claims twice a second: a dozen times in this window


def claim_lists(cluster) -> float:
    """The API server's count of cluster-wide LISTs of claims (what each pass makes; informers
    list once at their start)."""
    text = cluster.kubectl("get", "--raw", "/metrics", check=True).stdout
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_request_total{")
        and 'resource="persistentvolumeclaims"' in line
        and 'verb="LIST"' in line
        and 'scope="cluster"' in line
    )


def api_clients(cluster) -> list[str]:
    """The command lines of the processes connected to the API server (``ss``): who else lists."""
    port = cluster.server.rsplit(":", 1)[1]
    listed = subprocess.run(
        ["ss", "-Htnp", "state", "established", "dst", f"{cluster.host}:{port}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    pids = {int(pid) for pid in re.findall(r"pid=(\d+)", listed)}
    lines = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            lines.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:200])
    return lines


class Changes:
    """The claims' and volumes' watch events from now on, seen by watches of the test's own: in
    a session's cluster other tests' claims change too (their namespaces being deleted), and
    each change may start one pass."""

    def __init__(self, cluster, kubeconfig: Path) -> None:
        self.api = provisioner.Api(kubeconfig)
        self.seen: list[str] = []
        for path in provisioner.WATCHED:
            status, body = cluster.request("GET", f"{path}?limit=1")
            assert status == 200, body
            since = body["metadata"]["resourceVersion"]
            threading.Thread(target=self._follow, args=(path, since), daemon=True).start()

    def _follow(self, path: str, since: str) -> None:
        with self.api.watch(path, 120, since) as response:
            for line in response:
                event = json.loads(line)
                meta = event["object"]["metadata"]
                where = f"{meta.get('namespace', '')}/{meta['name']}".lstrip("/")
                self.seen.append(f"{event['type']} {event['object'].get('kind')} {where}")


def wait(what: str, probe, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answer := probe():
            return answer
        time.sleep(0.2)
    pytest.fail(f"not within {timeout} s: {what}")


def test_claims_are_served_on_their_watch_events_and_an_idle_provisioner_lists_nothing(
    kube_cluster, namespace, tmp_path: Path
):
    # the node's class under a name of its own, and not the default: other tests' claims
    klass = {**node.storage_class_manifest(), "metadata": {"name": f"prov-{uuid.uuid4().hex[:6]}"}}
    status, body = kube_cluster.request("POST", "/apis/storage.k8s.io/v1/storageclasses", klass)
    assert status == 201, body
    kubeconfig = tmp_path / "provisioner.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            node.file_kubeconfig(
                kube_cluster.server,
                kube_cluster.ca_cert,
                kube_cluster.admin_cert,
                kube_cluster.admin_key,
                "admin",
            )
        )
    )
    volumes = tmp_path / "volumes"
    # a resync far longer than the test: only a watch's event can start a pass after the first
    process = subprocess.Popen(
        [
            sys.executable, "-m", "payloadrun_devcluster.provisioner",
            f"--kubeconfig={kubeconfig}", f"--volumes-dir={volumes}", "--resync=3600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    claim_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    try:
        assert process.stdout is not None
        assert "serving storage class" in process.stdout.readline()
        time.sleep(1.0)  # its watches open and report what exists: the passes they start end
        changes = Changes(kube_cluster, kubeconfig)
        before = claim_lists(kube_cluster)
        time.sleep(IDLE_S)
        lists = claim_lists(kube_cluster) - before
        changed = list(changes.seen)
        # a pass for a change at most (one list left to the controller manager's informers)
        assert lists <= len(changed) + 1, (
            f"{lists:.0f} lists of claims in {IDLE_S} s with {len(changed)} changes: "
            + "; ".join(changed[:20])
            + "\nthe API server's clients: "
            + "\n".join(api_clients(kube_cluster))
        )

        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": klass["metadata"]["name"],
                "resources": {"requests": {"storage": "1Mi"}},
            },
        }
        status, body = kube_cluster.request("POST", claim_path, claim)
        assert status == 201, body
        volume = f"pvc-{body['metadata']['uid']}"

        def phase() -> str | None:
            return (
                kube_cluster.request("GET", f"{claim_path}/data")[1].get("status", {}).get("phase")
            )

        wait("the claim bound to a provisioned volume", lambda: phase() == "Bound")
        assert (volumes / volume).is_dir()

        kube_cluster.request("DELETE", f"{claim_path}/data")
        wait(
            "the released volume (policy Delete) and its directory deleted",
            lambda: (
                kube_cluster.request("GET", f"/api/v1/persistentvolumes/{volume}")[0] == 404
                and not (volumes / volume).exists()
            ),
        )
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
        kube_cluster.request(
            "DELETE", f"/apis/storage.k8s.io/v1/storageclasses/{klass['metadata']['name']}"
        )
    assert f"provisioned {volume} for {namespace}/data" in out, out
