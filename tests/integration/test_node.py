"""The local node's life cycle: ``up --node`` runs pods, ``down`` leaves the host as it found it,
and ``up`` works again after a crash.

Only one node can run on a machine (its bridge, addresses and DNS port are fixed), so this test
runs before the session's cluster starts its own node (``conftest.py`` orders it first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from payloadrun_devcluster import Binaries, glusterfs, running_node_state_dir
from payloadrun_devcluster.images import pause_image_name
from payloadrun_devcluster.node import (
    BRIDGE,
    RUN_DIR,
    SYSCTLS,
    ipset_names,
    is_kube_router_ipset,
    running_node_owner,
)

pytestmark = [pytest.mark.integration, pytest.mark.node_lifecycle]


def host_snapshot() -> dict:
    """What the node changes on the host, as seen from outside."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True)
    routing = subprocess.run(["ip", "rule"], capture_output=True, text=True, check=True)
    ipsets = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=True)
    mounts = Path("/proc/self/mountinfo").read_text()
    return {
        "bridge": f" {BRIDGE}:" in links.stdout,
        "sysctls": {name: Path("/proc/sys", name).read_text().strip() for name in SYSCTLS},
        "kube chains": sorted(
            line.split()[0] for line in rules.stdout.splitlines() if line.startswith(":KUBE-")
        ),
        # kube-router's policy ip sets, and the node's routing rule for the Service range
        "ipsets": sorted(ipsets.stdout.split()),
        "routing rules": routing.stdout.splitlines(),
        "node mounts": [
            line.split()[4]
            for line in mounts.splitlines()
            if str(RUN_DIR) in line or "/kubelet/" in line
        ],
        "run dir": RUN_DIR.exists(),
        # the node's GlusterFS volume and its clients (the provisioner's, every pod's); not
        # glusterd's own life, nor other volumes': another process (the GlusterFS tests, a
        # benchmark) may use the same glusterd at once
        "gluster mounts": [point for _, point in glusterfs.fuse_mounts(NODE_VOLUME_SOURCE)],
        "node volume": node_volume_exists(),
        "kubepods": sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods")),
    }  # fmt: skip


NODE_VOLUME_SOURCE = f"127.0.0.1:{glusterfs.NODE_VOLUME}"


def node_volume_exists() -> bool:
    server = glusterfs.GlusterServer()
    return server.running() and glusterfs.NODE_VOLUME in server.volume_names()


def cli(state: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "payloadrun_devcluster", "--state-dir", str(state), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def kubectl(
    binaries: Binaries, state: Path, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binaries.kubectl), f"--kubeconfig={state / 'admin.kubeconfig'}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def pod_running(binaries: Binaries, state: Path, name: str) -> bool:
    result = kubectl(binaries, state, "get", "pod", name, "-o", "jsonpath={.status.phase}")
    return result.stdout == "Running"


def wait(what: str, check, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # each check is one kubectl, ipset or /proc read: cheap


PAUSE_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "sandbox-only", "namespace": "default"},
    "spec": {
        "containers": [{"name": "pause", "image": pause_image_name(), "imagePullPolicy": "Never"}],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65535},
    },
}


# kube-router makes ip sets of the pods a policy selects and admits: a crash leaves them behind
POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "sandbox-from-pods", "namespace": "default"},
    "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]},
}


def test_up_runs_pods_and_down_leaves_the_host_as_it_was(node_binaries, tmp_path):
    binaries = node_binaries
    before = host_snapshot()
    state = tmp_path / "cluster"
    try:
        up = cli(state, "up", "--node")
        assert up.returncode == 0, up.stderr
        assert host_snapshot()["bridge"]
        assert node_volume_exists()
        assert running_node_state_dir() == state
        created = kubectl(binaries, state, "apply", "-f", "-", input=json.dumps(PAUSE_POD))
        assert created.returncode == 0, created.stderr
        wait("a pod running on the node", lambda: pod_running(binaries, state, "sandbox-only"))
        created = kubectl(binaries, state, "apply", "-f", "-", input=json.dumps(POLICY))
        assert created.returncode == 0, created.stderr
        wait(
            "kube-router's ip sets of the policy",
            lambda: any(is_kube_router_ipset(name) for name in ipset_names()),
            timeout=30,
        )

        # a crash: every process of the cluster killed at once, pods and mounts left behind
        recorded = json.loads((state / "state.json").read_text())["processes"]
        for process in recorded:
            os.killpg(process["pid"], signal.SIGKILL)
        # the owner record is left behind, and a node that no longer runs is nobody's
        assert running_node_owner() is not None
        wait("the killed processes reaped", lambda: running_node_state_dir() is None, timeout=30)
        again = cli(state, "up", "--node")
        assert again.returncode == 0, again.stderr
        assert "stale" in again.stderr
        created = kubectl(binaries, state, "apply", "-f", "-", input=json.dumps(PAUSE_POD))
        assert created.returncode == 0, created.stderr
        wait(
            "a pod running after the restart", lambda: pod_running(binaries, state, "sandbox-only")
        )
    finally:
        down = cli(state, "down")
    assert down.returncode == 0, down.stderr
    assert host_snapshot() == before
    leftovers = subprocess.run(
        ["pgrep", "-f", str(state)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert leftovers == []
