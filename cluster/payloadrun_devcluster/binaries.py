"""Where the control-plane binaries built by ``cluster/build.sh`` live.

The layout is keyed by the versions pinned in ``cluster/versions.env``::

    $PAYLOADRUN_CACHE/bin/kubernetes-<v>/{kube-apiserver,kube-controller-manager,kubectl,
                                         kubelet,kube-scheduler,kube-proxy}
    $PAYLOADRUN_CACHE/bin/etcd-<v>/etcd
    $PAYLOADRUN_CACHE/bin/helm-<v>/helm
    $PAYLOADRUN_CACHE/bin/coredns-<v>/coredns
    $PAYLOADRUN_CACHE/bin/kube-router-<v>/kube-router
    $PAYLOADRUN_CACHE/bin/lws-<v>/{manager,config/}   (LeaderWorkerSet: :mod:`.lws`, not here)
    $PAYLOADRUN_CACHE/bin/kueue-<v>/{manager,config/} (Kueue: :mod:`.kueue`, not here)

``PAYLOADRUN_CLUSTER_BIN`` overrides all of it with one directory holding every binary.
``PAYLOADRUN_KUBERNETES_VERSION`` (:data:`VERSION_ENV`) picks another built Kubernetes for the
control plane (kube-apiserver and kube-controller-manager): ``KUBERNETES_OLDEST_VERSION``, the
oldest the project claims; everything else stays at the pinned versions, and no node runs on it
(:func:`node_version_skew`).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

CLUSTER_DIR = Path(__file__).resolve().parent.parent
"""The repository's ``cluster/`` directory (holds ``versions.env`` and ``build.sh``)."""

BINARY_NAMES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
    "helm",
    "kubelet",
    "kube-scheduler",
    "kube-proxy",
    "coredns",
    "kube-router",
)
CONTROL_PLANE_NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
"""What a running control plane (and its tests) need; helm is only for charts."""
NODE_NAMES = ("kubelet", "kube-scheduler", "kube-proxy", "coredns", "kube-router")
"""What the node beside it adds (containerd and runc come from the machine's packages);
kube-router is its NetworkPolicy enforcer."""
BUILD_HINT = "run: bash cluster/build.sh  (or: python -m payloadrun_devcluster build)"
OLDEST_BUILD_HINT = (
    "run: bash cluster/build.sh --oldest  (the oldest Kubernetes' control plane, which the "
    "default build leaves out), and bash cluster/build.sh for the rest"
)
VERSION_ENV = "PAYLOADRUN_KUBERNETES_VERSION"
"""The Kubernetes version of the control plane, when not the pinned ``KUBERNETES_VERSION``."""


class BinariesMissing(RuntimeError):
    """The control-plane binaries are not built (or not where the versions say)."""


def cache_dir() -> Path:
    """The cache root shared with ``build.sh``."""
    root = os.environ.get("PAYLOADRUN_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "payloadrun"


def versions_file() -> Path:
    return Path(os.environ.get("PAYLOADRUN_CLUSTER_VERSIONS", CLUSTER_DIR / "versions.env"))


def build_script() -> Path:
    return CLUSTER_DIR / "build.sh"


_LINE = re.compile(r"^\s*([A-Z][A-Z0-9_]*)=(.*?)\s*$")


def read_versions(path: Path | None = None) -> dict[str, str]:
    """Parse the ``KEY=VALUE`` lines of ``versions.env`` (comments and blanks ignored)."""
    path = path or versions_file()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BinariesMissing(
            f"pinned versions file {path} not found; set PAYLOADRUN_CLUSTER_VERSIONS to the "
            "repository's cluster/versions.env, or PAYLOADRUN_CLUSTER_BIN to a directory of "
            "binaries"
        ) from None
    versions: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            versions[match.group(1)] = match.group(2).strip("'\"")
    for key in (
        "KUBERNETES_VERSION",
        "ETCD_VERSION",
        "HELM_VERSION",
        "COREDNS_VERSION",
        "KUBE_ROUTER_VERSION",
    ):
        if not versions.get(key):
            raise BinariesMissing(f"{path} does not set {key}")
    return versions


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the binaries one cluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path
    helm: Path
    kubelet: Path
    kube_scheduler: Path
    kube_proxy: Path
    coredns: Path
    kube_router: Path

    def path(self, name: str) -> Path:
        return getattr(self, name.replace("-", "_"))

    @property
    def directories(self) -> list[Path]:
        """Distinct directories, for prepending to ``PATH``."""
        seen: list[Path] = []
        for name in BINARY_NAMES:
            directory = self.path(name).parent
            if directory not in seen:
                seen.append(directory)
        return seen


def expected_binaries(versions: dict[str, str] | None = None) -> Binaries:
    """Where the binaries should be, whether or not they exist."""
    override = os.environ.get("PAYLOADRUN_CLUSTER_BIN")
    if override:
        base = Path(override)
        return Binaries(*(base / name for name in BINARY_NAMES))
    versions = versions or read_versions()
    bin_root = cache_dir() / "bin"
    k8s = bin_root / f"kubernetes-{versions['KUBERNETES_VERSION']}"
    control_plane = bin_root / f"kubernetes-{control_plane_version(versions)}"
    return Binaries(
        etcd=bin_root / f"etcd-{versions['ETCD_VERSION']}" / "etcd",
        kube_apiserver=control_plane / "kube-apiserver",
        kube_controller_manager=control_plane / "kube-controller-manager",
        kubectl=k8s / "kubectl",
        helm=bin_root / f"helm-{versions['HELM_VERSION']}" / "helm",
        kubelet=k8s / "kubelet",
        kube_scheduler=k8s / "kube-scheduler",
        kube_proxy=k8s / "kube-proxy",
        coredns=bin_root / f"coredns-{versions['COREDNS_VERSION']}" / "coredns",
        kube_router=bin_root / f"kube-router-{versions['KUBE_ROUTER_VERSION']}" / "kube-router",
    )


def control_plane_version(versions: dict[str, str]) -> str:
    """The Kubernetes version of the control plane: :data:`VERSION_ENV` when set (one that
    ``cluster/build.sh`` builds), else the pinned ``KUBERNETES_VERSION``."""
    asked = os.environ.get(VERSION_ENV, "").strip()
    built = [versions["KUBERNETES_VERSION"], versions.get("KUBERNETES_OLDEST_VERSION", "")]
    if not asked:
        return built[0]
    if asked not in built:
        raise BinariesMissing(
            f"{VERSION_ENV}={asked} is not a Kubernetes version cluster/build.sh builds; give "
            f"one of {', '.join(v for v in built if v)} (cluster/versions.env's "
            "KUBERNETES_VERSION and KUBERNETES_OLDEST_VERSION), or unset it"
        )
    return asked


def pinned_control_plane(versions: dict[str, str] | None = None) -> bool:
    """Whether the control plane is the pinned ``KUBERNETES_VERSION`` (the API server whose
    words the operator's own messages repeat), not another one :data:`VERSION_ENV` picked."""
    versions = versions or read_versions()
    return control_plane_version(versions) == versions["KUBERNETES_VERSION"]


def node_version_skew(versions: dict[str, str] | None = None) -> str | None:
    """Why no node may join this control plane, or None: a kubelet must not be newer than its
    API server (Kubernetes' version skew policy), and the node's are the pinned version's."""
    if os.environ.get("PAYLOADRUN_CLUSTER_BIN"):
        return None
    versions = versions or read_versions()
    if pinned_control_plane(versions):
        return None
    return (
        f"the control plane is Kubernetes {control_plane_version(versions)} ({VERSION_ENV}), "
        "older than the node's "
        f"kubelet {versions['KUBERNETES_VERSION']}: a kubelet must not be newer than its API server"
    )


def missing_binaries(binaries: Binaries) -> list[Path]:
    return [
        binaries.path(name) for name in BINARY_NAMES if not os.access(binaries.path(name), os.X_OK)
    ]


def find_binaries(required: tuple[str, ...] = BINARY_NAMES) -> Binaries:
    """The built binaries, or :class:`BinariesMissing` naming what is missing and what to do."""
    binaries = expected_binaries()
    missing = [
        binaries.path(name) for name in required if not os.access(binaries.path(name), os.X_OK)
    ]
    if missing:
        listed = ", ".join(str(p) for p in missing)
        hint = BUILD_HINT if pinned_control_plane() else OLDEST_BUILD_HINT
        raise BinariesMissing(f"control-plane binaries not built: {listed}; {hint}")
    return binaries


def run_build(extra_env: dict[str, str] | None = None) -> Path:
    """Run ``cluster/build.sh`` (progress on stderr) and return the binary directory it printed."""
    script = build_script()
    if not script.is_file():
        raise BinariesMissing(f"{script} not found: the build needs the repository checkout")
    env = dict(os.environ, **(extra_env or {}))
    result = subprocess.run(
        ["bash", str(script)], stdout=subprocess.PIPE, text=True, env=env, check=False
    )
    if result.returncode != 0:
        raise BinariesMissing(
            f"{script} failed with exit code {result.returncode} (its output is above)"
        )
    return Path(result.stdout.strip().splitlines()[-1])
