"""A real node beside the local control plane, so pods run: containerd + runc, kubelet,
kube-scheduler, kube-proxy, CoreDNS, kube-router's network policy controller (NetworkPolicy is
enforced), a bridge pod network and a ReadWriteMany storage class on a real network filesystem
(GlusterFS: a volume of the node's, a FUSE client per pod, see :mod:`glusterfs` and
:mod:`flexvolume`).

Linux and root only (bridges, iptables, mounts, cgroups). What it changes on the host is listed
here, recorded in ``<state>/node/host.json`` before it is changed, and undone by
:func:`teardown_host` (on ``down``, and before every ``up``, so a crash leaves nothing that a
new ``up`` trips over):

- a bridge ``prnode0`` with the node address 198.18.0.1/24; pods get 198.18.0.2-254 on it and
  Services 198.19.0.0/16: both in 198.18.0.0/15, the range reserved for benchmarking (RFC 2544),
  which no real network routes. Pods reach nothing beyond this machine.
- sysctls ``net.ipv4.ip_forward=1`` and ``net.bridge.bridge-nf-call-iptables=1`` (Service
  traffic between pods on one bridge goes through kube-proxy's iptables rules); the previous
  values are restored.
- the GlusterFS volume ``prnode`` (its brick under ``<state>/node/shared-volume``), on the
  machine's glusterd (started if none runs, stopped when no volume is left), and every client
  mount of it;
- kube-proxy's, the kubelet's and kube-router's iptables chains (every ``KUBE-`` chain and
  rule, IPv4 and IPv6: ``KUBE-SERVICES``..., ``KUBE-ROUTER-INPUT``/``FORWARD``/``OUTPUT`` and the
  jumps to them, ``KUBE-NWPLCY-*``, ``KUBE-POD-FW-*``; the host's other rules are restored as
  they were);
- kube-router's ip sets (``KUBE-SRC-*``, ``KUBE-DST-*``, ``TMP-*``: the pods a policy selects or
  admits), destroyed once no rule refers to them; the sets there before the node are recorded
  and kept;
- a routing rule ``iif prnode0 to 198.19.0.0/16 prohibit`` (priority 100): pod traffic to a
  Service address that kube-proxy did not translate, to a Service without endpoints, is refused
  at once (see :data:`SERVICE_RANGE_RULE`);
- containerd's and kubelet's state under ``<state>/node`` and ``/run/payloadrun-node`` (sockets
  and network namespaces), with the mounts in them; pod cgroups under ``/kubepods``; kubelet's
  ``/var/log/containers`` links.

Images come into the node two ways: imported from tarballs (:meth:`LocalNode.load_image`, what
``hack/images.sh`` makes), or pulled by containerd from a registry, as on any cluster. Its
registry configuration is a hosts directory (``config_path``:
``<state>/node/config/registry-hosts``) that containerd reads at each pull, so a registry started
after the node, on a port found then, becomes usable over plain HTTP with
:meth:`LocalNode.trust_plain_http_registry` (the release path's test:
``tests/integration/test_e2e.py``).

One node per machine: the bridge, the addresses and port 53 on the node address are fixed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import glusterfs
from .binaries import NODE_NAMES, Binaries, node_version_skew
from .certs import ClusterPKI, issue_client_cert, issue_serving_cert
from .flexvolume import install as install_volume_driver
from .images import pause_image_name, pause_image_tarball
from .processes import InBackground, ManagedProcess

NODE_NAME = "payloadrun-node"
BRIDGE = "prnode0"
NODE_IP = "198.18.0.1"
LOCAL_RANGE = "198.18.0.0/15"  # RFC 2544 (benchmarking): pods and Services, nothing real
POD_SUBNET = "198.18.0.0/24"
# a run has one ClusterIP Service (its inference): a /24 (254 addresses) held about 250 runs
SERVICE_SUBNET = "198.19.0.0/16"
KUBERNETES_SERVICE_IP = "198.19.0.1"
CLUSTER_DOMAIN = "cluster.local"
RUN_DIR = Path("/run/payloadrun-node")
# The kubelet's state, where it makes unix sockets (pod-resources/<10 digits>, device plugins):
# a socket path has at most 107 bytes, which a state directory under pytest's basetemp
# (/tmp/pytest-of-root/pytest-104/<test name>/cluster/node) exceeds. One node per machine, so
# one fixed short path, cleaned up (mounts too) with the rest of RUN_DIR.
KUBELET_ROOT = RUN_DIR / "kubelet"
CNI_BIN_DIR = Path("/usr/lib/cni")
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}
SERVICE_RANGE_RULE = ("iif", BRIDGE, "to", SERVICE_SUBNET, "priority", "100", "prohibit")
"""A routing rule (``ip rule``): what pods send to a Service address that kube-proxy did not
translate (a Service without endpoints) is refused at once. kube-proxy's REJECT of it is in the
filter table's FORWARD chain after kube-router's, which accepts all of a pod's traffic that its
policies allow; without this rule it would leave through the machine's default route."""
HOST_COMMANDS = (
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "ip",
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ipset",  # kube-router's policies match their pods through ip sets
    "conntrack",
    "gcc",  # the sandbox image's static pause binary (images.py)
)
PORT_NAMES = (
    "kubelet",
    "kubelet-healthz",
    "proxy-healthz",
    "proxy-metrics",
    "scheduler",
    "dns-health",
    "dns-ready",
    "netpol-metrics",
)
"""The node's ports, picked free at start with the control plane's (see ``state.json``)."""
NODE_COMPONENTS = (
    "containerd",
    "kubelet",
    "kube-scheduler",
    "kube-proxy",
    "coredns",
    "provisioner",
    "kube-router",
)
PROVISIONER_NAME = "payloadrun.dev/local-rwx"
SHARED_VOLUME_DIR = "shared-volume"  # under the node's state: the GlusterFS brick of NODE_VOLUME
STORAGE_CLASS = "standard"


def storage_class_manifest() -> dict:
    """The node's default storage class, served by ``provisioner.py``."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER_NAME,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


NODE_PACKAGES_HINT = "run: bash cluster/node-packages.sh  (Debian: containerd, runc, CNI plugins)"


class NodeError(RuntimeError):
    """The node cannot run here, or failed to start or stop."""


def node_unsupported_reason(binaries: Binaries) -> str | None:
    """Why a node cannot run on this machine, or None when it can."""
    if platform.system() != "Linux":
        return f"a node needs Linux (this is {platform.system()})"
    if os.geteuid() != 0:
        return "a node needs root (bridges, iptables, mounts, cgroups)"
    missing = [name for name in HOST_COMMANDS if shutil.which(name) is None]
    if not (CNI_BIN_DIR / "bridge").is_file():
        missing.append(str(CNI_BIN_DIR / "bridge"))
    if missing:
        return f"missing on this machine: {', '.join(missing)}; {NODE_PACKAGES_HINT}"
    shared = glusterfs.unsupported_reason()
    if shared:
        return f"the node's storage class needs GlusterFS: {shared}"
    not_built = [name for name in NODE_NAMES if not os.access(binaries.path(name), os.X_OK)]
    if not_built:
        return f"not built: {', '.join(not_built)}; run: bash cluster/build.sh"
    return node_version_skew()


# ---- configuration files (pure) ------------------------------------------------------------
def cni_config(ipam_dir: Path) -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": "payloadrun",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,  # pods need no traffic beyond this machine
                "hairpinMode": True,  # a pod reaches itself through its own Service
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                    # Services and the node, through the node; no default route: pods reach
                    # nothing beyond this machine.
                    "routes": [{"dst": LOCAL_RANGE}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def containerd_config(
    node_dir: Path, run_dir: Path, cni_conf_dir: Path, registry_hosts: Path
) -> str:
    """containerd's configuration (version 2, read by Debian's 1.6 and Ubuntu's 1.7).

    ``registry_hosts`` is its registry hosts directory (``<host[:port]>/hosts.toml`` files, see
    :func:`plain_http_registry_hosts`), read at each pull.
    """
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{node_dir / "containerd"}"
state = "{run_dir / "containerd"}"
[grpc]
  address = "{run_dir / "containerd.sock"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{node_dir / "containerd-opt"}"
[{cri}]
  sandbox_image = "{pause_image_name()}"
  # This machine's capability set lacks CAP_SYS_RESOURCE: without this, every sandbox fails
  # with "runc create failed: ... can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.registry]
    config_path = "{registry_hosts}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf_dir}"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
"""


def plain_http_registry_hosts(host: str) -> str:
    """A ``hosts.toml`` that has containerd pull from ``host`` (``127.0.0.1:5000``) over HTTP.

    Without one containerd speaks HTTPS to every registry but ``localhost``, and a registry on
    ``127.0.0.1`` without TLS fails the pull with "server gave HTTP response to HTTPS client".
    """
    if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", host):
        raise ValueError(f"registry host {host!r} is not host or host:port (no scheme, no path)")
    return (
        f'server = "http://{host}"\n\n'
        f'[host."http://{host}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
    )


def kubelet_config(
    *, node_dir: Path, pki: NodePKI, ca_cert: Path, port: int, healthz_port: int, runtime: str
) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Clients (the API server for exec, logs and proxy) prove who they are with a
        # certificate of the cluster CA; what they may do is asked of the API server.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(pki.kubelet_serving_cert),
        "tlsPrivateKeyFile": str(pki.kubelet_serving_key),
        "containerRuntimeEndpoint": runtime,
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,  # this machine mounts cgroup v1 hierarchies
        "failSwapOn": False,
        "clusterDNS": [NODE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",
        "podLogsDir": str(node_dir / "pod-logs"),
        # The project's images are imported, never pulled: image GC must not remove them.
        "imageGCHighThresholdPercent": 100,
        # An image the kubelet pulled (the release's, from a registry on loopback) is the same
        # image as one imported under another name (payloadrun:e2e): since Kubernetes 1.35
        # (KEP-2535, beta) the kubelet would re-pull it to check the second name's credentials,
        # and a pod with imagePullPolicy Never got ErrImageNeverPull. No credentials here.
        "imagePullCredentialsVerificationPolicy": "NeverVerify",
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
            "imagefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
    }


def kube_proxy_config(kubeconfig: Path, healthz_port: int, metrics_port: int) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "clusterCIDR": POD_SUBNET,
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # Leave the host's conntrack table sizes alone.
        "conntrack": {"maxPerCore": 0, "min": 0},
        # Masquerade Service traffic so replies between pods on one bridge come back through
        # the host (no dependence on the bridge's netfilter hooks for correctness).
        "iptables": {"masqueradeAll": True},
    }


def kube_router_args(binary: Path, kubeconfig: Path, metrics_port: int) -> list[str]:
    """kube-router as the node's NetworkPolicy enforcer only: its firewall (iptables + ipset),
    not its BGP router (the bridge is the pod network) nor its IPVS service proxy (kube-proxy is).
    """
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={NODE_NAME}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        "--enable-cni=false",
        "--enable-ipv4=true",
        "--enable-ipv6=false",
        # Service traffic is allowed towards this range in the INPUT chain; kube-proxy DNATs it
        # before the FORWARD chain, where the destination pod's policies apply.
        f"--service-cluster-ip-range={SERVICE_SUBNET}",
        # Its health server listens on every address of the machine: off. Readiness is its
        # rules (kube_router_synced); its metrics (sync times) stay on loopback.
        "--health-port=0",
        "--metrics-addr=127.0.0.1",
        f"--metrics-port={metrics_port}",
        "--v=1",
    ]


KUBE_ROUTER_TOP_CHAINS = {"INPUT": "KUBE-ROUTER-INPUT", "FORWARD": "KUBE-ROUTER-FORWARD",
                          "OUTPUT": "KUBE-ROUTER-OUTPUT"}  # fmt: skip
KUBE_ROUTER_IPSET = re.compile(r"(inet6:)?(KUBE-SRC-|KUBE-DST-|TMP-)[A-Z2-7]{16}")
"""kube-router's ip set names: a policy's source and destination pods, and the temporary sets it
swaps them in with (16 base32 characters of a hash; IPv6 ones begin with ``inet6:``)."""


def kube_proxy_synced(filter_rules: str) -> bool:
    """Whether ``iptables-save -t filter`` output shows kube-proxy's first sync done.

    kube-proxy inserts its jumps into the built-in chains (at the top, when they are missing)
    before the ``iptables-restore`` that writes its chains' rules, such as ``KUBE-FORWARD``'s.
    """
    return any(line.startswith("-A KUBE-FORWARD ") for line in filter_rules.splitlines())


def kube_router_synced(filter_rules: str) -> bool:
    """Whether ``iptables-save -t filter`` output shows a completed kube-router policy sync, with
    its chains first in ``INPUT``, ``FORWARD`` and ``OUTPUT``.

    First matters: kube-proxy's ``KUBE-FORWARD`` accepts every packet it marked for masquerading,
    which with ``masqueradeAll`` is all Service traffic, so a policy evaluated after it would not
    apply to pods reached through a Service. kube-router moves its jumps back to the top at each
    sync; it is started after kube-proxy's first sync (:func:`kube_proxy_synced`) so that its own
    first sync puts them there. The final ACCEPT of policy-compliant traffic in each of its chains
    is only written by the ``iptables-restore`` of a full sync.
    """
    lines = filter_rules.splitlines()
    for builtin, chain in KUBE_ROUTER_TOP_CHAINS.items():
        first = next((x for x in lines if x.startswith(f"-A {builtin} ")), "")
        if not first.endswith(f"-j {chain}"):
            return False
        accept = "--mark 0x20000/0x20000 -j ACCEPT"
        if not any(x.startswith(f"-A {chain} ") and x.endswith(accept) for x in lines):
            return False
    return True


def is_kube_router_ipset(name: str) -> bool:
    return KUBE_ROUTER_IPSET.fullmatch(name) is not None


def corefile(kubeconfig: Path, health_port: int, ready_port: int) -> str:
    return f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 10
}}
"""


# CoreDNS reads Services and endpoints; the provisioner gets the bootstrap provisioner role.
NODE_RBAC = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "payloadrun:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["list", "watch"],
            },
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "payloadrun:coredns"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "payloadrun:coredns",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "payloadrun:coredns"}
        ],
    },
    # kube-router's informers: every one it starts must sync, even those only its router and
    # service proxy (not run here) use
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "payloadrun:kube-router"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods", "namespaces", "nodes", "services", "endpoints"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["networking.k8s.io"],
                "resources": ["networkpolicies"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "payloadrun:kube-router"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "payloadrun:kube-router",
        },
        "subjects": [
            {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "User",
                "name": "payloadrun:kube-router",
            }
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "payloadrun:local-provisioner"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:persistent-volume-provisioner",
        },
        "subjects": [
            {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "User",
                "name": "payloadrun:local-provisioner",
            }
        ],
    },
]


# ---- certificates and kubeconfigs ------------------------------------------------------------
@dataclass(frozen=True)
class NodePKI:
    kubelet_client_cert: Path  # the API server, calling kubelets (exec, logs, proxy)
    kubelet_client_key: Path
    kubelet_cert: Path  # the kubelet, calling the API server as system:node:<name>
    kubelet_key: Path
    kubelet_serving_cert: Path
    kubelet_serving_key: Path
    clients: dict[str, tuple[Path, Path]]  # component -> (cert, key)


NODE_CLIENTS = {
    "kube-scheduler": "/CN=system:kube-scheduler",
    "kube-proxy": "/CN=system:kube-proxy",
    "coredns": "/CN=payloadrun:coredns",
    "provisioner": "/CN=payloadrun:local-provisioner",
    "kube-router": "/CN=payloadrun:kube-router",
}


def generate_node_pki(pki: ClusterPKI) -> NodePKI:
    """Every certificate the node's components and the API server's kubelet client need."""
    client_cert, client_key = issue_client_cert(
        pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client"
    )
    kubelet_cert, kubelet_key = issue_client_cert(
        pki, "kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}"
    )
    serving_cert, serving_key = issue_serving_cert(
        pki, "kubelet-serving", NODE_NAME, [f"IP:{NODE_IP}", f"DNS:{NODE_NAME}"]
    )
    clients = {
        name: issue_client_cert(pki, name, subject) for name, subject in NODE_CLIENTS.items()
    }
    return NodePKI(
        client_cert, client_key, kubelet_cert, kubelet_key, serving_cert, serving_key, clients
    )


def file_kubeconfig(server: str, ca_cert: Path, cert: Path, key: Path, user: str) -> dict:
    """A kubeconfig that names certificate files (every Go client and our provisioner read it)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}
        ],
        "users": [
            {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }


# ---- host changes and their undoing ------------------------------------------------------------
def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NodeError(f"{' '.join(args)} failed (exit {result.returncode}): {result.stderr}")
    return result


def filter_rules() -> str:
    """The IPv4 filter table, as ``iptables-save`` prints it."""
    return _run("iptables-save", "-t", "filter", check=False).stdout


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def prepare_host(node_dir: Path) -> None:
    """Bridge with the node address, sysctls; previous values recorded first (for teardown)."""
    node_dir.mkdir(parents=True, exist_ok=True)
    record = node_dir / "host.json"
    previous = {name: _sysctl_path(name).read_text().strip() for name in SYSCTLS}
    record.write_text(json.dumps({"sysctls": previous, "ipsets": ipset_names()}, indent=2) + "\n")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    (RUN_DIR / "owner").write_text(str(node_dir) + "\n")
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "replace", f"{NODE_IP}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    for name, value in SYSCTLS.items():
        _sysctl_path(name).write_text(value)
    _delete_service_range_rule()  # a crashed node's, so there is exactly one
    _run("ip", "rule", "add", *SERVICE_RANGE_RULE)


def _delete_service_range_rule() -> list[str]:
    """Delete :data:`SERVICE_RANGE_RULE`, however many times it is there."""
    for _ in range(10):
        result = _run("ip", "rule", "del", *SERVICE_RANGE_RULE, check=False)
        if result.returncode != 0:
            if "No such file or directory" in result.stderr:
                return []
            return [f"ip rule del {' '.join(SERVICE_RANGE_RULE)}: {result.stderr.strip()}"]
    return [f"ip rule {' '.join(SERVICE_RANGE_RULE)} still there after 10 deletions"]


def _mounts_under(prefixes: list[Path]) -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if any(point == str(p) or point.startswith(f"{p}/") for p in prefixes):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def _unmount(point: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    mnt_detach = 2
    libc.umount2(point.encode(), mnt_detach)


def _cgroup_dirs() -> list[Path]:
    """Pod cgroup directories in every hierarchy, deepest first."""
    dirs: list[Path] = []
    if not CGROUP_ROOT.is_dir():
        return dirs
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / KUBEPODS
        if top.is_dir():
            dirs.extend(Path(p) for p, _, _ in os.walk(top))
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def kill_pod_processes(containerd_socket: Path = RUN_DIR / "containerd.sock") -> None:
    """SIGKILL every container process (pod cgroups) and every shim of our containerd."""
    pids: set[int] = set()
    for directory in _cgroup_dirs():
        try:
            pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        except OSError:
            continue
    needle = str(containerd_socket).encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and needle in cmdline:
                pids.add(int(entry.name))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove_kube_rules() -> list[str]:
    """Remove every ``KUBE-`` chain and rule, IPv4 and IPv6: kube-proxy's and the kubelet's, and
    kube-router's (``KUBE-ROUTER-*``, ``KUBE-NWPLCY-*``, ``KUBE-POD-FW-*`` and the jumps to them).

    The rule set is dumped, filtered and restored in one step per family, so the host's other
    rules stay exactly as they are.
    """
    problems = []
    for save, restore in (
        ("iptables-save", "iptables-restore"),
        ("ip6tables-save", "ip6tables-restore"),
    ):
        if shutil.which(save) is None or shutil.which(restore) is None:
            continue
        dump = _run(save, check=False).stdout
        lines = dump.splitlines()
        kept = [line for line in lines if "KUBE-" not in line]
        if len(kept) == len(lines):
            continue
        result = subprocess.run(
            [restore], input="\n".join(kept) + "\n", capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            problems.append(f"{restore}: {result.stderr.strip()[-300:]}")
    return problems


def ipset_names() -> list[str]:
    """The machine's ip sets (none without the ``ipset`` command)."""
    if shutil.which("ipset") is None:
        return []
    return sorted(_run("ipset", "list", "-n", check=False).stdout.split())


def remove_kube_router_ipsets(keep: list[str]) -> list[str]:
    """Destroy kube-router's ip sets, except those in ``keep`` (there before the node).

    Only once no rule refers to them: after :func:`remove_kube_rules`.
    """
    problems = []
    for name in ipset_names():
        if is_kube_router_ipset(name) and name not in keep:
            result = _run("ipset", "destroy", name, check=False)
            if result.returncode != 0:
                problems.append(f"ipset destroy {name}: {result.stderr.strip()}")
    return problems


def teardown_host(node_dir: Path) -> list[str]:
    """Undo everything :func:`prepare_host` and the node's components changed. Idempotent.

    Returns what could not be undone (empty when the host is clean).
    """
    problems: list[str] = []
    kill_pod_processes()
    time.sleep(0.2)
    problems.extend(_delete_shared_volume())
    for point in _mounts_under([node_dir, RUN_DIR]):
        _unmount(point)
    for directory in _cgroup_dirs():
        with contextlib.suppress(OSError):
            directory.rmdir()
    problems.extend(remove_kube_rules())
    record = node_dir / "host.json"
    recorded = json.loads(record.read_text()) if record.is_file() else {}
    problems.extend(remove_kube_router_ipsets(keep=recorded.get("ipsets", [])))
    problems.extend(_delete_service_range_rule())
    if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        result = _run("ip", "link", "delete", BRIDGE, check=False)
        if result.returncode != 0:
            problems.append(f"deleting bridge {BRIDGE}: {result.stderr.strip()}")
    if record.is_file():
        for name, value in recorded.get("sysctls", {}).items():
            try:
                _sysctl_path(name).write_text(value)
            except OSError as error:
                problems.append(f"restoring sysctl {name}={value}: {error}")
        record.unlink()
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for link in logs.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(str(node_dir)):
                link.unlink()
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    left = _mounts_under([node_dir, RUN_DIR])
    if not left:  # images, containers, volumes: hundreds of MB; the pods' logs stay
        for entry in node_dir.iterdir() if node_dir.is_dir() else ():
            if entry.is_dir() and entry.name != "pod-logs":
                shutil.rmtree(entry, ignore_errors=True)
    if left:
        problems.append(f"still mounted: {', '.join(left[:5])}")
    return problems


def _delete_shared_volume() -> list[str]:
    """Delete the node's GlusterFS volume (its pods' clients first); stop glusterd if idle."""
    server = glusterfs.GlusterServer()
    if not server.running():
        return []
    try:
        if glusterfs.NODE_VOLUME in server.volume_names():
            server.delete_volume(glusterfs.NODE_VOLUME)
        server.stop_if_idle()
    except (glusterfs.GlusterError, OSError, subprocess.SubprocessError) as error:
        return [f"deleting the node's GlusterFS volume: {error}"]
    return []


def running_node_owner() -> str | None:
    """The state directory of a node that may be running on this machine, if any."""
    try:
        return (RUN_DIR / "owner").read_text().strip() or None
    except OSError:
        return None


# ---- the node ------------------------------------------------------------------------------
class LocalNode:
    """The node's processes, started after the control plane by :class:`LocalCluster`."""

    def __init__(self, node_dir: Path, binaries: Binaries, die_with_parent: bool) -> None:
        self.node_dir = node_dir
        self.binaries = binaries
        self.die_with_parent = die_with_parent
        self.processes: dict[str, ManagedProcess] = {}
        self.ports: dict[str, int] = {}

    @property
    def containerd_socket(self) -> Path:
        return RUN_DIR / "containerd.sock"

    def ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )

    def containerd_answers(self, timeout: float = 5) -> bool:
        """Whether containerd answers ``ctr version`` within ``timeout`` seconds. One that does
        not (just started, on a busy machine: seen in make test) is asked again by the caller,
        within its own deadline, rather than failing the node's start."""
        try:
            return self.ctr("version", timeout=timeout).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    @property
    def registry_hosts_dir(self) -> Path:
        """containerd's registry hosts directory (``config_path``), read at each pull."""
        return self.node_dir / "config" / "registry-hosts"

    def trust_plain_http_registry(self, host: str) -> Path:
        """Let the node pull images from ``host`` (``127.0.0.1:PORT``) over plain HTTP; takes
        effect at the next pull (no restart). Returns the ``hosts.toml`` written."""
        hosts = self.registry_hosts_dir / host / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(plain_http_registry_hosts(host))
        return hosts

    def load_image(self, tarball: Path) -> None:
        """Import a docker-archive or OCI tarball into the node's image store."""
        result = self.ctr("images", "import", "--no-unpack", str(tarball))
        if result.returncode != 0:
            raise NodeError(f"importing {tarball} into the node failed: {result.stderr.strip()}")

    def load_images(self, tarballs: list[Path]) -> None:
        """:meth:`load_image` of each tarball, all at once (an import mostly waits on the disk
        and on containerd; a layer two images share is written once, the second import waits
        for it); the first failure is raised once all have ended."""
        imports = [
            InBackground(f"import {tarball.name}", lambda _, t=tarball: self.load_image(t)).start()
            for tarball in tarballs
        ]
        for running in imports:
            running.thread.join()
        for done in imports:
            done.join()

    def start_runtime(
        self,
        spawn: Callable[[str, list[str]], ManagedProcess],
        record: Callable[[str], None],
    ) -> list[InBackground]:
        """What needs no API server, begun before the control plane starts (:meth:`start` waits
        for it): containerd, spawned here (in the caller's thread: ``PR_SET_PDEATHSIG`` is tied
        to the thread that forks), and in threads of their own containerd answering with the
        sandbox image imported, and the shared GlusterFS volume with the provisioner's client.
        Each takes seconds the control plane's start spends waiting anyway."""
        node = self.node_dir
        configs = node / "config"
        configs.mkdir(parents=True, exist_ok=True)
        cni_dir = configs / "cni"
        cni_dir.mkdir(exist_ok=True)
        (cni_dir / "10-payloadrun.conflist").write_text(
            json.dumps(cni_config(node / "cni-ipam"), indent=2)
        )
        install_volume_driver(self.volume_plugin_dir)
        containerd_toml = configs / "containerd.toml"
        self.registry_hosts_dir.mkdir(parents=True, exist_ok=True)
        containerd_toml.write_text(
            containerd_config(node, RUN_DIR, cni_dir, self.registry_hosts_dir)
        )
        containerd = spawn("containerd", ["containerd", "--config", str(containerd_toml)])

        def runtime(cancelled: threading.Event) -> None:
            # the sandbox image imported before the kubelet asks for a sandbox
            deadline = time.monotonic() + 60
            while not self.containerd_answers():
                if not containerd.running():
                    raise NodeError(
                        f"containerd exited (code {containerd.exit_code()}) while starting; its "
                        f"log is {containerd.log_path}:\n{containerd.log_tail()}"
                    )
                if cancelled.is_set() or time.monotonic() > deadline:
                    raise NodeError(f"containerd did not answer within 60 s: {containerd.log_path}")
                time.sleep(0.1)
            record("containerd answers")
            self.load_image(pause_image_tarball())
            record("the sandbox image imported")

        def shared_volume(cancelled: threading.Event) -> None:
            # the provisioner makes each claim's directory through a client of its own, the
            # kubelet mounts each pod's through the driver
            gluster = glusterfs.GlusterServer.ensure()
            if glusterfs.NODE_VOLUME in gluster.volume_names():  # a crashed node's
                gluster.delete_volume(glusterfs.NODE_VOLUME)
            shared = gluster.create_volume(node / SHARED_VOLUME_DIR, name=glusterfs.NODE_VOLUME)
            shared.mount(self.provisioner_mount())
            record("the shared volume served and mounted")

        return [
            InBackground("containerd", runtime).start(),
            InBackground("shared volume", shared_volume).start(),
        ]

    def start(
        self,
        *,
        server: str,
        pki: ClusterPKI,
        node_pki: NodePKI,
        ports: dict[str, int],
        runtime: list[InBackground],
        spawn: Callable[[str, list[str]], ManagedProcess],
        wait: Callable[[str, Callable[[], bool], float], None],
        api: Callable[[str, str, dict | None], tuple[int, dict]],
    ) -> None:
        """The node's components, once the API server answers and ``runtime`` (what
        :meth:`start_runtime` began) is done; returns when the node is Ready, its Services and
        policies are in force and CoreDNS answers."""
        node = self.node_dir
        self.ports = {name: ports[name] for name in PORT_NAMES}
        configs = node / "config"

        def kubeconfig(component: str, cert: Path, key: Path, user: str) -> Path:
            path = configs / f"{component}.kubeconfig"
            path.write_text(json.dumps(file_kubeconfig(server, pki.ca_cert, cert, key, user)))
            path.chmod(0o600)
            return path

        for manifest in NODE_RBAC:
            self._apply(api, manifest)
        self._apply(api, storage_class_manifest())
        for part in runtime:
            part.join()

        kubelet_kubeconfig = kubeconfig(
            "kubelet", node_pki.kubelet_cert, node_pki.kubelet_key, f"system:node:{NODE_NAME}"
        )
        kubelet_config_file = configs / "kubelet.json"
        kubelet_config_file.write_text(
            json.dumps(
                kubelet_config(
                    node_dir=node,
                    pki=node_pki,
                    ca_cert=pki.ca_cert,
                    port=self.ports["kubelet"],
                    healthz_port=self.ports["kubelet-healthz"],
                    runtime=f"unix://{self.containerd_socket}",
                ),
                indent=2,
            )
        )
        spawn(
            "kubelet",
            [
                str(self.binaries.path("kubelet")),
                f"--config={kubelet_config_file}",
                f"--kubeconfig={kubelet_kubeconfig}",
                f"--root-dir={KUBELET_ROOT}",
                f"--cert-dir={node / 'kubelet-certs'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                f"--volume-plugin-dir={self.volume_plugin_dir}",
                "--v=1",
            ],
        )

        cert, key = node_pki.clients["kube-scheduler"]
        scheduler_kubeconfig = kubeconfig("kube-scheduler", cert, key, "system:kube-scheduler")
        spawn(
            "kube-scheduler",
            [
                str(self.binaries.path("kube-scheduler")),
                f"--kubeconfig={scheduler_kubeconfig}",
                f"--authentication-kubeconfig={scheduler_kubeconfig}",
                f"--authorization-kubeconfig={scheduler_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                "--leader-elect=false",
                "--v=1",
            ],
        )

        cert, key = node_pki.clients["kube-proxy"]
        proxy_kubeconfig = kubeconfig("kube-proxy", cert, key, "system:kube-proxy")
        proxy_json = configs / "kube-proxy.json"
        proxy_json.write_text(
            json.dumps(
                kube_proxy_config(
                    proxy_kubeconfig, self.ports["proxy-healthz"], self.ports["proxy-metrics"]
                )
            )
        )
        spawn(
            "kube-proxy",
            [str(self.binaries.path("kube-proxy")), f"--config={proxy_json}", "--v=1"],
        )

        cert, key = node_pki.clients["coredns"]
        dns_kubeconfig = kubeconfig("coredns", cert, key, "payloadrun:coredns")
        core = configs / "Corefile"
        core.write_text(corefile(dns_kubeconfig, self.ports["dns-health"], self.ports["dns-ready"]))
        spawn("coredns", [str(self.binaries.path("coredns")), "-conf", str(core)])

        cert, key = node_pki.clients["provisioner"]
        provisioner_kubeconfig = kubeconfig(
            "provisioner", cert, key, "payloadrun:local-provisioner"
        )
        spawn(
            "provisioner",
            [
                sys.executable,
                "-m",
                "payloadrun_devcluster.provisioner",
                f"--kubeconfig={provisioner_kubeconfig}",
                f"--volumes-dir={node / 'volumes'}",
                f"--gluster-volume={glusterfs.NODE_VOLUME}",
            ],
        )

        wait("the node to be Ready", lambda: self._node_ready(api), 180)

        # NetworkPolicy: kube-router reads its Node object (the node's address) at start, so it
        # starts once the kubelet has registered it.
        cert, key = node_pki.clients["kube-router"]
        self._start_network_policies(
            kubeconfig("kube-router", cert, key, "payloadrun:kube-router"), spawn, wait
        )
        wait("CoreDNS /ready", self._dns_ready, 60)

    def _start_network_policies(
        self,
        kubeconfig: Path,
        spawn: Callable[[str, list[str]], ManagedProcess],
        wait: Callable[[str, Callable[[], bool], float], None],
    ) -> None:
        wait("kube-proxy's first sync", lambda: kube_proxy_synced(filter_rules()), 60)
        binary = self.binaries.path("kube-router")
        spawn("kube-router", kube_router_args(binary, kubeconfig, self.ports["netpol-metrics"]))
        wait("kube-router's first policy sync", lambda: kube_router_synced(filter_rules()), 60)

    @staticmethod
    def _apply(api: Callable[[str, str, dict | None], tuple[int, dict]], manifest: dict) -> None:
        kind = manifest["kind"]
        collection = {
            "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            "StorageClass": "/apis/storage.k8s.io/v1/storageclasses",
        }[kind]
        status, body = api("POST", collection, manifest)
        if status not in (201, 409):
            raise NodeError(f"creating {kind} {manifest['metadata']['name']}: HTTP {status} {body}")

    @staticmethod
    def _node_ready(api: Callable[[str, str, dict | None], tuple[int, dict]]) -> bool:
        status, body = api("GET", f"/api/v1/nodes/{NODE_NAME}", None)
        if status != 200:
            return False
        conditions = body.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    @property
    def volume_plugin_dir(self) -> Path:
        """Where the kubelet finds the shared volume's driver (:mod:`flexvolume`)."""
        return self.node_dir / "volume-plugins"

    def shared_volume(self) -> glusterfs.Volume:
        """The node's GlusterFS volume (the storage class every claim on this node gets), with
        the fault controls of :class:`~glusterfs.Volume`: a test kills its brick under running
        pods and starts it again. Its ``mounts`` are empty: the pods' clients are the kubelet's
        (through the volume driver), the provisioner's is :meth:`provisioner_mount`."""
        return glusterfs.Volume(glusterfs.NODE_VOLUME, self.node_dir / SHARED_VOLUME_DIR / "brick")

    def provisioner_mount(self) -> Path:
        """Where the provisioner's own client of :meth:`shared_volume` is mounted (it makes
        each claim's directory through it)."""
        return self.node_dir / "volumes"

    def _dns_ready(self) -> bool:
        url = f"http://127.0.0.1:{self.ports['dns-ready']}/ready"
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
