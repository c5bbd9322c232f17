"""Helpers of the tests that run a PayloadRun's pods on the local node, with the operator as a
host process that a test can restart or upgrade (the fixtures are in conftest.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from builders import NODE_PAYLOADS, run_body
from payloadrun.testing.processes import FAKE_VLLM_MODULE
from payloadrun_devkit.local_operator import LocalOperator
from payloadrun_operator.api import kinds

REPO = Path(__file__).resolve().parents[2]
IMAGE = "payloadrun:e2e"
NEXT_IMAGE = "payloadrun:e2e-next"  # the same image under a new tag: an upgrade's new sidecars
# An orchestrator or trainer that waits until stopped, and stops at SIGTERM (not after the
# grace period, as a `python -c "time.sleep(...)"` as PID 1 would)
SLEEP = ["python", "-m", "payloadrun.testing.roles", "idle"]
# the inference container of the end-to-end pods: the test kit's fake vLLM on vLLM's port
FAKE_VLLM = ["python", "-m", FAKE_VLLM_MODULE, "--host", "0.0.0.0", "--port", "8000"]

# Pod Security's restricted level (the Pod Security Standards), as the runs' own containers
# meet it: the operator adds no security context to the user's containers, so a template that is
# to run in a restricted namespace carries it. The pod's part covers every container (the image's
# user is uid 65532, so runAsNonRoot needs no runAsUser); the container's part is per container,
# as the API has it.
RESTRICTED_POD = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
MAIN_CONTAINERS = {"inference": "vllm", "orchestrator": "orchestrator", "trainer": "trainer"}
POD_SECURITY = "pod-security.kubernetes.io"


def pod_security_labels(level: str) -> dict[str, str]:
    """A namespace's labels that make the API server enforce Pod Security ``level`` on its pods
    (and warn about workloads whose pod templates it would refuse)."""
    return {
        f"{POD_SECURITY}/enforce": level,
        f"{POD_SECURITY}/enforce-version": "latest",
        f"{POD_SECURITY}/warn": level,
        f"{POD_SECURITY}/warn-version": "latest",
    }


def restricted(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` (a PayloadRun) with every role's template restricted-compliant: the pod's and
    each container's security context (the main container added to the template, by name, when
    the role gives it by its short fields). What the template sets itself is kept (capabilities
    it adds too, beside dropping the rest)."""
    run = copy.deepcopy(run)
    for role, main in MAIN_CONTAINERS.items():
        template = run["spec"].setdefault(role, {}).setdefault("template", {})
        spec = template.setdefault("spec", {})
        spec["securityContext"] = {**RESTRICTED_POD, **spec.get("securityContext", {})}
        containers = spec.setdefault("containers", [])
        if not any(c.get("name") == main for c in containers):
            containers.insert(0, {"name": main})
        for container in [*containers, *spec.get("initContainers", [])]:
            theirs = container.get("securityContext", {})
            container["securityContext"] = {
                **RESTRICTED_CONTAINER,
                **theirs,
                "capabilities": {"drop": ["ALL"], **theirs.get("capabilities", {})},
            }
    return run


def node_run(name: str, *, namespace: str | None = None, **spec: Any) -> dict[str, Any]:
    """A by-handle run (router replay) for the local node's pods: its payloads on a claim of the
    node's ReadWriteMany class, its own containers restricted-compliant; ``spec`` sets the rest
    (and may replace those two)."""
    return restricted(
        run_body(
            name, {"routerReplay": True, "payloads": NODE_PAYLOADS, **spec}, namespace=namespace
        )
    )


class Operator:
    """The operator as a host process that a test can restart, or upgrade to other settings."""

    def __init__(self, cluster, namespace: str, tmp_path: Path) -> None:
        self.cluster, self.namespace, self.tmp_path = cluster, namespace, tmp_path
        self.process: LocalOperator | None = None
        self.starts = 0

    def start(self, sidecar_image: str = IMAGE) -> LocalOperator:
        self.stop()
        self.starts += 1
        self.process = LocalOperator(
            self.cluster.kubeconfig,
            namespaces=(self.namespace,),
            env={
                "PAYLOADRUN_SIDECAR_IMAGE": sidecar_image,
                "PAYLOADRUN_SIDECAR_IMAGE_PULL_POLICY": "Never",
                # no resync in a test's time: every status change comes from watch events
                "PAYLOADRUN_RESYNC_SECONDS": "3600",
            },
            log_path=self.tmp_path / f"operator-{self.starts}.log",
        ).start()
        return self.process

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def reconciled(self) -> float:
        """How many reconciles this operator process has applied (from its /metrics)."""
        assert self.process is not None
        return metric_sum(self.process.metrics_url, RECONCILES, 'result="applied"')

    def caught_up(self, refreshes: float = 1) -> bool:
        """Whether this operator process has refreshed run statuses ``refreshes`` times and
        has none pending (:func:`status_caught_up`)."""
        assert self.process is not None
        return status_caught_up(self.process.metrics_url, refreshes)


RECONCILES = "payloadrun_operator_reconciles_total"
REFRESHES = "payloadrun_operator_status_refreshes_total"
PENDING = "payloadrun_operator_status_pending_runs"


def metric_sum(metrics_url: str, family: str, having: str = "") -> float:
    """The sum of ``family``'s samples (those whose labels contain ``having``) at
    ``metrics_url``; 0 when it has none."""
    with urllib.request.urlopen(metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        name, _, labels = sample.partition("{")
        if name == family and having in labels:
            total += float(value)
    return total


def status_refreshes(metrics_url: str) -> float:
    """How many run statuses the operator at ``metrics_url`` has recomputed since it started."""
    return metric_sum(metrics_url, REFRESHES)


def status_caught_up(metrics_url: str, refreshes: float) -> bool:
    """Whether the operator has recomputed run statuses at least ``refreshes`` times since it
    started and has no run pending: it has acted on every watch event it received. What a test
    waits for instead of sleeping for "a readiness pass or two"."""
    return status_refreshes(metrics_url) >= refreshes and metric_sum(metrics_url, PENDING) == 0


def kubectl(cluster, namespace: str, *args: str, input: str | None = None) -> str:
    result = cluster.kubectl("-n", namespace, *args, input=input)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


# kubectl's names of what the tests read -> (apiVersion, plural, namespaced): get() and find()
# read them from the API server in one call. They are what the pod tests poll (twice a second
# while they wait), and a kubectl process cost 87 ms of CPU a call, 1,937 of them in one make test.
RESOURCES: dict[str, tuple[str, str, bool]] = {
    **{
        name: (kind.api_version, kind.plural, True)
        for kind, names in (
            (kinds.RUN, ("payloadrun",)),
            (kinds.POD, ("pod", "pods")),
            (kinds.JOB, ("job",)),
            (kinds.CLAIM, ("pvc",)),
            (kinds.EVENT, ("events",)),
            (kinds.STATEFUL_SET, ("statefulset", "statefulsets")),
            (kinds.SERVICE, ("service",)),
            (kinds.CONFIG_MAP, ("configmap",)),
            (kinds.NETWORK_POLICY, ("networkpolicy",)),
            (kinds.LEADER_WORKER_SET, ("leaderworkerset",)),
            (kinds.WORKLOAD, ("workloads.kueue.x-k8s.io",)),
        )
        for name in names
    },
    "endpointslices": ("discovery.k8s.io/v1", "endpointslices", True),
    "pv": ("v1", "persistentvolumes", False),
    "nodes": ("v1", "nodes", False),
}
QUERY_FLAGS = {"-l": "labelSelector", "--field-selector": "fieldSelector"}


def api_path(namespace: str, resource: str, name: str | None = None) -> str:
    """The API path of ``kubectl -n namespace get resource [name]``."""
    api_version, plural, namespaced = RESOURCES[resource]
    root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{root}/namespaces/{namespace}/{plural}" if namespaced else f"{root}/{plural}"
    return f"{path}/{name}" if name else path


def get(cluster, namespace: str, resource: str, *args: str) -> dict[str, Any]:
    """``kubectl -n namespace get resource [name] [-l selector] [--field-selector selector] -o
    json``'s answer, from the API server: a list's items carry their apiVersion and kind, as
    kubectl's do."""
    name, query, rest = None, {}, list(args)
    while rest:
        arg = rest.pop(0)
        if arg in QUERY_FLAGS:
            query[QUERY_FLAGS[arg]] = rest.pop(0)
        elif name is None and not arg.startswith("-"):
            name = arg
        else:
            raise ValueError(f"get(): {arg!r} is not one of a name, -l and --field-selector")
    if resource not in RESOURCES:
        raise ValueError(f"get(): {resource!r} is not in pod_helpers.RESOURCES: add its path there")
    path = api_path(namespace, resource, name)
    status, body = cluster.request("GET", f"{path}?{urlencode(query)}" if query else path)
    assert status == 200, f"GET {path} {query}: HTTP {status} {body.get('message', body)}"
    if name is None:
        type_meta = {"apiVersion": body["apiVersion"], "kind": body["kind"].removesuffix("List")}
        body["items"] = [{**type_meta, **item} for item in body["items"]]
    return body


def apply(cluster, namespace: str, manifest: dict[str, Any]) -> None:
    kubectl(cluster, namespace, "apply", "-f", "-", input=json.dumps(manifest))


def patch_run(cluster, namespace: str, name: str, patch: dict[str, Any]) -> None:
    kubectl(
        cluster, namespace, "patch", "payloadrun", name, "--type=merge", "-p", json.dumps(patch)
    )


def wait_for(
    what: str,
    probe: Callable[[], Any],
    timeout: float = 180.0,
    seen: Callable[[], Any] | None = None,
) -> Any:
    """``probe()`` once it is truthy; else fail with ``seen()`` (what there was instead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := probe():
            return result
        time.sleep(0.5)  # a probe is one kubectl or one /metrics read
    pytest.fail(f"timed out after {timeout} s waiting for {what}; saw {seen() if seen else None}")


def wait_for_phase(cluster, namespace: str, name: str, phase: str) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        return get(cluster, namespace, "payloadrun", name)

    return wait_for(
        f"{name} {phase}",
        lambda: (r := run()).get("status", {}).get("phase") == phase and r,
        seen=lambda: run().get("status"),
    )


def find(cluster, namespace: str, resource: str, name: str) -> dict[str, Any] | None:
    """The object, or None when there is none (``kubectl get --ignore-not-found``)."""
    path = api_path(namespace, resource, name)
    status, body = cluster.request("GET", path)
    if status == 404:
        return None
    assert status == 200, f"GET {path}: HTTP {status} {body.get('message', body)}"
    return body


def pods(cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return get(cluster, namespace, "pods", "-l", f"payloadrun.dev/run={name}")["items"]


def live_pods(cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(cluster, namespace, name)
        if p["status"].get("phase") in ("Pending", "Running")
        and not p["metadata"].get("deletionTimestamp")
    ]


def running(cluster, namespace: str, name: str) -> dict[str, Any]:
    return wait_for_phase(cluster, namespace, name, "Running")


# One connection attempt per target ``[name, host, port]`` (argv[1], JSON), from inside a pod:
# "connected", or the error's name (kube-router REJECTs a denied connection:
# ConnectionRefusedError at once, no timeout), with its errno's when it has no class of its own
# ("OSError EHOSTUNREACH"). Standard library only: any image runs it.
CONNECT = """
import errno, json, socket, sys
out = {}
for name, host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=3).close()
        out[name] = "connected"
    except OSError as error:
        out[name] = type(error).__name__
        if type(error) is OSError and error.errno:
            out[name] += " " + errno.errorcode.get(error.errno, str(error.errno))
print(json.dumps(out))
"""


def run_helm(kube_cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The built helm against ``kube_cluster``, its answer whatever it is (the caller asserts)."""
    return subprocess.run(
        [str(kube_cluster.binaries.path("helm")), *args],
        capture_output=True,
        text=True,
        env={**kube_cluster.env(), "HOME": str(kube_cluster.state_dir)},
        check=False,
        timeout=300,
    )


Sample = tuple[str, dict[str, str], float]  # a Prometheus sample: name, labels, value


def samples(text: str) -> list[Sample]:
    """Every sample of a Prometheus text page (counters by their ``_total`` names)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def pod_metrics(cluster, namespace: str, pod: str, port: int) -> list[Sample]:
    """A pod's ``/metrics`` on ``port``, through the API server's pod proxy (as Prometheus
    scrapes it in test_e2e.py)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/metrics"
    return samples(kubectl(cluster, namespace, "get", "--raw", path))


def kubelet_probe_metrics(cluster, node: str) -> list[Sample]:
    """The kubelet's probe metrics (``prober_probe_total`` by probe type, result, container and
    pod): how many times it has probed each container, through the API server's node proxy."""
    result = cluster.kubectl("get", "--raw", f"/api/v1/nodes/{node}/proxy/metrics/probes")
    assert result.returncode == 0, f"the kubelet's probe metrics: {result.stderr}"
    return samples(result.stdout)
