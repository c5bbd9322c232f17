"""``make demo``: what payloadrun does, end to end, on one machine with no cluster and no GPU.

1. A real Kubernetes control plane on loopback (built from source the first time).
2. The Helm chart installed into it, and the operator running with the chart's ServiceAccount.
3. PayloadRuns: the multi-node example goes by handle; the disaggregated example with a payload
   root set by hand is rejected by the API server (the CRD's CEL rule); the disaggregated example
   in Auto mode falls back to inline, with its reason.
4. The data path: a vLLM-format upstream behind the writer sidecar, the retention sidecar, and
   the simulator as orchestrator and trainer, on a temporary payload root; then the same rollouts
   under the version-sweep baseline, and what the inline transport would have sent.

Nothing is left running at the end or on Ctrl-C; ``--keep`` leaves the control plane, the
operator and the sidecars up, prints how to reach them, and stops them all on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from payloadrun_devcluster.binaries import BinariesMissing, find_binaries, run_build
from payloadrun_devcluster.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "payloadrun"
EXAMPLES = REPO / "examples"
SYSTEM_NS = "payloadrun-system"
DEMO_NS = "payloadrun-demo"
RELEASE = "payloadrun"


def say(text: str = "") -> None:
    print(text, flush=True)


def section(title: str) -> None:
    say()
    say(f"== {title} " + "=" * max(0, 72 - len(title)))


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


class Demo:
    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="payloadrun-demo-")))
        self.cluster: LocalCluster | None = None
        self.reach: list[str] = []

    # --- helpers -------------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        assert self.cluster is not None
        result = self.cluster.kubectl(*args, input=input)
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout if result.returncode == 0 else result.stderr

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def wait_reconciled(self, name: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.get("payloadrun", name, "-n", DEMO_NS)
            status = run.get("status") or {}
            if status.get("observedGeneration") == run["metadata"]["generation"]:
                return status
            time.sleep(0.3)
        raise TimeoutError(f"PayloadRun {name} was not reconciled within {timeout} s")

    # --- the control plane ---------------------------------------------------------------------

    def control_plane(self) -> None:
        section("1. A Kubernetes control plane on this machine")
        try:
            find_binaries()
        except BinariesMissing:
            say("building etcd, kube-apiserver, kube-controller-manager, kubectl and helm from the")
            say("Go module proxy (the first time only: about 15-20 minutes on 2 cores)...")
            run_build()
        self.cluster = LocalCluster(self.tmp / "cluster")
        self.stack.callback(self.cluster.stop)
        t0 = time.monotonic()
        self.cluster.start()
        say(f"etcd + kube-apiserver + kube-controller-manager up in {time.monotonic() - t0:.1f} s")
        say(f"at {self.cluster.server}, kubeconfig {self.cluster.kubeconfig}")
        self.reach.append(f"export KUBECONFIG={self.cluster.kubeconfig}")

    def chart(self) -> None:
        assert self.cluster is not None
        section("2. The Helm chart")
        helm = str(self.cluster.binaries.path("helm"))
        env = {**os.environ, **self.cluster.env(), "HOME": str(self.tmp)}
        cmd = [
            helm,
            "upgrade",
            "--install",
            RELEASE,
            str(CHART),
            "--namespace",
            SYSTEM_NS,
            "--create-namespace",
            "--set",
            f"operator.watchNamespaces={{{DEMO_NS}}}",
            "--set",
            "operator.readinessCheckSeconds=2",
        ]
        say("$ helm upgrade --install payloadrun charts/payloadrun -n payloadrun-system ...")
        self.kubectl("create", "namespace", DEMO_NS, check=False)
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"helm install failed: {result.stderr}")
        say(result.stdout.split("NOTES:")[0].strip())
        say("(no kubelet runs here, so the chart's Deployment starts no pod: the operator runs")
        say(" below as a local process, with the chart's ServiceAccount token and environment)")

    def operator(self) -> None:
        from payloadrun_operator.testing import LocalOperator, operator_env_from_deployment

        assert self.cluster is not None
        section("3. The operator, with the chart's identity")
        sa = self.cluster.service_account_kubeconfig(
            SYSTEM_NS, f"{RELEASE}", self.tmp / "operator.kubeconfig"
        )
        deploy = self.get("deployment", RELEASE, "-n", SYSTEM_NS)
        env = operator_env_from_deployment(deploy)
        op = LocalOperator(sa, namespaces=(DEMO_NS,), env=env, log_path=self.tmp / "operator.log")
        op.start()
        self.stack.callback(op.stop)
        say(f"payloadrun-operator running (pid {op.pid}), metrics at {op.metrics_url}")
        self.reach.append(f"operator metrics: curl {op.metrics_url}")

    def runs(self) -> None:
        section("4. PayloadRuns")
        say("$ kubectl apply -f examples/multinode-by-handle.yaml")
        say(
            self.kubectl(
                "apply", "-n", DEMO_NS, "-f", str(EXAMPLES / "multinode-by-handle.yaml")
            ).strip()
        )
        status = self.wait_reconciled("qwen3-moe-grpo")
        say(
            f"  mode {status['payloadMode']} ({status['payloadModeReason']}): "
            f"{status['payloadModeMessage']}"
        )
        say(f"  claim {status['claimName']}, payload root {status['payloadRoot']}")
        say()
        say("$ kubectl apply -f examples/disaggregated-root-rejected.yaml")
        rejected = self.kubectl(
            "apply",
            "-n",
            DEMO_NS,
            "-f",
            str(EXAMPLES / "disaggregated-root-rejected.yaml"),
            check=False,
        )
        say("  " + rejected.strip().replace("\n", "\n  "))
        say()
        say("$ kubectl apply -f examples/disaggregated-inline.yaml")
        say(
            self.kubectl(
                "apply", "-n", DEMO_NS, "-f", str(EXAMPLES / "disaggregated-inline.yaml")
            ).strip()
        )
        status = self.wait_reconciled("pd-disaggregated")
        say(
            f"  mode {status['payloadMode']} ({status['payloadModeReason']}): "
            f"{status['payloadModeMessage']}"
        )
        time.sleep(2.5)  # one readiness check, so the table shows the conditions' verdicts
        say()
        say("$ kubectl get payloadruns -o wide")
        say(self.kubectl("get", "payloadruns", "-n", DEMO_NS, "-o", "wide").rstrip())
        say()
        say(
            "$ kubectl get statefulsets,deployments,pvc,services "
            "-l payloadrun.dev/run=qwen3-moe-grpo"
        )
        say(
            self.kubectl(
                "get",
                "statefulsets,deployments,pvc,services",
                "-n",
                DEMO_NS,
                "-l",
                "payloadrun.dev/run=qwen3-moe-grpo",
            ).rstrip()
        )

    # --- the data path -------------------------------------------------------------------------

    def data_path(self) -> None:
        from payloadrun.simulate import DELETE_ON_CONSUME, VERSION_SWEEP, Workload, run_policy
        from payloadrun.testing import processes

        section("5. The data path: writer and retention sidecars, the simulator as orchestrator")
        root = self.tmp / "payloads"
        root.mkdir()
        # Qwen3-30B-A3B's routing shape: 48 MoE layers, top-8 of 128 experts, 384 B per token
        fake = processes.fake_vllm(
            "--layers", "48", "--top-k", "8", "--experts", "128", log_path=self.tmp / "vllm.log"
        )
        self.stack.enter_context(fake)
        writer_process = processes.writer(fake.url, root, log_path=self.tmp / "writer.log")
        self.stack.enter_context(writer_process)
        writer, writer_metrics_url = writer_process.url, writer_process.metrics_url
        w = Workload(
            batch_size=self.args.batch_size,
            group_size=8,
            max_off_policy_steps=self.args.max_off_policy_steps,
            steps=self.args.steps,
            seed=7,
        )
        retention = processes.SidecarProcess(
            root,
            "demo",
            args=["--max-off-policy-steps", str(w.max_off_policy_steps), "--scan-interval", "1"],
            log_path=self.tmp / "retention.log",
        ).start()
        self.stack.callback(retention.stop)
        say(f"fake vLLM {fake.url} <- writer {writer} (metrics {writer_metrics_url})")
        say(f"retention sidecar {retention.url} (metrics {retention.metrics_url})")
        tokens = f"{self.args.prompt_tokens}+{self.args.max_tokens}"
        say(
            f"payload root {root}; batch {w.batch_size} rollouts of {tokens} tokens, "
            f"max_off_policy_steps {w.max_off_policy_steps}"
        )
        self.reach += [
            f"writer metrics: curl {writer_metrics_url}",
            f"retention metrics: curl {retention.metrics_url}",
        ]
        tty = sys.stdout.isatty()

        def progress(r) -> None:
            avoided = _metric(writer_metrics_url, "payloadrun_writer_inline_bytes_avoided_total")
            deleted = _metric(retention.metrics_url, "payloadrun_retention_deleted_files_total")
            line = (
                f"step {r.step:>3}/{w.steps}  dir {mb(r.high_bytes):>9} {r.high_files:>5} files "
                f"-> {mb(r.after_bytes):>9}  deleted {int(deleted):>6} files  "
                f"kept off the wire {mb(avoided):>10}"
            )
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)

        kw = {
            "writer_url": writer,
            "prompt_tokens": self.args.prompt_tokens,
            "max_tokens": self.args.max_tokens,
        }
        say("delete on consume (the retention sidecar):")
        consume = run_policy(w, DELETE_ON_CONSUME, root, url=retention.url, progress=progress, **kw)
        if tty:
            say()
        handle_sent = _metric(
            writer_metrics_url, "payloadrun_writer_response_bytes_total", mode="handle"
        )
        avoided = _metric(writer_metrics_url, "payloadrun_writer_inline_bytes_avoided_total")
        say("the same rollouts under the version-sweep baseline (rmtree of old v<k> only):")
        sweep = run_policy(w, VERSION_SWEEP, root, **kw)
        self._summary(consume, sweep, handle_sent, avoided)
        if consume.missing_files or sweep.missing_files:
            raise RuntimeError("the trainer found payload files missing: a retention bug")

    def _summary(self, consume, sweep, handle_sent: float, avoided: float) -> None:
        inline = handle_sent + avoided
        rollouts = consume.written_rollouts
        per_batch = inline / max(rollouts, 1) * consume.workload.batch_size
        section("Summary")
        say(f"{'':34}{'peak directory':>16}{'in batches':>12}{'peak files':>12}")
        rows = (("delete on consume (payloadrun)", consume), ("version sweep (baseline)", sweep))
        for label, s in rows:
            say(f"{label:34}{mb(s.peak_bytes):>16}{s.peak_batches:>12.2f}{s.peak_files:>12}")
        if consume.peak_bytes:
            ratio = sweep.peak_bytes / consume.peak_bytes
            say(f"the directory peaked {ratio:.1f} times lower with delete on consume")
        say()
        smaller = inline / max(handle_sent, 1)
        say(
            f"responses for {rollouts} rollouts: inline {mb(inline)}, by handle {mb(handle_sent)} "
            f"({smaller:,.0f} times smaller); {mb(avoided)} kept off the wire"
        )
        say(
            f"and out of the orchestrator's memory: about {mb(per_batch)} per batch buffered inline"
        )

    def keep_running(self) -> None:
        section("Left running (--keep)")
        for line in self.reach:
            say(f"  {line}")
        say(f"  kubectl get payloadruns -n {DEMO_NS} -o wide")
        say("press Ctrl-C to stop everything")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


def _metric(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples matching ``labels``, from a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="make demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="at the end, keep the control plane, operator and sidecars up (and print how to "
        "reach them) until Ctrl-C",
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps to simulate")
    parser.add_argument("--batch-size", type=int, default=64, help="rollouts per batch")
    parser.add_argument("--max-off-policy-steps", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--skip-cluster", action="store_true", help="only the data path")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch_size % 8:
        raise SystemExit(
            f"--batch-size must be a multiple of 8 (the group size), got {args.batch_size}"
        )
    # SIGTERM unwinds like Ctrl-C, so everything started is stopped either way.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    started = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            demo = Demo(args, stack)
            if not args.skip_cluster:
                demo.control_plane()
                demo.chart()
                demo.operator()
                demo.runs()
            demo.data_path()
            if args.keep:
                demo.keep_running()
    except KeyboardInterrupt:
        say("\ninterrupted: everything started was stopped")
        return 130
    say(f"\ndone in {time.monotonic() - started:.0f} s; nothing left running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
