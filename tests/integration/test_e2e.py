"""End-to-end test bodies, run against two backends.

- ``local`` (here): the local control plane with the operator as a process. No kubelet runs, so
  what needs pods (readiness, the data path through the sidecars, sidecar metrics) is skipped with
  the reason printed.
- ``kind`` (where Docker exists; ``bash hack/kind-e2e.sh test`` sets it up): the chart's operator
  image in a kind cluster, the run's pods really running (the fake vLLM behind the writer
  sidecar, the retention sidecar beside the orchestrator), and a static hostPath RWX volume.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from payloadrun.codec import compact_routed_experts
from payloadrun_operator.testing import LocalOperator

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "e2e"
RUN = "e2e-run"


def run_manifest(image: str) -> dict[str, Any]:
    sleep = ["python", "-c", "import time; time.sleep(10**9)"]
    return {
        "apiVersion": "payloadrun.dev/v1alpha1",
        "kind": "PayloadRun",
        "metadata": {"name": RUN, "namespace": NAMESPACE},
        "spec": {
            "routerReplay": True,
            "samplingMaskCapture": True,
            # kind's default class; the static volume of hack/kind/volume.yaml is pre-bound
            "payloads": {"volume": {"size": "10Gi", "storageClassName": "standard"}},
            "inference": {
                "image": image,
                "command": ["payloadrun", "fake-vllm", "--host", "0.0.0.0", "--port", "8000"],
            },
            "orchestrator": {"image": image, "command": sleep},
            "trainer": {"image": image, "command": sleep},
        },
    }


@dataclass
class Backend:
    name: str
    kubeconfig: str
    kubectl_bin: str
    pods_run: bool
    operator_metrics: Any  # () -> str

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result.stdout

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def need_pods(self) -> None:
        if not self.pods_run:
            pytest.skip(
                f"{self.name}: no kubelet runs on the local control plane, pods never start"
            )


def _kind_backend() -> Backend:
    kubeconfig = os.environ.get("PAYLOADRUN_KIND_KUBECONFIG")
    if not kubeconfig:
        docker = shutil.which("docker")
        why = "no docker client" if docker is None else "no kind cluster set up"
        if docker:
            probe = subprocess.run([docker, "info"], capture_output=True, text=True, check=False)
            if probe.returncode != 0:
                why = "no Docker engine answers (docker info failed), so kind cannot run here"
        pytest.skip(f"kind end-to-end: {why}; run `bash hack/kind-e2e.sh test` where Docker runs")
    kubectl = shutil.which("kubectl") or "kubectl"

    def metrics() -> str:
        return subprocess.run(
            [
                kubectl,
                f"--kubeconfig={kubeconfig}",
                "get",
                "--raw",
                "/api/v1/namespaces/payloadrun-system/services/payloadrun-metrics:9400/proxy/metrics",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    return Backend("kind", kubeconfig, kubectl, True, metrics)


@pytest.fixture(scope="module", params=["local", "kind"])
def e2e(request, tmp_path_factory):
    if request.param == "kind":
        backend = _kind_backend()
        image = os.environ.get("PAYLOADRUN_E2E_IMAGE", "payloadrun:e2e")
        backend.kubectl("create", "namespace", NAMESPACE, check=False)
        yield backend, image
        backend.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        return
    cluster = request.getfixturevalue("kube_cluster")
    kubectl = str(cluster.binaries.path("kubectl"))
    backend = Backend("local", str(cluster.kubeconfig), kubectl, False, lambda: "")
    backend.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    backend.kubectl("wait", "--for=condition=Established", "crd/payloadruns.payloadrun.dev")
    backend.kubectl("create", "namespace", NAMESPACE, check=False)
    log = tmp_path_factory.mktemp("e2e") / "operator.log"
    with LocalOperator(
        cluster.kubeconfig,
        namespaces=(NAMESPACE,),
        log_path=log,
        env={"PAYLOADRUN_READINESS_CHECK_SECONDS": "1"},
    ) as op:
        backend.operator_metrics = lambda: _http_get(op.metrics_url)
        yield backend, "payloadrun:e2e"
    backend.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def _http_get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def wait_for(what: str, probe, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(1)
    pytest.fail(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


def test_run_reconciles_with_its_sidecars(e2e):
    backend, image = e2e
    backend.kubectl("apply", "-f", "-", input=json.dumps(run_manifest(image)))

    def reconciled():
        status = backend.get("payloadrun", RUN, "-n", NAMESPACE).get("status") or {}
        return status if status.get("observedGeneration") == 1 else None

    status = wait_for("the run reconciled", reconciled, 60)
    assert status["payloadMode"] == "ByHandle"
    assert status["payloadRoot"] == f"/payloads/{NAMESPACE}/{RUN}/payloads"
    sts = backend.get("statefulset", f"{RUN}-inference", "-n", NAMESPACE)
    (writer,) = sts["spec"]["template"]["spec"]["initContainers"]
    assert writer["name"] == "payload-writer" and writer["restartPolicy"] == "Always"
    deploy = backend.get("deployment", f"{RUN}-orchestrator", "-n", NAMESPACE)
    (retention,) = deploy["spec"]["template"]["spec"]["initContainers"]
    assert retention["name"] == "payload-retention"


def test_pods_and_sidecars_become_ready(e2e):
    backend, _ = e2e
    backend.need_pods()
    for component in ("inference", "orchestrator", "trainer"):
        backend.kubectl(
            "wait",
            "--for=condition=Ready",
            "pod",
            "-l",
            f"payloadrun.dev/run={RUN},app.kubernetes.io/component={component}",
            "-n",
            NAMESPACE,
            "--timeout=300s",
        )

    def run_ready():
        status = backend.get("payloadrun", RUN, "-n", NAMESPACE)["status"]
        return status["phase"] == "Running" and status

    status = wait_for("phase Running", run_ready, 120)
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Validated": "True", "VolumeReady": "True", "Ready": "True"}


def test_a_request_by_handle_through_the_writer(e2e):
    backend, _ = e2e
    backend.need_pods()
    root = f"/payloads/{NAMESPACE}/{RUN}/payloads"
    request = {
        "model": "fake",
        "prompt": "the writer sidecar in a real pod",
        "max_tokens": 8,
        "return_token_ids": True,
    }
    proxy = f"/api/v1/namespaces/{NAMESPACE}/services/{RUN}-inference:8001/proxy/v1/completions"

    def post(body: dict) -> dict:
        out = backend.kubectl("create", "--raw", proxy, "-f", "-", input=json.dumps(body))
        return json.loads(out)

    inline = post(request)
    by_handle = post({**request, "vllm_xargs": {"payload_dir": f"{root}/v0"}})
    choice = by_handle["choices"][0]
    assert choice["routed_experts"] is None
    segments = choice["payload"]
    assert segments and all(s["file"].startswith(f"{root}/v0/") for s in segments)
    raw = base64.b64decode(inline["choices"][0]["routed_experts"])
    # what the writer stores: the same ids, compacted to uint8 when they fit
    expected = compact_routed_experts(np.load(io.BytesIO(raw), allow_pickle=False))
    # the trainer pod (read-only mount) reads the rows back through the library
    script = (
        "import json,sys,hashlib;from payloadrun import PayloadReader,segments_from_json;"
        f"segs=segments_from_json(json.loads(sys.argv[1]));r=PayloadReader({root!r});"
        "s=[x for x in segs if x.field=='routed_experts'][0];"
        "a=r.read(segs,'routed_experts',s.pos,s.end);print(hashlib.sha256(a.tobytes()).hexdigest())"
    )
    digest = backend.kubectl(
        "exec",
        "-n",
        NAMESPACE,
        f"{RUN}-trainer-0",
        "-c",
        "trainer",
        "--",
        "python",
        "-c",
        script,
        json.dumps(segments),
    ).strip()
    import hashlib

    assert digest == hashlib.sha256(np.ascontiguousarray(expected).tobytes()).hexdigest()


def test_operator_metrics_are_scraped(e2e):
    backend, _ = e2e
    text = wait_for(
        "operator metrics",
        lambda: "payloadrun_operator_reconciles_total" in (m := backend.operator_metrics()) and m,
        60,
    )
    assert 'payloadrun_operator_reconciles_total{result="applied"}' in text


def test_sidecar_metrics_are_scraped(e2e):
    backend, _ = e2e
    backend.need_pods()
    pod = f"{RUN}-inference-0"
    writer = backend.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}:9401/proxy/metrics"
    )
    assert "payloadrun_writer_requests_total" in writer
    orchestrator = backend.get(
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        f"payloadrun.dev/run={RUN},app.kubernetes.io/component=orchestrator",
    )["items"][0]["metadata"]["name"]
    retention = backend.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{orchestrator}:9402/proxy/metrics"
    )
    assert "payloadrun_retention_directory_bytes" in retention


def test_deleting_the_run_collects_its_children(e2e):
    backend, _ = e2e
    backend.kubectl("delete", "payloadrun", RUN, "-n", NAMESPACE, "--wait=true", "--timeout=120s")

    def gone():
        left = backend.get(
            "statefulsets,deployments,services,configmaps,persistentvolumeclaims",
            "-n",
            NAMESPACE,
            "-l",
            f"payloadrun.dev/run={RUN}",
        )["items"]
        return not left or None

    wait_for("garbage collection of the run's children", lambda: gone() or None, 120)
