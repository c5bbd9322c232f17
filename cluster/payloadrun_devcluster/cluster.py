"""A real Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager; optionally a
node beside it (``node=True``: containerd, kubelet, kube-scheduler, kube-proxy, CoreDNS,
kube-router for NetworkPolicy; see ``node.py``) so that pods run.

Without a node everything listens on loopback and pods are stored but never run; everything that
lives in the API server (CRDs and their CEL validation, RBAC, admission, owner-reference garbage
collection, service accounts and their tokens) is the real thing. With a node the API server
listens on the node address instead (198.18.0.1, on the node's bridge: pods must reach it).

    with LocalCluster() as cluster:
        subprocess.run([cluster.binaries.kubectl, "--kubeconfig", cluster.kubeconfig, "get", "ns"])
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import node as node_module
from .api import api_request
from .binaries import CONTROL_PLANE_NAMES, NODE_NAMES, Binaries, find_binaries
from .certs import ClusterPKI, generate_pki
from .node import (
    KUBERNETES_SERVICE_IP,
    NODE_COMPONENTS,
    NODE_IP,
    SERVICE_SUBNET,
    LocalNode,
)
from .processes import InBackground, ManagedProcess

# In 198.18.0.0/15 (RFC 2544, benchmarking), which no real network routes: no collision.
SERVICE_CLUSTER_IP_RANGE = SERVICE_SUBNET
SERVICE_CLUSTER_FIRST_IP = KUBERNETES_SERVICE_IP  # the "kubernetes" Service; in the serving cert
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
CLUSTER_NAME = "payloadrun-dev"
ADMIN_USER = "payloadrun-admin"
STATE_FILE = "state.json"
STARTUP_LOG = "startup.log"  # when each step of the last start was done: where its time went
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager")
# the node's processes that are clients of the API server (all but containerd)
NODE_CLIENTS = ("kube-router", "provisioner", "coredns", "kube-proxy", "kube-scheduler", "kubelet")


class ClusterError(RuntimeError):
    """The control plane failed to start, stop or answer."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that are free right now (the kernel picks)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))  # all bound at once, so no port is handed out twice
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _b64_file(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig_document(
    server: str, ca_cert: Path, user: dict, user_name: str, namespace: str = "default"
) -> dict:
    """A kubeconfig as a dict; written as JSON, which is valid YAML for every Kubernetes client."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": _b64_file(ca_cert)},
            }
        ],
        "users": [{"name": user_name, "user": user}],
        "contexts": [
            {
                "name": f"{user_name}@{CLUSTER_NAME}",
                "context": {"cluster": CLUSTER_NAME, "user": user_name, "namespace": namespace},
            }
        ],
        "current-context": f"{user_name}@{CLUSTER_NAME}",
        "preferences": {},
    }


def write_private(path: Path, text: str) -> None:
    """Write a file readable only by its owner (kubeconfigs carry credentials)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _node_still_running(node_dir: Path) -> bool:
    """Whether the cluster that owns ``node_dir`` has a live process (its state.json says)."""
    try:
        data = json.loads((node_dir.parent / STATE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return any(ManagedProcess.from_json(p).running() for p in data.get("processes", []))


def running_node_state_dir() -> Path | None:
    """The state directory of the local cluster whose node runs on this machine, if one does.

    A node that crashed or was killed leaves its owner record behind; that one does not count
    (the next cluster to start a node cleans up after it).
    """
    owner = node_module.running_node_owner()
    if owner and _node_still_running(Path(owner)):
        return Path(owner).parent
    return None


def crd_list_paths(crd: Mapping[str, Any]) -> list[str]:
    """The list path of each version a CustomResourceDefinition serves, cluster-wide."""
    spec = crd["spec"]
    return [
        f"/apis/{spec['group']}/{version['name']}/{spec['names']['plural']}"
        for version in spec.get("versions") or []
        if version.get("served")
    ]


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager (+ a node), in a state directory.

    ``state_dir`` holds certificates, kubeconfigs, etcd's data, each component's log
    (``<component>.log``) and ``state.json`` (pids, ports). Without one, a temporary directory is
    made and removed on :meth:`stop` unless ``keep_state`` is true.

    ``detached=False`` (default): the processes die with this Python process (atexit cleanup
    plus ``PR_SET_PDEATHSIG``). ``detached=True``: they outlive it, for ``up``/``down``.

    ``node=True``: a node runs beside the control plane (Linux, root; see
    :func:`node_unsupported_reason`), and :meth:`load_image` imports images into it.

    ``extra_args``: flags appended to a control-plane component's own, by component name, e.g.
    ``{"kube-apiserver": ["--audit-policy-file=..."]}`` (bench/operator.py counts the
    operator's requests from an audit log, and plays some controllers itself).
    """

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        binaries: Binaries | None = None,
        detached: bool = False,
        keep_state: bool | None = None,
        startup_timeout: float = 180.0,
        verbosity: int = 1,
        node: bool = False,
        extra_args: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        unknown = set(extra_args or {}) - set(COMPONENTS)
        if unknown:
            raise ValueError(
                f"extra_args for {sorted(unknown)}: only the control plane's {COMPONENTS} take them"
            )
        self.extra_args = {name: list(args) for name, args in (extra_args or {}).items()}
        self._owns_state_dir = state_dir is None
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.keep_state = (not self._owns_state_dir) if keep_state is None else keep_state
        self._binaries = binaries
        self.detached = detached
        self.startup_timeout = startup_timeout
        self.verbosity = verbosity
        self.processes: dict[str, ManagedProcess] = {}
        self.ports: dict[str, int] = {}
        self._pki: ClusterPKI | None = None
        self._atexit_registered = False
        self.with_node = node
        self.host = NODE_IP if node else "127.0.0.1"
        self._node: LocalNode | None = None
        self._node_pki: node_module.NodePKI | None = None
        self._runtime: list[InBackground] = []  # the node's start that needs no API server
        self._started_at = time.monotonic()

    # ---- paths and addresses -------------------------------------------------------------
    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            required = CONTROL_PLANE_NAMES + (NODE_NAMES if self.with_node else ())
            self._binaries = find_binaries(required)
        return self._binaries

    def _require_state_dir(self) -> Path:
        if self.state_dir is None:
            raise ClusterError("the cluster has no state directory yet: call start() first")
        return self.state_dir

    @property
    def pki_dir(self) -> Path:
        return self._require_state_dir() / "pki"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (client certificate in group system:masters)."""
        return self._require_state_dir() / "admin.kubeconfig"

    @property
    def server(self) -> str:
        if "apiserver" not in self.ports:
            raise ClusterError("the cluster is not started: no API server address yet")
        return f"https://{self.host}:{self.ports['apiserver']}"

    @property
    def ca_cert(self) -> Path:
        return self.pki_dir / "ca.crt"

    @property
    def admin_cert(self) -> Path:
        return self.pki_dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.pki_dir / "admin.key"

    @property
    def node(self) -> LocalNode:
        if self._node is None:
            raise ClusterError("this cluster runs no node (start it with node=True / up --node)")
        return self._node

    @property
    def node_dir(self) -> Path:
        return self._require_state_dir() / "node"

    def load_image(self, tarball: Path | str) -> None:
        """Import a docker-archive tarball into the node, for pods with imagePullPolicy Never."""
        self.node.load_image(Path(tarball))

    def load_images(self, tarballs: Sequence[Path | str]) -> None:
        """Import docker-archive tarballs into the node, all at once (see
        :meth:`LocalNode.load_images <payloadrun_devcluster.node.LocalNode.load_images>`)."""
        self.node.load_images([Path(t) for t in tarballs])

    @property
    def etcd_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd']}"

    def env(self) -> dict[str, str]:
        """Variables that point kubectl/helm at this cluster: KUBECONFIG and PATH."""
        path = os.pathsep.join(
            [*(str(d) for d in self.binaries.directories), os.environ.get("PATH", "")]
        )
        return {"KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | str | None = None,
        input: str | None = None,
        check: bool = False,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster (admin unless ``kubeconfig`` is given).

        Discovery is cached in the state directory, never in ``~/.kube``.
        """
        command = [
            str(self.binaries.kubectl),
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            f"--cache-dir={self._require_state_dir() / 'kubectl-cache'}",
            *args,
        ]
        return subprocess.run(
            command, input=input, capture_output=True, text=True, check=check, timeout=timeout
        )

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        """Wait until the CustomResourceDefinition ``crd`` serves its resources: Established, and
        a list of every served version answered from the API server's watch cache.

        ``kubectl wait --for=condition=Established`` fails at once, instead of waiting, while a
        new CRD has no conditions yet (a large schema takes about 2 s to install). An established
        CRD's storage is made on its first request and its cache fills after it: until then a
        list without a limit answers 429 "storage is (re)initializing", and so does the CRD
        finalizer's own list when the CRD is deleted before anyone asked for its resources (the
        finalizer then retries with a growing back-off, which took more than a minute on a busy
        machine).
        """
        deadline = time.monotonic() + timeout
        while True:
            result = self.kubectl("get", "crd", crd, "-o", "json")
            if result.returncode == 0:
                found = json.loads(result.stdout)
                conditions = found.get("status", {}).get("conditions") or []
                if any(
                    c.get("type") == "Established" and c.get("status") == "True" for c in conditions
                ) and all(self._get_status(path) == 200 for path in crd_list_paths(found)):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"CustomResourceDefinition {crd} was not Established and listed within "
                    f"{timeout} s: {result.stdout or result.stderr}"[:2000]
                )
            time.sleep(0.2)

    def delete_crd(self, crd: str, timeout: float = 60.0) -> None:
        """Delete the CustomResourceDefinition ``crd`` and wait until it is gone (its instances
        with it). Its storage is made ready first (:meth:`wait_established`), so the CRD
        finalizer's list of the instances succeeds the first time."""
        if self.kubectl("get", "crd", crd).returncode != 0:
            return
        self.wait_established(crd, timeout=timeout)
        deleted = self.kubectl("delete", "crd", crd, "--wait=true", f"--timeout={timeout:.0f}s")
        if deleted.returncode != 0:
            left = self.kubectl("get", "crd", crd, "-o", "jsonpath={.status.conditions}")
            raise TimeoutError(
                f"CustomResourceDefinition {crd} was not deleted within {timeout:.0f} s: "
                f"{deleted.stderr.strip()}; its conditions: {left.stdout or left.stderr}"[:2000]
            )

    # ---- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        """Start all components and wait until the API is ready.

        On any failure (or KeyboardInterrupt) everything started so far is stopped first.
        """
        binaries = self.binaries  # fail early, with the build hint, when something is missing
        if self.state_dir is None:
            self.state_dir = Path(tempfile.mkdtemp(prefix="payloadrun-devcluster-"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.with_node:
            self._prepare_node_host()
        if not self.detached and not self._atexit_registered:
            atexit.register(self._stop_quietly)
            self._atexit_registered = True
        extra_ips = (NODE_IP,) if self.with_node else ()
        self._pki = generate_pki(self.pki_dir, SERVICE_CLUSTER_FIRST_IP, extra_ips)
        if self.with_node:  # the API server's kubelet client certificate is among them
            self._node_pki = node_module.generate_node_pki(self._pki)
        attempts = 3
        for attempt in range(1, attempts + 1):
            try:
                if attempt > 1 and self.with_node:
                    # the failed attempt's _abort_start tore the host down (the bridge and the
                    # node address with it): without it the API server cannot bind the node
                    # address ("cannot assign requested address"), as make test saw when a
                    # kube-router port was taken by another part's cluster starting at once
                    node_module.prepare_host(self.node_dir)
                self._start_once(binaries)
                return self
            except ClusterError as error:
                port_clash = "address already in use" in str(error)
                self._abort_start()
                if port_clash and attempt < attempts:
                    continue  # another process took a port between our probe and the bind
                raise
            except BaseException:
                self._abort_start()  # KeyboardInterrupt during startup leaves nothing behind
                raise
        raise AssertionError("unreachable")

    def _prepare_node_host(self) -> None:
        """Refuse a second node on this machine; clean up after a crashed one; set up the host."""
        reason = node_module.node_unsupported_reason(self.binaries)
        if reason:
            raise ClusterError(f"cannot run a node here: {reason}")
        owner = node_module.running_node_owner()
        other = running_node_state_dir()
        if other is not None and other != self.node_dir.parent:
            raise ClusterError(
                f"a node of another local cluster (state {other}) runs on this machine; only "
                f"one can: stop it with python -m payloadrun_devcluster --state-dir {other} down"
            )
        # whatever a crashed earlier node left behind (its own or another state dir's)
        for stale in {self.node_dir, *([Path(owner)] if owner else [])}:
            node_module.teardown_host(stale)
        node_module.prepare_host(self.node_dir)

    def _abort_start(self) -> None:
        for part in self._runtime:  # before the host's teardown deletes what they make
            part.cancel()
        self._runtime = []
        self._stop_processes()
        (self._require_state_dir() / STATE_FILE).unlink(missing_ok=True)
        self.keep_state = True  # the error message points at the logs in it

    def _start_once(self, binaries: Binaries) -> None:
        state = self._require_state_dir()
        names = ("etcd", "etcd-peer", "apiserver", "controller-manager")
        if self.with_node:
            names += node_module.PORT_NAMES
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        etcd_data = state / "etcd"
        if etcd_data.exists():
            shutil.rmtree(etcd_data)
        self._write_kubeconfigs()

        self._started_at = time.monotonic()
        (state / STARTUP_LOG).write_text("")
        if self.with_node:
            # containerd, its sandbox image and the shared volume need no API server: begun
            # first, they are ready by the time it is
            self._node = LocalNode(self.node_dir, binaries, die_with_parent=not self.detached)
            self._runtime = self._node.start_runtime(spawn=self._spawn, record=self._record)

        self._spawn("etcd", [str(binaries.etcd), *self._etcd_args(etcd_data)])
        self._wait("etcd /health", self._etcd_healthy, timeout=30)

        self._spawn("kube-apiserver", [str(binaries.kube_apiserver), *self._apiserver_args()])
        self._wait(
            "kube-apiserver /readyz",
            lambda: self._get_status("/readyz") == 200,
            timeout=self.startup_timeout,
        )

        self._spawn(
            "kube-controller-manager",
            [str(binaries.kube_controller_manager), *self._controller_manager_args()],
        )
        if self._node is not None:
            # the node's components need the API server, not the controller manager: they
            # start beside it
            self._node.start(
                server=self.server,
                pki=self._pki_or_raise(),
                node_pki=self._node_pki,
                ports=self.ports,
                runtime=self._runtime,
                spawn=self._spawn,
                wait=lambda what, check, timeout: self._wait(what, check, timeout=timeout),
                api=self.request,
            )
        self._wait("kube-controller-manager /healthz", self._controller_manager_healthy, timeout=60)
        self._wait(
            "the default service account (made by the serviceaccount controller)",
            lambda: self._get_status("/api/v1/namespaces/default/serviceaccounts/default") == 200,
            timeout=60,
        )
        self._write_state()

    def stop(self) -> None:
        """Stop every component (whole process groups; SIGTERM, then SIGKILL) and clean up."""
        if self.state_dir is not None and not self.processes:
            self._load_state_processes()
        errors = self._stop_processes()
        if self._atexit_registered:
            atexit.unregister(self._stop_quietly)
            self._atexit_registered = False
        if self.state_dir is not None and not errors:
            (self.state_dir / STATE_FILE).unlink(missing_ok=True)
            # etcd preallocates ~120 MB of WAL; the certificates and logs are what a
            # post-mortem needs, and a new start wipes the data anyway.
            shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
            if self._owns_state_dir and not self.keep_state:
                shutil.rmtree(self.state_dir, ignore_errors=True)
        if errors:
            raise ClusterError("; ".join(errors))

    def _stop_quietly(self) -> None:
        try:
            self.stop()
        except Exception as error:  # atexit: report, never raise
            print(f"payloadrun_devcluster: cleanup failed: {error}", flush=True)

    def _stop_processes(self) -> list[str]:
        errors: list[str] = []
        # The node first (kubelet before containerd), then the control plane's clients, etcd
        # last so the API server can shut down cleanly. Each step's processes stop together:
        # none waits for another's shutdown.
        errors.extend(self._stop_together(NODE_CLIENTS, grace=5.0))
        node = self.with_node and self.state_dir is not None
        if node:
            # containers and shims die before containerd
            node_module.kill_pod_processes()
            errors.extend(self._stop_together(("containerd",), grace=5.0))
        errors.extend(self._stop_together(("kube-controller-manager", "kube-apiserver"), 10.0))
        if node:
            # mounts, rules, bridge, sysctls: after the API server, which deletes its own
            # Lease through its advertised address (the bridge's) as it stops, and waited 10 s
            # for an address already gone
            errors.extend(node_module.teardown_host(self.node_dir))
        errors.extend(self._stop_together(("etcd",), grace=10.0))
        self.processes = {}
        return errors

    def _stop_together(self, names: Sequence[str], grace: float) -> list[str]:
        """SIGTERM each of ``names`` at once, then wait for each (SIGKILL after ``grace``)."""
        stopping = []
        errors = []
        for name in names:
            process = self.processes.get(name)
            try:
                if process is not None and process.terminate():
                    stopping.append((name, process))
            except Exception as error:
                errors.append(f"stopping {name}: {error}")
        for name, process in stopping:
            try:
                process.wait_or_kill(grace)
            except Exception as error:
                errors.append(f"stopping {name}: {error}")
        return errors

    # ---- attach to a detached cluster ------------------------------------------------------
    @classmethod
    def attach(cls, state_dir: Path | str, binaries: Binaries | None = None) -> LocalCluster:
        """The cluster recorded in ``state_dir/state.json`` (as written by a detached start)."""
        cluster = cls(state_dir, binaries=binaries, detached=True, keep_state=True)
        if not cluster._load_state_processes():
            raise ClusterError(
                f"no cluster state in {state_dir} (no {STATE_FILE}); "
                "start one with: python -m payloadrun_devcluster up"
            )
        return cluster

    def _load_state_processes(self) -> bool:
        path = self._require_state_dir() / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return False
        self.ports = {k: int(v) for k, v in data["ports"].items()}
        self.processes = {p["name"]: ManagedProcess.from_json(p) for p in data["processes"]}
        self.with_node = bool(data.get("node", False))
        self.host = data.get("host", self.host)
        if self.with_node:
            self._node = LocalNode(self.node_dir, self.binaries, die_with_parent=False)
            self._node.ports = {name: self.ports[name] for name in node_module.PORT_NAMES}
        return True

    def _write_state(self) -> None:
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "ports": self.ports,
            "detached": self.detached,
            "node": self.with_node,
            "host": self.host,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "processes": [p.to_json() for p in self.processes.values()],
        }
        path = self._require_state_dir() / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(path)

    def component_status(self) -> dict[str, bool]:
        """Whether each component's recorded process is still running."""
        names = COMPONENTS + (NODE_COMPONENTS if self.with_node else ())
        return {name: (name in self.processes and self.processes[name].running()) for name in names}

    def healthy(self) -> bool:
        try:
            return all(self.component_status().values()) and self._get_status("/readyz") == 200
        except Exception:
            return False

    # ---- processes -----------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> ManagedProcess:
        state = self._require_state_dir()
        args = [*args, *self.extra_args.get(name, ())]
        process = ManagedProcess.spawn(
            name, args, state / f"{name}.log", cwd=state, die_with_parent=not self.detached
        )
        self.processes[name] = process
        self._write_state_partial()
        self._record(f"{name} spawned")
        return process

    def _write_state_partial(self) -> None:
        # Recorded as soon as a process exists, so `down` can stop a half-started cluster.
        path = self._require_state_dir() / STATE_FILE
        data = {
            "ports": self.ports,
            "processes": [p.to_json() for p in self.processes.values()],
            "node": self.with_node,
            "host": self.host,
            "partial": True,
        }
        path.write_text(json.dumps(data, indent=2) + "\n")

    def _etcd_args(self, data_dir: Path) -> list[str]:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        return [
            "--name=payloadrun-dev",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=payloadrun-dev={peer}",
            "--initial-cluster-state=new",
            # A throwaway test database: skipping fsync makes every API write much faster.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        pki = self._pki_or_raise()
        state = self._require_state_dir()
        return [
            f"--etcd-servers={self.etcd_endpoint}",
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
            f"--secure-port={self.ports['apiserver']}",
            f"--cert-dir={state / 'apiserver-certs'}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            f"--v={self.verbosity}",
            *(
                self._apiserver_node_args()
                if self.with_node
                else [
                    # No node address: a loopback endpoint for the "kubernetes" Service is
                    # invalid, so do not reconcile it.
                    "--endpoint-reconciler-type=none",
                ]
            ),
        ]

    def _apiserver_node_args(self) -> list[str]:
        pki = self._pki_or_raise()
        node_pki = self.pki_dir
        return [
            # kubelets limited to their own node's objects, as in every real cluster
            "--enable-admission-plugins=NodeRestriction",
            # calls to the kubelet (exec, logs, proxy): a client certificate, and the kubelet's
            # serving certificate checked against the cluster CA
            f"--kubelet-client-certificate={node_pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={node_pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def _controller_manager_args(self) -> list[str]:
        pki = self._pki_or_raise()
        state = self._require_state_dir()
        kubeconfig = state / "controller-manager.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['controller-manager']}",
            f"--cert-dir={state / 'controller-manager-certs'}",
            "--leader-elect=false",
            "--controllers=*",
            # Each controller (garbage collector, serviceaccount, ...) runs as its own service
            # account with the bootstrap RBAC roles, as in kubeadm clusters.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.ca_cert}",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            f"--v={self.verbosity}",
        ]

    def _pki_or_raise(self) -> ClusterPKI:
        if self._pki is None:
            raise ClusterError("certificates not generated: call start()")
        return self._pki

    def _write_kubeconfigs(self) -> None:
        pki = self._pki_or_raise()
        state = self._require_state_dir()
        admin = kubeconfig_document(
            self.server,
            pki.ca_cert,
            {
                "client-certificate-data": _b64_file(pki.admin_cert),
                "client-key-data": _b64_file(pki.admin_key),
            },
            ADMIN_USER,
        )
        write_private(self.kubeconfig, json.dumps(admin, indent=2) + "\n")
        kcm = kubeconfig_document(
            self.server,
            pki.ca_cert,
            {
                "client-certificate-data": _b64_file(pki.controller_manager_cert),
                "client-key-data": _b64_file(pki.controller_manager_key),
            },
            "system:kube-controller-manager",
            namespace="kube-system",
        )
        write_private(state / "controller-manager.kubeconfig", json.dumps(kcm, indent=2) + "\n")

    # ---- waiting ---------------------------------------------------------------------------
    def _record(self, done: str) -> None:
        """A line of ``startup.log``: seconds since the start began, and what was done then
        (one write per line: the node's threads record too)."""
        line = f"{time.monotonic() - self._started_at:7.2f} s  {done}\n"
        with open(self._require_state_dir() / STARTUP_LOG, "a") as log:
            log.write(line)

    def _wait(
        self, what: str, check: Callable[[], bool], timeout: float, interval: float = 0.1
    ) -> None:
        began = time.monotonic()
        deadline = began + timeout
        last_error: Exception | None = None
        while True:
            self._raise_if_any_died(what)
            try:
                if check():
                    self._record(f"{what} (waited {time.monotonic() - began:.2f} s)")
                    return
                last_error = None
            except Exception as error:  # not up yet: connection refused, TLS handshake, 5xx...
                last_error = error
            if time.monotonic() > deadline:
                detail = f" (last error: {last_error})" if last_error else ""
                raise ClusterError(
                    f"timed out after {timeout:.0f}s waiting for {what}{detail}\n"
                    + self._log_tails()
                )
            time.sleep(interval)

    def _raise_if_any_died(self, waiting_for: str) -> None:
        for name, process in list(self.processes.items()):
            if not process.running():
                code = process.exit_code()
                raise ClusterError(
                    f"{name} exited (code {code}) while waiting for {waiting_for}; "
                    f"its log is {process.log_path}:\n{self._log_tails([name])}"
                )

    def _log_tails(self, names: list[str] | None = None, lines: int = 30) -> str:
        parts = []
        for name in names or list(self.processes):
            process = self.processes.get(name)
            if process is not None:
                parts.append(
                    f"--- last {lines} lines of {process.log_path} ---\n{process.log_tail(lines)}"
                )
        return "\n".join(parts)

    def _etcd_healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.etcd_endpoint}/health", timeout=2) as response:
            return json.loads(response.read()).get("health") == "true"

    def _controller_manager_healthy(self) -> bool:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # self-signed serving cert; only /healthz is read
        url = f"https://127.0.0.1:{self.ports['controller-manager']}/healthz"
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return response.status == 200

    # ---- talking to the API as admin -----------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        context.load_cert_chain(str(self.admin_cert), str(self.admin_key))
        return context

    def request(
        self, method: str, path: str, body: dict | None = None, timeout: float = 10.0
    ) -> tuple[int, dict]:
        """An admin API call; returns (HTTP status, decoded JSON body or {})."""
        return api_request(self.server, self._ssl_context(), method, path, body, timeout)

    def _get_status(self, path: str) -> int:
        return self.request("GET", path, timeout=5)[0]

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        path: Path | str | None = None,
        expiration_seconds: int = 3600,
    ) -> Path:
        """Mint a token for service account ``namespace/name`` and write a kubeconfig with it.

        The service account must exist. Returns the kubeconfig path (default:
        ``<state_dir>/sa-<namespace>-<name>.kubeconfig``).
        """
        status, body = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
        if status != 201:
            raise ClusterError(
                f"TokenRequest for service account {namespace}/{name} failed with HTTP {status}: "
                f"{body.get('message', body)}"
            )
        token = body["status"]["token"]
        target = (
            Path(path) if path else self._require_state_dir() / f"sa-{namespace}-{name}.kubeconfig"
        )
        document = kubeconfig_document(
            self.server,
            self.ca_cert,
            {"token": token},
            f"system:serviceaccount:{namespace}:{name}",
            namespace,
        )
        write_private(target, json.dumps(document, indent=2) + "\n")
        return target
