"""A local Kubernetes cluster for tests and humans.

etcd, kube-apiserver and kube-controller-manager on 127.0.0.1; with ``node=True`` (``up --node``)
also a node (containerd, kubelet, kube-scheduler, kube-proxy, CoreDNS, kube-router's network
policy controller) so pods run.

Binaries come from ``cluster/build.sh`` (built from the Go module proxy at the versions in
``cluster/versions.env``); containerd and runc from the machine's packages
(``cluster/node-packages.sh``). Standard library only.
"""

from .binaries import (
    CONTROL_PLANE_NAMES,
    NODE_NAMES,
    Binaries,
    BinariesMissing,
    find_binaries,
    read_versions,
)
from .certs import CertificateError
from .cluster import ClusterError, LocalCluster, running_node_state_dir
from .node import NodeError, node_unsupported_reason

__all__ = [
    "CONTROL_PLANE_NAMES",
    "NODE_NAMES",
    "Binaries",
    "BinariesMissing",
    "CertificateError",
    "ClusterError",
    "LocalCluster",
    "NodeError",
    "find_binaries",
    "node_unsupported_reason",
    "read_versions",
    "running_node_state_dir",
]
