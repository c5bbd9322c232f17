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
