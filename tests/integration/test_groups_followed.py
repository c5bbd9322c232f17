"""A run whose inference replicas are LeaderWorkerSet groups, against the real control plane
(kube-apiserver, etcd, kube-controller-manager; no node, no LeaderWorkerSet controller):

- without LeaderWorkerSet's API, such a run gets Applied/Ready ``LeaderWorkerSetMissing`` and a
  Warning event, and nothing of it is created; once the API is installed and the operator
  started again (it learns at start which APIs the cluster serves), the same run is applied;
- with the API, the run's readiness follows its LeaderWorkerSet's ``status.readyReplicas``
  (written here through the status subresource, as LeaderWorkerSet's controller would);
- StatefulSets a LeaderWorkerSet makes carry the run's labels (v0.10.0 copies them) and are never
  taken for the run's children.

LeaderWorkerSet's own CRD (``config/crd/bases`` of the version ``cluster/build.sh`` fetched) is
applied without its controller; removed at the end if this module installed it. The same unit
by unit: tests/operator/test_groups_followed.py.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from example_runs import example_run
from kubernetes.client.rest import ApiException

from payloadrun_devcluster import BinariesMissing
from payloadrun_devkit.local_operator import LocalOperator
from payloadrun_devkit.required import skip_or_fail
from payloadrun_operator.api import names
from payloadrun_operator.api.kinds import LEADER_WORKER_SET
from payloadrun_operator.api.models import GROUP, PLURAL, VERSION
from payloadrun_operator.observed.following import Follower
from payloadrun_operator.observed.status import workload_ready
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings

pytestmark = pytest.mark.integration

LWS_GROUP, LWS_VERSION = LEADER_WORKER_SET.api_version.split("/")
LWS_CRD = f"{LEADER_WORKER_SET.plural}.{LWS_GROUP}"
DISCOVERY = f"/apis/{LEADER_WORKER_SET.api_version}"
PODS_PER_REPLICA = 2
TOUCH_ANNOTATION = "test.payloadrun.dev/touch"  # a change of the run that builds no child anew
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # LeaderWorkerSet's own, on what it makes


def eventually(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``probe`` until it returns something truthy; fail with the last value otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except ApiException as exc:
            last = f"{exc.status} {exc.reason}"
        if last and not isinstance(last, str):
            return last
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


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
def lws_api(kube_cluster, crd) -> Iterator[Callable[[], None]]:
    """Installs LeaderWorkerSet's CRD when called (and waits until discovery serves it); at the
    module's end, deletes it if this module installed it (another session's real LeaderWorkerSet
    stays)."""
    there_before = lws_served(kube_cluster)
    installed: list[bool] = []

    def install() -> None:
        if lws_served(kube_cluster):
            return
        applied = kube_cluster.kubectl("apply", "--server-side", "-f", str(lws_crd_file()))
        assert applied.returncode == 0, applied.stderr
        installed.append(True)
        kube_cluster.wait_established(LWS_CRD)
        eventually("LeaderWorkerSet's API in discovery", lambda: lws_served(kube_cluster))

    yield install
    if installed and not there_before:
        kube_cluster.kubectl("delete", "crd", LWS_CRD, "--wait=false")


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


def condition(run: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    conditions = (run.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == ctype), None)


def has_condition(api, namespace: str, name: str, ctype: str, reason: str) -> Callable[[], Any]:
    def probe() -> Any:
        run = get_run(api, namespace, name)
        found = condition(run, ctype)
        return run if found and found["reason"] == reason else (found or {}).get("reason", "")

    return probe


def touched_ready_message(api, namespace: str, name: str, touch: int) -> str:
    """The Ready condition's message as the reconcile of a change to the run's annotations
    writes it (once its ``observedDigest``, kopf's record of the change, is written)."""
    before = get_run(api, namespace, name)["status"].get("observedDigest")
    patch = {"metadata": {"annotations": {TOUCH_ANNOTATION: str(touch)}}}
    api["custom"].patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)

    def reconciled() -> Any:
        run = get_run(api, namespace, name)
        return [run] if run["status"].get("observedDigest") != before else ""

    (run,) = eventually("the touch reconciled", reconciled)
    return (condition(run, "Ready") or {}).get("message", "")


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


def run_owner(run: dict[str, Any]) -> dict[str, Any]:
    meta = run["metadata"]
    return {
        "apiVersion": names.API_VERSION,
        "kind": "PayloadRun",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


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


def test_a_run_of_groups_waits_for_leaderworkerset_then_follows_its_groups(
    kube_cluster, crd, api, namespace, lws_api, tmp_path
):
    if lws_served(kube_cluster):
        pytest.skip("LeaderWorkerSet's API is installed already (by another test of this session)")
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
        applied = condition(run, "Applied")
        assert applied["status"] == "False"
        assert "Install LeaderWorkerSet (tested with v0.9.0" in applied["message"]
        assert "restart the operator" in applied["message"]
        ready, validated = condition(run, "Ready"), condition(run, "Validated")
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
    lws_api()
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
        # A condition's message alone is not worth a write (status.status_update): the
        # reconcile a touch of the run's annotations starts writes the Ready condition as the
        # operator's cache has it (handlers.reconcile: readiness.cached_status).
        touches = iter(range(1, 1000))

        def ready_after_a_touch(wanted: Callable[[str], bool]) -> Callable[[], Any]:
            def probe() -> Any:
                message = touched_ready_message(api, namespace, name, next(touches))
                return [message] if wanted(message) else message

            return probe

        eventually(
            "the LeaderWorkerSet's groups in the Ready condition",
            ready_after_a_touch(lambda m: f"{lws_name} 0/2 groups ready" in m),
        )
        set_ready_groups(api, namespace, lws, ready=2)
        # every group ready: the LeaderWorkerSet is no longer waited for (the Jobs' pods are:
        # this control plane runs no node)
        (message,) = eventually(
            "the groups ready",
            ready_after_a_touch(lambda m: bool(m) and lws_name not in m),
        )
        assert f"{name}-orchestrator" in message
        set_ready_groups(api, namespace, lws, ready=1)  # a group recreated: waited for again
        eventually(
            "a group not ready",
            ready_after_a_touch(lambda m: f"{lws_name} 1/2 groups ready" in m),
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
    lws_api()
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
        follower = Follower(op, lambda: "2026-12-04T11:00:00Z")
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
