"""Operator benchmark on the local control plane (cluster/build.sh builds it); no node.

Latency: from the create call of a PayloadRun to its status reporting every child applied
(``observedGeneration`` set, which the operator writes only after the last child), p50 and p95,
for ``--runs`` runs created one at a time and as many created at once (8 create calls in
flight). Baseline, same run: the same children server-side applied straight from this process,
one run's worth at a time (the API server's own share of the work), and as many runs' worth at
once (each run's children in order, every run concurrently: the API server alone, whose p95 is
the floor under the operator's for a burst on this machine). A second floor does a run's whole
share of the API server's work from here: each run created, its children applied, its status
written once as the operator's first pass writes it (the runs of the CRD's copy under
``floor.payloadrun.dev``, which the operator does not watch). The times are taken from a
watch of the runs in this process, so the benchmark adds no list calls of its own.

Bursts: each "at once", the floor's and the operator's, is ``--bursts`` bursts (3; fresh runs
each, the floors' before the operator starts at first), and the p95 compared is the median of
the bursts' p95s. One burst's p95 is one of its three slowest runs, two seconds of a machine
shared by the API server, etcd, the operator and this process: on 2 vCPUs the same code gave a
single burst's ratio anywhere from 1.2 to 1.6. Goals, each printed as a ratio to its bound: the
operator's p95 for each burst at most 1.5 x the children's floor and 1.3 x the whole runs'
floor, and its requests per created run at most the run's children's applies + 1 (its one
status write), counted as below without the election's Lease calls (an update every 2 s,
whatever the runs, and a get when it was refused). No absolute latency goal for a burst: on
this machine the floor alone is above any such figure.

Readiness: with those runs reconciled, the time from the children's status saying every pod is
ready to the run's ``Ready`` condition being True, p50 and p95 over ``--ready-runs`` runs, one
run made ready every 0.2 s (so a periodic check is met at every phase of its period). Without a
kubelet no pod runs, so this process plays the kube-controller-manager's StatefulSet and Job
controllers (disabled here, with the PersistentVolume binder: they would overwrite the status
it writes, and retry failed pod creations and provisioning forever): it creates each workload's
pods from its template (5 a run, Pending), and for readiness patches them Running and Ready,
then their StatefulSet's status (``readyReplicas`` ...) and Jobs' (``active``, ``ready``), the
last patch's start being the time from which the latency is counted.

Idle cost: with nothing changing (15 s after the last change), the operator's CPU over 60 s
(utime + stime from /proc, as a share of one core) and its API requests per minute, counted by
the API server itself: the operator runs as a service account of its own (bound to
cluster-admin), and the API server writes an audit log (level Metadata) of that user's requests
only; a watch counts once, when opened. Measured at the runs above and, with ``--scale``, at
that many runs, in the same run: their ratio says whether the requests grow with the runs.

``--scale N`` (e.g. 1000): the runs brought to N in all (created 8 at a time, their pods after
them), then the idle cost again, 50 more runs created at once (p95 against both floors, measured
again at N; as many bursts of 50 as above), readiness again. The operator's RSS is taken after
the first burst at once of each part: after 101 runs, and after N + 50. About 9 minutes at
1,000 on 2 vCPUs; progress goes to stderr.

The operator's own share: admission (the pod templates composed) and building one run's
children, p50 of 200 rounds in this process, against the direct apply's p50.

Memory: the operator's resident set after the runs, against a process that only imports kopf and
the official Kubernetes client (where a client-based kopf operator starts). The operator runs as
in its image, where ``import kubernetes`` fails (:class:`LocalOperator`): this environment has
the client for the benchmark's own calls, and kopf would import it into the operator too.
``--client-libraries`` lets the operator import it, to see what that costs.

Another commit's operator: ``git archive <commit> operator | tar -x -C /tmp/op`` and run this
with ``PYTHONPATH=/tmp/op/operator`` (the operator process and this one's builders both use it).

    python bench/operator.py [--runs 50] [--scale 1000] [--client-libraries]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import kopf
import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from payloadrun_devcluster import LocalCluster
from payloadrun_devkit.local_operator import CLIENT_LIBRARIES, LocalOperator
from payloadrun_operator.api.conditions import ConditionType, StatusField
from payloadrun_operator.api.models import GROUP, KIND, PLURAL, VERSION, PayloadRunSpec
from payloadrun_operator.api.names import LABEL_RUN, MANAGED_SELECTOR
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.decisions import decide_payload_mode
from payloadrun_operator.observed.status import claim_check, status_update, workloads_check
from payloadrun_operator.platform import kube
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.settings import OperatorSettings
from payloadrun_operator.reconcile import CHILDREN_APPLIED, SPEC_VALID, handled, utc_now
from report import Goal, machine_load, print_goals, print_load

MIB = 1 << 20
CONCURRENCY = 8  # create calls in flight from this process
READY_SPACING = 0.2  # seconds between two runs made ready
SETTLE_SECONDS = 15.0  # after the last change, before an idle measurement
MORE_AT_SCALE = 50
BENCH_NAMESPACE = "payloadrun-bench"  # the operator's service account
OPERATOR_SA = "payloadrun-operator"
OPERATOR_USER = f"system:serviceaccount:{BENCH_NAMESPACE}:{OPERATOR_SA}"
# The controllers this process plays (they would undo the children's status it writes).
PLAYED_CONTROLLERS = (
    "statefulset-controller",
    "job-controller",
    "persistentvolume-binder-controller",
)

REPO = Path(__file__).resolve().parents[1]
# the PayloadRun of the example (its file also holds a ConfigMap of prime-rl's configs)
(EXAMPLE,) = [
    d
    for d in yaml.safe_load_all((REPO / "examples/multinode-by-handle.yaml").read_text())
    if d and d.get("kind") == "PayloadRun"
]
RunKey = tuple[str, str]  # (namespace, name)
# The whole-run floor's runs: PayloadRuns of the CRD's copy under a group of its own, which the
# operator (it watches payloadrun.dev) never sees: the same schema, size and storage.
FLOOR_GROUP = f"floor.{GROUP}"
FLOOR_API_VERSION = f"{FLOOR_GROUP}/{VERSION}"
kube.PLURALS[FLOOR_API_VERSION, KIND] = PLURAL  # for this process's client only


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Phases:
    """How long each phase took, printed at the end."""

    took: list[tuple[str, float]] = field(default_factory=list)

    @contextlib.contextmanager
    def timed(self, label: str) -> Iterator[None]:
        progress(f"{label} ...")
        t0 = time.monotonic()
        yield
        self.took.append((label, time.monotonic() - t0))
        progress(f"{label}: {self.took[-1][1]:.1f} s")


# --- the operator's process -----------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` so far (its threads included, not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


# --- the operator's requests, as the API server saw them ------------------------------------------


def audit_policy(user: str) -> dict:
    """Every request of ``user`` at level Metadata (who, what, when: no bodies), no one else's."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": [user]}, {"level": "None"}],
    }


def audit_args(state: Path) -> list[str]:
    policy = state / "audit-policy.yaml"
    policy.write_text(json.dumps(audit_policy(OPERATOR_USER)))
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={state / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",  # written before the response: nothing lost at a window's end
    ]


def audited_requests(log: Path, since: float, until: float) -> Counter[str]:
    """The requests received between the wall-clock times ``since`` and ``until``, by verb and
    resource. A watch has two audit events (its response started, completed): one request."""
    seen: dict[str, str] = {}
    with open(log) as f:
        for line in f:
            event = json.loads(line)
            when = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
            if since <= when < until:
                ref = event.get("objectRef") or {}
                what = "/".join(p for p in (ref.get("resource"), ref.get("subresource")) if p)
                seen[event["auditID"]] = f"{event['verb']} {what or event['requestURI']}"
    return Counter(seen.values())


def for_runs(requests: Counter[str]) -> Counter[str]:
    """The requests the runs cause: all but the election's Lease (an update every 2 s
    whatever the runs, which the idle figures count), so a burst's window does not charge its
    runs with them."""
    return Counter({what: n for what, n in requests.items() if not what.endswith(" leases")})


def breakdown(requests: Counter[str], per: float = 1.0) -> str:
    return ", ".join(f"{what} {n / per:.3g}" for what, n in requests.most_common())


@dataclass(frozen=True)
class Idle:
    runs: int
    seconds: float
    cpu: float  # the operator's, cores
    apiserver_cpu: float
    requests: Counter[str]
    load: str

    @property
    def per_minute(self) -> float:
        return sum(self.requests.values()) * 60 / self.seconds


def measure_idle(
    op_pid: int, apiserver_pid: int, audit_log: Path, runs: int, seconds: float
) -> Idle:
    time.sleep(SETTLE_SECONDS)
    load = machine_load()
    wall0, t0 = time.time(), time.monotonic()
    op0, api0 = cpu_seconds(op_pid), cpu_seconds(apiserver_pid)
    time.sleep(seconds)
    op1, api1 = cpu_seconds(op_pid), cpu_seconds(apiserver_pid)
    wall1, elapsed = time.time(), time.monotonic() - t0
    requests = audited_requests(audit_log, wall0, wall1)
    return Idle(runs, elapsed, (op1 - op0) / elapsed, (api1 - api0) / elapsed, requests, load)


# --- the runs -------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_body(name: str) -> dict:
    body = copy.deepcopy(EXAMPLE)
    body["metadata"] = {"name": name}
    return body


def run_keys(namespace: str, count: int, start: int = 0) -> list[RunKey]:
    return [(namespace, f"run-{i:04d}") for i in range(start, start + count)]


def is_ready(run: dict) -> bool:
    conditions = (run.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class RunWatch:
    """When each run was first seen reconciled, and first seen Ready, from one watch of every
    run in the cluster (relisted when the watch's resourceVersion is too old)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.changed = threading.Condition()
        self.reconciled: dict[RunKey, float] = {}
        self.ready: dict[RunKey, float] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="run-watch", daemon=True)

    def __enter__(self) -> RunWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()

    def _see(self, run: dict, now: float) -> None:
        meta = run["metadata"]
        key = (meta["namespace"], meta["name"])
        status = run.get("status") or {}
        with self.changed:
            if status.get("observedGeneration") == meta.get("generation"):
                self.reconciled.setdefault(key, now)
            if is_ready(run):
                self.ready.setdefault(key, now)
            self.changed.notify_all()

    def _relist(self) -> str:
        listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        now = time.monotonic()
        for run in listed["items"]:
            self._see(run, now)
        return listed["metadata"]["resourceVersion"]

    def _follow(self) -> None:
        version = self._relist()
        while not self._stopping.is_set():
            try:
                for event in watch.Watch().stream(
                    self.custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    PLURAL,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=30,
                ):
                    if event["type"] == "ERROR":
                        version = self._relist()
                        break
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._see(event["object"], time.monotonic())
            except ApiException as exc:
                if exc.status != 410:
                    raise
                version = self._relist()
            except urllib3.exceptions.HTTPError:  # the API server went away, or stops
                if self._stopping.wait(1.0):
                    return

    def wait(
        self,
        seen: dict[RunKey, float],
        keys: Iterable[RunKey],
        what: str,
        timeout: float,
        logs: Callable[[], str] = lambda: "",
    ) -> None:
        """Until every one of ``keys`` is in ``seen`` (``self.reconciled`` or ``self.ready``),
        with a line of progress every 10 s."""
        wanted = set(keys)
        deadline = time.monotonic() + timeout
        told = time.monotonic()
        with self.changed:
            while missing := wanted - seen.keys():
                now = time.monotonic()
                if now > deadline:
                    raise TimeoutError(
                        f"{len(missing)} of {len(wanted)} runs not {what} after {timeout:.0f} s "
                        f"(e.g. {sorted(missing)[:3]}); the operator's log ends:\n{logs()}"
                    )
                if now - told > 10:
                    progress(f"  {len(wanted) - len(missing)} of {len(wanted)} runs {what}")
                    told = now
                self.changed.wait(1.0)

    def latencies(self, seen: dict[RunKey, float], since: dict[RunKey, float]) -> list[float]:
        return [seen[key] - t0 for key, t0 in since.items()]


def create_runs(
    custom: client.CustomObjectsApi, keys: list[RunKey], concurrency: int = CONCURRENCY
) -> dict[RunKey, float]:
    """Create the runs, ``concurrency`` calls in flight; when each create call was made."""
    sent: dict[RunKey, float] = {}

    def create(key: RunKey) -> None:
        namespace, name = key
        sent[key] = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, run_body(name))
        if len(sent) % 250 == 0:
            progress(f"  {len(sent)} of {len(keys)} runs created")

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(create, keys))
    return sent


def make_namespace(core: client.CoreV1Api, name: str) -> str:
    core.create_namespace({"metadata": {"name": name}})
    return name


# --- the controllers' part: pods, and the children's status ---------------------------------------


@dataclass
class RunChildren:
    """One run's workloads, as (kind, name, generation, pods wanted), and its pods' names."""

    workloads: list[tuple[str, str, int, int]] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)


def workload_pods(workload: dict) -> list[dict]:
    """The pods a StatefulSet's or a Job's controller would create from its template."""
    meta, spec = workload["metadata"], workload["spec"]
    template = spec["template"]
    owner = {
        "apiVersion": workload["apiVersion"],
        "kind": workload["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pods = []
    if workload["kind"] == "StatefulSet":
        count = spec.get("replicas", 1)
    else:
        count = spec.get("parallelism", 1) if not spec.get("suspend") else 0
    for i in range(count):
        pod_meta = copy.deepcopy(template.get("metadata") or {})
        labels = pod_meta.setdefault("labels", {})
        pod_spec = copy.deepcopy(template["spec"])
        if workload["kind"] == "StatefulSet":
            name = f"{meta['name']}-{i}"
            labels |= {
                "statefulset.kubernetes.io/pod-name": name,
                "apps.kubernetes.io/pod-index": str(i),
            }
            pod_spec |= {"hostname": name, "subdomain": spec.get("serviceName", "")}
        else:
            name = f"{meta['name']}-{i}-bench"
            labels |= {
                "batch.kubernetes.io/job-name": meta["name"],
                "batch.kubernetes.io/controller-uid": meta["uid"],
                "batch.kubernetes.io/job-completion-index": str(i),
            }
            pod_meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = (
                str(i)
            )
            pod_spec["hostname"] = f"{meta['name']}-{i}"
        pod_meta |= {"name": name, "namespace": meta["namespace"], "ownerReferences": [owner]}
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec})
    return pods


def list_raw(call: Callable, namespace: str, **params: str) -> list[dict]:
    resp = call(namespace, _preload_content=False, **params)
    return json.loads(resp.data)["items"]


def create_pods(
    api_client: client.ApiClient, namespace: str, concurrency: int = CONCURRENCY
) -> dict[str, RunChildren]:
    """Create the pods of every workload of the operator's in ``namespace``; each run's."""
    apps, batch = client.AppsV1Api(api_client), client.BatchV1Api(api_client)
    core = client.CoreV1Api(api_client)
    runs: dict[str, RunChildren] = {}
    pods: list[dict] = []
    for api_version, kind, call in (
        ("apps/v1", "StatefulSet", apps.list_namespaced_stateful_set),
        ("batch/v1", "Job", batch.list_namespaced_job),
    ):
        for workload in list_raw(call, namespace, label_selector=MANAGED_SELECTOR):
            workload |= {"apiVersion": api_version, "kind": kind}
            meta = workload["metadata"]
            children = runs.setdefault(meta["labels"][LABEL_RUN], RunChildren())
            made = workload_pods(workload)
            children.workloads.append((kind, meta["name"], meta["generation"], len(made)))
            children.pods += [p["metadata"]["name"] for p in made]
            pods += made
    created = 0

    def create(pod: dict) -> None:
        nonlocal created
        core.create_namespaced_pod(namespace, pod)
        created += 1
        if created % 1000 == 0:
            progress(f"  {created} of {len(pods)} pods created")

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(create, pods))
    return runs


def rfc3339_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def make_ready(api_client: client.ApiClient, namespace: str, children: RunChildren) -> float:
    """Patch the run's pods Running and Ready, then its workloads' status as their controllers
    would; the time the last workload's patch was sent."""
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    batch = client.BatchV1Api(api_client)
    now = rfc3339_now()
    true = [
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    for pod in children.pods:
        core.patch_namespaced_pod_status(
            pod, namespace, {"status": {"phase": "Running", "startTime": now, "conditions": true}}
        )
    sent = 0.0
    for kind, name, generation, pods in children.workloads:
        sent = time.monotonic()
        if kind == "StatefulSet":
            apps.patch_namespaced_stateful_set_status(
                name,
                namespace,
                {
                    "status": {
                        "observedGeneration": generation,
                        "replicas": pods,
                        "readyReplicas": pods,
                        "currentReplicas": pods,
                        "updatedReplicas": pods,
                        "availableReplicas": pods,
                    }
                },
            )
        else:
            batch.patch_namespaced_job_status(
                name, namespace, {"status": {"active": pods, "ready": pods, "startTime": now}}
            )
    return sent


# --- the baselines --------------------------------------------------------------------------------


def run_context(name: str, namespace: str, uid: str) -> RunContext:
    """The example's run as the operator builds it."""
    spec = PayloadRunSpec.model_validate(EXAMPLE["spec"])
    return RunContext(name, namespace, uid, spec, decide_payload_mode(spec), OperatorSettings())


def install_floor_crd(cluster: LocalCluster) -> None:
    """The PayloadRun CRD again, under :data:`FLOOR_GROUP`: the whole-run floor's runs."""
    crd = yaml.safe_load((REPO / "crds" / f"{GROUP}_{PLURAL}.yaml").read_text())
    crd["metadata"]["name"] = f"{PLURAL}.{FLOOR_GROUP}"
    crd["spec"]["group"] = FLOOR_GROUP
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(crd), check=True)
    cluster.wait_established(f"{PLURAL}.{FLOOR_GROUP}")


def first_status(ctx: RunContext, run: dict) -> dict:
    """The status the operator's first pass writes on a new run: the spec valid, the children
    applied, the volume and the workloads not ready yet, its record of the handled spec."""
    checks = {
        ConditionType.VALIDATED: SPEC_VALID,
        ConditionType.APPLIED: CHILDREN_APPLIED,
        ConditionType.VOLUME_READY: claim_check(None, ctx.claim),
        ConditionType.READY: workloads_check([None, None, None], ["inference", "orch", "trainer"]),
    }
    decision = ctx.decision
    fields = {
        **handled(run),
        StatusField.PAYLOAD_MODE: str(decision.mode),
        StatusField.PAYLOAD_MODE_REASON: str(decision.reason),
        StatusField.PAYLOAD_MODE_MESSAGE: decision.message,
        StatusField.PAYLOAD_ROOT: ctx.root,
        StatusField.CLAIM_NAME: ctx.claim,
        StatusField.START_TIME: utc_now(),
    }
    written = status_update({}, 1, checks, fields, utc_now()).fields
    assert written is not None
    return written


def bench_direct_apply(
    kubeconfig: Path, namespace: str, runs: int, *, at_once: bool, whole: bool = False
) -> list[float]:
    """Server-side apply of ``runs`` runs' children from here, with the operator's own client,
    each run's children one after another as the operator applies them: one run at a time (the
    time of each), or every run at once (the time from the start to each run's last child: what
    the API server alone needs for a burst, the floor under the operator's). ``whole``: each
    run also created first (of :data:`FLOOR_GROUP`, owning its children) and its status written
    once after (:func:`first_status`), as a run the operator handles costs the API server."""
    os.environ["KUBECONFIG"] = str(kubeconfig)
    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())

    async def apply_run(kube: KubeClient, i: int, t0: float | None) -> float:
        name = f"run-{i:04d}"
        start = time.monotonic() if t0 is None else t0
        run: dict | None = None
        if whole:
            body = run_body(name)
            body["apiVersion"] = FLOOR_API_VERSION
            body["metadata"]["namespace"] = namespace
            run = await kube.apply(body)
        ctx = run_context(name, namespace, run["metadata"]["uid"] if run else f"uid-{i}")
        for child in build_children(ctx):
            if run is None:
                child["metadata"].pop("ownerReferences", None)  # no owner object exists here
            else:  # owned by the floor's run, which the garbage collector then finds
                for ref in child["metadata"].get("ownerReferences") or []:
                    ref["apiVersion"] = FLOOR_API_VERSION
            await kube.apply(child)
        if run is not None:
            await kube.patch_status(run, first_status(ctx, run))
        return time.monotonic() - start

    async def apply_all() -> list[float]:
        kube = KubeClient()
        kube.login(info)
        try:
            if at_once:
                t0 = time.monotonic()
                return list(await asyncio.gather(*(apply_run(kube, i, t0) for i in range(runs))))
            return [await apply_run(kube, i, None) for i in range(runs)]
        finally:
            await kube.close()

    return asyncio.run(apply_all())


def floor_bursts(
    cluster: LocalCluster, core: client.CoreV1Api, prefix: str, runs: int, bursts: int
) -> tuple[list[list[float]], list[list[float]]]:
    """The two floors under a burst of ``runs`` runs at once, ``bursts`` times each: the
    children applied alone, and whole runs (created, their children, their status once)."""
    children = [
        bench_direct_apply(
            cluster.kubeconfig, make_namespace(core, f"{prefix}-{k}"), runs, at_once=True
        )
        for k in range(bursts)
    ]
    whole = [
        bench_direct_apply(
            cluster.kubeconfig,
            make_namespace(core, f"{prefix}-whole-{k}"),
            runs,
            at_once=True,
            whole=True,
        )
        for k in range(bursts)
    ]
    return children, whole


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
        if getattr(admission, "built", None) is None:  # an operator whose admission builds none
            build_children(admission.ctx)
        times.append(time.perf_counter() - t0)
    return times


# --- the cluster ----------------------------------------------------------------------------------


def bench_cluster(state: Path) -> LocalCluster:
    state.mkdir(parents=True)
    disabled = ",".join(f"-{c}" for c in PLAYED_CONTROLLERS)
    return LocalCluster(
        state / "cluster",
        extra_args={
            "kube-apiserver": audit_args(state),
            "kube-controller-manager": [f"--controllers=*,{disabled}"],
        },
    )


def operator_identity(cluster: LocalCluster, kubeconfig: Path) -> Path:
    """A service account for the operator (cluster-admin), so its requests are its own."""
    manifests = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BENCH_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": OPERATOR_SA, "namespace": BENCH_NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "payloadrun-bench-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": BENCH_NAMESPACE}
            ],
        },
        # the example's pods ask for it; without it the API server refuses them
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        },
    ]
    cluster.kubectl(
        "apply", "-f", "-", input="\n---\n".join(json.dumps(m) for m in manifests), check=True
    )
    return cluster.service_account_kubeconfig(
        BENCH_NAMESPACE, OPERATOR_SA, kubeconfig, expiration_seconds=24 * 3600
    )


@dataclass(frozen=True)
class Burst:
    """What runs created at once cost, from the first create to the last run reconciled."""

    runs: int
    seconds: float
    requests: Counter[str]  # the operator's
    cpu: float  # the operator's, CPU seconds
    apiserver_cpu: float
    bench_cpu: float  # this process's (its creates and its watch)

    def __add__(self, other: Burst) -> Burst:
        return Burst(
            self.runs + other.runs,
            self.seconds + other.seconds,
            self.requests + other.requests,
            self.cpu + other.cpu,
            self.apiserver_cpu + other.apiserver_cpu,
            self.bench_cpu + other.bench_cpu,
        )


# --- the benchmark --------------------------------------------------------------------------------


@dataclass
class Results:
    """What one benchmark run measured; the labels say at how many runs."""

    direct: list[float] = field(default_factory=list)
    direct_apiserver_cpu: float = 0.0  # CPU seconds over the direct applies
    applies: int = 0  # one run's children: the applies a created run needs
    # the same bursts' children applied straight from here, every run at once (the floor):
    # each burst's latencies
    direct_at_once: dict[str, list[list[float]]] = field(default_factory=dict)
    # and whole runs from here (created, their children, their status written once)
    whole_at_once: dict[str, list[list[float]]] = field(default_factory=dict)
    # apply -> status reported, each burst's (one at a time: one)
    latency: dict[str, list[list[float]]] = field(default_factory=dict)
    bursts: dict[str, Burst] = field(default_factory=dict)  # the bursts of a label together
    ready: dict[str, list[float]] = field(default_factory=dict)  # children ready -> Ready
    idle: list[Idle] = field(default_factory=list)
    rss: dict[str, float] = field(default_factory=dict)  # MiB


class Bench:
    """The cluster, this process's clients and watch, the operator, and what they measured."""

    def __init__(
        self, cluster: LocalCluster, audit_log: Path, runs: RunWatch, op: LocalOperator
    ) -> None:
        self.cluster, self.audit_log, self.runs, self.op = cluster, audit_log, runs, op
        self.api_client = runs.custom.api_client
        self.core = client.CoreV1Api(self.api_client)
        self.custom = runs.custom
        self.children: dict[str, dict[str, RunChildren]] = {}  # namespace -> run -> children
        self.total = 0  # runs created
        self.results = Results()

    def reconciled(self, sent: dict[RunKey, float], timeout: float) -> list[float]:
        self.runs.wait(self.runs.reconciled, sent, "reconciled", timeout, self.op.log_tail)
        self.total += len(sent)
        return self.runs.latencies(self.runs.reconciled, sent)

    def one_at_a_time(self, label: str, keys: list[RunKey]) -> None:
        latencies: list[float] = []
        for key in keys:
            latencies += self.reconciled(create_runs(self.custom, [key], 1), 60)
        self.results.latency[label] = [latencies]

    def at_once(self, label: str, keys: list[RunKey], timeout: float = 300) -> None:
        """``keys`` created CONCURRENCY at a time; their latencies, and the operator's requests
        from the first create to the last run reconciled (``label`` None: none recorded)."""
        apiserver = self.cluster.processes["kube-apiserver"].pid
        wall0, t0 = time.time(), time.monotonic()
        op0, api0, own0 = cpu_seconds(self.op.pid), cpu_seconds(apiserver), time.process_time()
        latencies = self.reconciled(create_runs(self.custom, keys), timeout)
        op1, api1, own1 = cpu_seconds(self.op.pid), cpu_seconds(apiserver), time.process_time()
        self.results.latency.setdefault(label, []).append(latencies)
        requests = audited_requests(self.audit_log, wall0, time.time())
        burst = Burst(
            len(keys), time.monotonic() - t0, requests, op1 - op0, api1 - api0, own1 - own0
        )
        before = self.results.bursts.get(label)
        self.results.bursts[label] = burst if before is None else before + burst

    def pods(self, namespace: str) -> None:
        self.children[namespace] = create_pods(self.api_client, namespace)

    def readiness(self, label: str, keys: list[RunKey]) -> None:
        """Make ``keys`` ready one every READY_SPACING s; the latencies to their Ready=True."""
        sent: dict[RunKey, float] = {}
        next_at = time.monotonic()
        for namespace, name in keys:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += READY_SPACING
            children = self.children[namespace][name]
            sent[namespace, name] = make_ready(self.api_client, namespace, children)
        self.runs.wait(self.runs.ready, keys, "Ready", 180, self.op.log_tail)
        self.results.ready[label] = self.runs.latencies(self.runs.ready, sent)

    def idle(self, seconds: float) -> None:
        apiserver = self.cluster.processes["kube-apiserver"].pid
        self.results.idle.append(
            measure_idle(self.op.pid, apiserver, self.audit_log, self.total, seconds)
        )

    def rss(self, label: str) -> None:
        self.results.rss[label] = rss_mib(self.op.pid)


def first_small(args: argparse.Namespace) -> int:
    """Runs after the first burst at once: the warm-up run, one at a time, that burst."""
    return 2 * args.runs + 1


def small_runs(args: argparse.Namespace) -> int:
    """Runs before ``--scale``: the warm-up run, one at a time, every burst at once."""
    return args.runs * (1 + args.bursts) + 1


def median_p95(bursts: list[list[float]]) -> float:
    """The median of the bursts' p95s: one burst's p95 is one of its slowest runs."""
    return statistics.median(percentile(b, 0.95) for b in bursts)


def run_bench(args: argparse.Namespace, phases: Phases) -> Results:
    small = small_runs(args)
    label = f"{args.runs} at once"
    ready_runs = min(args.ready_runs, args.runs)
    with (
        tempfile.TemporaryDirectory(prefix="payloadrun-bench-op-") as tmp,
        bench_cluster(Path(tmp) / "state") as cluster,
    ):
        print(f"control plane up at {cluster.server}", flush=True)
        cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"), check=True)
        cluster.wait_established(f"{PLURAL}.{GROUP}")
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        api_client.configuration.connection_pool_maxsize = 2 * CONCURRENCY
        core = client.CoreV1Api(api_client)
        with phases.timed(f"direct SSA of {args.runs} runs' children"):
            api0 = cpu_seconds(cluster.processes["kube-apiserver"].pid)
            direct = bench_direct_apply(
                cluster.kubeconfig, make_namespace(core, "bench-direct"), args.runs, at_once=False
            )
            direct_cpu = cpu_seconds(cluster.processes["kube-apiserver"].pid) - api0
        install_floor_crd(cluster)
        with phases.timed(f"the floors of {args.bursts} x {args.runs} runs at once"):
            direct_at_once, whole_at_once = floor_bursts(
                cluster, core, "bench-direct-at-once", args.runs, args.bursts
            )
        op_kubeconfig = operator_identity(cluster, Path(tmp) / "operator.kubeconfig")
        with (
            RunWatch(api_client) as runs,
            LocalOperator(
                op_kubeconfig,
                log_path=Path(tmp) / "operator.log",
                client_libraries=args.client_libraries,
            ) as op,
        ):
            bench = Bench(cluster, Path(tmp) / "state" / "audit.log", runs, op)
            bench.results.direct, bench.results.direct_apiserver_cpu = direct, direct_cpu
            bench.results.applies = len(build_children(run_context("run", "bench", "uid")))
            bench.results.direct_at_once[label] = direct_at_once
            bench.results.whole_at_once[label] = whole_at_once
            bench.rss("start")
            # the first run also waits for the operator's start (its lists, its lease)
            warmup = run_keys(make_namespace(core, "bench-warmup"), 1)
            bench.reconciled(create_runs(bench.custom, warmup), 120)
            with phases.timed(f"{args.runs} runs one at a time"):
                keys = run_keys(make_namespace(core, "bench-one-at-a-time"), args.runs)
                bench.one_at_a_time("one at a time", keys)
            at_once = [f"bench-at-once-{k}" for k in range(args.bursts)]
            with phases.timed(f"{args.bursts} x {args.runs} runs at once"):
                for k, namespace in enumerate(at_once):
                    bench.at_once(label, run_keys(make_namespace(core, namespace), args.runs))
                    if k == 0:
                        bench.rss(f"after {bench.total} runs")
            with phases.timed(f"the pods of {small} runs, {ready_runs} made ready"):
                for namespace in ("bench-warmup", "bench-one-at-a-time", *at_once):
                    bench.pods(namespace)
                bench.readiness(f"at {small} runs", run_keys(at_once[0], ready_runs))
            with phases.timed(f"idle at {small} runs"):
                bench.idle(args.idle_seconds)
            if args.scale:
                scale_up(bench, args, phases)
    return bench.results


def scale_up(bench: Bench, args: argparse.Namespace, phases: Phases) -> None:
    """The runs brought to ``--scale``, idle there, then MORE_AT_SCALE more at once."""
    ready_runs = min(args.ready_runs, args.runs)
    namespace = make_namespace(bench.core, "bench-scale")
    count = args.scale - bench.total
    with phases.timed(f"{count} more runs, to {args.scale}"):
        keys = run_keys(namespace, count)
        bench.reconciled(create_runs(bench.custom, keys), 900)
    with phases.timed(f"their pods ({count} runs)"):
        bench.pods(namespace)
    with phases.timed(f"idle at {args.scale} runs"):
        bench.idle(args.idle_seconds)
    label = f"{MORE_AT_SCALE} more at {args.scale}"
    bursts = f"{args.bursts} x {MORE_AT_SCALE}"
    with phases.timed(f"the floors of {bursts} runs at once, at {args.scale}"):
        results = bench.results
        results.direct_at_once[label], results.whole_at_once[label] = floor_bursts(
            bench.cluster, bench.core, "bench-direct-scale", MORE_AT_SCALE, args.bursts
        )
    with phases.timed(f"{bursts} more at once, from {args.scale} runs"):
        for k in range(args.bursts):
            bench.at_once(label, run_keys(namespace, MORE_AT_SCALE, count + k * MORE_AT_SCALE))
            if k == 0:
                bench.rss(f"after {bench.total} runs")
    with phases.timed(f"{ready_runs} made ready, at {bench.total} runs"):
        bench.readiness(f"at {bench.total} runs", keys[:ready_runs])


# --- the report -----------------------------------------------------------------------------------


def flat(bursts: list[list[float]]) -> list[float]:
    return [t for burst in bursts for t in burst]


def latency_row(label: str, values: list[float], base: float | None = None) -> str:
    p50, p95 = statistics.median(values), percentile(values, 0.95)
    ratio = f"{p95 / base:>15.1f}" if base else ""
    return f"{label:<40} {p50 * 1e3:>7.0f}ms {p95 * 1e3:>7.0f}ms {ratio}"


def idle_lines(idle: Idle) -> list[str]:
    return [
        f"idle at {idle.runs} runs ({idle.seconds:.0f} s, {idle.load}): operator CPU "
        f"{idle.cpu * 100:.2f}% of a core, API server {idle.apiserver_cpu * 100:.1f}%; "
        f"{idle.per_minute:.1f} operator requests/min",
        f"  per minute: {breakdown(idle.requests, idle.seconds / 60) or 'none'}",
    ]


def print_results(r: Results, args: argparse.Namespace, phases: Phases) -> None:
    base_p50 = statistics.median(r.direct)
    build_p50 = statistics.median(bench_admit_and_build())
    print()
    print(
        f"admission + building one run's children, in the operator: {build_p50 * 1e3:.1f} ms "
        f"p50 over 200 rounds, {build_p50 / base_p50:.2f} of the direct SSA p50"
    )
    print(f"{'apply -> status reported':<40} {'p50':>9} {'p95':>9} {'p95/direct p50':>15}")
    print(latency_row("direct SSA of the children", r.direct))
    for label, bursts in r.direct_at_once.items():
        print(latency_row(f"direct SSA, {label} (all bursts)", flat(bursts)))
    for label, bursts in r.whole_at_once.items():
        print(latency_row(f"whole runs from here, {label} (all bursts)", flat(bursts)))
    for label, bursts in r.latency.items():
        print(latency_row(f"operator, {label}", flat(bursts), base_p50))
    for label, floor in r.direct_at_once.items():
        ours = r.latency[label]
        print(
            f"operator p95 / direct SSA p95, {label}: {median_p95(ours) / median_p95(floor):.2f}"
            f" (medians of {len(ours)} bursts' p95s; operator "
            + ", ".join(f"{percentile(b, 0.95):.2f}" for b in ours)
            + " s, direct "
            + ", ".join(f"{percentile(b, 0.95):.2f}" for b in floor)
            + " s: the direct p95 is the API server's alone, no operator answers sooner)"
        )
    for label, floor in r.whole_at_once.items():
        ours = r.latency[label]
        print(
            f"operator p95 / whole-run p95, {label}: {median_p95(ours) / median_p95(floor):.2f}"
            " (whole runs: created, their children applied, their status written once, from "
            "here: " + ", ".join(f"{percentile(b, 0.95):.2f}" for b in floor) + " s)"
        )
    for label, floor in r.whole_at_once.items():
        # no operator reconciles a run for less than the API server's work on it: the run's
        # create and its one status write on top of the children (the whole-run floor)
        children_only = r.direct_at_once[label]
        print(
            f"whole-run p95 / children-only p95, {label}: "
            f"{median_p95(floor) / median_p95(children_only):.2f} (the run's own create and "
            "status write, with no operator: the least an operator's ratio to the "
            "children-only floor can be)"
        )
    direct_cpu = r.direct_apiserver_cpu / len(r.direct) * 1e3
    print(f"direct SSA: API server CPU {direct_cpu:.0f} ms per run")
    for label, burst in r.bursts.items():
        print(
            f"{label}: all reconciled in {burst.seconds:.1f} s; per run, operator CPU "
            f"{burst.cpu / burst.runs * 1e3:.1f} ms, API server CPU "
            f"{burst.apiserver_cpu / burst.runs * 1e3:.0f} ms, this process "
            f"{burst.bench_cpu / burst.runs * 1e3:.0f} ms; "
            f"{sum(burst.requests.values()) / burst.runs:.1f} operator requests, "
            f"{sum(for_runs(burst.requests).values()) / burst.runs:.2f} without the election's "
            f"Lease ({r.applies} children to apply): {breakdown(burst.requests, burst.runs)}"
        )
    print()
    print(f"{'children ready -> run Ready':<40} {'p50':>9} {'p95':>9}")
    for label, values in r.ready.items():
        print(latency_row(f"{len(values)} runs, {label}", values))
    print()
    for idle in r.idle:
        print("\n".join(idle_lines(idle)))
    if len(r.idle) > 1:
        ratio = r.idle[-1].per_minute / max(r.idle[0].per_minute, 1.0)
        print(f"requests/min at {r.idle[-1].runs} runs / at {r.idle[0].runs}: {ratio:.2f}")
    print()
    if args.client_libraries:
        print("operator: kopf could import the kubernetes client (not so in the operator image)")
    else:
        print("operator: as in its image, import kubernetes fails (--client-libraries allows it)")
    print("operator RSS " + ", ".join(f"{label} {mib:.0f} MiB" for label, mib in r.rss.items()))
    floor, kopf_floor = client_floor_mib(), kopf_floor_mib()
    print(f"a process that only imports kopf, no client library: {kopf_floor:.0f} MiB")
    print(f"a process that only imports kopf + the kubernetes client: {floor:.0f} MiB")
    print(f"ratio operator / client floor: {list(r.rss.values())[-1] / floor:.2f}")
    print()
    print("phases: " + "; ".join(f"{label} {took:.0f} s" for label, took in phases.took))
    print()
    print_goals(goals(r, args))


def goals(r: Results, args: argparse.Namespace) -> list[Goal]:
    def p95(values: list[float]) -> float:
        return percentile(values, 0.95)

    small, first = small_runs(args), first_small(args)
    # the operator against the API server alone (the same children applied from here, in the
    # same run; and whole runs: created, their children, their status once), and the requests
    # a created run costs beyond its children's applies
    out = [
        Goal.at_most(
            f"operator p95 / children-only p95, {label}",
            median_p95(r.latency[label]) / median_p95(floor),
            1.5,
        )
        for label, floor in r.direct_at_once.items()
    ]
    out += [
        Goal.at_most(
            f"operator p95 / whole-run p95, {label}",
            median_p95(r.latency[label]) / median_p95(floor),
            1.3,
        )
        for label, floor in r.whole_at_once.items()
    ]
    out += [
        Goal.at_most(
            f"operator requests per created run, {label}",
            sum(for_runs(burst.requests).values()) / burst.runs,
            r.applies + 1,
        )
        for label, burst in r.bursts.items()
    ]
    out += [
        Goal.at_most("operator p95, one at a time (s)", p95(flat(r.latency["one at a time"])), 2),
        Goal.at_most("children ready -> Ready, p95 (s)", p95(r.ready[f"at {small} runs"]), 1),
        Goal.at_most(
            f"operator RSS after {first} runs (MB)", r.rss[f"after {first} runs"] * MIB / 1e6, 100
        ),
    ]
    if args.scale:
        small_idle, scale_idle = r.idle[0], r.idle[-1]
        total = args.scale + MORE_AT_SCALE
        out += [
            Goal.at_most(f"idle CPU at {args.scale} runs (% of a core)", scale_idle.cpu * 100, 1),
            Goal.at_most(
                f"requests/min, {args.scale} runs / {small}",
                scale_idle.per_minute / max(small_idle.per_minute, 1.0),
                1.25,
            ),
            Goal.at_most(
                f"operator RSS after {total} runs (MB)",
                r.rss[f"after {total} runs"] * MIB / 1e6,
                140,
            ),
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50, help="runs one at a time, and at once")
    parser.add_argument("--ready-runs", type=int, default=50, help="runs made ready (<= --runs)")
    parser.add_argument(
        "--scale", type=int, default=0, help="then bring the runs to this many (e.g. 1000)"
    )
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument(
        "--client-libraries",
        action="store_true",
        help="let the operator import the kubernetes client (its image has none)",
    )
    parser.add_argument(
        "--bursts",
        type=int,
        default=3,
        help="bursts of --runs at once, the floor's and the operator's, at the start and at "
        "--scale: each p95 compared is the median of the bursts' (default 3)",
    )
    args = parser.parse_args()
    if args.bursts < 1:
        parser.error(f"--bursts must be at least 1, got {args.bursts}")
    small = small_runs(args)
    if args.scale and args.scale <= small:
        parser.error(f"--scale must be more than the {small} runs that --runs {args.runs} makes")
    phases = Phases()
    print_load("start")
    results = run_bench(args, phases)
    print_results(results, args, phases)
    print_load("end")


if __name__ == "__main__":
    main()
