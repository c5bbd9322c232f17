"""A run whose inference replicas are LeaderWorkerSet groups, against the real control plane
(kube-apiserver, etcd, kube-controller-manager; no node, no LeaderWorkerSet controller):

- without LeaderWorkerSet's API, such a run gets Applied/Ready ``LeaderWorkerSetMissing`` and a
  Warning event, and nothing of it is created; once the API is installed and the operator
  started again (it learns at start which APIs the cluster serves), the same run is applied;
- with the API, the operator follows the run's LeaderWorkerSet: a group counted out of its
  ``status.readyReplicas`` (written here through the status subresource, as LeaderWorkerSet's
  controller would) with a pod of the group whose container failed (its status written as the
  kubelet would) gives the run's status and a Warning event naming the replica, the pod and the
  exit code, and the groups' readiness follows ``readyReplicas``;
- StatefulSets a LeaderWorkerSet makes carry the run's labels (v0.10.0 copies them) and are never
  taken for the run's children.

LeaderWorkerSet's own CRD (``config/crd/bases`` of the version ``cluster/build.sh`` fetched) is
applied without its controller; removed at the end if this module installed it. The same unit
by unit: tests/operator/test_lws_following.py.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from addon_api import AddonApi
from example_runs import example_run
from kubernetes.client.rest import ApiException
from test_operator import eventually

from builders import condition_of, run_owner
from payloadrun_devcluster import BinariesMissing
from payloadrun_devkit.local_operator import LocalOperator
from payloadrun_devkit.required import skip_or_fail
from payloadrun_operator.api import names
from payloadrun_operator.api.kinds import LEADER_WORKER_SET
from payloadrun_operator.api.models import GROUP, PLURAL, VERSION
from payloadrun_operator.observed.following import Follower
from payloadrun_operator.observed.status import workload_ready
from payloadrun_operator.platform.discovery import missing_fields
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings

pytestmark = pytest.mark.integration

LWS_GROUP, LWS_VERSION = LEADER_WORKER_SET.api_version.split("/")
LWS_CRD = f"{LEADER_WORKER_SET.plural}.{LWS_GROUP}"
DISCOVERY = f"/apis/{LEADER_WORKER_SET.api_version}"
PODS_PER_REPLICA = 2
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # LeaderWorkerSet's own, on what it makes
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


def lws_served(kube_cluster) -> bool:
    status, body = kube_cluster.request("GET", DISCOVERY)
    return status == 200 and any(
        r.get("name") == LEADER_WORKER_SET.plural for r in body.get("resources") or []
    )


def lws_crd_file() -> Path:
    from payloadrun_devcluster.lws import find_build

    try:
        build = find_build()
    except BinariesMissing as error:
        skip_or_fail(str(error))
        raise
    return build.config / "crd" / "bases" / f"{LWS_GROUP}_{LEADER_WORKER_SET.plural}.yaml"


@pytest.fixture(scope="module")
def lws_api(kube_cluster, crd) -> Iterator[AddonApi]:
    """LeaderWorkerSet's CRD (``config/crd/bases`` of the build), without its controller."""

    def install() -> None:
        applied = kube_cluster.kubectl("apply", "--server-side", "-f", str(lws_crd_file()))
        assert applied.returncode == 0, applied.stderr
        kube_cluster.wait_established(LWS_CRD)
        eventually("LeaderWorkerSet's API in discovery", lambda: lws_served(kube_cluster))

    def remove() -> None:
        # gone before an operator starts: one that found the API would watch a resource about
        # to vanish
        kube_cluster.delete_crd(LWS_CRD)
        eventually("LeaderWorkerSet's API gone", lambda: not lws_served(kube_cluster))

    api = AddonApi(lambda: lws_served(kube_cluster), install, remove)
    yield api
    api.restore()


def local_operator(kube_cluster, namespace: str, log: Path) -> LocalOperator:
    return LocalOperator(
        kube_cluster.kubeconfig,
        namespaces=(namespace,),
        env={"PAYLOADRUN_SIDECAR_IMAGE": "payloadrun:test", "PAYLOADRUN_RESYNC_SECONDS": "3600"},
        log_path=log,
    ).start()


def group_run() -> dict[str, Any]:
    """The by-handle example (a claim, Services, network policies, workloads) with replicas of
    two pods each."""
    body = copy.deepcopy(example_run("multinode-by-handle.yaml"))
    body["spec"]["inference"]["podsPerReplica"] = PODS_PER_REPLICA
    return body


def get_run(api, namespace: str, name: str) -> dict[str, Any]:
    return api["custom"].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def has_condition(api, namespace: str, name: str, ctype: str, reason: str) -> Callable[[], Any]:
    def probe() -> Any:
        run = get_run(api, namespace, name)
        found = condition_of(run, ctype)
        return run if found and found["reason"] == reason else (found or {}).get("reason", "")

    return probe


def run_children(api, namespace: str, name: str) -> list[tuple[str, str]]:
    """Every object labelled with the run, of the kinds a run's children are."""
    from kubernetes import client

    selector = f"{names.LABEL_RUN}={name}"
    networking = client.NetworkingV1Api(api["core"].api_client)
    listers = {
        "ConfigMap": api["core"].list_namespaced_config_map,
        "Service": api["core"].list_namespaced_service,
        "PersistentVolumeClaim": api["core"].list_namespaced_persistent_volume_claim,
        "StatefulSet": api["apps"].list_namespaced_stateful_set,
        "Job": api["batch"].list_namespaced_job,
        "NetworkPolicy": networking.list_namespaced_network_policy,
    }
    found = [
        (kind, item.metadata.name)
        for kind, lister in listers.items()
        for item in lister(namespace, label_selector=selector).items
    ]
    if lws_listable(api):
        listed = api["custom"].list_namespaced_custom_object(
            LWS_GROUP, LWS_VERSION, namespace, LEADER_WORKER_SET.plural, label_selector=selector
        )
        found += [("LeaderWorkerSet", i["metadata"]["name"]) for i in listed["items"]]
    return sorted(found)


def lws_listable(api) -> bool:
    try:
        api["custom"].list_cluster_custom_object(
            LWS_GROUP, LWS_VERSION, LEADER_WORKER_SET.plural, limit=1
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def hand_made_lws(run: dict[str, Any]) -> dict[str, Any]:
    """A small LeaderWorkerSet as the operator makes it for ``run``: its name, the run's labels,
    owned by the run (until the builders make one: then the operator's is used)."""
    meta = run["metadata"]
    name = meta["name"]
    pod = {"spec": {"containers": [{"name": "vllm", "image": "payloadrun:test"}]}}
    return {
        "apiVersion": LEADER_WORKER_SET.api_version,
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": names.inference_groups_name(name),
            "labels": {
                names.LABEL_MANAGED_BY: names.FIELD_MANAGER,
                names.LABEL_RUN: name,
                names.LABEL_COMPONENT: names.INFERENCE,
            },
            "ownerReferences": [run_owner(run)],
        },
        "spec": {
            "replicas": run["spec"]["inference"]["replicas"],
            "leaderWorkerTemplate": {"size": PODS_PER_REPLICA, "workerTemplate": pod},
        },
    }


def the_runs_lws(api, namespace: str, run: dict[str, Any]) -> dict[str, Any]:
    """The run's LeaderWorkerSet: the operator's, or one made by hand while the builders make
    none (issue 36's builders land apart from this test)."""
    name = names.inference_groups_name(run["metadata"]["name"])
    custom = api["custom"]
    try:
        return custom.get_namespaced_custom_object(
            LWS_GROUP, LWS_VERSION, namespace, LEADER_WORKER_SET.plural, name
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
    return custom.create_namespaced_custom_object(
        LWS_GROUP, LWS_VERSION, namespace, LEADER_WORKER_SET.plural, hand_made_lws(run)
    )


def set_ready_groups(api, namespace: str, lws: dict[str, Any], ready: int) -> None:
    """What LeaderWorkerSet's controller writes of its groups (its status subresource)."""
    status = {
        "observedGeneration": lws["metadata"]["generation"],
        "replicas": lws["spec"]["replicas"],
        "readyReplicas": ready,
    }
    api["custom"].patch_namespaced_custom_object_status(
        LWS_GROUP,
        LWS_VERSION,
        namespace,
        LEADER_WORKER_SET.plural,
        lws["metadata"]["name"],
        {"status": status},
    )


def failed_group_pod(api, namespace: str, lws_name: str, group: int, exit_code: int) -> str:
    """A pod of group ``group`` (LeaderWorkerSet's labels) whose vllm container ended with
    ``exit_code`` and was restarted, as the kubelet writes it (no node runs here)."""
    name = f"{lws_name}-{group}-1"
    api["core"].create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {LWS_NAME_LABEL: lws_name, LWS_GROUP_INDEX_LABEL: str(group)},
            },
            "spec": {"containers": [{"name": "vllm", "image": "payloadrun:test"}]},
        },
    )
    ended = {
        "exitCode": exit_code,
        "reason": "Error",
        "startedAt": "2026-12-04T10:00:00Z",
        "finishedAt": "2026-12-04T10:05:00Z",
    }
    status = {
        "containerStatuses": [
            {
                "name": "vllm",
                "image": "payloadrun:test",
                "imageID": "",
                "ready": False,
                "restartCount": 1,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": ended},
            }
        ]
    }
    api["core"].patch_namespaced_pod_status(name, namespace, {"status": status})
    return name


def test_a_run_of_groups_waits_for_leaderworkerset_then_follows_its_groups(
    kube_cluster, crd, api, namespace, lws_api, tmp_path
):
    lws_api.remove()  # whatever installed it before: this test starts without it
    body = group_run()
    name = body["metadata"]["name"]
    lws_name = names.inference_groups_name(name)
    operator = local_operator(kube_cluster, namespace, tmp_path / "before.log")
    try:
        api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        run = eventually(
            "Applied LeaderWorkerSetMissing",
            has_condition(api, namespace, name, "Applied", "LeaderWorkerSetMissing"),
        )
        applied = condition_of(run, "Applied")
        assert applied["status"] == "False"
        assert "Install LeaderWorkerSet (https://lws.sigs.k8s.io/" in applied["message"]
        assert "from LeaderWorkerSet v0.4.0 on; tested with v0.9.0)" in applied["message"]
        assert "restart the operator" in applied["message"]
        ready, validated = condition_of(run, "Ready"), condition_of(run, "Validated")
        assert (ready["status"], ready["reason"]) == ("False", "LeaderWorkerSetMissing")
        assert (validated["status"], validated["reason"]) == ("True", "SpecValid")
        assert run["status"]["phase"] == "Provisioning"
        assert "observedGeneration" not in run["status"]  # nothing applied: not followed
        # nothing half-made: no claim, no settings, no Service, no policy, no workload
        assert run_children(api, namespace, name) == []
        selector = f"involvedObject.name={name},involvedObject.kind=PayloadRun"
        events = api["core"].list_namespaced_event(namespace, field_selector=selector).items
        warnings = [(e.type, e.reason) for e in events if e.reason == "LeaderWorkerSetMissing"]
        assert warnings == [("Warning", "LeaderWorkerSetMissing")]
    finally:
        operator.stop()

    # LeaderWorkerSet installed, the operator started again: the run created before is applied
    lws_api.install()
    operator = local_operator(kube_cluster, namespace, tmp_path / "after.log")
    try:
        run = eventually(
            "the run applied",
            has_condition(api, namespace, name, "Applied", "ChildrenApplied"),
        )
        made = run_children(api, namespace, name)
        for child in (
            ("PersistentVolumeClaim", f"{name}-payloads"),
            ("ConfigMap", f"{name}-settings"),
            ("Job", f"{name}-orchestrator"),
            ("Job", f"{name}-trainer"),
        ):
            assert child in made
        lws = the_runs_lws(api, namespace, run)
        # a pod of group 1 fails (its container's end written as the kubelet writes it), then
        # LeaderWorkerSet counts the group out: the run's status and a Warning event say which
        failed = failed_group_pod(api, namespace, lws_name, group=1, exit_code=3)
        set_ready_groups(api, namespace, lws, ready=1)

        def failure_and_groups() -> Any:
            # the pod's end and the LeaderWorkerSet's status are two events: a pass may see the
            # first alone (Ready still 0/2), the next one both
            run = get_run(api, namespace, name)
            ready = condition_of(run, "Ready") or {}
            seen = run["status"].get("lastInferenceGroupRestart") and (
                f"{lws_name} 1/2 groups ready" in ready.get("message", "")
            )
            return [run] if seen else f"not yet: {run['status']}"

        (run,) = eventually("the group's failure and the groups in the status", failure_and_groups)
        last = run["status"]["lastInferenceGroupRestart"]
        assert (last["replica"], last["pod"], last["container"], last["exitCode"]) == (
            1,
            failed,
            "vllm",
            3,
        )
        assert run["status"]["inferenceGroupRestarts"] == 1
        selector = f"involvedObject.name={name},involvedObject.kind=PayloadRun"

        def restarted() -> Any:  # posted once the status holds the failure
            events = api["core"].list_namespaced_event(namespace, field_selector=selector).items
            return [e for e in events if e.reason == "InferenceGroupRestarted"]

        (event,) = eventually("the Warning event", restarted)
        assert event.type == "Warning"
        said = f"replica 1 of {lws_name}: container vllm of pod {failed} exited with code 3"
        assert said in event.message
    finally:
        operator.stop()


OPENAPI = f"/openapi/v3/apis/{LEADER_WORKER_SET.api_version}"
SUBDOMAIN_POLICY = ("spec.networkConfig.subdomainPolicy",)


def unpublished(kube_cluster) -> tuple[str, ...] | None:
    """Which of :data:`SUBDOMAIN_POLICY` the API server's OpenAPI document of LeaderWorkerSet's
    group lacks (None: no document yet). A changed CRD is published a moment after it is
    applied."""
    status, document = kube_cluster.request("GET", OPENAPI)
    return missing_fields(document, LEADER_WORKER_SET, SUBDOMAIN_POLICY) if status == 200 else None


def test_an_older_leaderworkerset_that_lacks_what_the_operator_sets_is_named_too_old(
    kube_cluster, crd, api, namespace, lws_api, tmp_path
):
    """A LeaderWorkerSet before v0.4.0 serves leaderworkerset.x-k8s.io/v1 too, without
    ``spec.networkConfig`` (read in the v0.3.0 module): the API server would drop the
    subdomain policy the operator sets. Here v0.9.0's CRD without that field stands for it: the
    operator finds it in the published schema at start, names it too old and applies nothing."""
    lws_api.install()
    # the real document: the operator's check reads it as the API server publishes it
    eventually("v0.9.0's schema published", lambda: unpublished(kube_cluster) == ())
    older = yaml.load(lws_crd_file().read_text(), Loader=yaml.CSafeLoader)
    for version in older["spec"]["versions"]:
        del version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
            "networkConfig"
        ]
    operator = None
    try:
        applied = kube_cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(older)
        )
        assert applied.returncode == 0, applied.stderr
        eventually(
            "the older schema published", lambda: unpublished(kube_cluster) == SUBDOMAIN_POLICY
        )
        operator = local_operator(kube_cluster, namespace, tmp_path / "operator.log")
        body = group_run()
        name = body["metadata"]["name"]
        api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        run = eventually(
            "Applied LeaderWorkerSetMissing",
            has_condition(api, namespace, name, "Applied", "LeaderWorkerSetMissing"),
        )
        message = condition_of(run, "Applied")["message"]
        assert (
            "this cluster served leaderworkerset.x-k8s.io at v1 without "
            "spec.networkConfig.subdomainPolicy only when the operator started, an older "
            "LeaderWorkerSet than the operator needs" in message
        ), message
        assert "Upgrade LeaderWorkerSet (https://lws.sigs.k8s.io/" in message
        ready = condition_of(run, "Ready")
        assert ready["message"].startswith("LeaderWorkerSet is too old")
        assert run_children(api, namespace, name) == []
        log = (tmp_path / "operator.log").read_text()
        assert "LeaderWorkerSet leaderworkerset.x-k8s.io/v1: not served; this cluster served" in log
    finally:
        if operator is not None:
            operator.stop()
        # the module's CRD back, as the module found it
        restored = kube_cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(lws_crd_file())
        )
        assert restored.returncode == 0, restored.stderr
        eventually("v0.9.0's schema published again", lambda: unpublished(kube_cluster) == ())


def test_a_group_template_the_api_server_refuses_is_refused_before_anything_is_applied(
    kube_cluster, crd, api, namespace, lws_api, tmp_path
):
    """LeaderWorkerSet's webhook does not check pod templates, and its controller's refusal is
    only a Warning event on it (v0.9.0's controllers): the operator has the API server check
    each template as a StatefulSet (a dry run) before it applies the LeaderWorkerSet."""
    lws_api.install()
    body = group_run()
    name = body["metadata"]["name"]
    worker = copy.deepcopy(body["spec"]["inference"]["template"])  # the vllm container's
    worker["spec"]["containers"].append(
        {"name": "proxy", "image": "proxy:1", "ports": [{"containerPort": -1}]}
    )
    body["spec"]["inference"]["workerTemplate"] = worker
    operator = local_operator(kube_cluster, namespace, tmp_path / "operator.log")
    try:
        api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        run = eventually(
            "Validated InvalidSpec", has_condition(api, namespace, name, "Validated", "InvalidSpec")
        )
        message = condition_of(run, "Validated")["message"]
        assert message.startswith(
            "spec.inference.workerTemplate: the API server refuses its pods as a StatefulSet's"
        ), message
        assert (
            "spec.inference.workerTemplate.spec.containers[proxy].ports[0].containerPort: "
            "Invalid value: -1: must be between 1 and 65535, inclusive" in message
        ), message
        assert "spec.inference.template:" not in message  # the leaders' template is fine
        assert run_children(api, namespace, name) == []  # nothing half-made
        # the same spec with the port mended is applied
        run["spec"]["inference"]["workerTemplate"]["spec"]["containers"][-1]["ports"] = [
            {"containerPort": 9000}
        ]
        api["custom"].replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, run)
        eventually(
            "the run applied", has_condition(api, namespace, name, "Applied", "ChildrenApplied")
        )
        assert ("LeaderWorkerSet", names.inference_groups_name(name)) in run_children(
            api, namespace, name
        )
    finally:
        operator.stop()


def test_statefulsets_leaderworkerset_makes_are_never_the_runs_children(
    kube_cluster, crd, api, namespace, lws_api, monkeypatch
):
    """LeaderWorkerSet v0.10.0 copies the LeaderWorkerSet's labels (the run's) onto the
    StatefulSets it makes; the follower lists and watches by those labels, and leaves out what
    another controller owns: here a leader StatefulSet controlled by the LeaderWorkerSet, named
    even as the run's own inference StatefulSet would be."""
    lws_api.install()
    body = group_run()
    name = body["metadata"]["name"]
    run = api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    lws = api["custom"].create_namespaced_custom_object(
        LWS_GROUP, LWS_VERSION, namespace, LEADER_WORKER_SET.plural, hand_made_lws(run)
    )
    labels = {
        **lws["metadata"]["labels"],
        "leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"],
    }
    lws_owner = {
        "apiVersion": LEADER_WORKER_SET.api_version,
        "kind": "LeaderWorkerSet",
        "name": lws["metadata"]["name"],
        "uid": lws["metadata"]["uid"],
        "controller": True,
    }
    for sts_name in (lws["metadata"]["name"], names.child_name(name, names.INFERENCE)):
        api["apps"].create_namespaced_stateful_set(
            namespace,
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": sts_name, "labels": labels, "ownerReferences": [lws_owner]},
                "spec": {
                    "replicas": 1,
                    "serviceName": sts_name,
                    "selector": {"matchLabels": {"x": sts_name}},
                    "template": {
                        "metadata": {"labels": {"x": sts_name}},
                        "spec": {"containers": [{"name": "c", "image": "payloadrun:test"}]},
                    },
                },
            },
        )
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))

    lws_key = (namespace, "LeaderWorkerSet", lws["metadata"]["name"])

    async def follow() -> dict:
        client = KubeClient()
        op = Operator(OperatorSettings(sidecar_image="payloadrun:test"), client, OperatorMetrics())
        client.login(kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
        follower = Follower(op)
        follower.start([namespace])

        async def lws_now() -> dict:  # the LeaderWorkerSet as an event of its watch brings it
            found = await client.get(
                LEADER_WORKER_SET.api_version, "LeaderWorkerSet", *lws_key[::2]
            )
            assert found is not None
            follower.observe("LeaderWorkerSet", {"type": "MODIFIED", "object": found})
            return follower.cache.children[lws_key]

        try:
            await asyncio.wait_for(follower.synced.wait(), 60)
            assert op.discovery.serves(LEADER_WORKER_SET)
            # what the watches deliver goes through the same door
            for sts in await client.list_objects("apps/v1", "StatefulSet", namespace):
                follower.observe("StatefulSet", {"type": "ADDED", "object": sts})
            cached = dict(follower.cache.children)
            # the groups' readiness, as LeaderWorkerSet's controller writes it (status
            # subresource) and the API server gives it back
            readiness = [workload_ready(await lws_now())]
            for ready in (2, 1):
                set_ready_groups(api, namespace, lws, ready)
                readiness.append(workload_ready(await lws_now()))
            return {"cached": cached, "readiness": readiness}
        finally:
            await follower.stop()
            await client.close()

    followed = asyncio.run(follow())
    assert {(kind, child) for _, kind, child in followed["cached"]} == {
        ("LeaderWorkerSet", lws["metadata"]["name"])
    }
    vllm = lws["metadata"]["name"]
    assert followed["readiness"] == [
        (False, f"{vllm} 0/2 groups ready"),
        (True, f"{vllm} 2/2 groups ready"),
        (False, f"{vllm} 1/2 groups ready"),
    ]
