"""The observed side of a run whose inference replicas are LeaderWorkerSet groups: which APIs the
cluster serves (discovery), the run that asks for groups where LeaderWorkerSet is missing, the
follower's cache (LeaderWorkerSet's own StatefulSets left out) and the readiness of groups. The
same against the real API server: tests/integration/test_groups_followed.py."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from builders import job, observed_run, run_owner
from payloadrun_operator.api import names
from payloadrun_operator.api.addons import ADDONS, KUEUE_ADDON, LEADER_WORKER_SET_ADDON
from payloadrun_operator.api.conditions import (
    AppliedReason,
    ConditionType,
    ReadyReason,
    StatusField,
)
from payloadrun_operator.api.kinds import LEADER_WORKER_SET, OPTIONAL, STATEFUL_SET, WORKLOAD
from payloadrun_operator.api.models import PayloadRunStatus
from payloadrun_operator.api.recorded import Recorded
from payloadrun_operator.observed import groups
from payloadrun_operator.observed.following import Cache, Follower, controlled_elsewhere, slim
from payloadrun_operator.observed.prerequisites import lws_missing_message, missing_checks
from payloadrun_operator.observed.readiness import GROUP_EVENTS, GROUP_PODS, Observed, run_status
from payloadrun_operator.observed.status import status_update, workload_ready
from payloadrun_operator.platform.discovery import Discovery, missing_fields, served_by
from payloadrun_operator.platform.kube import KubeApiError, KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings

NS, NAME = "ml", "big"
NOW = "2026-12-04T11:00:00Z"
RUN_UID = "run-uid"
LWS_UID = "lws-uid"
LABELS = {names.LABEL_MANAGED_BY: names.FIELD_MANAGER, names.LABEL_RUN: NAME}
REPO = Path(__file__).resolve().parents[2]

# v0.9.0's discovery document of leaderworkerset.x-k8s.io/v1, as a kube-apiserver serves it
LWS_RESOURCES = {
    "kind": "APIResourceList",
    "groupVersion": "leaderworkerset.x-k8s.io/v1",
    "resources": [
        {
            "name": "leaderworkersets",
            "kind": "LeaderWorkerSet",
            "namespaced": True,
            "verbs": [
                *("create", "delete", "deletecollection", "get"),
                *("list", "patch", "update", "watch"),
            ],
        },
        {"name": "leaderworkersets/status", "verbs": ["get", "patch", "update"]},
        {"name": "leaderworkersets/scale", "verbs": ["get", "patch", "update"]},
    ],
}


def lws(ready: int = 0, replicas: int = 2, generation: int = 1, observed: int = 1) -> dict:
    return {
        "apiVersion": LEADER_WORKER_SET.api_version,
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": names.inference_groups_name(NAME),
            "namespace": NS,
            "uid": LWS_UID,
            "generation": generation,
            "resourceVersion": "5",
            "labels": LABELS,
            "ownerReferences": [run_owner(group_run())],
        },
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": []}}},
        },
        "status": {"observedGeneration": observed, "readyReplicas": ready, "replicas": replicas},
    }


def lws_statefulset(name: str, owner_kind: str = "LeaderWorkerSet") -> dict:
    """A StatefulSet LeaderWorkerSet makes: its labels copied from the LeaderWorkerSet (the
    run's), controlled by the LeaderWorkerSet (leaders) or a leader pod (a group's workers)."""
    api = LEADER_WORKER_SET.api_version if owner_kind == "LeaderWorkerSet" else "v1"
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "namespace": NS,
            "resourceVersion": "7",
            "labels": {**LABELS, "leaderworkerset.sigs.k8s.io/name": f"{NAME}-vllm"},
            "ownerReferences": [
                {"apiVersion": api, "kind": owner_kind, "name": "x", "uid": "u", "controller": True}
            ],
        },
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 1, "readyReplicas": 2},
    }


def run_jobs() -> tuple[dict, ...]:
    """The orchestrator's and the trainers' Jobs of the run, running."""
    return tuple(
        job(component, run=NAME, labels=LABELS) for component in ("orchestrator", "trainer")
    )


def group_run(pods_per_replica: int = 2) -> dict:
    inference = {"replicas": 2, "podsPerReplica": pods_per_replica}
    spec = {"inference": inference, "failurePolicy": {"backoffLimit": 2}}
    return observed_run(spec, name=NAME, uid=RUN_UID, payloadMode="Inline")


# --- discovery --------------------------------------------------------------------------------


def test_discovery_reads_the_served_resource_and_its_verbs():
    assert served_by(LEADER_WORKER_SET, LWS_RESOURCES)
    assert not served_by(LEADER_WORKER_SET, None)  # 404: the group version is not served
    no_watch = {"resources": [{"name": "leaderworkersets", "verbs": ["get", "list", "patch"]}]}
    assert not served_by(LEADER_WORKER_SET, no_watch)  # kopf could not follow it
    other = {"resources": [{"name": "disaggregatedsets", "verbs": ["list", "watch", "patch"]}]}
    assert not served_by(LEADER_WORKER_SET, other)


def test_discovery_asks_once_whoever_asks():
    class Answers(KubeClient):
        def __init__(self) -> None:
            super().__init__()
            self.asked = 0

        async def discover(self, kind):  # type: ignore[no-untyped-def]
            self.asked += 1
            await asyncio.sleep(0)  # the other caller comes in meanwhile
            return LWS_RESOURCES

        async def discover_group(self, group):  # type: ignore[no-untyped-def]
            return {"versions": [{"version": "v1beta1"}]} if group == "kueue.x-k8s.io" else None

        async def openapi(self, kind):  # type: ignore[no-untyped-def]
            return lws_openapi(subdomain_policy=True)

    async def both() -> tuple[int, bool]:
        client, discovery = Answers(), Discovery()
        assert not discovery.serves(LEADER_WORKER_SET)  # not asked yet: unknown is not served
        await asyncio.gather(discovery.discover(client), discovery.discover(client))
        await discovery.discover(client)  # a login again, on expired credentials
        # Kueue's group served at v1beta1 only: an older Kueue, named as such
        assert discovery.group_versions(WORKLOAD) == ("v1beta1",)
        assert discovery.group_versions(LEADER_WORKER_SET) == ()
        return client.asked, discovery.serves(LEADER_WORKER_SET)

    # once per group version of the add-ons (LeaderWorkerSet's; Kueue's three kinds share one)
    assert asyncio.run(both()) == (2, True)


def lws_openapi(subdomain_policy: bool) -> dict:
    """LeaderWorkerSet's OpenAPI v3 document as the API server publishes a CRD's
    (``/openapi/v3/apis/leaderworkerset.x-k8s.io/v1``), with or without ``networkConfig`` (a
    release before v0.4.0); tests/integration/test_groups_followed.py reads the real one."""
    spec = {"type": "object", "properties": {"replicas": {"type": "integer"}}}
    if subdomain_policy:
        network = {"type": "object", "properties": {"subdomainPolicy": {"type": "string"}}}
        spec["properties"]["networkConfig"] = network
    gvk = {"group": "leaderworkerset.x-k8s.io", "kind": "LeaderWorkerSet", "version": "v1"}
    return {
        "components": {
            "schemas": {
                "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object"},
                "io.k8s.x-k8s.leaderworkerset.v1.LeaderWorkerSet": {
                    "type": "object",
                    "properties": {"spec": spec},
                    "x-kubernetes-group-version-kind": [gvk],
                },
            }
        }
    }


def test_an_older_leaderworkerset_is_told_by_the_fields_it_lacks():
    fields = ("spec.networkConfig.subdomainPolicy",)
    assert missing_fields(lws_openapi(True), LEADER_WORKER_SET, fields) == ()
    assert missing_fields(lws_openapi(False), LEADER_WORKER_SET, fields) == fields
    # no schema of the kind in the document: nothing to tell, nothing refused
    assert missing_fields({"components": {"schemas": {}}}, LEADER_WORKER_SET, fields) == ()
    assert missing_fields(None, LEADER_WORKER_SET, fields) == ()

    class Older(KubeClient):
        async def discover(self, kind):  # type: ignore[no-untyped-def]
            return LWS_RESOURCES if kind == LEADER_WORKER_SET else None

        async def discover_group(self, group):  # type: ignore[no-untyped-def]
            return None

        async def openapi(self, kind):  # type: ignore[no-untyped-def]
            return lws_openapi(subdomain_policy=False)

    class Forbidden(Older):
        async def openapi(self, kind):  # type: ignore[no-untyped-def]
            raise KubeApiError(403, "Forbidden", "forbidden", "reading the schema")

    # a schema the operator may not read (no system:discovery): served, as discovery says
    unread = Discovery()
    asyncio.run(unread.discover(Forbidden()))
    assert unread.serves(LEADER_WORKER_SET)

    discovery = Discovery()
    asyncio.run(discovery.discover(Older()))
    assert not discovery.serves(LEADER_WORKER_SET)
    versions = discovery.group_versions(LEADER_WORKER_SET)
    assert versions == ("v1 without spec.networkConfig.subdomainPolicy",)
    said = lws_missing_message(2, versions)
    assert (
        "this cluster served leaderworkerset.x-k8s.io at v1 without "
        "spec.networkConfig.subdomainPolicy only when the operator started, an older "
        "LeaderWorkerSet than the operator needs: leaderworkerset.x-k8s.io/v1 leaderworkersets "
        "(with spec.networkConfig.subdomainPolicy: from LeaderWorkerSet v0.4.0 on; tested with "
        "v0.9.0). Upgrade LeaderWorkerSet"
    ) in said


def test_the_follower_lists_leaderworkersets_only_where_they_are_served():
    op = Operator(OperatorSettings(), KubeClient(), OperatorMetrics())
    follower = Follower(op)
    op.discovery.mark([])
    kinds = {kind for _, kind in follower.followed()}
    assert "LeaderWorkerSet" not in kinds and {"StatefulSet", "Job"} <= kinds
    op.discovery.mark([LEADER_WORKER_SET])
    assert ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet") in follower.followed()


# --- a run that asks for groups where LeaderWorkerSet is missing ------------------------------


def test_a_run_of_groups_without_leaderworkerset_says_so_and_what_to_do():
    assert missing_checks(1, lws_served=False) == {}  # one-pod replicas need nothing more
    assert missing_checks(4, lws_served=True) == {}
    checks = missing_checks(4, lws_served=False)
    applied, ready = checks[ConditionType.APPLIED], checks[ConditionType.READY]
    assert (applied.ok, applied.reason, applied.warning) == (
        False,
        AppliedReason.LEADER_WORKER_SET_MISSING,
        True,
    )
    assert "podsPerReplica is 4" in applied.message
    assert (
        "leaderworkerset.x-k8s.io/v1 leaderworkersets (with spec.networkConfig.subdomainPolicy: "
        "from LeaderWorkerSet v0.4.0 on; tested with v0.9.0)"
    ) in applied.message
    assert "Install LeaderWorkerSet (https://lws.sigs.k8s.io/" in applied.message
    assert "restart the operator" in applied.message
    assert ready.reason == ReadyReason.LEADER_WORKER_SET_MISSING and not ready.warning
    # one Warning event (Applied's), the phase Provisioning: the spec is valid
    update = status_update({}, 1, checks, {}, NOW)
    assert [(t, r) for t, r, _ in update.events] == [("Warning", "LeaderWorkerSetMissing")]
    assert update.phase == "Provisioning"


def test_an_older_addon_is_named_as_installed_and_too_old_with_what_the_operator_needs():
    """A cluster that serves the add-on's group at another version (an older release) is told
    to upgrade it, not to install it."""
    lws = missing_checks(2, lws_served=False, lws_versions=("v1alpha1",))
    applied = lws[ConditionType.APPLIED]
    assert "served leaderworkerset.x-k8s.io at v1alpha1 only" in applied.message
    assert "an older LeaderWorkerSet than the operator needs" in applied.message
    assert "Upgrade LeaderWorkerSet (https://lws.sigs.k8s.io/" in applied.message
    assert "Install" not in applied.message
    assert lws[ConditionType.READY].message.startswith("LeaderWorkerSet is too old:")
    kueue = missing_checks(1, True, queue="q", kueue_served=False, kueue_versions=("v1beta1",))
    applied = kueue[ConditionType.APPLIED]
    assert applied.reason == AppliedReason.KUEUE_MISSING
    assert "served kueue.x-k8s.io at v1beta1 only" in applied.message
    assert (
        "kueue.x-k8s.io/v1beta2 workloads (served from Kueue v0.15.0 on; tested with v0.19.2)"
        in (applied.message)
    )
    assert kueue[ConditionType.READY].message.startswith("Kueue is too old:")


def test_the_addons_tested_releases_are_the_ones_the_tests_install():
    """cluster/versions.env pins the releases the suite builds and installs; the operator's
    messages name the same ones."""
    pinned = dict(
        line.split("=", 1)
        for line in (REPO / "cluster" / "versions.env").read_text().splitlines()
        if re.match(r"^[A-Z_]+=", line)
    )
    assert LEADER_WORKER_SET_ADDON.tested == pinned["LWS_VERSION"]
    assert KUEUE_ADDON.tested == pinned["KUEUE_VERSION"]
    assert ADDONS.keys() == {k for k in OPTIONAL if k.followed}


# --- the follower's cache ---------------------------------------------------------------------


def test_statefulsets_leaderworkerset_makes_are_not_the_runs_children():
    leaders = lws_statefulset(names.inference_groups_name(NAME))
    workers = lws_statefulset(f"{NAME}-vllm-0", owner_kind="Pod")
    assert controlled_elsewhere(leaders) and controlled_elsewhere(workers)
    cache = Cache()
    assert cache.put("StatefulSet", leaders) is None  # no run queued for it
    assert cache.put("StatefulSet", workers, deleted=True) is None
    cache.replace("StatefulSet", NS, [leaders, workers])
    assert cache.children == {}
    # the run's own children: controlled by the run, or by nothing (a claim it keeps)
    ours = {**lws(), "metadata": {**lws()["metadata"]}}
    assert not controlled_elsewhere(ours)
    kept_claim = {"metadata": {"name": "c", "namespace": NS, "labels": LABELS}}
    assert not controlled_elsewhere(kept_claim)
    assert cache.put("LeaderWorkerSet", ours) == (NS, NAME)


def test_a_name_collision_cannot_make_a_leaderworkerset_statefulset_the_inference_workload():
    """Even named as the run's own inference StatefulSet would be, LeaderWorkerSet's
    StatefulSet stays out of the cache: readiness finds no StatefulSet there."""
    impostor = lws_statefulset(names.child_name(NAME, names.INFERENCE))
    cache = Cache()
    cache.put("StatefulSet", impostor)
    cache.replace("StatefulSet", NS, [impostor])
    assert (NS, "StatefulSet", f"{NAME}-inference") not in cache.children


def test_the_cache_keeps_no_worker_template():
    run = group_run()
    run["spec"]["inference"]["workerTemplate"] = {"spec": {"containers": [{"name": "vllm"}]}}
    run["spec"]["inference"]["template"] = {"spec": {"containers": [{"name": "vllm"}]}}
    assert slim(run)["spec"]["inference"] == {"replicas": 2, "podsPerReplica": 2}
    assert slim(lws())["spec"] == {"replicas": 2}  # a LeaderWorkerSet's: only its replicas


# --- readiness of groups ----------------------------------------------------------------------


def test_a_leaderworkerset_is_ready_when_every_group_is_at_its_generation():
    assert workload_ready(lws(ready=2)) == (True, "big-vllm 2/2 groups ready")
    assert workload_ready(lws(ready=1)) == (False, "big-vllm 1/2 groups ready")
    # a new spec not yet seen by LeaderWorkerSet's controller: not ready on old counts
    assert not workload_ready(lws(ready=2, generation=2, observed=1))[0]
    assert workload_ready(lws(ready=0, replicas=0)) == (True, "big-vllm 0/0 groups ready")


def test_the_inference_workload_of_a_run_of_groups_is_its_leaderworkerset():
    assert names.run_workloads(NAME, 2)[0] == (
        LEADER_WORKER_SET.api_version,
        "LeaderWorkerSet",
        "big-vllm",
    )
    statefulset = (STATEFUL_SET.api_version, "StatefulSet", NAME + "-inference")
    assert names.run_workloads(NAME, 1)[0] == statefulset
    assert names.run_workloads(NAME, 2)[1:] == names.run_workloads(NAME, 1)[1:]


def cached(*objs: dict) -> dict:
    cache = Cache()
    for obj in objs:
        cache.put(obj["kind"], obj)
    return cache.children


def test_the_run_is_ready_when_its_leaderworkerset_is_and_never_on_lws_statefulsets():
    jobs = run_jobs()
    others = (lws_statefulset("big-vllm"), lws_statefulset("big-vllm-0", owner_kind="Pod"))
    waiting = run_status(group_run(), Observed(cached(lws(ready=1), *others, *jobs)), NOW)
    ready = waiting.checks[ConditionType.READY]
    assert (ready.ok, ready.reason) == (False, ReadyReason.WORKLOADS_NOT_READY)
    assert "big-vllm 1/2 groups ready" in ready.message
    # LeaderWorkerSet's StatefulSets all ready, and no LeaderWorkerSet: not ready
    none = run_status(group_run(), Observed(cached(*others, *jobs)), NOW)
    assert "big-vllm not created yet" in none.checks[ConditionType.READY].message
    done = run_status(group_run(), Observed(cached(lws(ready=2), *others, *jobs)), NOW)
    assert done.checks[ConditionType.READY].reason == ReadyReason.WORKLOADS_READY
    assert StatusField.FAILURE not in done.fields


# --- a group's failure ------------------------------------------------------------------------


def group_pod(
    group: int, worker: int, uid: str, *, exit_code: int = 1, restarts: int = 1, at: str = NOW
) -> dict:
    """A pod of the run's LeaderWorkerSet whose vllm container ended (and was restarted)."""
    name = f"{NAME}-vllm-{group}" + (f"-{worker}" if worker else "")
    terminated = {"exitCode": exit_code, "reason": "Error", "finishedAt": at}
    return {
        "metadata": {
            "name": name,
            "uid": uid,
            "labels": {
                groups.LWS_NAME_LABEL: f"{NAME}-vllm",
                groups.LWS_GROUP_INDEX_LABEL: str(group),
                groups.LWS_WORKER_INDEX_LABEL: str(worker),
            },
        },
        "status": {
            "containerStatuses": [
                {"name": "payload-writer", "restartCount": 0, "state": {"running": {}}},
                {
                    "name": "vllm",
                    "restartCount": restarts,
                    "state": {"running": {}},
                    "lastState": {"terminated": terminated},
                },
            ]
        },
    }


def healthy_pod(group: int, uid: str) -> dict:
    pod = group_pod(group, 0, uid)
    pod["status"]["containerStatuses"] = [{"name": "vllm", "restartCount": 0, "state": {}}]
    return pod


def test_a_groups_failure_names_the_replica_the_pod_and_the_exit_code():
    earlier = group_pod(0, 1, "u-old", exit_code=137, at="2026-12-04T10:59:00Z")
    failure = groups.last_failure(
        [healthy_pod(0, "u0"), earlier, group_pod(1, 1, "u-new", exit_code=3)], "big-vllm"
    )
    assert failure is not None
    assert (failure["replica"], failure["pod"], failure["container"], failure["exitCode"]) == (
        1,
        "big-vllm-1-1",
        "vllm",
        3,
    )
    assert failure["message"].startswith(
        "replica 1 of big-vllm: container vllm of pod big-vllm-1-1 exited with code 3 (Error)"
    )
    assert groups.last_failure([healthy_pod(0, "u0")], "big-vllm") is None
    # an init container that completed is no failure
    done = healthy_pod(0, "u1")
    done["status"]["initContainerStatuses"] = [
        {"name": "init", "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}
    ]
    assert groups.last_failure([done], "big-vllm") is None


def test_a_failure_is_recorded_once_and_counted():
    failure = groups.last_failure([group_pod(1, 1, "u1")], "big-vllm")
    fields = groups.restart_fields(Recorded(), failure)
    assert fields[StatusField.INFERENCE_GROUP_RESTARTS] == 1
    recorded = {str(k): v for k, v in fields.items()}
    assert (
        groups.restart_fields(Recorded.of_status(recorded), failure) == {}
    )  # the same failure, seen again
    again = groups.last_failure([group_pod(1, 1, "u2", at="2026-12-04T11:05:00Z")], "big-vllm")
    assert (
        groups.restart_fields(Recorded.of_status(recorded), again)[
            StatusField.INFERENCE_GROUP_RESTARTS
        ]
        == 2
    )
    PayloadRunStatus.model_validate(recorded)  # the model's shape


def test_a_pass_lists_the_groups_pods_only_while_a_group_is_short_of_ready():
    jobs = run_jobs()
    run = group_run()
    ready = run_status(run, Observed(cached(lws(ready=2), *jobs)), NOW)
    assert GROUP_PODS not in ready.wants  # every group ready: nothing listed
    short = run_status(run, Observed(cached(lws(ready=1), *jobs)), NOW)
    assert {GROUP_PODS, GROUP_EVENTS} <= short.wants
    listed = Observed(
        cached(lws(ready=1), *jobs),
        group_pods=[group_pod(1, 0, "u1", exit_code=2)],
        group_events=[],
    )
    found = run_status(run, listed, NOW)
    assert not found.wants
    last = found.fields[StatusField.LAST_INFERENCE_GROUP_RESTART]
    assert (last["replica"], last["pod"], last["exitCode"]) == (1, "big-vllm-1", 2)
    # written with the pass's conditions (one write), and no second time
    update = status_update(run["status"], 1, found.checks, found.fields, NOW)
    assert update.fields is not None
    after = {**run, "status": {**run["status"], **update.fields}}
    assert run_status(after, listed, NOW).fields == {}
    # a suspended run's groups are stopped on purpose: nothing listed
    stopped = {**run, "spec": {**run["spec"], "suspend": True}}
    assert GROUP_PODS not in run_status(stopped, Observed(cached(lws(ready=0), *jobs)), NOW).wants


# --- a StatefulSet LeaderWorkerSet's controller could not make --------------------------------

QUOTA = (
    'statefulsets.apps "{name}" is forbidden: exceeded quota: sts, requested: '
    "count/statefulsets.apps=1, used: count/statefulsets.apps=1, limited: count/statefulsets.apps=1"
)


def lws_event(note: str, *, related: str = "", reason: str = "FailedCreate", at: str = NOW) -> dict:
    """A Warning LeaderWorkerSet's controller recorded on the run's LeaderWorkerSet, as the core
    API lists one its events.k8s.io recorder made (``regarding`` as ``involvedObject``, ``note``
    as ``message``, ``eventTime`` set, the old timestamps not)."""
    event = {
        "metadata": {"name": f"big-vllm.{related or 'lws'}{len(note)}", "namespace": NS},
        "involvedObject": {
            "apiVersion": LEADER_WORKER_SET.api_version,
            "kind": "LeaderWorkerSet",
            "name": "big-vllm",
            "namespace": NS,
            "uid": LWS_UID,
        },
        "reason": reason,
        "message": note,
        "type": "Warning",
        "action": "Create",
        "eventTime": at.replace("Z", ".000001Z"),
        "firstTimestamp": None,
        "lastTimestamp": None,
        "reportingComponent": "leaderworkerset",
    }
    if related:
        event["related"] = {"apiVersion": "v1", "kind": "Pod", "name": "big-vllm-1", "uid": related}
    return event


def workers_refused(uid: str, at: str = NOW) -> dict:
    note = "Failed to create worker statefulset for leader pod big-vllm-1: " + QUOTA.format(
        name="big-vllm-1"
    )
    return lws_event(note, related=uid, at=at)


def test_the_events_listed_are_this_leaderworkersets_warnings():
    selector = groups.events_selector(lws())
    assert selector.split(",") == [
        "involvedObject.kind=LeaderWorkerSet",
        "involvedObject.name=big-vllm",
        f"involvedObject.uid={LWS_UID}",
        "type=Warning",
    ]


def test_a_groups_workers_refused_are_said_while_its_leader_is_alone():
    jobs = run_jobs()
    # group 0 whole, group 1's leader alone: its workers' StatefulSet refused by a quota
    pods = [healthy_pod(0, "l0"), group_pod(0, 1, "w0"), healthy_pod(1, "l1")]
    events = [
        workers_refused("l1-before", at="2026-12-04T11:05:00Z"),  # a leader pod since replaced
        workers_refused("l1"),
        lws_event("Failed to create headless service for error: x"),  # leaders applied: past
    ]
    seen = Observed(cached(lws(ready=1), *jobs), group_pods=pods, group_events=events)
    found = run_status(group_run(), seen, NOW)
    ready = found.checks[ConditionType.READY]
    assert (ready.ok, ready.reason, ready.warning) == (False, ReadyReason.GROUPS_REFUSED, True)
    assert ready.message.startswith(
        "LeaderWorkerSet big-vllm could not create the workers' StatefulSet of replica 1 (pods "
        "from spec.inference.workerTemplate, or spec.inference.template where it is unset): "
        + QUOTA.format(name="big-vllm-1")
    )
    assert "leaders" not in ready.message and "headless" not in ready.message
    assert found.recheck  # nothing watched says when the controller gets past it
    # its workers made: nothing refused any more, nothing to look at again
    pods.append(group_pod(1, 1, "w1"))
    after = run_status(group_run(), seen, NOW)
    ready = after.checks[ConditionType.READY]
    assert (ready.reason, ready.message) == (
        ReadyReason.WORKLOADS_NOT_READY,
        "waiting for big-vllm 1/2 groups ready",
    )
    assert not after.recheck


def test_refused_leaders_are_said_until_the_controller_applies_their_generation():
    jobs = run_jobs()
    older = lws_event(
        "Failed to create leader statefulset big-vllm: old", at="2026-12-04T10:00:00Z"
    )
    newer = lws_event(
        "Failed to update leader statefulset big-vllm: " + QUOTA.format(name="big-vllm"),
        reason="FailedUpdate",
    )
    unrelated = lws_event("something else", reason="RecreateGroup")
    events = [newer, older, unrelated]
    pending = lws(ready=0, generation=2, observed=1)
    seen = Observed(cached(pending, *jobs), group_pods=[], group_events=events)
    found = run_status(group_run(), seen, NOW)
    ready = found.checks[ConditionType.READY]
    assert ready.reason == ReadyReason.GROUPS_REFUSED and found.recheck
    assert ready.message.startswith(
        "LeaderWorkerSet big-vllm could not update its leaders' StatefulSet (pods from "
        "spec.inference.template): " + QUOTA.format(name="big-vllm") + "; its controller retries"
    )
    # the controller applied generation 2 (it writes observedGeneration only then): past
    applied = Observed(
        cached(lws(ready=0, generation=2, observed=2), *jobs), group_pods=[], group_events=events
    )
    after = run_status(group_run(), applied, NOW)
    assert after.checks[ConditionType.READY].reason == ReadyReason.WORKLOADS_NOT_READY
    assert not after.recheck


def test_both_refusals_at_once_are_both_said():
    jobs = run_jobs()
    events = [lws_event("Failed to update leader statefulset big-vllm: no"), workers_refused("l1")]
    pods = [healthy_pod(1, "l1")]
    seen = Observed(
        cached(lws(ready=0, generation=2, observed=1), *jobs), group_pods=pods, group_events=events
    )
    message = run_status(group_run(), seen, NOW).checks[ConditionType.READY].message
    assert "could not update its leaders' StatefulSet" in message
    assert "; and could not create the workers' StatefulSet of replica 1" in message


def test_the_latest_event_of_a_series_counts_by_its_last_observation():
    first = lws_event(
        "Failed to update leader statefulset big-vllm: first", at="2026-12-04T10:00:00Z"
    )
    first["series"] = {"count": 7, "lastObservedTime": "2026-12-04T11:30:00.000000Z"}
    second = lws_event("Failed to update leader statefulset big-vllm: second")  # 11:00
    check = groups.refusal(lws(generation=2, observed=1), [second, first], [], 2)
    assert check is not None and check.message.endswith(
        "StatefulSet (pods from spec.inference.template): first; its controller retries: once "
        "the cause is gone (a quota raised, a policy changed, the template fixed) the groups start"
    )
