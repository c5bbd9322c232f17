"""Operator benchmark on the local control plane (cluster/build.sh builds it).

Latency: from the create call of a PayloadRun to its status reporting every child applied
(``observedGeneration`` set, which the operator writes only after the last child), p50 and p95,
for 50 runs created one at a time and 50 created at once. Baseline, same run: the same children
server-side applied straight from this process, one run's worth at a time (the API server's own
share of the work).

The operator's own share: admission (the pod templates composed) and building one run's
children, p50 of 200 rounds in this process, against the direct apply's p50.

Memory: the operator's resident set after the runs, against a process that only imports kopf and
the official Kubernetes client (where a client-based kopf operator starts). The operator runs as
in its image, where ``import kubernetes`` fails (:class:`LocalOperator`): this environment has
the client for the benchmark's own calls, and kopf would import it into the operator too.
``--client-libraries`` lets the operator import it, to see what that costs.

    python bench/operator.py [--runs 50] [--client-libraries]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kopf
import yaml
from kubernetes import client, config

from payloadrun_devcluster import LocalCluster
from payloadrun_operator.admission import admit
from payloadrun_operator.builders import RunContext, build_children
from payloadrun_operator.decisions import decide_payload_mode
from payloadrun_operator.kube import KubeClient
from payloadrun_operator.models import GROUP, PLURAL, VERSION, PayloadRunSpec
from payloadrun_operator.settings import OperatorSettings
from payloadrun_operator.testing import CLIENT_LIBRARIES, LocalOperator
from report import Goal, print_goals, print_load

MIB = 1 << 20

REPO = Path(__file__).resolve().parents[1]
# the PayloadRun of the example (its file also holds a ConfigMap of prime-rl's configs)
(EXAMPLE,) = [
    d
    for d in yaml.safe_load_all((REPO / "examples/multinode-by-handle.yaml").read_text())
    if d and d.get("kind") == "PayloadRun"
]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def import_rss_mib(imports: str) -> float:
    """RSS of a Python that ran ``imports``, nothing else."""
    code = f"{imports}\nprint(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout) / 1024


def client_floor_mib() -> float:
    """RSS of a Python that imported kopf and the official client, nothing else."""
    return import_rss_mib("import kopf, kubernetes, kubernetes.client, kubernetes.config")


def kopf_floor_mib() -> float:
    """RSS of a Python that imported kopf where no client library can be imported (the image)."""
    return import_rss_mib(
        f"import sys; sys.modules.update(dict.fromkeys({CLIENT_LIBRARIES!r})); import kopf"
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_body(name: str) -> dict:
    body = copy.deepcopy(EXAMPLE)
    body["metadata"] = {"name": name}
    return body


def wait_reconciled(custom: client.CustomObjectsApi, ns: str, names: set[str], t0: dict) -> dict:
    done: dict[str, float] = {}
    deadline = time.monotonic() + 300
    while len(done) < len(names):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(names) - len(done)} runs not reconciled after 300 s")
        items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
        now = time.monotonic()
        for item in items:
            name = item["metadata"]["name"]
            reported = (item.get("status") or {}).get("observedGeneration") == 1
            if name in names and name not in done and reported:
                done[name] = now - t0[name]
        time.sleep(0.02)
    return done


def make_namespace(core: client.CoreV1Api, name: str) -> str:
    core.create_namespace({"metadata": {"name": name}})
    return name


def bench_operator(api_client: client.ApiClient, runs: int) -> dict[str, list[float]]:
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    out = {}
    ns = make_namespace(core, "bench-one-at-a-time")
    latencies = []
    for i in range(runs):
        name = f"run-{i:03d}"
        t0 = {name: time.monotonic()}
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, run_body(name))
        latencies += wait_reconciled(custom, ns, {name}, t0).values()
    out["one at a time"] = latencies
    ns = make_namespace(core, "bench-all-at-once")
    t0 = {}
    for i in range(runs):
        name = f"run-{i:03d}"
        t0[name] = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, run_body(name))
    out[f"{runs} at once"] = list(wait_reconciled(custom, ns, set(t0), t0).values())
    return out


def bench_direct_apply(kubeconfig: Path, runs: int) -> list[float]:
    """Server-side apply of one run's children from here, with the operator's own client."""
    os.environ["KUBECONFIG"] = str(kubeconfig)
    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    spec = PayloadRunSpec.model_validate(EXAMPLE["spec"])
    settings = OperatorSettings()

    async def apply_all() -> list[float]:
        kube = KubeClient()
        kube.login(info)
        times = []
        try:
            decision = decide_payload_mode(spec)
            for i in range(runs):
                name = f"run-{i:03d}"
                ctx = RunContext(name, "bench-direct", f"uid-{i}", spec, decision, settings)
                t0 = time.monotonic()
                for child in build_children(ctx):
                    child["metadata"].pop("ownerReferences", None)  # no owner object exists here
                    await kube.apply(child)
                times.append(time.monotonic() - t0)
        finally:
            await kube.close()
        return times

    return asyncio.run(apply_all())


def bench_admit_and_build(rounds: int = 200) -> list[float]:
    """What the operator itself spends on one run before any API call: checking the spec
    (admission, composition of the pod templates included) and building its children."""
    settings = OperatorSettings()
    body = {**copy.deepcopy(EXAMPLE), "status": {}}
    body["metadata"] = {**body["metadata"], "namespace": "bench", "uid": "uid-0"}
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        admission = admit(body, settings)
        assert admission.ctx is not None, admission.errors
        build_children(admission.ctx)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument(
        "--client-libraries",
        action="store_true",
        help="let the operator import the kubernetes client (its image has none)",
    )
    args = parser.parse_args()
    print_load("start")
    with (
        tempfile.TemporaryDirectory(prefix="payloadrun-bench-op-") as tmp,
        LocalCluster(Path(tmp) / "cluster") as cluster,
    ):
        print(f"control plane up at {cluster.server}", flush=True)
        cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"), check=True)
        cluster.wait_established(f"{PLURAL}.{GROUP}")
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        make_namespace(client.CoreV1Api(api_client), "bench-direct")
        direct = bench_direct_apply(cluster.kubeconfig, args.runs)
        with LocalOperator(
            cluster.kubeconfig,
            log_path=Path(tmp) / "operator.log",
            client_libraries=args.client_libraries,
        ) as op:
            start_rss = rss_mib(op.pid)
            results = bench_operator(api_client, args.runs)
            end_rss = rss_mib(op.pid)
        floor = client_floor_mib()
        kopf_floor = kopf_floor_mib()

    base_p50 = statistics.median(direct)
    build_p50 = statistics.median(bench_admit_and_build())
    print()
    print(
        f"admission + building one run's children, in the operator: {build_p50 * 1e3:.1f} ms "
        f"p50 over 200 rounds, {build_p50 / base_p50:.2f} of the direct SSA p50"
    )
    print(f"{'apply -> status reported':<28} {'p50':>8} {'p95':>8} {'p95/direct p50':>15}")
    rows = [("direct SSA of the children", direct, None)]
    rows += [(f"operator, {label}", values, base_p50) for label, values in results.items()]
    for label, values, base in rows:
        p50, p95 = statistics.median(values), percentile(values, 0.95)
        ratio = f"{p95 / base:>15.1f}" if base else ""
        print(f"{label:<28} {p50 * 1e3:>6.0f}ms {p95 * 1e3:>6.0f}ms {ratio}")
    print()
    if args.client_libraries:
        print("operator: kopf could import the kubernetes client (not so in the operator image)")
    else:
        print("operator: as in its image, import kubernetes fails (--client-libraries allows it)")
    print(
        f"operator RSS at start {start_rss:.0f} MiB, after {2 * args.runs} runs {end_rss:.0f} MiB"
    )
    print(f"a process that only imports kopf, no client library: {kopf_floor:.0f} MiB")
    print(f"a process that only imports kopf + the kubernetes client: {floor:.0f} MiB")
    print(f"ratio operator / client floor: {end_rss / floor:.2f}")
    print()
    goals = [
        Goal.at_most(f"operator p95, {label} (s)", percentile(values, 0.95), 2)
        for label, values in results.items()
    ]
    goals.append(Goal.at_most("operator RSS after the runs (MB)", end_rss * MIB / 1e6, 100))
    print_goals(goals)
    print_load("end")


if __name__ == "__main__":
    main()
