"""``make demo``: what payloadrun does, end to end, on one machine with no cluster and no GPU.

1. A real Kubernetes cluster on this machine (built from source the first time): the control
   plane, and a node (containerd, kubelet, kube-proxy, CoreDNS) where the machine can run one
   (Linux, root); elsewhere the control plane alone, and the demo says why.
2. The Helm chart installed into it; with the node, the project's images built here and the
   operator running as the chart's pod, else as a local process with the chart's ServiceAccount.
3. PayloadRuns: the multi-node example goes by handle; the disaggregated example with a payload
   root set by hand is rejected by the API server (the CRD's CEL rule); the disaggregated example
   in Auto mode falls back to inline, with its reason.
4. With the node, a run whose pods really run: the fake vLLM behind the writer sidecar, the
   orchestrator with the retention sidecar, a trainer reading from its read-only mount; one
   rollout by handle through the inference Service, read by the trainer, deleted on consume;
   then an agentic rollout of three turns (a tool call, a fork), every branch read back by the
   trainer and compared with verifiers' own inline branch (``hack/demo_agentic.py``).
5. The data path at scale: a vLLM-format upstream behind the writer sidecar, the retention
   sidecar, and the simulator as orchestrator and trainer, on a temporary payload root; then the
   same rollouts under the version-sweep baseline, and what the inline transport would have sent.
   It runs from the start, beside 1-4 (which mostly wait on the API server and pods), and is
   printed after them.

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
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import demo_agentic

from payloadrun_devcluster import node_unsupported_reason, running_node_state_dir
from payloadrun_devcluster.binaries import BinariesMissing, find_binaries, run_build
from payloadrun_devcluster.cluster import LocalCluster
from payloadrun_operator.api.kinds import RUN
from payloadrun_operator.platform.kube import object_path

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "payloadrun"
EXAMPLES = REPO / "examples"
SYSTEM_NS = "payloadrun-system"
DEMO_NS = "payloadrun-demo"
RELEASE = "payloadrun"
REDUCTION_METRIC = "payloadrun_writer_response_reduction_bytes_total"


def say(text: str = "") -> None:
    print(text, flush=True)


def section(title: str, out: Callable[[str], None] = say) -> None:
    out("")
    out(f"== {title} " + "=" * max(0, 72 - len(title)))


class Held:
    """Lines kept to be printed later: the data path's, while the cluster's sections print."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        self.lines.append(text)

    def release(self) -> None:
        for line in self.lines:
            say(line)
        self.lines.clear()


def say_mode(status: dict[str, Any]) -> None:
    say(
        f"  mode {status['payloadMode']} ({status['payloadModeReason']}): "
        f"{status['payloadModeMessage']}"
    )


def wait_until(what: str, probe: Any, timeout: float, interval: float = 1.0) -> Any:
    """``probe()``'s first truthy answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answer := probe():
            return answer
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout} s")


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


class Demo:
    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="payloadrun-demo-")))
        self.cluster: LocalCluster | None = None
        self.with_node = False
        self.why_not: str | None = None
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

    def run(self, name: str | None = None) -> dict[str, Any]:
        """A PayloadRun of the demo's namespace (all of them without ``name``), read from the
        API server in one call: the waits below ask several times a second, and a kubectl
        process costs 87 ms of CPU."""
        assert self.cluster is not None
        path = object_path(RUN.api_version, RUN.kind, DEMO_NS, name)
        status, body = self.cluster.request("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status} {body.get('message')}")
        return body

    def wait_reconciled(self, name: str, timeout: float = 60) -> dict[str, Any]:
        def reconciled() -> dict[str, Any] | None:
            run = self.run(name)
            status = run.get("status") or {}
            return (
                status
                if status.get("observedGeneration") == run["metadata"]["generation"]
                else None
            )

        return wait_until(f"PayloadRun {name} reconciled", reconciled, timeout, interval=0.3)

    def apply_example(self, name: str, check: bool = True) -> str:
        """``kubectl apply -f examples/<name>``, shown with its answer (unless it is refused)."""
        say(f"$ kubectl apply -f examples/{name}")
        out = self.kubectl("apply", "-n", DEMO_NS, "-f", str(EXAMPLES / name), check=check)
        if check:
            say(out.strip())
        return out

    def wait_phase(self, name: str, phase: str, timeout: float) -> dict[str, Any]:
        def in_phase() -> dict[str, Any] | None:
            status = self.run(name).get("status") or {}
            return status if status.get("phase") == phase else None

        return wait_until(f"PayloadRun {name} {phase}", in_phase, timeout)

    # --- the control plane ---------------------------------------------------------------------

    def decide_node(self) -> None:
        """Whether a node runs here (else why not), decided before anything starts: the data
        path's section number depends on it."""
        section("1. A Kubernetes cluster on this machine")
        try:
            binaries = find_binaries()
        except BinariesMissing:
            say("building the control plane, the node's kubelet, kube-proxy, kube-scheduler,")
            say("CoreDNS and helm from the Go module proxy (the first time only: about 13 minutes")
            say("on 2 cores)...")
            run_build()
            binaries = find_binaries()
        why_not = node_unsupported_reason(binaries)
        other = running_node_state_dir() if why_not is None else None
        if other is not None:
            why_not = (
                f"another local cluster's node runs on this machine (state {other}); one node"
                " per machine"
            )
        self.with_node = why_not is None
        self.why_not = why_not

    def control_plane(self) -> None:
        why_not = self.why_not
        self.cluster = LocalCluster(self.tmp / "cluster", node=self.with_node)
        self.stack.callback(self.cluster.stop)
        t0 = time.monotonic()
        self.cluster.start()
        took = time.monotonic() - t0
        if self.with_node:
            say(f"etcd, kube-apiserver, kube-controller-manager and a node up in {took:.1f} s:")
            say(self.kubectl("get", "nodes", "-o", "wide").rstrip())
        else:
            say(f"etcd + kube-apiserver + kube-controller-manager up in {took:.1f} s")
            say(f"no node, so no pod runs: {why_not}")
        say(f"at {self.cluster.server}, kubeconfig {self.cluster.kubeconfig}")
        self.reach.append(f"export KUBECONFIG={self.cluster.kubeconfig}")

    def chart(self) -> None:
        assert self.cluster is not None
        section("2. The Helm chart, and the operator with the chart's identity")
        self.kubectl("create", "namespace", DEMO_NS, check=False)
        watch = f"operator.watchNamespaces={{{DEMO_NS}}}"
        env = {**os.environ, **self.cluster.env(), "HOME": str(self.tmp)}
        if self.with_node:
            say("$ bash hack/images.sh   # the project's Dockerfiles, built here, cached")
            from payloadrun_devkit.images import build_images

            self.cluster.load_images(list(build_images(REPO).values()))
            say("$ bash hack/install-chart.sh e2e --set operator.watchNamespaces={payloadrun-demo}")
            result = subprocess.run(
                ["bash", str(REPO / "hack" / "install-chart.sh"), "e2e", "--set", watch],
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if result.returncode != 0:
                raise RuntimeError(f"installing the chart failed: {result.stderr}")
            say(self.kubectl("get", "pods", "-n", SYSTEM_NS, "-o", "wide").rstrip())
            return
        helm = str(self.cluster.binaries.path("helm"))
        cmd = [
            helm, "upgrade", "--install", RELEASE, str(CHART), "--namespace", SYSTEM_NS,
            "--create-namespace", "--set", watch,
        ]  # fmt: skip
        say("$ helm upgrade --install payloadrun charts/payloadrun -n payloadrun-system ...")
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"helm install failed: {result.stderr}")
        say(result.stdout.split("NOTES:")[0].strip())
        say("(no node here, so the chart's Deployment starts no pod: the operator runs as a")
        say(" local process, with the chart's ServiceAccount token and environment)")
        self.local_operator()

    def local_operator(self) -> None:
        from payloadrun_devkit.local_operator import LocalOperator, operator_env_from_deployment

        assert self.cluster is not None
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
        section("3. PayloadRuns")
        self.apply_example("multinode-by-handle.yaml")
        status = self.wait_reconciled("qwen3-moe-grpo")
        say_mode(status)
        say(f"  claim {status['claimName']}, payload root {status['payloadRoot']}")
        say()
        rejected = self.apply_example("disaggregated-root-rejected.yaml", check=False)
        say("  " + rejected.strip().replace("\n", "\n  "))
        say()
        self.apply_example("disaggregated-inline.yaml")
        say_mode(self.wait_reconciled("pd-disaggregated"))

        def judged() -> bool:  # the status from the children's events, for the table below
            runs = self.run()["items"]
            return all(
                any(c["type"] == "Ready" for c in (r.get("status") or {}).get("conditions", []))
                for r in runs
            )

        wait_until("every run's Ready condition", judged, timeout=30, interval=0.2)
        say()
        say("$ kubectl get payloadruns -o wide")
        say(self.kubectl("get", "payloadruns", "-n", DEMO_NS, "-o", "wide").rstrip())
        say()
        say("$ kubectl get statefulsets,jobs,pvc,services -l payloadrun.dev/run=qwen3-moe-grpo")
        say(
            self.kubectl(
                "get",
                "statefulsets,jobs,pvc,services",
                "-n",
                DEMO_NS,
                "-l",
                "payloadrun.dev/run=qwen3-moe-grpo",
            ).rstrip()
        )

    # --- a run with real pods -------------------------------------------------------------------

    def pods(self) -> None:
        section("4. A run whose pods run: vLLM (fake) + writer, orchestrator + retention, trainer")
        self.apply_example(LOCAL_RUN)
        # Running is the operator's verdict that every workload of the run is ready (a pod
        # selector alone could be waited on before the StatefulSets have made their pods)
        status = self.wait_phase("local-by-handle", "Running", timeout=300)
        say(self.kubectl("get", "pods", "-n", DEMO_NS, "-l", "payloadrun.dev/run=local-by-handle",
                         "-o", "wide").rstrip())  # fmt: skip
        say(f"  mode {status['payloadMode']}, root {status['payloadRoot']}")

        def pod(component: str) -> str:
            return self.kubectl(
                "get", "pods", "-n", DEMO_NS, "-o", "jsonpath={.items[0].metadata.name}",
                "-l", f"payloadrun.dev/run=local-by-handle,app.kubernetes.io/component={component}",
            )  # fmt: skip

        def in_pod(component: str, script: str, *args: str) -> str:
            return self.kubectl(
                "exec", "-n", DEMO_NS, pod(component), "-c", component, "--",
                "python", "-c", script, *args,
            ).strip()  # fmt: skip

        say("orchestrator pod: one rollout by handle through the inference Service (the writer)")
        files = in_pod("orchestrator", ROLLOUT)
        say(f"  -> {files}")
        say("trainer pod, read-only mount: the rows, read through payloadrun.PayloadReader")
        say("  -> " + in_pod("trainer", READ, files))
        say("orchestrator pod: record_batch(1) and policy_updated(1) to the retention sidecar")
        in_pod("orchestrator", CONSUME, files)
        say("trainer pod: do the files still exist? (the sidecar deletes them in the background)")

        def deleted() -> str | None:
            answer = in_pod("trainer", EXISTS, files)
            return answer if "True" not in answer else None

        say("  -> " + wait_until("the consumed files deleted", deleted, timeout=30, interval=0.2))
        say("an agentic rollout by handle (docs/integration.md#multi-turn-rollouts-by-handle):")
        demo_agentic.run(in_pod, say)
        self.finish(pod("trainer"))

    def finish(self, trainer_pod: str) -> None:
        section("5. The run finishes: its trainer exits 0")
        self.kubectl("exec", "-n", DEMO_NS, trainer_pod, "-c", "trainer", "--",
                     "touch", "/tmp/last-step-done")  # fmt: skip
        status = self.wait_phase("local-by-handle", "Succeeded", timeout=120)
        say("$ kubectl get payloadrun local-by-handle -o wide")
        say(
            self.kubectl(
                "get", "payloadrun", "local-by-handle", "-n", DEMO_NS, "-o", "wide"
            ).rstrip()
        )
        say(f"  completed at {status['completionTime']}, last policy step {status.get('lastStep')}")

        def released() -> dict[str, Any] | None:
            run = self.run("local-by-handle")
            conds = {c["type"]: c for c in run["status"]["conditions"]}
            cond = conds.get("PayloadsReleased") or {}
            return cond if cond.get("status") == "True" else None

        cond = wait_until("the payload files deleted", released, timeout=120)
        say(f"  PayloadsReleased: {cond['reason']}: {cond['message']}")
        say("$ kubectl get pods -l payloadrun.dev/run=local-by-handle")
        say(self.kubectl("get", "pods", "-n", DEMO_NS, "-l", "payloadrun.dev/run=local-by-handle")
            .rstrip())  # fmt: skip
        say("  (inference and the orchestrator stopped; the trainer and cleanup pods are kept,")
        say("   with their logs, until the run is deleted)")

    # --- the data path -------------------------------------------------------------------------

    def data_path(self, out: Callable[[str], None] = say) -> None:
        """Section 6 (4 without a node). ``out`` takes its lines: a :class:`Held` when it runs
        beside the cluster's sections (:meth:`data_path_beside`)."""
        from payloadrun.agentic import Shape
        from payloadrun.simulate import DELETE_ON_CONSUME, VERSION_SWEEP, Workload, run_policy
        from payloadrun.testing import processes

        number = 6 if self.with_node else 4  # after the pods' two sections, when a node runs
        section(
            f"{number}. The data path at scale: sidecar processes, the simulator as the loop", out
        )
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
            rollout=Shape(
                prompt_tokens=self.args.prompt_tokens,
                completion_tokens=self.args.max_tokens,
                max_turns=self.args.turns,
            ),
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
        out(f"fake vLLM {fake.url} <- writer {writer} (metrics {writer_metrics_url})")
        out(f"retention sidecar {retention.url} (metrics {retention.metrics_url})")
        tokens = f"{self.args.prompt_tokens}+{self.args.max_tokens}"
        out(
            f"payload root {root}; batch {w.batch_size} rollouts of 1-{self.args.turns} turns "
            f"({tokens} tokens the first), max_off_policy_steps {w.max_off_policy_steps}"
        )
        self.reach += [
            f"writer metrics: curl {writer_metrics_url}",
            f"retention metrics: curl {retention.metrics_url}",
        ]
        tty = out is say and sys.stdout.isatty()  # a line per step when not on a terminal

        def progress(r) -> None:
            avoided = _metric(writer_metrics_url, REDUCTION_METRIC)
            deleted = _metric(retention.metrics_url, "payloadrun_retention_deleted_files_total")
            line = (
                f"step {r.step:>3}/{w.steps}  dir {mb(r.high_bytes):>9} {r.high_files:>5} files "
                f"-> {mb(r.after_bytes):>9}  deleted {int(deleted):>6} files  "
                f"kept off the wire {mb(avoided):>10}"
            )
            if tty:
                print("\r" + line, end="", flush=True)
            else:
                out(line)

        kw = {"writer_url": writer}
        out("delete on consume (the retention sidecar):")
        consume = run_policy(w, DELETE_ON_CONSUME, root, url=retention.url, progress=progress, **kw)
        if tty:
            out("")
        handle_sent = _metric(
            writer_metrics_url, "payloadrun_writer_response_bytes_total", mode="handle"
        )
        avoided = _metric(writer_metrics_url, REDUCTION_METRIC)
        out("the same rollouts under the version-sweep baseline (rmtree of old v<k> only):")
        sweep = run_policy(w, VERSION_SWEEP, root, **kw)
        self._summary(consume, sweep, handle_sent, avoided, out)
        if consume.missing_files or sweep.missing_files:
            raise RuntimeError("the trainer found payload files missing: a retention bug")

    def _summary(
        self, consume, sweep, handle_sent: float, avoided: float, out: Callable[[str], None]
    ) -> None:
        inline = handle_sent + avoided
        rollouts = consume.written_rollouts
        turns = consume.written_files  # one request (and one file) a turn
        per_batch = inline / max(rollouts, 1) * consume.workload.batch_size
        section("Summary", out)
        out(f"{'':34}{'peak directory':>16}{'in batches':>12}{'peak files':>12}")
        rows = (("delete on consume (payloadrun)", consume), ("version sweep (baseline)", sweep))
        for label, s in rows:
            out(f"{label:34}{mb(s.peak_bytes):>16}{s.peak_batches:>12.2f}{s.peak_files:>12}")
        if consume.peak_bytes:
            ratio = sweep.peak_bytes / consume.peak_bytes
            out(f"the directory peaked {ratio:.1f} times lower with delete on consume")
        out("")
        smaller = inline / max(handle_sent, 1)
        out(
            f"responses for {rollouts} rollouts ({turns} turns): inline {mb(inline)}, by handle "
            f"{mb(handle_sent)} "
            f"({smaller:,.0f} times smaller); {mb(avoided)} kept off the wire"
        )
        out(
            f"and out of the orchestrator's memory: about {mb(per_batch)} per batch buffered inline"
        )

    def data_path_beside(self) -> Beside:
        """The data path started in a thread, beside the cluster's sections (which mostly wait
        on the API server and on pods): its section is printed when theirs are done."""
        return Beside(self).start()

    def keep_running(self) -> None:
        section("Left running (--keep)")
        for line in self.reach:
            say(f"  {line}")
        say(f"  kubectl get payloadruns -n {DEMO_NS} -o wide")
        say("press Ctrl-C to stop everything")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


class Beside:
    """:meth:`Demo.data_path` in a thread, its lines held; :meth:`finish` waits for it, prints
    them and raises what it raised."""

    def __init__(self, demo: Demo) -> None:
        self.held = Held()
        self.error: BaseException | None = None
        # a daemon: Ctrl-C stops its processes (the ExitStack), and nothing waits on it then
        self.thread = threading.Thread(
            target=self._run, args=(demo,), name="data-path", daemon=True
        )

    def _run(self, demo: Demo) -> None:
        try:
            demo.data_path(self.held)
        except BaseException as error:  # re-raised by finish(), in the main thread
            self.error = error

    def start(self) -> Beside:
        self.thread.start()
        return self

    def finish(self) -> None:
        self.thread.join()
        self.held.release()
        if self.error is not None:
            raise self.error


LOCAL_RUN = "local-node-by-handle.yaml"  # in examples/
ROLLOUT = """
import json, os, urllib.request
from payloadrun import PAYLOAD_DIR_ARG, Env, choice_segments, payload_dir, segments_to_json
extra_args = {PAYLOAD_DIR_ARG: payload_dir(os.environ[Env.PAYLOAD_ROOT], 0)}
body = {"model": "policy", "token_ids": list(range(100, 612)),
        "sampling_params": {"max_tokens": 128, "temperature": 1.0, "extra_args": extra_args}}
url = os.environ[Env.INFERENCE_URL] + "/inference/v1/generate"
req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=60) as resp:
    answer = resp.read()
segments = segments_to_json(choice_segments(json.loads(answer)["choices"][0]))
print(json.dumps({"response_bytes": len(answer), "segments": segments}))
"""
READ = """
import json, os, sys
from payloadrun import Env, PayloadReader, segments_from_json
segments = segments_from_json(json.loads(sys.argv[1])["segments"])
with PayloadReader(os.environ[Env.PAYLOAD_ROOT]) as reader:
    for field in sorted({s.field for s in segments}):
        mine = [s for s in segments if s.field == field]
        rows = reader.read(mine, field, min(s.pos for s in mine), max(s.end for s in mine))
        print(f"{field}: {rows.shape} {rows.dtype}", end="; ")
"""
CONSUME = """
import json, sys
from payloadrun import files_of, segments_from_json
from payloadrun.retention.client import RetentionClient
files = files_of(segments_from_json(json.loads(sys.argv[1])["segments"]))
client = RetentionClient()
client.record_batch(1, files)
client.policy_updated(1)
"""
EXISTS = """
import json, os, sys
from payloadrun import files_of, segments_from_json
files = files_of(segments_from_json(json.loads(sys.argv[1])["segments"]))
print({f: os.path.exists(f) for f in files})
"""


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
        help="at the end, keep the cluster, operator, pods and sidecars up (and print how to "
        "reach them) until Ctrl-C",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=12,
        help="training steps to simulate (default 12: past the step where the version-sweep "
        "baseline reaches its steady peak, --max-off-policy-steps + 1)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="rollouts per batch")
    parser.add_argument("--max-off-policy-steps", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--turns", type=int, default=4, help="turns per rollout: 1 to this")
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
            if args.skip_cluster:
                demo.data_path()
            else:
                demo.decide_node()
                beside = demo.data_path_beside()
                demo.control_plane()
                demo.chart()
                demo.runs()
                if demo.with_node:
                    demo.pods()
                beside.finish()
            if args.keep:
                demo.keep_running()
    except KeyboardInterrupt:
        say("\ninterrupted: everything started was stopped")
        return 130
    say(f"\ndone in {time.monotonic() - started:.0f} s; nothing left running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
