"""Pod Security: the pods the project makes are admitted under ``restricted`` by the local
control plane's own kube-apiserver (its PodSecurity admission plugin, on by default, with no
exemptions: ``cluster/payloadrun_devcluster/cluster.py`` passes no admission configuration).

Every namespace here enforces ``restricted`` (``@pytest.mark.pod_security``). Each pod is
created with a server dry run (``POST .../pods?dryRun=All``: admission runs, nothing is stored),
so no node is needed:

- the operator's pod: the chart's Deployment as ``helm template`` renders it, with its defaults
  and as on OpenShift (without ``runAsUser``/``runAsGroup``);
- every pod the operator builds for each example run (the inference pod with the writer sidecar,
  the orchestrator with the retention sidecar, the trainers, the cleanup Job's pod) once the
  example's own containers carry what ``restricted`` asks of them (``pod_helpers.restricted``);
- the examples as they are: refused for the user's containers alone (the operator adds no
  security context to them), never for the operator's;
- the operator's pods with one field of their security context taken away: refused, so that
  these tests can fail.

With a node, the chart installed into a restricted namespace runs the operator as a pod, and a
run there runs its sidecars, its trainers to the end and its cleanup Job (seccomp
``RuntimeDefault`` on this node's containerd and runc).
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from example_runs import EXAMPLES, example_run
from pod_helpers import (
    FAKE_VLLM,
    IMAGE,
    MAIN_CONTAINERS,
    SLEEP,
    apply,
    get,
    kubectl,
    live_pods,
    node_run,
    restricted,
    run_helm,
    running,
    wait_for,
    wait_for_phase,
)

from payloadrun_operator.api import names
from payloadrun_operator.api.kinds import LEADER_WORKER_SET
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.cleanup import build_cleanup
from payloadrun_operator.platform.settings import OperatorSettings

pytestmark = [pytest.mark.integration, pytest.mark.pod_security("restricted")]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "payloadrun"
VIOLATES = 'violates PodSecurity "restricted:latest"'
# Every example the operator accepts, and the one it refuses (it builds no pods)
ACCEPTED = [
    "disaggregated-inline.yaml",
    "local-node-by-handle.yaml",
    "multinode-by-handle.yaml",
    "prime-rl-moe-multinode.yaml",
    "prime-rl.yaml",
    "singlenode-inline.yaml",
]
REFUSED = ["disaggregated-root-rejected.yaml"]
# What an example's own containers ask for beyond restricted, so that its pod is refused even
# with pod_helpers.restricted: the multi-node trainers add IPC_LOCK (RDMA pins its buffers;
# restricted lets a container add only NET_BIND_SERVICE, baseline not IPC_LOCK either).
BEYOND_RESTRICTED = {
    "qwen3-moe-grpo-trainer": 'unrestricted capabilities (container "trainer" must not include '
    '"IPC_LOCK" in securityContext.capabilities.add)',
}
SETTINGS = OperatorSettings(sidecar_image="registry.example/payloadrun:test")
DONE = "/tmp/done"  # the trainers exit 0 once it exists
TRAIN_UNTIL_DONE = ["python", "-m", "payloadrun.testing.roles", "idle", "--until", DONE]


# --- helpers ------------------------------------------------------------------------------------


COLLECTIONS = {
    "Pod": "/api/v1/namespaces/{}/pods",
    "StatefulSet": "/apis/apps/v1/namespaces/{}/statefulsets",
    "Job": "/apis/batch/v1/namespaces/{}/jobs",
}


def dry_run(api_client, namespace: str, obj: dict[str, Any]) -> tuple[int, str, str]:
    """``obj`` (a Pod, StatefulSet or Job) created with a server dry run: (HTTP status, the
    refusal's message, the API server's warnings). The raw call: the typed one would refuse a
    quantity given as a number (``nvidia.com/gpu: 8``), which the API server takes."""
    method, url, headers, body, _ = api_client.param_serialize(
        "POST",
        COLLECTIONS[obj["kind"]].format(namespace),
        query_params=[("dryRun", "All")],
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=obj,
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(method, url, header_params=headers, body=body)
    answer = json.loads(response.read() or b"{}")
    message = "" if response.status == 201 else answer.get("message", str(answer))
    return response.status, message, warnings(response.headers.get("Warning", ""))


def warnings(header: str) -> str:
    """The texts of a ``Warning`` header (``299 - "text"``, as many as there are), unquoted and
    joined by "; "."""
    texts = re.findall(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"', header)
    return "; ".join(re.sub(r"\\(.)", r"\1", text) for text in texts)


def pod_of(workload: dict[str, Any]) -> dict[str, Any]:
    """A pod of ``workload`` (a StatefulSet, Job or Deployment), as its controller makes it."""
    template = workload["spec"]["template"]
    meta = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{workload['metadata']['name']}-0",
            "labels": meta.get("labels", {}),
            "annotations": meta.get("annotations", {}),
        },
        "spec": copy.deepcopy(template["spec"]),
    }


def operator_workloads(run: dict[str, Any], namespace: str) -> dict[str, dict[str, Any]]:
    """Every workload the operator makes for ``run``, by name (the cleanup Job too, by
    handle)."""
    meta = {**run["metadata"], "namespace": namespace, "uid": str(uuid.uuid4())}
    admission = admit({**run, "metadata": meta, "status": {}}, SETTINGS)
    assert admission.ctx is not None, admission.errors
    children = build_children(admission.ctx)
    workloads = [c for c in children if c["kind"] in ("StatefulSet", "Job")]
    for lws in (c for c in children if c["kind"] == LEADER_WORKER_SET.kind):
        workloads += group_templates(lws)
    if admission.ctx.by_handle:
        workloads.append(build_cleanup(admission.ctx))
    return {w["metadata"]["name"]: w for w in workloads}


def group_templates(lws: dict[str, Any]) -> list[dict[str, Any]]:
    """A LeaderWorkerSet's two pod templates, each as a workload of its own (``<lws>-leader``,
    ``<lws>-worker``) that :func:`pod_of` reads; LeaderWorkerSet's CRD is not installed in this
    part, so only their pods are created."""
    group = lws["spec"]["leaderWorkerTemplate"]
    templates = {"leader": group["leaderTemplate"], "worker": group["workerTemplate"]}
    return [
        {
            "kind": LEADER_WORKER_SET.kind,
            "metadata": {"name": f"{lws['metadata']['name']}-{role}"},
            "spec": {"template": template},
        }
        for role, template in templates.items()
    ]


def operator_pods(run: dict[str, Any], namespace: str) -> dict[str, dict[str, Any]]:
    """A pod of every workload the operator makes for ``run``, by workload name."""
    return {n: pod_of(w) for n, w in operator_workloads(run, namespace).items()}


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def chart_objects(kube_cluster, namespace: str, *sets: str) -> dict[str, dict[str, Any]]:
    """The chart's objects as ``helm template`` renders them into ``namespace``, by kind (one
    of each kind is all these tests use)."""
    args = ["template", "psa", str(CHART), "--namespace", namespace, "--set", "crds.install=false"]
    for value in sets:
        args += ["--set", value]
    rendered = run_helm(kube_cluster, *args)
    assert rendered.returncode == 0, rendered.stderr
    return {d["kind"]: d for d in yaml.safe_load_all(rendered.stdout) if d}


@pytest.fixture(scope="module")
def nvidia_runtime_class(kube_cluster):
    """The RuntimeClass the examples' GPU pods name (the RuntimeClass admission plugin refuses
    a pod that names a missing one); removed after this module when it created it."""
    body = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }
    status, answer = kube_cluster.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", body)
    assert status in (201, 409), answer
    yield
    if status == 201:
        kube_cluster.request("DELETE", "/apis/node.k8s.io/v1/runtimeclasses/nvidia")


@pytest.fixture
def restricted_ns(kube_cluster, namespace: str, nvidia_runtime_class) -> str:
    """The test's namespace (it enforces restricted) once its default ServiceAccount exists:
    the ServiceAccount admission plugin refuses a pod before."""
    labels = kube_cluster.request("GET", f"/api/v1/namespaces/{namespace}")[1]["metadata"]
    assert labels["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
    wait_for("the default ServiceAccount", lambda: kube_cluster.request("GET", path)[0] == 200, 60)
    return namespace


# --- the operator's pod ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param((), id="defaults"),
        # OpenShift's restricted SCC assigns the uid: docs/operations.md, Install
        pytest.param(
            ("podSecurityContext.runAsUser=null", "podSecurityContext.runAsGroup=null"),
            id="without-uid",
        ),
    ],
)
def test_the_operators_pod_is_admitted(kube_cluster, kube_api_client, restricted_ns, sets):
    objects = chart_objects(kube_cluster, restricted_ns, *sets)
    account = objects["ServiceAccount"]
    status, body = kube_cluster.request(
        "POST", f"/api/v1/namespaces/{restricted_ns}/serviceaccounts", account
    )
    assert status == 201, body
    assert dry_run(kube_api_client, restricted_ns, pod_of(objects["Deployment"])) == (201, "", "")


def test_the_operators_pod_without_its_pod_security_context_is_refused(
    kube_cluster, kube_api_client, restricted_ns
):
    objects = chart_objects(kube_cluster, restricted_ns, "podSecurityContext=null")
    pod = pod_of(objects["Deployment"])
    pod["spec"]["serviceAccountName"] = "default"
    status, message, _ = dry_run(kube_api_client, restricted_ns, pod)
    assert status == 403 and VIOLATES in message, message
    assert 'runAsNonRoot != true (pod or container "operator"' in message
    assert 'seccompProfile (pod or container "operator"' in message


# --- the pods the operator builds -----------------------------------------------------------------


def test_every_example_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(ACCEPTED + REFUSED)


@pytest.mark.parametrize("example", ACCEPTED)
def test_the_pods_the_operator_builds_are_admitted(kube_api_client, restricted_ns, example):
    """With the run's own containers restricted, every pod of the run is admitted: the
    operator's parts (sidecars, volumes, /dev/shm, the cleanup Job) need nothing more. The
    workloads themselves are created without a warning (the namespace warns of workloads whose
    pods it would refuse), as the operator's apply would be."""
    workloads = operator_workloads(restricted(example_run(example)), restricted_ns)
    pods = {name: pod_of(workload) for name, workload in workloads.items()}
    if any(name.endswith(f"-{names.CLEANUP}") for name in pods):  # by handle: the sidecars and
        # the cleanup Job are among the admitted pods
        sidecars = {n for pod in pods.values() for n in containers(pod)} & {
            names.WRITER_CONTAINER,
            names.RETENTION_CONTAINER,
            names.CLEANUP_CONTAINER,
        }
        assert len(sidecars) == 3, sidecars
    for name, pod in pods.items():
        status, message, warnings = dry_run(kube_api_client, restricted_ns, pod)
        if workloads[name]["kind"] == LEADER_WORKER_SET.kind:  # its pods only (no CRD here)
            assert (status, message, warnings) == (201, "", ""), name
            continue
        workload = dry_run(kube_api_client, restricted_ns, workloads[name])
        if name in BEYOND_RESTRICTED:
            assert status == 403 and BEYOND_RESTRICTED[name] in message, message
            assert workload[0] == 201 and BEYOND_RESTRICTED[name] in workload[2], workload
            continue
        assert (status, message, warnings) == (201, "", ""), name
        assert workload == (201, "", ""), name


@pytest.mark.parametrize("example", ["multinode-by-handle.yaml", "prime-rl.yaml"])
def test_the_users_containers_are_theirs_to_make_restricted(
    kube_api_client, restricted_ns, example
):
    """As the examples are (no security context), their pods are refused for the user's
    containers only: the operator adds no security context to them, and its own containers
    comply on their own."""
    run = example_run(example)
    pods = operator_pods(run, restricted_ns)
    name = run["metadata"]["name"]
    for component, main in MAIN_CONTAINERS.items():
        pod = pods[f"{name}-{component}"]
        (theirs,) = [c for c in run["spec"][component]["template"]["spec"]["containers"]]
        # nothing invented: the container's as the template has it, the pod's only the fsGroup
        assert containers(pod)[main].get("securityContext") == theirs.get("securityContext")
        assert set(pod["spec"].get("securityContext", {})) <= {"fsGroup", "fsGroupChangePolicy"}
        status, message, _ = dry_run(kube_api_client, restricted_ns, pod)
        assert status == 403 and VIOLATES in message, message
        assert f'"{main}"' in message
        for ours in (names.WRITER_CONTAINER, names.RETENTION_CONTAINER):
            assert ours not in message, message
    if cleanup := pods.get(f"{name}-{names.CLEANUP}"):  # by handle
        assert dry_run(kube_api_client, restricted_ns, cleanup) == (201, "", "")


def without(path: str):
    """An edit of the cleanup container's securityContext that deletes ``path`` (a.b)."""

    def edit(container: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = container["securityContext"]
        for key in parents:
            target = target[key]
        del target[last]

    return edit


def privileged(container: dict[str, Any]) -> None:
    del container["securityContext"]["allowPrivilegeEscalation"]  # invalid beside privileged
    container["securityContext"]["privileged"] = True


def host_path(pod: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/var/lib"}})


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (without("allowPrivilegeEscalation"), "allowPrivilegeEscalation != false"),
        (without("capabilities.drop"), "unrestricted capabilities"),
        (without("runAsNonRoot"), "runAsNonRoot != true"),
        (without("seccompProfile"), "seccompProfile"),
        (lambda c: c["securityContext"].update(runAsUser=0), "runAsUser=0"),
        (privileged, 'privileged (container "cleanup" must not set'),
    ],
    ids=[
        "allowPrivilegeEscalation-unset",
        "capabilities-kept",
        "runAsNonRoot-unset",
        "seccomp-unset",
        "root",
        "privileged",
    ],
)
def test_an_operator_pod_that_breaks_restricted_is_refused(
    kube_api_client, restricted_ns, edit, says
):
    """The cleanup Job's pod (the operator's alone: no template of the user's in it) with one
    field less is refused, naming the field and the container."""
    pods = operator_pods(restricted(example_run("multinode-by-handle.yaml")), restricted_ns)
    (cleanup,) = [p for n, p in pods.items() if n.endswith(f"-{names.CLEANUP}")]
    edit(containers(cleanup)[names.CLEANUP_CONTAINER])
    status, message, _ = dry_run(kube_api_client, restricted_ns, cleanup)
    assert status == 403 and VIOLATES in message, message
    assert says in message and f'"{names.CLEANUP_CONTAINER}"' in message, message


def test_a_writer_without_allow_privilege_escalation_false_is_refused(
    kube_api_client, restricted_ns
):
    pods = operator_pods(restricted(example_run("multinode-by-handle.yaml")), restricted_ns)
    inference = pods["qwen3-moe-grpo-inference"]
    del containers(inference)[names.WRITER_CONTAINER]["securityContext"]["allowPrivilegeEscalation"]
    status, message, _ = dry_run(kube_api_client, restricted_ns, inference)
    assert status == 403, message
    assert (
        f'allowPrivilegeEscalation != false (container "{names.WRITER_CONTAINER}" must set '
        "securityContext.allowPrivilegeEscalation=false)" in message
    ), message


def test_a_host_path_volume_is_refused(kube_api_client, restricted_ns):
    pods = operator_pods(restricted(example_run("multinode-by-handle.yaml")), restricted_ns)
    (cleanup,) = [p for n, p in pods.items() if n.endswith(f"-{names.CLEANUP}")]
    host_path(cleanup)
    status, message, _ = dry_run(kube_api_client, restricted_ns, cleanup)
    assert status == 403 and VIOLATES in message, message
    assert 'restricted volume types (volume "host" uses restricted volume type "hostPath")' in (
        message
    )


# --- real pods ------------------------------------------------------------------------------------


def test_the_chart_and_a_run_run_their_pods_in_a_restricted_namespace(node_cluster, namespace):
    """The operator as the chart's pod, and a by-handle run's pods (vLLM with the writer, the
    orchestrator with retention, two trainers that exit 0, then the cleanup Job), all in one
    namespace that enforces restricted, on the local node."""
    cluster = node_cluster
    release = f"psa-{uuid.uuid4().hex[:6]}"
    install = run_helm(
        cluster, "install", release, str(CHART), "--namespace", namespace,
        "--set", "crds.install=false",
        "--set", "image.repository=payloadrun-operator", "--set", "image.tag=e2e",
        "--set", "image.pullPolicy=Never",
        "--set", "sidecars.image.repository=payloadrun", "--set", "sidecars.image.tag=e2e",
        "--set", "sidecars.image.pullPolicy=Never",
        "--set", f"operator.watchNamespaces={{{namespace}}}",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    try:
        assert install.returncode == 0, (
            install.stderr + cluster.kubectl("describe", "pods", "-n", namespace).stdout
        )
        selector = f"app.kubernetes.io/instance={release}"
        (operator_pod,) = get(cluster, namespace, "pods", "-l", selector)["items"]
        assert operator_pod["status"]["containerStatuses"][0]["ready"]

        run = node_run(
            "psa",
            inference={"image": IMAGE, "command": FAKE_VLLM},
            orchestrator={"image": IMAGE, "command": SLEEP},
            # until the run has been seen Running (every pod ready)
            trainer={"image": IMAGE, "command": TRAIN_UNTIL_DONE, "replicas": 2},
        )
        apply(cluster, namespace, run)
        running(cluster, namespace, "psa")
        trainers = [
            p["metadata"]["name"]
            for p in live_pods(cluster, namespace, "psa")
            if p["metadata"]["labels"].get("app.kubernetes.io/component") == "trainer"
        ]
        assert len(trainers) == 2, trainers
        for pod in trainers:
            kubectl(cluster, namespace, "exec", pod, "-c", "trainer", "--", "touch", DONE)
        done = wait_for_phase(cluster, namespace, "psa", "Succeeded")
        assert done["status"]["payloadMode"] == "ByHandle"

        def released() -> Any:
            conditions = get(cluster, namespace, "payloadrun", "psa")["status"]["conditions"]
            found = {c["type"]: c for c in conditions}.get("PayloadsReleased", {})
            return found.get("status") == "True" and found

        assert wait_for("PayloadsReleased", released)["reason"] == "FilesDeleted"
        assert get(cluster, namespace, "job", f"psa-{names.CLEANUP}")["status"]["succeeded"] == 1
        # no pod of the namespace was refused on the way
        events = get(cluster, namespace, "events")["items"]
        refused = [e["message"] for e in events if "PodSecurity" in e.get("message", "")]
        assert not refused, refused
    finally:
        run_helm(cluster, "uninstall", release, "--namespace", namespace, "--wait")
