"""End-to-end bodies with real pods, run against two backends.

- ``local`` (``make test``): the local cluster with its node (containerd, kubelet, kube-proxy,
  CoreDNS; ``tests/integration/conftest.py``) and the release path a user's cluster takes: the
  project's images built from its Dockerfiles by ``hack/images.sh`` and the chart, pushed by
  ``hack/publish.sh`` (what the release workflow runs) to a real OCI registry on loopback
  (``local_registry.py``), the chart installed from ``oci://`` by ``hack/install-chart.sh`` with
  the operator as a pod, both images pulled from that registry by the node's containerd (nothing
  imported under their names), and ReadWriteMany claims served by the node's provisioner.
- ``kind`` (where Docker runs; ``bash hack/kind-e2e.sh test`` sets it up): the same install on a
  kind cluster, with the static hostPath volume of ``hack/kind/volume.sh``.

The module's tests run in order on one run: each builds on the one before (the run reconciles,
its pods become ready, a request goes through the writer, the trainer reads it, retention
deletes it, Prometheus scrapes what happened, ...).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from local_registry import LocalRegistry
from pod_helpers import CONNECT, FAKE_VLLM, node_run, pod_security_labels

from payloadrun.codec import compact_routed_experts
from payloadrun.settings import RETENTION_METRICS_PORT, VLLM_PORT, WRITER_METRICS_PORT, WRITER_PORT
from payloadrun.testing.processes import free_port
from payloadrun_devcluster.binaries import cache_dir
from payloadrun_devkit.release import release_version
from payloadrun_operator.api.names import TRAINER_DIST_PORT

pytestmark = [pytest.mark.integration, pytest.mark.node]  # its cluster comes by getfixturevalue

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "e2e"
RUN = "e2e-run"
SYSTEM_NS = "payloadrun-system"
ROOT = f"/payloads/{NAMESPACE}/{RUN}/payloads"
OPERATOR_METRICS = f"/api/v1/namespaces/{SYSTEM_NS}/services/payloadrun-metrics:9400/proxy/metrics"
OPERATOR_POD = "app.kubernetes.io/name=payloadrun-operator"  # the chart's selector label
SLEEP = ["python", "-m", "payloadrun.testing.roles", "idle"]  # stops at SIGTERM
# a TCP listener that stops at SIGTERM (http.server as PID 1 ignores it: every deletion of the
# run waited out the 30 s grace period)
RENDEZVOUS_LISTENER = [
    "python", "-m", "payloadrun.testing.roles", "orchestrator", "--port", str(TRAINER_DIST_PORT),
]  # fmt: skip


def run_manifest(image: str, name: str = RUN) -> dict[str, Any]:
    """The run, its own containers restricted-compliant (its namespace enforces restricted); on
    kind, the static volume of hack/kind/volume.yaml is pre-bound to its claim."""
    return node_run(
        name,
        namespace=NAMESPACE,
        samplingMaskCapture=True,
        inference={"image": image, "command": FAKE_VLLM},
        orchestrator={"image": image, "command": SLEEP},
        # two ranks, each listening on the rendezvous port (the network policy test)
        trainer={"image": image, "command": RENDEZVOUS_LISTENER, "replicas": 2},
    )


@dataclass
class Backend:
    name: str
    kubeconfig: str
    env: dict[str, str]  # PATH with kubectl and helm, KUBECONFIG
    image: str = "payloadrun:e2e"
    # local: the registry the release path pushed to, and the node that pulls from it
    registry: LocalRegistry | None = None
    node: Any = None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=self.env,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result.stdout

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def exec(self, pod: str, container: str, *command: str, check: bool = True) -> str:
        return self.kubectl(
            "exec", "-n", NAMESPACE, pod, "-c", container, "--", *command, check=check
        )

    def python(self, pod: str, container: str, script: str, *args: str) -> str:
        return self.exec(pod, container, "python", "-c", script, *args)

    def pod_of(self, component: str, run: str = RUN) -> dict[str, Any]:
        items = self.get(
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            f"payloadrun.dev/run={run},app.kubernetes.io/component={component}",
        )["items"]
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        assert live, f"no {component} pod of {run}"
        return live[0]


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


def _local_backend(request: pytest.FixtureRequest) -> Backend:
    cluster = request.getfixturevalue("kube_cluster")
    if not cluster.with_node:
        # under PAYLOADRUN_REQUIRE_CLUSTER the kube_cluster fixture has failed already
        pytest.skip(
            "local end-to-end: the session's cluster runs no node (PAYLOADRUN_NO_NODE is set, "
            "or this machine cannot run one: see the node tests' skip reason)"
        )
    return Backend(
        "local", str(cluster.kubeconfig), {**os.environ, **cluster.env()}, node=cluster.node
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
    image = os.environ.get("PAYLOADRUN_E2E_IMAGE", "payloadrun:e2e")
    return Backend("kind", kubeconfig, {**os.environ, "KUBECONFIG": kubeconfig}, image)


def restricted_namespace(backend: Backend, name: str) -> None:
    """``name``, created when missing, enforcing Pod Security's restricted level: the operator's
    pods, the run's and the outsiders all comply (tests/integration/test_pod_security.py)."""
    backend.kubectl("create", "namespace", name, check=False)
    labels = [f"{k}={v}" for k, v in pod_security_labels("restricted").items()]
    backend.kubectl("label", "namespace", name, *labels, "--overwrite")


@pytest.fixture(scope="module", params=["local", "kind"])
def e2e(request, tmp_path_factory):
    backend = _local_backend(request) if request.param == "local" else _kind_backend()
    if backend.name == "kind":  # hack/kind-e2e.sh has installed the chart
        restricted_namespace(backend, SYSTEM_NS)
        restricted_namespace(backend, NAMESPACE)
        yield backend
        backend.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        return
    # helm's own files in a home of the test's; the project's caches (the images, crane and helm
    # that hack/publish.sh uses) stay where they are, not under that home
    env = {
        **backend.env,
        "HOME": str(tmp_path_factory.mktemp("helm-home")),
        "PAYLOADRUN_CACHE": str(cache_dir()),
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, capture_output=True, text=True, env=env, timeout=400, check=False
        )

    # The release path: both images and the chart pushed by the release's script to a registry
    # on loopback, the chart installed from it, the node told it may pull from it over HTTP.
    registry = LocalRegistry.start(tmp_path_factory.mktemp("registry"))
    try:
        backend.registry = registry
        prefix = f"{registry.host}/payloadrun"
        version = release_version(REPO)
        for part in ("images", "chart"):
            published = run("bash", str(REPO / "hack" / "publish.sh"), part, prefix, "--plain-http")
            assert published.returncode == 0, published.stderr[-4000:]
        backend.image = f"{prefix}/payloadrun:{version}"  # the run's own containers pull it too
        backend.node.trust_plain_http_registry(registry.host)
        assert node_images(backend, prefix) == [], "imported, not pulled"

        restricted_namespace(backend, SYSTEM_NS)  # before the operator's pods are made
        # two operator pods: one acts on the Lease, one stands by
        install = run(
            "env", f"PAYLOADRUN_REGISTRY={prefix}", "PAYLOADRUN_PLAIN_HTTP=1",
            "bash", str(REPO / "hack" / "install-chart.sh"), version,
            "--set", "operator.replicas=2",
        )  # fmt: skip
        assert install.returncode == 0, install.stderr + backend.kubectl(
            "describe", "pods", "-n", SYSTEM_NS, check=False
        )
        restricted_namespace(backend, NAMESPACE)
        yield backend
        # The operator pod watches every namespace: it must not outlive this module, or it would
        # reconcile the runs of the tests that come after it beside their own operator.
        run("helm", "uninstall", "payloadrun", "--namespace", SYSTEM_NS, "--wait")
        backend.kubectl("delete", "namespace", NAMESPACE, SYSTEM_NS, "--wait=false", check=False)
    finally:
        registry.stop()


def node_images(e2e: Backend, prefix: str) -> list[str]:
    """The node's images (containerd's k8s.io namespace) whose names start with ``prefix``."""
    listed = e2e.node.ctr("images", "ls", "-q")
    assert listed.returncode == 0, listed.stderr
    return sorted(n for n in listed.stdout.split() if n.startswith(prefix + "/"))


# ---- the operator, as the chart installs it ---------------------------------------------------
def operator_pods(e2e: Backend) -> list[dict[str, Any]]:
    pods = e2e.get("pods", "-n", SYSTEM_NS, "-l", OPERATOR_POD)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def leader_pod(e2e: Backend) -> str | None:
    """The operator pod holding the Lease (its identity: payloadrun-operator@<pod>/<pid>), or
    None while nobody does (a leader that stopped cleanly released it: no holder)."""
    lease = e2e.get("lease", "payloadrun", "-n", SYSTEM_NS)
    holder = lease["spec"].get("holderIdentity") or ""
    return holder.split("@", 1)[1].split("/", 1)[0] if "@" in holder else None


def operator_metric(e2e: Backend, pod: str, name: str) -> float:
    """A sample of one operator pod's /metrics, through the API server's pod proxy."""
    text = e2e.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{SYSTEM_NS}/pods/{pod}:9400/proxy/metrics"
    )
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values)


def test_the_operator_runs_as_a_pod_with_the_charts_identity(e2e):
    """The chart's two operator pods start and stay up as uid 65532 (no passwd entry for it);
    one holds the Lease and acts, the other stands by, ready, doing nothing."""
    pods = wait_for(
        "two operator pods ready", lambda: len(operator_pods(e2e)) == 2 and operator_pods(e2e)
    )
    for pod in pods:
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["restartCount"] == 0, status
        assert pod["spec"]["serviceAccountName"] == "payloadrun"
    leader = wait_for("a leader", lambda: leader_pod(e2e))
    assert leader in {p["metadata"]["name"] for p in pods}
    for pod in pods:
        name = pod["metadata"]["name"]
        assert operator_metric(e2e, name, "payloadrun_operator_leader ") == (name == leader)
    # the uid has no passwd entry, so getpass.getuser() (kopf's default identity) raises:
    # the operator must not depend on it
    probe = e2e.kubectl(
        "exec", "-n", SYSTEM_NS, pods[0]["metadata"]["name"], "--", "python", "-c",
        "import getpass, os\ntry:\n    getpass.getuser()\nexcept KeyError:\n"
        "    print(os.getuid(), 'has no user name')",
    )  # fmt: skip
    assert probe.strip() == "65532 has no user name"


# ---- a run by handle -------------------------------------------------------------------------
def test_run_reconciles_with_its_sidecars(e2e):
    e2e.kubectl("apply", "-f", "-", input=json.dumps(run_manifest(e2e.image)))

    def reconciled():
        status = e2e.get("payloadrun", RUN, "-n", NAMESPACE).get("status") or {}
        return status if status.get("observedGeneration") == 1 else None

    status = wait_for("the run reconciled", reconciled, 90)
    assert status["payloadMode"] == "ByHandle"
    assert status["payloadRoot"] == ROOT
    sts = e2e.get("statefulset", f"{RUN}-inference", "-n", NAMESPACE)
    (writer,) = sts["spec"]["template"]["spec"]["initContainers"]
    assert writer["name"] == "payload-writer" and writer["restartPolicy"] == "Always"
    job = e2e.get("job", f"{RUN}-orchestrator", "-n", NAMESPACE)
    (retention,) = job["spec"]["template"]["spec"]["initContainers"]
    assert retention["name"] == "payload-retention"


def test_pods_and_sidecars_become_ready(e2e):
    def run_ready():
        status = e2e.get("payloadrun", RUN, "-n", NAMESPACE)["status"]
        return status["phase"] == "Running" and status

    # the operator's verdict first: a pod selector waited on too early matches no pod yet
    status = wait_for("phase Running", run_ready, 300)
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "Validated": "True",
        "Applied": "True",
        "VolumeReady": "True",
        "Ready": "True",
    }
    for component in ("inference", "orchestrator", "trainer"):
        pods = e2e.get(
            "pods", "-n", NAMESPACE,
            "-l", f"payloadrun.dev/run={RUN},app.kubernetes.io/component={component}",
        )["items"]  # fmt: skip
        assert pods, component
        for pod in pods:
            ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"]
            assert ready == "True", (component, pod["metadata"]["name"], pod["status"])


def test_the_release_was_installed_from_the_registry_and_pulled_by_the_node(e2e):
    """What hack/publish.sh pushed is what runs: the chart's release came from ``oci://``, its
    images at the chart's appVersion, and the node's containerd pulled both (the kubelet says it
    pulled them; the registry logged containerd fetching their manifests and layers)."""
    if e2e.registry is None:
        pytest.skip("kind: hack/kind-e2e.sh loads the images into kind's node")
    prefix, version = f"{e2e.registry.host}/payloadrun", release_version(REPO)
    operator_image = f"{prefix}/payloadrun-operator:{version}"
    sidecar_image = f"{prefix}/payloadrun:{version}"
    (release,) = json.loads(
        subprocess.run(
            ["helm", "list", "-n", SYSTEM_NS, "-o", "json"],
            capture_output=True, text=True, env=e2e.env, check=True,
        ).stdout
    )  # fmt: skip
    assert (release["chart"], release["app_version"]) == (f"payloadrun-{version}", version)
    for pod in operator_pods(e2e):
        assert pod["spec"]["containers"][0]["image"] == operator_image
    inference = e2e.pod_of("inference")
    writer = inference["spec"]["initContainers"][0]
    assert (writer["name"], writer["image"]) == ("payload-writer", sidecar_image)

    def pulled(namespace: str) -> set[str]:
        events = e2e.get("events", "-n", namespace, "--field-selector", "reason=Pulled")["items"]
        return {
            m.group(1)
            for e in events
            if (m := re.match(r'Successfully pulled image "([^"]+)"', e.get("message", "")))
        }

    assert operator_image in pulled(SYSTEM_NS)
    assert sidecar_image in pulled(NAMESPACE)
    # by tag (CRI also records each by digest, prefix/name@sha256:...)
    tagged = [n for n in node_images(e2e, prefix) if "@" not in n]
    assert tagged == sorted([operator_image, sidecar_image])
    fetched = {
        (r.path.split("/")[3], r.path.split("/")[4])  # /v2/payloadrun/<repository>/<kind>/...
        for r in e2e.registry.requests()
        if r.method == "GET" and r.status == 200 and r.agent.startswith("containerd/")
    }
    for repository in ("payloadrun", "payloadrun-operator"):
        assert {(repository, "manifests"), (repository, "blobs")} <= fetched, fetched


MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def registry_get(e2e: Backend, path: str, accept: str | None = None) -> Any:
    """A JSON document from the test's registry (HTTP on loopback), by its API's path."""
    headers = {"Accept": accept} if accept else {}
    request = urllib.request.Request(f"http://{e2e.registry.host}/v2/{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_each_image_is_one_index_of_amd64_and_arm64(e2e):
    """What hack/publish.sh pushed: per image, one manifest list at the version whose entries
    are the amd64 and the arm64 image (the latter built here under emulation), each image's
    config of its own architecture with the OCI labels; the node pulled its own through it."""
    if e2e.registry is None:
        pytest.skip("kind: hack/kind-e2e.sh loads the images into kind's node")
    version = release_version(REPO)
    for repository in ("payloadrun", "payloadrun-operator"):
        index = registry_get(e2e, f"payloadrun/{repository}/manifests/{version}", MANIFEST_LIST)
        assert index["mediaType"] == MANIFEST_LIST, index
        platforms = {
            (m["platform"]["os"], m["platform"]["architecture"]): m["digest"]
            for m in index["manifests"]
        }
        assert set(platforms) == {("linux", "amd64"), ("linux", "arm64")}, index
        for (_, arch), digest in platforms.items():
            manifest = registry_get(e2e, f"payloadrun/{repository}/manifests/{digest}", MANIFEST)
            # the same image as the architecture's own tag
            tagged = registry_get(
                e2e, f"payloadrun/{repository}/manifests/{version}-{arch}", MANIFEST
            )
            assert manifest == tagged
            config = registry_get(
                e2e, f"payloadrun/{repository}/blobs/{manifest['config']['digest']}"
            )
            assert config["architecture"] == arch and config["os"] == "linux"
            labels = config["config"]["Labels"]
            assert labels["org.opencontainers.image.version"] == version
            assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
            assert labels["org.opencontainers.image.source"].startswith("https://")
        # containerd asked for the list, then for the amd64 image by digest, never the arm64 one
        fetched = {
            r.path.rsplit("/", 1)[1]
            for r in e2e.registry.requests()
            if r.method == "GET"
            and r.status == 200
            and r.agent.startswith("containerd/")
            and r.path.startswith(f"/v2/payloadrun/{repository}/manifests/")
        }
        assert platforms["linux", "amd64"] in fetched, fetched
        assert platforms["linux", "arm64"] not in fetched, fetched


def outside_pod(name: str, labels: dict[str, str], image: str) -> dict[str, Any]:
    """A pod of the run's namespace that is no pod of the run."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": SLEEP,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def test_network_policies_admit_the_run_and_the_scrapers_only(e2e):
    """Enforced by the node's policy controller: an outsider reaches no port of the run; the
    run's own pods (the orchestrator, a trainer) every port of each other, the sidecars'
    included; Prometheus the metrics ports only."""
    inference, orchestrator = e2e.pod_of("inference"), e2e.pod_of("orchestrator")
    trainers = e2e.get(
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        f"payloadrun.dev/run={RUN},app.kubernetes.io/component=trainer",
    )["items"]
    assert len(trainers) == 2
    policies = e2e.get("networkpolicies", "-n", NAMESPACE, "-l", f"payloadrun.dev/run={RUN}")
    assert sorted(p["metadata"]["name"] for p in policies["items"]) == [
        f"{RUN}-{c}" for c in ("inference", "orchestrator", "trainer")
    ]
    targets = {
        "writer": (inference["status"]["podIP"], WRITER_PORT),
        "vllm": (inference["status"]["podIP"], VLLM_PORT),
        "writer-metrics": (inference["status"]["podIP"], WRITER_METRICS_PORT),
        "retention-metrics": (orchestrator["status"]["podIP"], RETENTION_METRICS_PORT),
        "rendezvous": (trainers[1]["status"]["podIP"], TRAINER_DIST_PORT),
    }

    def reach(pod: str, container: str) -> dict[str, str]:
        wanted = [[name, host, port] for name, (host, port) in targets.items()]
        return json.loads(e2e.python(pod, container, CONNECT, json.dumps(wanted)))

    outsiders = {
        "outsider": {"app": "curious"},
        "prometheus": {"app.kubernetes.io/name": "prometheus"},
    }
    for name, labels in outsiders.items():
        e2e.kubectl("apply", "-f", "-", input=json.dumps(outside_pod(name, labels, e2e.image)))
    for name in outsiders:
        e2e.kubectl(
            "wait", "-n", NAMESPACE, "--for=condition=Ready", f"pod/{name}", "--timeout=120s"
        )
    try:
        seen = {
            "outsider": reach("outsider", "main"),
            "prometheus": reach("prometheus", "main"),
            "orchestrator": reach(orchestrator["metadata"]["name"], "orchestrator"),
            "trainer": reach(trainers[0]["metadata"]["name"], "trainer"),
        }
    finally:
        e2e.kubectl("delete", "pod", "-n", NAMESPACE, *outsiders, "--wait=false")
    connected = {
        who: sorted(t for t, got in found.items() if got == "connected")
        for who, found in seen.items()
    }
    every_port = sorted(targets)
    assert connected == {
        "outsider": [],
        "prometheus": ["retention-metrics", "writer-metrics"],
        "orchestrator": every_port,
        "trainer": every_port,
    }, seen


def _started_at(pod: dict[str, Any], container: str) -> str:
    statuses = pod["status"].get("initContainerStatuses", []) + pod["status"]["containerStatuses"]
    (status,) = [s for s in statuses if s["name"] == container]
    return status["state"]["running"]["startedAt"]


def test_the_writer_serves_before_vllm_starts(e2e):
    """Native sidecar order: the kubelet starts vLLM only once the writer answers its probe."""
    pod = e2e.pod_of("inference")
    name = pod["metadata"]["name"]
    vllm_started = _started_at(pod, "vllm")
    logs = e2e.kubectl(
        "logs", "-n", NAMESPACE, name, "-c", "payload-writer", "--timestamps"
    ).splitlines()
    listening = [line.split()[0] for line in logs if "listening" in line]
    assert listening, logs
    # RFC 3339 with nanoseconds vs seconds: compare as text to the second
    assert listening[0][:19] <= vllm_started[:19], (listening[0], vllm_started)


def _inference_pod_path(e2e: Backend, port: int, path: str) -> str:
    pod = e2e.pod_of("inference")["metadata"]["name"]
    return f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}:{port}/proxy{path}"


def test_a_request_by_handle_through_the_writer(e2e):
    """Through the inference Service (writer), read back by the trainer from its read-only mount.

    The same body sent straight to vLLM (port 8000, past the writer) answers inline: the fake
    vLLM's output is a function of the body, so the trainer's rows must equal those ids.
    """
    request = {
        "model": "fake",
        "prompt": "the writer sidecar in a real pod",
        "max_tokens": 8,
        "return_token_ids": True,
        "vllm_xargs": {"payload_dir": f"{ROOT}/v0"},
    }
    service = f"/api/v1/namespaces/{NAMESPACE}/services/{RUN}-inference:8001/proxy/v1/completions"

    def post(path: str) -> dict:
        return json.loads(
            e2e.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(request))
        )

    by_handle = post(service)
    inline = post(_inference_pod_path(e2e, 8000, "/v1/completions"))
    choice = by_handle["choices"][0]
    assert choice["routed_experts"] is None
    segments = choice["payload"]
    assert segments and all(s["file"].startswith(f"{ROOT}/v0/") for s in segments)
    raw = base64.b64decode(inline["choices"][0]["routed_experts"])
    # what the writer stores: the same ids, compacted to uint8 when they fit
    expected = compact_routed_experts(np.load(io.BytesIO(raw), allow_pickle=False))
    script = (
        "import json,sys,hashlib;from payloadrun import PayloadReader,segments_from_json;"
        f"segs=segments_from_json(json.loads(sys.argv[1]));r=PayloadReader({ROOT!r});"
        "s=[x for x in segs if x.field=='routed_experts'][0];"
        "a=r.read(segs,'routed_experts',s.pos,s.end);print(hashlib.sha256(a.tobytes()).hexdigest())"
    )
    trainer = e2e.pod_of("trainer")["metadata"]["name"]
    digest = e2e.python(trainer, "trainer", script, json.dumps(segments)).strip()
    assert digest == hashlib.sha256(np.ascontiguousarray(expected).tobytes()).hexdigest()


ORCHESTRATOR_STEP = """
import json, os, urllib.request
from payloadrun import PAYLOAD_DIR_ARG, Env, RetentionClient, choice_segments, files_of, payload_dir
url = os.environ[Env.INFERENCE_URL] + "/inference/v1/generate"
extra_args = {PAYLOAD_DIR_ARG: payload_dir(os.environ[Env.PAYLOAD_ROOT], 0)}
files = []
for i in range(3):
    body = {"model": "policy", "token_ids": list(range(100 + i, 140 + i)),
            "sampling_params": {"max_tokens": 16, "temperature": 1.0, "extra_args": extra_args}}
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=60) as resp:
        files += files_of(choice_segments(json.loads(resp.read())["choices"][0]))
RetentionClient().record_batch(1, sorted(set(files)))
print(json.dumps(sorted(set(files))))
"""


def record_a_batch(e2e: Backend, run: str) -> list[str]:
    """Three rollouts by handle through the run's Service, recorded as step 1's batch with the
    retention sidecar, from the run's orchestrator pod: the files the batch holds."""
    orchestrator = e2e.pod_of("orchestrator", run)["metadata"]["name"]
    return json.loads(e2e.python(orchestrator, "orchestrator", ORCHESTRATOR_STEP))


def update_the_policy(e2e: Backend, run: str, step: int) -> None:
    """The trainer has read ``step``: the orchestrator tells the retention sidecar."""
    orchestrator = e2e.pod_of("orchestrator", run)["metadata"]["name"]
    e2e.python(
        orchestrator,
        "orchestrator",
        f"from payloadrun import RetentionClient; RetentionClient().policy_updated({step})",
    )


EXISTING = (
    "import json,os,sys; print(json.dumps([os.path.exists(f) for f in json.loads(sys.argv[1])]))"
)


def test_consumed_files_are_deleted_from_the_shared_volume(e2e):
    """The orchestrator's loop in its pod: rollouts through the Service (DNS, kube-proxy, the
    writer), a batch recorded with the retention sidecar on loopback; the trainer pod sees the
    files; once the policy is updated, they are gone from the shared volume."""
    files = record_a_batch(e2e, RUN)
    assert len(files) == 3 and all(f.startswith(f"{ROOT}/v0/") for f in files)
    trainer = e2e.pod_of("trainer")["metadata"]["name"]
    assert json.loads(e2e.python(trainer, "trainer", EXISTING, json.dumps(files))) == [True] * 3
    update_the_policy(e2e, RUN, 1)

    def gone():
        exists = json.loads(e2e.python(trainer, "trainer", EXISTING, json.dumps(files)))
        return not any(exists)

    wait_for("the consumed files deleted", gone, 30)


def test_operator_and_sidecar_metrics_are_scraped_by_prometheus(e2e, tmp_path):
    """The real Prometheus (hack/prometheus.sh) scrapes the operator and both sidecars in their
    pods, through the API server's proxy (kubectl proxy on loopback)."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is not installed: bash hack/prometheus.sh installs Debian's")
    inference = e2e.pod_of("inference")["metadata"]["name"]
    orchestrator = e2e.pod_of("orchestrator")["metadata"]["name"]
    with ExitStack() as stack:
        proxy = subprocess.Popen(
            ["kubectl", f"--kubeconfig={e2e.kubeconfig}", "proxy", "--port=0",
             "--address=127.0.0.1"],
            stdout=subprocess.PIPE, text=True, env=e2e.env,
        )  # fmt: skip
        stack.callback(proxy.wait, 10)
        stack.callback(proxy.terminate)
        line = proxy.stdout.readline()  # "Starting to serve on 127.0.0.1:NNNNN"
        address = re.search(r"127\.0\.0\.1:\d+", line).group(0)
        paths = {
            "operator": OPERATOR_METRICS,
            "writer": f"/api/v1/namespaces/{NAMESPACE}/pods/{inference}:9401/proxy/metrics",
            "retention": f"/api/v1/namespaces/{NAMESPACE}/pods/{orchestrator}:9402/proxy/metrics",
        }
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {"job_name": job, "metrics_path": path, "static_configs": [{"targets": [address]}]}
                for job, path in paths.items()
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        with (tmp_path / "prometheus.log").open("w") as log:
            server = subprocess.Popen(
                [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        stack.callback(server.wait, 10)
        stack.callback(server.terminate)

        def query(expr: str) -> dict[str, float]:
            url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(expr)}"
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    result = json.loads(response.read())["data"]["result"]
            except OSError:
                return {}
            return {r["metric"].get("job", expr): float(r["value"][1]) for r in result}

        def all_up() -> dict[str, float]:
            # a target appears in `up` only once it has been scraped: wait for all three
            up = query("up")
            return up if set(up) == set(paths) and min(up.values()) == 1 else {}

        wait_for("the operator, writer and retention targets up", all_up, 60)
        # what the earlier tests did, as Prometheus saw it
        expected = {
            "sum(payloadrun_writer_requests_total)": 4,  # 1 + 3 requests by handle
            "sum(payloadrun_retention_deleted_files_total)": 3,  # the consumed batch
            'sum(payloadrun_operator_reconciles_total{result="applied"})': 1,
        }

        def seen() -> dict[str, float]:
            values = {expr: sum(query(expr).values()) for expr in expected}
            return values if all(values[e] >= n for e, n in expected.items()) else {}

        wait_for("the earlier tests' traffic in the scraped metrics", seen, 30)


def _container_status(pod: dict[str, Any], name: str) -> dict[str, Any]:
    statuses = pod["status"].get("initContainerStatuses", []) + pod["status"]["containerStatuses"]
    (status,) = [s for s in statuses if s["name"] == name]
    return status


def restart_the_writer(e2e: Backend, run: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The writer sidecar of the run's inference pod killed (SIGTERM to its PID 1), and waited
    for until the kubelet has restarted it and it is ready: the pod before, and after."""
    before = e2e.pod_of("inference", run)
    name = before["metadata"]["name"]
    writer_restarts = _container_status(before, "payload-writer")["restartCount"]
    e2e.exec(
        name, "payload-writer", "python", "-c", "import os, signal; os.kill(1, signal.SIGTERM)",
        check=False,
    )  # fmt: skip

    def restarted():
        pod = e2e.get("pod", name, "-n", NAMESPACE)
        writer = _container_status(pod, "payload-writer")
        return writer["restartCount"] > writer_restarts and writer["ready"] and pod

    return before, wait_for("the writer restarted and ready", restarted, 120)


def test_a_killed_sidecar_restarts_while_vllm_keeps_running(e2e):
    before, pod = restart_the_writer(e2e, RUN)
    vllm_before = _container_status(before, "vllm")
    vllm = _container_status(pod, "vllm")
    assert vllm["restartCount"] == vllm_before["restartCount"]
    assert vllm["state"]["running"]["startedAt"] == vllm_before["state"]["running"]["startedAt"]
    # and it serves again, by handle
    body = {"model": "f", "prompt": "after", "max_tokens": 2,
            "vllm_xargs": {"payload_dir": f"{ROOT}/v0"}}  # fmt: skip
    answer = json.loads(
        e2e.kubectl(
            "create", "--raw", _inference_pod_path(e2e, 8001, "/v1/completions"), "-f", "-",
            input=json.dumps(body),
        )
    )  # fmt: skip
    assert answer["choices"][0]["payload"]


CANNOT_WRITE = """
import errno, os, sys
results = {}
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        results[path] = "written"
    except OSError as error:
        results[path] = errno.errorcode[error.errno]
print(results)
"""


def test_containers_cannot_write_where_they_must_not(e2e):
    """Non-root sidecars with a read-only root filesystem; the trainer's mount is read-only."""
    inference = e2e.pod_of("inference")["metadata"]["name"]
    trainer = e2e.pod_of("trainer")["metadata"]["name"]
    assert e2e.python(
        inference, "payload-writer", "import os; print(os.getuid(), os.getgid())"
    ).split() == [
        "65532",
        "65532",
    ]
    writer = e2e.python(inference, "payload-writer", CANNOT_WRITE, "/opt/x", f"{ROOT}/v0/probe")
    assert writer == str({"/opt/x": "EROFS", f"{ROOT}/v0/probe": "written"}) + "\n"
    reader = e2e.python(trainer, "trainer", CANNOT_WRITE, f"{ROOT}/v0/probe2")
    assert reader == str({f"{ROOT}/v0/probe2": "EROFS"}) + "\n"


def run_the_runbook_against(e2e: Backend, run: str, tmp_path: Path) -> None:
    """docs/operations.md's commands as written, against ``run`` and the chart's operator pods
    (test_runbook.py: how the page marks them, what runs rewritten or not at all, and why). The
    run's writer must have a previous container and a step must have been consumed."""
    from test_runbook import NOT_RUN, run_the_runbook, runbook_commands

    status = json.loads(
        e2e.exec(e2e.pod_of("orchestrator", run)["metadata"]["name"], "orchestrator", "python",
                 "-c", "from payloadrun import RetentionClient; import json; "
                 "print(json.dumps(RetentionClient().status()))")
    )  # fmt: skip
    assert status["policy_step"] >= 1, status  # a step the trainer has read
    values = {
        "NS": NAMESPACE,
        "RUN": run,
        "POD": e2e.pod_of("inference", run)["metadata"]["name"],
        "OPERATOR_NS": SYSTEM_NS,
        "OPERATOR": "payloadrun",  # hack/install-chart.sh's release
        "STEP": str(status["policy_step"]),
    }
    ran = run_the_runbook(e2e.kubeconfig, e2e.env, values, tmp_path)
    assert len(ran) == len(runbook_commands()) - len(NOT_RUN)


def test_the_runbook_runs_against_this_run(e2e, tmp_path):
    """Here the writer has a previous container (killed above) and step 1 was consumed."""
    run_the_runbook_against(e2e, RUN, tmp_path)


def test_the_runbook_runs_against_a_run_whose_volume_is_its_run_directory(e2e, tmp_path):
    """The same commands against a run with ``spec.runDirectory``: its volume is mounted at the
    run directory's path, not at /payloads, so the page's commands that look at the volume must
    find it through ``status.payloadRoot`` (issue 51). Its writer restarted and a step consumed
    first, as for the run above."""
    name = "e2e-rundir"
    run = run_manifest(e2e.image, name)
    run["spec"]["trainer"]["replicas"] = 1
    run["spec"]["runDirectory"] = {"mountPath": "/data"}
    e2e.kubectl("apply", "-f", "-", input=json.dumps(run))

    def running():
        status = e2e.get("payloadrun", name, "-n", NAMESPACE).get("status") or {}
        return status.get("phase") == "Running" and status

    status = wait_for("the run with a run directory running", running, 300)
    root = f"/data/{NAMESPACE}/{name}/payloads"
    assert status["payloadRoot"] == root
    files = record_a_batch(e2e, name)
    assert len(files) == 3 and all(f.startswith(f"{root}/v0/") for f in files)
    update_the_policy(e2e, name, 1)
    restart_the_writer(e2e, name)
    run_the_runbook_against(e2e, name, tmp_path)
    e2e.kubectl("delete", "payloadrun", name, "-n", NAMESPACE, "--wait=true", "--timeout=120s")


# ---- other runs -----------------------------------------------------------------------------
def test_an_inline_run_has_no_volume_and_no_sidecars_and_succeeds(e2e):
    """An inline run (no volume, no sidecars) that runs to its end: its trainer exits 0 once told
    to, and the run is Succeeded (with the local backend: a release installed from the registry
    carries a run from apply to success)."""
    run = run_manifest(e2e.image, "e2e-inline")
    run["spec"]["deploymentType"] = "SingleNode"
    del run["spec"]["payloads"]
    done = "/tmp/done"
    run["spec"]["trainer"].update(command=[*SLEEP, "--until", done], replicas=1)
    e2e.kubectl("apply", "-f", "-", input=json.dumps(run))

    def reconciled():
        status = e2e.get("payloadrun", "e2e-inline", "-n", NAMESPACE).get("status") or {}
        return status.get("phase") == "Running" and status

    status = wait_for("the inline run running", reconciled, 240)
    assert status["payloadMode"] == "Inline" and status["payloadModeReason"] == "SingleNode"
    pod = e2e.pod_of("inference", "e2e-inline")
    assert "initContainers" not in pod["spec"] and "volumes" not in json.dumps(
        pod["spec"]["containers"]
    )
    claims = e2e.get("pvc", "-n", NAMESPACE, "-l", "payloadrun.dev/run=e2e-inline")["items"]
    assert claims == []

    trainer = e2e.pod_of("trainer", "e2e-inline")["metadata"]["name"]
    e2e.exec(trainer, "trainer", "python", "-c", f"open({done!r}, 'x').close()")

    def succeeded():
        status = e2e.get("payloadrun", "e2e-inline", "-n", NAMESPACE)["status"]
        return status["phase"] == "Succeeded" and status

    status = wait_for("the inline run Succeeded", succeeded, 120)
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Complete"][0] == "True", conditions
    e2e.kubectl("delete", "payloadrun", "e2e-inline", "-n", NAMESPACE, "--wait=true")


def test_a_disaggregated_run_by_handle_is_rejected_by_kubectl_apply(e2e):
    manifest = (REPO / "examples" / "disaggregated-root-rejected.yaml").read_text()
    result = subprocess.run(
        ["kubectl", f"--kubeconfig={e2e.kubeconfig}", "apply", "-n", NAMESPACE, "-f", "-"],
        input=manifest, capture_output=True, text=True, env=e2e.env, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "cannot be combined with prefill/decode-disaggregated" in result.stderr


def test_the_leader_killed_a_standby_takes_over_with_no_duplicates(e2e):
    """The leader's pod deleted: another candidate takes the Lease. Which one is a race the
    test leaves alone: the old leader releases the Lease as it stops, and the standby (polling
    every retry period) and the Deployment's replacement pod (trying as it starts) are equals."""
    leader = wait_for("a leader", lambda: leader_pod(e2e))
    (standby,) = [
        p["metadata"]["name"] for p in operator_pods(e2e) if p["metadata"]["name"] != leader
    ]
    # the standby wrote nothing all along: every run so far was the leader's
    assert operator_metric(e2e, standby, "payloadrun_operator_reconciles_total") == 0
    assert operator_metric(e2e, standby, "payloadrun_operator_status_refreshes_total") == 0
    e2e.kubectl("apply", "-f", "-", input=json.dumps(run_manifest(e2e.image, "e2e-second")))
    e2e.kubectl(
        "delete", "pod", "-n", SYSTEM_NS, leader, "--grace-period=0", "--force", "--wait=false"
    )

    def new_leader() -> str | None:
        holder = leader_pod(e2e)
        return holder if holder not in (None, leader) else None

    successor = wait_for("another operator pod leading", new_leader, 60)

    def reconciled():
        status = e2e.get("payloadrun", "e2e-second", "-n", NAMESPACE).get("status") or {}
        return status.get("observedGeneration") == 1 and status

    # created while the leader went: reconciled once, by whichever of the two held the Lease
    wait_for("the run reconciled", reconciled, 120)
    # the new leader resumes every run it finds (the old leader may have applied this one)
    wait_for(
        "the new leader reconciling",
        lambda: operator_metric(e2e, successor, "payloadrun_operator_reconciles_total") >= 1,
        60,
    )
    children = e2e.get(
        "statefulsets,jobs,services,configmaps,persistentvolumeclaims",
        "-n",
        NAMESPACE,
        "-l",
        "payloadrun.dev/run=e2e-second",
    )["items"]
    kinds = sorted(f"{c['kind']}/{c['metadata']['name']}" for c in children)
    assert len(kinds) == len(set(kinds))
    assert [k.split("/")[0] for k in kinds].count("Job") == 2
    assert [k.split("/")[0] for k in kinds].count("StatefulSet") == 1
    assert [k.split("/")[0] for k in kinds].count("PersistentVolumeClaim") == 1

    # whichever pod stands by now has still written nothing
    def two_ready() -> list[str] | None:
        pods = operator_pods(e2e)
        ready = [
            p
            for p in pods
            if all(c.get("ready") for c in p["status"].get("containerStatuses", [{}]))
        ]
        return len(ready) == 2 and [p["metadata"]["name"] for p in ready]

    (waiting,) = [
        name for name in wait_for("two operator pods ready", two_ready, 120) if name != successor
    ]
    assert operator_metric(e2e, waiting, "payloadrun_operator_reconciles_total") == 0
    assert operator_metric(e2e, waiting, "payloadrun_operator_status_refreshes_total") == 0
    e2e.kubectl("delete", "payloadrun", "e2e-second", "-n", NAMESPACE, "--wait=true")


def test_deleting_the_run_collects_its_children(e2e):
    e2e.kubectl("delete", "payloadrun", RUN, "-n", NAMESPACE, "--wait=true", "--timeout=120s")

    def gone():
        left = e2e.get(
            "statefulsets,jobs,services,configmaps,persistentvolumeclaims",
            "-n",
            NAMESPACE,
            "-l",
            f"payloadrun.dev/run={RUN}",
        )["items"]
        return not left or None

    wait_for("garbage collection of the run's children", gone, 120)
