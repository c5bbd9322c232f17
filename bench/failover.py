"""Operator failover with real pods: the chart's two operator pods on the local node (root).

The chart is installed as a user would (``hack/install-chart.sh``, ``operator.replicas=2``, the
images built here) with its default election timing (lease 15 s, renew deadline 10 s, retry
2 s). Through each failover, a run is created every 0.5 s for 25 s (the lease and 10 s more), and
the figure is the longest any of them waited to be reconciled (create -> ``observedGeneration``,
which the operator writes only after the run's last child): how long the operator was away, as a
user sees it. Each round has four parts:

- leader up (the baseline): 3 s of runs with nothing failing;
- pod deleted: the leader's pod force-deleted (``kubectl delete pod --force --grace-period=0``,
  what an eviction or ``kubectl delete`` does: the kubelet stops the container with SIGTERM, and
  the operator releases the Lease as it stops);
- frozen: the leader's process stopped (SIGSTOP; a leader cut off from the API server, or a
  node gone): it keeps the Lease without renewing it, so the standby takes it only once it has
  not changed for the lease's duration; then SIGCONT, and the old leader finds its lease lost
  and exits (its pod restarts it);
- killed: the leader's process SIGKILLed (an OOM kill): no release; the kubelet restarts the
  container, which takes its own Lease back at once (same pod, same identity) unless the standby
  was first.

Between parts, two ready operator pods and a leader again. The runs are suspended
(``spec.suspend``), so they have every child but no pods: the figure is the operator's, not the
node's. The goal is at most the lease duration + 5 s, with no duplicate child. About 6 minutes on
2 vCPUs once the images and the node are up.

    sudo python bench/failover.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from payloadrun_devcluster import node_unsupported_reason, running_node_state_dir
from payloadrun_devcluster.binaries import BinariesMissing, find_binaries
from payloadrun_devcluster.cluster import LocalCluster
from report import Goal, print_goals, print_load

REPO = Path(__file__).resolve().parents[1]
SYSTEM_NS = "payloadrun-system"
RUNS_NS = "payloadrun-failover"
LEASE = "payloadrun"  # the chart's fullname for the release hack/install-chart.sh installs
OPERATOR_PODS = "app.kubernetes.io/name=payloadrun-operator"
LEASE_SECONDS = 15  # the chart's operator.leaderElection.leaseDuration
STREAM_SPACING = 0.5  # seconds between two runs created through a failover
FAILOVER_WINDOW = LEASE_SECONDS + 10  # how long runs are created after the leader goes
(EXAMPLE,) = [
    d
    for d in yaml.safe_load_all((REPO / "examples/multinode-by-handle.yaml").read_text())
    if d and d.get("kind") == "PayloadRun"
]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def wait_for(what: str, probe: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(every)
    raise TimeoutError(f"{what}: not after {timeout:.0f} s")


class Failover:
    """The cluster's kubectl, the chart's operator pods, and suspended runs to time."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.count = 0

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return self.cluster.kubectl(*args, input=input, check=True).stdout

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def operator_pods(self) -> list[dict[str, Any]]:
        pods = self.get("pods", "-n", SYSTEM_NS, "-l", OPERATOR_PODS)["items"]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def two_ready(self) -> bool:
        pods = self.operator_pods()
        return len(pods) == 2 and all(
            s["ready"] for p in pods for s in p["status"].get("containerStatuses") or [{}]
        )

    def leader(self) -> str | None:
        """The pod holding the Lease (identity ``payloadrun-operator@<pod>/<pid>``)."""
        lease = self.get("lease", LEASE, "-n", SYSTEM_NS)
        holder = lease["spec"].get("holderIdentity") or ""
        return holder.split("@", 1)[1].split("/", 1)[0] if "@" in holder else None

    def create_run(self) -> str:
        self.count += 1
        name = f"failover-{self.count:03d}"
        run = copy.deepcopy(EXAMPLE)
        run["metadata"] = {"name": name, "namespace": RUNS_NS}
        run["spec"]["suspend"] = True
        self.kubectl("create", "-f", "-", input=json.dumps(run))
        return name

    def reconciled(self) -> set[str]:
        runs = self.get("payloadruns", "-n", RUNS_NS)["items"]
        return {
            r["metadata"]["name"]
            for r in runs
            if (r.get("status") or {}).get("observedGeneration") == r["metadata"]["generation"]
        }

    def stream(self, seconds: float, timeout: float = 120) -> tuple[float, int]:
        """Runs created every STREAM_SPACING s for ``seconds``: the longest any of them waited
        to be reconciled (create -> ``observedGeneration``, seen by a list every 0.1 s) and
        the duplicate children among them."""
        created: dict[str, float] = {}
        seen: dict[str, float] = {}
        end = time.monotonic() + seconds
        deadline = end + timeout
        next_at = time.monotonic()
        while time.monotonic() < deadline and (
            time.monotonic() < end or seen.keys() < created.keys()
        ):
            now = time.monotonic()
            if now < end and now >= next_at:
                created[self.create_run()] = now
                next_at += STREAM_SPACING
            done = time.monotonic()
            for name in self.reconciled() & created.keys():
                seen.setdefault(name, done)
            time.sleep(0.05)
        if missing := created.keys() - seen.keys():
            raise TimeoutError(f"{len(missing)} runs not reconciled after {timeout:.0f} s")
        duplicates = sum(len(c) - len(set(c)) for c in map(self.children, created))
        return max(seen[n] - created[n] for n in created), duplicates

    def children(self, name: str) -> list[str]:
        items = self.get(
            "statefulsets,jobs,services,configmaps,persistentvolumeclaims",
            "-n", RUNS_NS, "-l", f"payloadrun.dev/run={name}",
        )["items"]  # fmt: skip
        return [f"{c['kind']}/{c['metadata']['name']}" for c in items]


def operator_process(pod: str) -> int:
    """The pid, on this machine, of the operator running in ``pod`` (its HOSTNAME)."""
    wanted = f"HOSTNAME={pod}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            if b"payloadrun-operator" in cmdline and wanted in (entry / "environ").read_bytes():
                return int(entry.name)
    raise LookupError(f"no operator process of pod {pod} on this machine")


def settled(bench: Failover) -> str:
    """Two ready operator pods again, one of them leading: the leader's pod."""
    wait_for("two ready operator pods", bench.two_ready, 240, every=1)
    return wait_for("a leader", bench.leader, 60)


def one_round(bench: Failover, number: int) -> dict[str, float]:
    settled(bench)
    baseline, dup = bench.stream(3)

    leader = settled(bench)
    bench.kubectl(
        "delete", "pod", "-n", SYSTEM_NS, leader, "--grace-period=0", "--force", "--wait=false"
    )
    deleted, more = bench.stream(FAILOVER_WINDOW)
    dup += more

    pid = operator_process(settled(bench))
    os.kill(pid, signal.SIGSTOP)  # a leader cut off: it holds the Lease and renews nothing
    try:
        frozen, more = bench.stream(FAILOVER_WINDOW)
        dup += more
    finally:
        os.kill(pid, signal.SIGCONT)  # it finds its lease lost and exits; its pod restarts it

    os.kill(operator_process(settled(bench)), signal.SIGKILL)
    killed, more = bench.stream(FAILOVER_WINDOW)
    dup += more
    progress(
        f"round {number}: worst wait of a run, leader up {baseline:.2f} s, its pod deleted "
        f"{deleted:.2f} s, frozen {frozen:.2f} s, killed {killed:.2f} s"
    )
    return {"baseline": baseline, "deleted": deleted, "frozen": frozen, "killed": killed,
            "dup": dup}  # fmt: skip


@contextlib.contextmanager
def chart_on_a_node(tmp: Path) -> Iterator[LocalCluster]:
    try:
        binaries = find_binaries()
    except BinariesMissing as exc:
        sys.exit(f"bench/failover.py: {exc}")
    why_not = node_unsupported_reason(binaries) or (
        running_node_state_dir() and "another local cluster's node runs on this machine"
    )
    if why_not:
        sys.exit(f"bench/failover.py needs a node with real pods: {why_not}")
    from payloadrun_devkit.images import build_images

    with LocalCluster(tmp / "cluster", node=True) as cluster:
        progress("images ...")
        for path in build_images(REPO).values():
            cluster.load_image(path)
        progress("the chart, with two operator pods ...")
        env = {**os.environ, **cluster.env(), "HOME": str(tmp)}
        subprocess.run(
            ["bash", str(REPO / "hack/install-chart.sh"), "e2e", "--set", "operator.replicas=2"],
            env=env, check=True, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        cluster.kubectl("create", "namespace", RUNS_NS, check=True)
        yield cluster


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="failovers of each kind")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("the node needs root (containerd, kubelet, the pod network)")
    print_load("start")
    rounds = []
    with (
        tempfile.TemporaryDirectory(prefix="payloadrun-bench-failover-") as tmp,
        chart_on_a_node(Path(tmp)) as cluster,
    ):
        bench = Failover(cluster)
        for number in range(1, args.rounds + 1):
            rounds.append(one_round(bench, number))
    print()
    print("the longest a run created every 0.5 s waited to be reconciled:")
    print(f"{'round':<7} {'leader up':>10} {'pod deleted':>12} {'frozen':>8} {'killed':>8}")
    for i, r in enumerate(rounds, 1):
        print(
            f"{i:<7} {r['baseline']:>9.2f}s {r['deleted']:>11.2f}s {r['frozen']:>7.2f}s "
            f"{r['killed']:>7.2f}s"
        )
    base = max(r["baseline"] for r in rounds)
    worst = {k: max(r[k] for r in rounds) for k in ("deleted", "frozen", "killed")}
    print(
        "worst / worst with the leader up "
        f"({base:.2f} s): "
        + ", ".join(f"{k} {v / base:.1f}" for k, v in worst.items())
        + f"; lease duration {LEASE_SECONDS} s"
    )
    bound = LEASE_SECONDS + 5
    print_goals(
        [
            Goal.at_most("leader pod deleted: a run's worst wait (s)", worst["deleted"], bound),
            Goal.at_most("leader frozen: a run's worst wait (s)", worst["frozen"], bound),
            Goal.at_most("leader killed: a run's worst wait (s)", worst["killed"], bound),
            Goal.at_most("duplicate children", sum(r["dup"] for r in rounds), 0),
        ]
    )
    print_load("end")


if __name__ == "__main__":
    main()
