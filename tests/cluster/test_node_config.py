"""The local node's pure parts: its address plan, its components' configuration, and the
decisions of its volume provisioner (what to provision, what to delete)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path

from payloadrun_devcluster import flexvolume, node, provisioner
from payloadrun_devcluster.node import NodePKI


def test_every_address_is_in_the_benchmarking_range_and_the_subnets_are_disjoint():
    benchmarking = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544: routed by no real network
    pods = ipaddress.ip_network(node.POD_SUBNET)
    services = ipaddress.ip_network(node.SERVICE_SUBNET)
    assert pods.subnet_of(benchmarking) and services.subnet_of(benchmarking)
    assert not pods.overlaps(services)
    assert ipaddress.ip_address(node.NODE_IP) in pods
    assert ipaddress.ip_address(node.KUBERNETES_SERVICE_IP) == next(services.hosts())


def test_the_pod_network_is_the_nodes_bridge_with_the_node_as_gateway(tmp_path):
    (bridge,) = node.cni_config(tmp_path)["plugins"]
    assert bridge["bridge"] == node.BRIDGE and bridge["isGateway"]
    assert not bridge["ipMasq"]  # pods need nothing beyond this machine
    (range_,) = bridge["ipam"]["ranges"][0]
    assert range_ == {"subnet": node.POD_SUBNET, "gateway": node.NODE_IP}
    assert bridge["ipam"]["dataDir"] == str(tmp_path)  # not /var/lib/cni


def test_the_kubelet_authenticates_its_clients_and_asks_the_api_server():
    pki = NodePKI(*(Path(f"/pki/{i}") for i in range(6)), clients={})
    config = node.kubelet_config(
        node_dir=Path("/state/node"),
        pki=pki,
        ca_cert=Path("/pki/ca.crt"),
        port=10250,
        healthz_port=10248,
        runtime="unix:///run/x.sock",
    )
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["x509"] == {"clientCAFile": "/pki/ca.crt"}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["readOnlyPort"] == 0
    assert config["clusterDNS"] == [node.NODE_IP]
    assert config["imageGCHighThresholdPercent"] == 100  # imported images are never pulled again
    # the release's image, pulled from a registry, is also imported as payloadrun:e2e: its pods
    # (imagePullPolicy Never) must not need it pulled again under that name
    assert config["imagePullCredentialsVerificationPolicy"] == "NeverVerify"


# iptables-save -t filter on the node, trimmed: kube-proxy's jumps, kube-router's, and the rules
# the end of a kube-router policy sync writes
PROXY_JUMPS = """\
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A OUTPUT -m conntrack --ctstate NEW -j KUBE-SERVICES
"""
PROXY_SYNCED = """\
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
"""
ROUTER_JUMPS = """\
-A INPUT -m comment --comment "kube-router netpol - 4IA2OSFRMVNDXBVV" -j KUBE-ROUTER-INPUT
-A FORWARD -m comment --comment "kube-router netpol - TEMCG2JMHZYE7H7T" -j KUBE-ROUTER-FORWARD
-A OUTPUT -m comment --comment "kube-router netpol - VEAAIY32XVBHCSCY" -j KUBE-ROUTER-OUTPUT
"""
ROUTER_SYNCED = "".join(
    f'-A {chain} -m comment --comment "rule to explicitly ACCEPT traffic that comply to network '
    f'policies" -m mark --mark 0x20000/0x20000 -j ACCEPT\n'
    for chain in ("KUBE-ROUTER-INPUT", "KUBE-ROUTER-FORWARD", "KUBE-ROUTER-OUTPUT")
)  # fmt: skip


def test_kube_router_starts_after_kube_proxy_has_written_its_rules():
    assert not node.kube_proxy_synced(PROXY_JUMPS)  # jumps inserted, rules not restored yet
    assert node.kube_proxy_synced(PROXY_JUMPS + PROXY_SYNCED)


def test_kube_router_is_ready_once_synced_with_its_chains_before_kube_proxys():
    assert node.kube_router_synced(ROUTER_JUMPS + PROXY_JUMPS + PROXY_SYNCED + ROUTER_SYNCED)
    assert not node.kube_router_synced(ROUTER_JUMPS + PROXY_JUMPS)  # no full sync yet
    # after kube-proxy's jumps, kube-proxy's KUBE-FORWARD would accept Service traffic first
    assert not node.kube_router_synced(PROXY_JUMPS + ROUTER_JUMPS + ROUTER_SYNCED)


def test_kube_router_runs_its_policy_controller_only_with_nothing_on_other_addresses():
    args = node.kube_router_args(Path("/bin/kube-router"), Path("/k.kubeconfig"), 10999)
    assert "--run-firewall=true" in args
    assert "--run-router=false" in args and "--run-service-proxy=false" in args
    assert f"--service-cluster-ip-range={node.SERVICE_SUBNET}" in args
    assert f"--hostname-override={node.NODE_NAME}" in args
    # its health server would listen on every address: off; metrics on loopback
    assert "--health-port=0" in args
    assert "--metrics-addr=127.0.0.1" in args and "--metrics-port=10999" in args


def test_only_kube_routers_ip_sets_are_destroyed_with_the_node():
    assert node.is_kube_router_ipset("KUBE-SRC-T5DIORJ733K543G4")
    assert node.is_kube_router_ipset("KUBE-DST-7MOZSJXIUHIRZ5JM")
    assert node.is_kube_router_ipset("inet6:KUBE-DST-7MOZSJXIUHIRZ5JM")
    assert node.is_kube_router_ipset("TMP-LXNCLNQVYSDEWXB2")
    assert not node.is_kube_router_ipset("my-blocklist")
    assert not node.is_kube_router_ipset("TMP-mine")  # not a hash: someone else's


def test_only_untranslated_pod_traffic_to_the_service_range_is_refused_by_route():
    rule = node.SERVICE_RANGE_RULE
    assert rule[rule.index("iif") + 1] == node.BRIDGE
    assert rule[rule.index("to") + 1] == node.SERVICE_SUBNET
    assert rule[-1] == "prohibit"


def claim(name: str, *, annotated: bool = True, phase: str = "Pending", **spec) -> dict:
    annotations = (
        {provisioner.STORAGE_PROVISIONER: provisioner.PROVISIONER_NAME} if annotated else {}
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": annotations,
        },
        "spec": {
            "storageClassName": "standard",
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            **spec,
        },
        "status": {"phase": phase},
    }


CLASSES = {"standard": node.storage_class_manifest(), "other": {"provisioner": "x.io/y"}}


def test_only_claims_handed_to_this_provisioner_are_provisioned():
    claims = [
        claim("wanted"),
        # a static volume pre-bound by claimRef is bound by the controller: no annotation
        claim("static", annotated=False),
        claim("bound", phase="Bound", volumeName="pv-1"),
        claim("other-class", storageClassName="other"),
    ]
    wanted = provisioner.claims_to_provision(claims, CLASSES)
    assert [c["metadata"]["name"] for c in wanted] == ["wanted"]


def test_a_volume_is_a_fresh_directory_pre_bound_to_its_claim(tmp_path):
    volume = provisioner.volume_for_claim(claim("data"), tmp_path, "Delete")
    assert volume["metadata"]["name"] == "pvc-uid-data"
    spec = volume["spec"]
    assert spec["hostPath"]["path"] == str(tmp_path / "pvc-uid-data")
    assert spec["claimRef"]["uid"] == "uid-data" and spec["claimRef"]["name"] == "data"
    assert spec["accessModes"] == ["ReadWriteMany"]
    assert spec["capacity"] == {"storage": "1Gi"}
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"


def test_on_the_shared_volume_a_claim_is_a_directory_each_pod_mounts_through_the_driver(tmp_path):
    volume = provisioner.volume_for_claim(claim("data"), tmp_path, "Retain", "prnode")
    spec = volume["spec"]
    assert "hostPath" not in spec
    assert spec["flexVolume"] == {
        "driver": "payloadrun.dev/glusterfs",
        "options": {"volume": "prnode", "subdir": "pvc-uid-data"},
    }
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"


def test_the_volume_driver_answers_the_kubelet_without_attach_or_ownership_changes(tmp_path):
    reply, code = flexvolume.answer(["init"])
    assert code == 0 and reply["status"] == "Success"
    assert reply["capabilities"] == {"attach": False, "fsGroup": False, "selinuxRelabel": False}
    reply, code = flexvolume.answer(["attach", "{}", "node"])
    assert code == 1 and reply["status"] == "Not supported"
    driver = flexvolume.install(tmp_path)
    assert driver == tmp_path / "payloadrun.dev~glusterfs" / "glusterfs"
    assert os.access(driver, os.X_OK)
    out = subprocess.run([driver, "init"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["status"] == "Success"


def test_only_released_volumes_of_ours_with_policy_delete_are_deleted():
    def pv(name: str, phase: str, policy: str = "Delete", ours: bool = True) -> dict:
        annotations = {provisioner.PROVISIONED_BY: provisioner.PROVISIONER_NAME} if ours else {}
        return {
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"persistentVolumeReclaimPolicy": policy},
            "status": {"phase": phase},
        }

    volumes = [
        pv("released", "Released"),
        pv("bound", "Bound"),
        pv("retained", "Released", policy="Retain"),
        pv("static", "Released", ours=False),
    ]
    assert [v["metadata"]["name"] for v in provisioner.volumes_to_delete(volumes)] == ["released"]


def test_the_built_coredns_has_every_plugin_the_nodes_corefile_uses(tmp_path):
    """build.sh compiles CoreDNS with a list of plugins of its own: a directive the Corefile
    gains must be in it, or the node's DNS refuses its configuration at start."""
    from payloadrun_devcluster.binaries import BinariesMissing, find_binaries
    from payloadrun_devkit.required import skip_or_fail

    try:
        coredns = find_binaries(("coredns",)).path("coredns")
    except BinariesMissing as missing:
        skip_or_fail(str(missing))
    text = node.corefile(tmp_path / "dns.kubeconfig", 8181, 8182)
    used = {
        line.split()[0]
        for line in text.splitlines()[1:]  # the server block's lines, its address line aside
        if line.startswith("    ") and not line.startswith("     ") and line.strip() != "}"
    }
    assert {"kubernetes", "cache", "health", "ready"} <= used  # the parse reads the directives
    compiled = set(
        subprocess.run(
            [str(coredns), "-plugins"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.split()
    )
    assert used <= compiled, f"{sorted(used - compiled)}: add them to COREDNS_PLUGINS (build.sh)"
