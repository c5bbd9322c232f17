"""Command line: python -m payloadrun_devcluster {build,up,down,status,env,load-image,lws,kueue}.

    build       build the binaries that are missing (cluster/build.sh)
    up          start a detached cluster; prints the kubeconfig path and `export KUBECONFIG=...`
                (--node: and a node, so pods run; Linux and root)
    down        stop it (every process group; SIGTERM, then SIGKILL) and undo the node's
                changes to the host (bridge, iptables rules, sysctls, mounts)
    status      show each component and the API server's readiness (exit 1 when not healthy)
    env         print `export KUBECONFIG=... PATH=...`:
                eval "$(python -m payloadrun_devcluster env)"
    load-image  import docker-archive tarballs into the node (pods use imagePullPolicy Never)
    lws         install LeaderWorkerSet (upstream's config/default, webhooks on) on the node
    kueue       install Kueue (upstream's config/default, webhooks on, scoped to namespaces
                labelled payloadrun.dev/kueue-tests=true) on the node

The state directory (certificates, kubeconfig, logs, etcd data, pids) is --state-dir, or
$PAYLOADRUN_DEVCLUSTER_DIR, or $PAYLOADRUN_CACHE/devcluster (~/.cache/payloadrun/devcluster).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .addons import Addon, AddonError, AddonInstall
from .binaries import (
    CONTROL_PLANE_NAMES,
    NODE_NAMES,
    BinariesMissing,
    cache_dir,
    find_binaries,
    run_build,
)
from .certs import CertificateError
from .cluster import STATE_FILE, ClusterError, LocalCluster
from .images import ImageError
from .node import NodeError


def default_state_dir() -> Path:
    configured = os.environ.get("PAYLOADRUN_DEVCLUSTER_DIR")
    return Path(configured) if configured else cache_dir() / "devcluster"


def _say(message: str) -> None:
    print(
        f"[{time.strftime('%H:%M:%S')}] payloadrun_devcluster: {message}",
        file=sys.stderr,
        flush=True,
    )


def _exports(cluster: LocalCluster) -> str:
    dirs = os.pathsep.join(str(d) for d in cluster.binaries.directories)
    kubeconfig = shlex.quote(str(cluster.kubeconfig))
    return f'export KUBECONFIG={kubeconfig}\nexport PATH={shlex.quote(dirs)}:"$PATH"'


def cmd_build(args: argparse.Namespace) -> int:
    print(run_build())
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    if (state_dir / STATE_FILE).exists():
        existing = LocalCluster.attach(state_dir)
        if existing.healthy():
            _say(f"already running at {existing.server} (state {state_dir})")
            print(f"kubeconfig: {existing.kubeconfig}")
            print(_exports(existing))
            return 0
        _say(f"found a stale or unhealthy cluster in {state_dir}; stopping what is left of it")
        existing.stop()
    find_binaries(CONTROL_PLANE_NAMES + (NODE_NAMES if args.node else ()))
    what = "etcd, kube-apiserver, kube-controller-manager"
    if args.node:
        what += ", and a node (containerd, kubelet, kube-scheduler, kube-proxy, CoreDNS, "
        what += "kube-router)"
    _say(f"starting {what} (state {state_dir})")
    started = time.monotonic()
    cluster = LocalCluster(
        state_dir,
        detached=True,
        keep_state=True,
        startup_timeout=args.timeout,
        node=args.node,
    )
    cluster.start()
    _say(
        f"ready in {time.monotonic() - started:.1f}s at {cluster.server}; "
        f"logs in {state_dir}/*.log; stop with: python -m payloadrun_devcluster down"
    )
    print(f"kubeconfig: {cluster.kubeconfig}")
    print(_exports(cluster))
    return 0


def _running(state_dir: Path) -> LocalCluster | None:
    """The cluster recorded in ``state_dir``, or None (said on stderr) when there is none."""
    if not (state_dir / STATE_FILE).exists():
        _say(f"no cluster running in {state_dir} (no {STATE_FILE})")
        return None
    return LocalCluster.attach(state_dir)


def cmd_load_image(args: argparse.Namespace) -> int:
    cluster = _running(args.state_dir)
    if cluster is None:
        return 1
    for tarball in args.tarballs:
        if not tarball.is_file():
            _say(
                f"error: {tarball} is not a file (a docker-archive tarball, as docker save writes)"
            )
            return 1
    cluster.load_images(args.tarballs)
    for tarball in args.tarballs:
        _say(f"imported {tarball}")
    return 0


def cmd_lws(args: argparse.Namespace) -> int:
    from . import lws

    return _install_addon(args, lws.ADDON, lws.install)


def cmd_kueue(args: argparse.Namespace) -> int:
    from . import kueue

    code = _install_addon(args, kueue.ADDON, kueue.install)
    if code == 0:
        labels = ",".join(f"{k}={v}" for k, v in kueue.NAMESPACE_LABELS.items())
        _say(f"Kueue looks at namespaces labelled {labels} only")
    return code


def _install_addon(
    args: argparse.Namespace, addon: Addon, install: Callable[[LocalCluster], AddonInstall]
) -> int:
    """Install an add-on (:mod:`.addons`) on the running cluster's node and say how it went."""

    cluster = _running(args.state_dir)
    if cluster is None:
        return 1
    try:
        installed = install(cluster)
    except AddonError as error:
        _say(f"error: {error}")
        return 1
    _say(
        f"{addon.title} {installed.version} ({installed.image}) answers, "
        f"{installed.seconds:.1f} s: {installed.timings}"
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    cluster = _running(args.state_dir)
    if cluster is None:
        return 0
    cluster.stop()
    _say(f"stopped; logs kept in {args.state_dir}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    if not (state_dir / STATE_FILE).exists():
        print(f"not running (no {state_dir / STATE_FILE})")
        return 1
    cluster = LocalCluster.attach(state_dir)
    for name, running in cluster.component_status().items():
        process = cluster.processes.get(name)
        pid = process.pid if process else "-"
        print(f"{name:<24} {'running' if running else 'NOT RUNNING':<12} pid {pid}")
    healthy = cluster.healthy()
    print(f"{'api server':<24} {'ready' if healthy else 'NOT READY':<12} {cluster.server}")
    print(f"kubeconfig: {cluster.kubeconfig}")
    return 0 if healthy else 1


def cmd_env(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    if not (state_dir / STATE_FILE).exists():
        _say(
            f"no cluster running in {state_dir}; start one with: python -m payloadrun_devcluster up"
        )
        return 1
    print(_exports(LocalCluster.attach(state_dir)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m payloadrun_devcluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--state-dir", type=Path, default=default_state_dir(), help="default: %(default)s"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build missing binaries (cluster/build.sh)").set_defaults(
        func=cmd_build
    )
    up = commands.add_parser("up", help="start a detached cluster")
    up.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds to wait for readiness (default %(default)s)",
    )
    up.add_argument(
        "--node",
        action="store_true",
        help="also run a node (containerd, kubelet, kube-scheduler, kube-proxy, CoreDNS, "
        "kube-router enforcing NetworkPolicy, a bridge pod network on 198.18.0.0/24, Services "
        "on 198.19.0.0/16, a ReadWriteMany storage class 'standard'), so pods run; Linux and "
        "root only",
    )
    up.set_defaults(func=cmd_up)
    load = commands.add_parser("load-image", help="import image tarballs into the node")
    load.add_argument("tarballs", nargs="+", type=Path, help="docker-archive tarballs")
    load.set_defaults(func=cmd_load_image)
    commands.add_parser(
        "lws", help="install LeaderWorkerSet on the node (bash cluster/build.sh builds it)"
    ).set_defaults(func=cmd_lws)
    commands.add_parser(
        "kueue", help="install Kueue on the node (bash cluster/build.sh builds it)"
    ).set_defaults(func=cmd_kueue)
    commands.add_parser("down", help="stop the cluster").set_defaults(func=cmd_down)
    commands.add_parser("status", help="show component status").set_defaults(func=cmd_status)
    commands.add_parser("env", help="print export lines for KUBECONFIG and PATH").set_defaults(
        func=cmd_env
    )
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (BinariesMissing, ClusterError, CertificateError, NodeError, ImageError) as error:
        _say(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        _say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
