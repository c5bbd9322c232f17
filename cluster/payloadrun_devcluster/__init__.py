"""A local Kubernetes control plane for tests and humans.

etcd, kube-apiserver and kube-controller-manager on 127.0.0.1.

Binaries come from ``cluster/build.sh`` (built from the Go module proxy at the versions in
``cluster/versions.env``). Standard library only.
"""

from .binaries import CONTROL_PLANE_NAMES, Binaries, BinariesMissing, find_binaries, read_versions
from .certs import CertificateError
from .cluster import ClusterError, LocalCluster

__all__ = [
    "CONTROL_PLANE_NAMES",
    "Binaries",
    "BinariesMissing",
    "CertificateError",
    "ClusterError",
    "LocalCluster",
    "find_binaries",
    "read_versions",
]
