"""The operator against the real local control plane: CRD, CEL rules, children, status, GC."""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from example_runs import example_run
from kubernetes.client.rest import ApiException
from pod_helpers import status_caught_up

from builders import condition_of
from payloadrun_devkit.local_operator import LocalOperator
from payloadrun_operator.api.crd import build_crd
from payloadrun_operator.api.models import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
CEL_MESSAGE = "the P/D router does not stitch by-handle routing segments"


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


def install_crd(kube_cluster, crd: dict[str, Any]) -> None:
    result = kube_cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd)
    )
    assert result.returncode == 0, result.stderr
    kube_cluster.wait_established(f"{PLURAL}.{GROUP}")


@pytest.fixture(scope="module")
def operator(kube_cluster, crd, tmp_path_factory):
    op = LocalOperator(
        kube_cluster.kubeconfig,
        env={
            "PAYLOADRUN_SIDECAR_IMAGE": "payloadrun:test",
            "PAYLOADRUN_APPLY_RETRY_SECONDS": "2",
            "PAYLOADRUN_RESYNC_SECONDS": "3600",  # status from watch events only
        },
        log_path=tmp_path_factory.mktemp("operator") / "operator.log",
    )
    op.start()
    yield op
    op.stop()


def load_example(name: str) -> dict[str, Any]:
    return example_run(name)


def create_run(api, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def get_run(api, namespace: str, name: str) -> dict[str, Any]:
    return api["custom"].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def reconciled(api, namespace: str, name: str, generation: int | None = None):
    def probe():
        run = get_run(api, namespace, name)
        status = run.get("status") or {}
        want = generation or run["metadata"]["generation"]
        followed = any(c["type"] == "Ready" for c in status.get("conditions") or [])
        done = status.get("observedGeneration") == want and status.get("phase") and followed
        return run if done else None

    # reconciled, and its Ready condition computed from the children's watch events
    return eventually(f"{namespace}/{name} reconciled", probe)


def children(api, namespace: str, name: str) -> dict[tuple[str, str], Any]:
    selector = f"payloadrun.dev/run={name}"
    found = {}
    for kind, lister in (
        ("ConfigMap", api["core"].list_namespaced_config_map),
        ("Service", api["core"].list_namespaced_service),
        ("PersistentVolumeClaim", api["core"].list_namespaced_persistent_volume_claim),
        ("StatefulSet", api["apps"].list_namespaced_stateful_set),
        ("Job", api["batch"].list_namespaced_job),
    ):
        for item in lister(namespace, label_selector=selector).items:
            found[(kind, item.metadata.name)] = item
    return found


def run_events(api, namespace: str, name: str) -> list:
    """The events about a run."""
    selector = f"involvedObject.name={name},involvedObject.kind=PayloadRun"
    return api["core"].list_namespaced_event(namespace, field_selector=selector).items


def writes(obj) -> tuple[str, list]:
    """An object's uid and the times the operator's field manager last wrote it."""
    ours = [f.time for f in obj.metadata.managed_fields or [] if f.manager == "payloadrun-operator"]
    assert ours, f"{obj.metadata.name} has no fields managed by the operator"
    return obj.metadata.uid, ours


def env_of(container) -> dict[str, str]:
    return {e.name: e.value for e in container.env or []}


# --- the examples, through kubectl ----------------------------------------------------------------


def test_kubectl_apply_of_each_example(kube_cluster, operator, api, namespace):
    for example in (
        "multinode-by-handle.yaml",
        "singlenode-inline.yaml",
        "disaggregated-inline.yaml",
    ):
        result = kube_cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / example))
        assert result.returncode == 0, f"{example}: {result.stderr}"

    rejected = kube_cluster.kubectl(
        "apply", "-n", namespace, "-f", str(EXAMPLES / "disaggregated-root-rejected.yaml")
    )
    assert rejected.returncode != 0
    assert CEL_MESSAGE in rejected.stderr
    assert "pd-with-root" not in kube_cluster.kubectl("get", "prun", "-n", namespace).stdout

    expected = {
        "qwen3-moe-grpo": ("ByHandle", "PayloadRootSet"),
        "small-moe-debug": ("Inline", "SingleNode"),
        "pd-disaggregated": ("Inline", "Disaggregated"),
    }
    for name, (mode, reason) in expected.items():
        run = reconciled(api, namespace, name)
        assert (run["status"]["payloadMode"], run["status"]["payloadModeReason"]) == (mode, reason)
        assert condition_of(run, "Validated")["status"] == "True"

    table = kube_cluster.kubectl("get", "payloadruns", "-n", namespace).stdout
    assert table.splitlines()[0].split() == ["NAME", "MODE", "PHASE", "READY", "CLAIM", "AGE"]
    assert "qwen3-moe-grpo-payloads" in table
    # Ready follows the workloads, whose pods wait for a node (or for the claim) here
    row = next(line.split() for line in table.splitlines() if line.startswith("qwen3-moe-grpo"))
    assert row[1:4] == ["ByHandle", "Provisioning", "False"], table


def test_python_client_gets_the_cel_message(operator, api, namespace):
    body = load_example("disaggregated-root-rejected.yaml")
    with pytest.raises(ApiException) as info:
        create_run(api, namespace, body)
    assert info.value.status == 422
    assert CEL_MESSAGE in info.value.body


def test_claim_name_is_immutable(operator, api, namespace):
    body = load_example("multinode-by-handle.yaml")
    body["spec"]["payloads"]["volume"] = {"claimName": "team-nfs"}
    create_run(api, namespace, body)
    patch = {"spec": {"payloads": {"volume": {"claimName": "other"}}}}
    with pytest.raises(ApiException) as info:
        api["custom"].patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body["metadata"]["name"], patch
        )
    assert "volume.claimName cannot change after creation" in info.value.body


# --- children, status, events ---------------------------------------------------------------------


def test_by_handle_run_children_status_and_events(operator, api, namespace):
    body = load_example("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    created = create_run(api, namespace, body)
    uid = created["metadata"]["uid"]
    run = reconciled(api, namespace, name)
    status = run["status"]
    root = "/data/outputs/payloads"  # <run dir>/payloads, as the example sets it
    assert status["payloadRoot"] == root
    assert status["claimName"] == f"{name}-payloads"
    assert status["phase"] == "Provisioning"
    assert condition_of(run, "Validated")["reason"] == "SpecValid"
    # no provisioner serves the nfs-rwx class here: the claim waits, and the status says so
    volume = condition_of(run, "VolumeReady")
    assert (volume["status"], volume["reason"]) == ("False", "ClaimPending")
    assert condition_of(run, "Ready")["status"] == "False"

    kids = children(api, namespace, name)
    assert {kind for kind, _ in kids} == {
        "ConfigMap",
        "Service",
        "PersistentVolumeClaim",
        "StatefulSet",
        "Job",
    }
    for (kind, child_name), obj in kids.items():
        refs = obj.metadata.owner_references
        assert refs and refs[0].uid == uid and refs[0].controller, (kind, child_name)

    claim = kids[("PersistentVolumeClaim", f"{name}-payloads")]
    assert claim.spec.access_modes == ["ReadWriteMany"]
    assert claim.spec.storage_class_name == "nfs-rwx"

    inference = kids[("StatefulSet", f"{name}-inference")].spec.template.spec
    (writer,) = inference.init_containers
    assert writer.restart_policy == "Always" and writer.image == "payloadrun:test"
    assert env_of(writer)["PAYLOAD_ROOT"] == root
    assert writer.security_context.run_as_non_root
    # one path for the payload volume in every container: the run directory's
    assert writer.volume_mounts[0].mount_path == "/data" and not writer.volume_mounts[0].read_only
    (vllm,) = inference.containers
    assert {m.mount_path for m in vllm.volume_mounts} == {"/config", "/data", "/dev/shm"}
    assert inference.runtime_class_name == "nvidia"

    orchestrator = kids[("Job", f"{name}-orchestrator")].spec.template.spec
    (retention,) = orchestrator.init_containers
    assert env_of(retention)["PAYLOADRUN_RUN_ID"] == uid
    assert env_of(orchestrator.containers[0])["PAYLOADRUN_RETENTION_URL"] == "http://127.0.0.1:8002"

    trainer = kids[("Job", f"{name}-trainer")].spec.template.spec
    mounts = {m.mount_path: m for m in trainer.containers[0].volume_mounts}
    assert not mounts["/data"].read_only  # the run directory, read-write
    assert mounts[root].read_only is True and mounts[root].sub_path == "outputs/payloads"

    settings = kids[("ConfigMap", f"{name}-settings")].data
    assert settings["payloadMode"] == "ByHandle" and settings["payloadRoot"] == root

    # a new run's Validated, Applied, VolumeReady (pending) and Ready (not yet) are in its
    # status and post no event (each is a request; the volume test waits for its first one)
    assert run_events(api, namespace, name) == []


def test_volume_becomes_ready_when_a_volume_binds(kube_cluster, operator, api, namespace, tmp_path):
    body = load_example("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    body["spec"]["payloads"]["volume"] = {"size": "10Gi"}  # no storage class: a static PV serves it
    create_run(api, namespace, body)
    reconciled(api, namespace, name)
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pv-{namespace}"},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "hostPath": {"path": str(tmp_path)},
            "claimRef": {"namespace": namespace, "name": f"{name}-payloads"},
        },
    }
    api["core"].create_persistent_volume(pv)
    try:

        def volume_ready():
            run = get_run(api, namespace, name)
            return condition_of(run, "VolumeReady")["status"] == "True" and run

        run = eventually("VolumeReady=True", volume_ready, timeout=60)
        assert condition_of(run, "VolumeReady")["reason"] == "ClaimBound"
        # the volume bound is news (a flip of VolumeReady): an event, the first of the run's
        # life (its conditions as a new run posted none)
        events = eventually(
            "the ClaimBound event",
            lambda: (
                [e for e in run_events(api, namespace, name) if e.reason == "ClaimBound"]
                and run_events(api, namespace, name)
            ),
        )
        assert [(e.type, e.reason) for e in events] == [("Normal", "ClaimBound")]
    finally:
        api["core"].delete_persistent_volume(f"pv-{namespace}")


def test_inline_run_has_no_volume_and_no_sidecars(operator, api, namespace):
    body = load_example("singlenode-inline.yaml")
    name = body["metadata"]["name"]
    create_run(api, namespace, body)
    run = reconciled(api, namespace, name)
    assert condition_of(run, "VolumeReady")["reason"] == "NotNeeded"
    assert "claimName" not in run["status"]
    kids = children(api, namespace, name)
    assert not any(kind == "PersistentVolumeClaim" for kind, _ in kids)
    for (kind, _), obj in kids.items():
        if kind in ("StatefulSet", "Job"):
            assert obj.spec.template.spec.init_containers is None
            # no claim: at most the memory-backed /dev/shm of inference and trainers
            volumes = obj.spec.template.spec.volumes or []
            assert [(v.name, v.empty_dir.medium) for v in volumes] in ([], [("dshm", "Memory")])


def test_spec_update_reconciles(operator, api, namespace):
    body = load_example("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    create_run(api, namespace, body)
    reconciled(api, namespace, name)
    api["custom"].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"inference": {"replicas": 3}}}
    )
    run = reconciled(api, namespace, name, generation=2)
    assert run["status"]["observedGeneration"] == 2
    sts = api["apps"].read_namespaced_stateful_set(f"{name}-inference", namespace)
    assert sts.spec.replicas == 3


def history(api, namespace: str, name: str, since: str) -> list[dict[str, Any]]:
    """Every version of one run after resourceVersion ``since``, in order: the API server's
    watch replays them from its cache, and ends the stream a second after the last."""
    stream = kubernetes.watch.Watch().stream(
        api["custom"].list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        field_selector=f"metadata.name={name}",
        resource_version=since,
        timeout_seconds=1,
    )
    return [event["object"] for event in stream]


def test_each_pass_writes_the_run_once_with_kopfs_record_in_its_status(operator, api, namespace):
    """A reconcile writes the run once: its status, with what the follower computes from the
    children (VolumeReady, Ready) and kopf's record of what it handled (observedDigest); kopf
    writes nothing of its own (no record, no marker), and a change of labels alone (no new
    generation) is still handled."""
    body = load_example("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    created = create_run(api, namespace, body)
    digest = reconciled(api, namespace, name)["status"]["observedDigest"]
    api["custom"].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"labels": {"team": "rl"}}}
    )

    def handled_again() -> Any:
        run = get_run(api, namespace, name)
        return run if run["status"]["observedDigest"] != digest else None

    relabelled = eventually("the label change handled", handled_again)
    assert relabelled["status"]["observedGeneration"] == 1
    # a spec change applied at the first try (naming a client changes a NetworkPolicy only;
    # a pass that waits and is retried keeps kopf's progress record while it is)
    clients = [{"podSelector": {"matchLabels": {"app": "router"}}}]
    api["custom"].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"inference": {"clients": clients}}}
    )
    # kopf handles a run's events one after another: once generation 2 is handled, any write
    # of its own after the earlier passes has been made, and is in the run's history
    reconciled(api, namespace, name, generation=2)
    seen = history(api, namespace, name, created["metadata"]["resourceVersion"])
    first = seen[0]["status"]
    assert first["observedGeneration"] == 1 and first["observedDigest"] == digest
    assert {"Validated", "Applied", "VolumeReady", "Ready"} <= {
        c["type"] for c in first["conditions"]
    }
    kopfs = [
        (o["metadata"]["resourceVersion"], key)
        for o in seen
        for key in o["metadata"].get("annotations") or {}
        if key.startswith(f"{GROUP}/")
    ]
    assert kopfs == [], "kopf wrote records of its own into the run"


def test_workloads_changed_behind_the_operators_back_are_applied_again(operator, api, namespace):
    """The reconcile reads the workloads from the operator's watch cache, not the API server:
    one edited and one deleted behind its back are seen there, so a reconcile applies them
    again. A cache that missed either event would keep the edit (its inputs hash said
    unchanged) or scale a Job that is gone (refused), for ever. The watch events reach the
    cache within moments of the changes, and a reconcile may come first: the spec is changed
    again until one has seen them (at the first, almost always)."""
    body = load_example("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    create_run(api, namespace, body)
    reconciled(api, namespace, name)
    inputs_key = "payloadrun.dev/inputs"
    sts_name, job_name = f"{name}-inference", f"{name}-orchestrator"
    sts = api["apps"].read_namespaced_stateful_set(sts_name, namespace)
    inputs, replicas = sts.metadata.annotations[inputs_key], sts.spec.replicas
    old_job = api["batch"].read_namespaced_job(job_name, namespace)
    api["apps"].patch_namespaced_stateful_set(
        sts_name,
        namespace,
        {"metadata": {"annotations": {inputs_key: "edited"}}, "spec": {"replicas": replicas + 1}},
    )
    api["batch"].delete_namespaced_job(job_name, namespace, propagation_policy="Background")
    limit = old_job.spec.backoff_limit  # the run's failurePolicy.backoffLimit
    for change in range(1, 4):
        policy = {"spec": {"failurePolicy": {"backoffLimit": limit + change}}}
        custom = api["custom"]
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, policy)
        reconciled(api, namespace, name, generation=1 + change)
        sts = api["apps"].read_namespaced_stateful_set(sts_name, namespace)
        named = f"metadata.name={job_name}"
        jobs = api["batch"].list_namespaced_job(namespace, field_selector=named)
        edited = (sts.metadata.annotations[inputs_key], sts.spec.replicas) != (inputs, replicas)
        if not edited and jobs.items:
            break
    else:
        pytest.fail(f"the workloads were never applied again: {sts.metadata}, {jobs.items}")
    (job,) = jobs.items
    assert job.metadata.uid != old_job.metadata.uid
    assert job.metadata.annotations[inputs_key] == old_job.metadata.annotations[inputs_key]
    assert job.spec.backoff_limit == limit + change


def test_workloads_deleted_behind_the_operators_back_are_made_again_at_once(
    operator, api, namespace
):
    """A live run's StatefulSet and Job deleted by hand come back with no change of the run:
    their DELETED events reach the follower's cache, which reconciles the run again (as
    controller-runtime's Owns() does); before, they stayed gone until the run's next change.
    The run's generation and its other children are untouched: nothing but the two is
    written."""
    body = load_example("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    create_run(api, namespace, body)
    reconciled(api, namespace, name)
    before = {key: writes(obj) for key, obj in children(api, namespace, name).items()}
    sts_name, job_name = f"{name}-inference", f"{name}-orchestrator"
    old_sts = api["apps"].read_namespaced_stateful_set(sts_name, namespace)
    old_job = api["batch"].read_namespaced_job(job_name, namespace)
    deleted = time.monotonic()
    api["apps"].delete_namespaced_stateful_set(sts_name, namespace)
    api["batch"].delete_namespaced_job(job_name, namespace, propagation_policy="Background")

    def made_again():
        sts = (
            api["apps"]
            .list_namespaced_stateful_set(namespace, field_selector=f"metadata.name={sts_name}")
            .items
        )
        jobs = (
            api["batch"]
            .list_namespaced_job(namespace, field_selector=f"metadata.name={job_name}")
            .items
        )
        old = (old_sts.metadata.uid, old_job.metadata.uid)
        fresh = [[o for o in found if o.metadata.uid not in old] for found in (sts, jobs)]
        return fresh if all(fresh) else None

    (sts,), (job,) = eventually("the two made again", made_again)
    print(f"\ndeleted -> both made again: {time.monotonic() - deleted:.2f} s")
    assert sts.spec.template == old_sts.spec.template and sts.spec.replicas == old_sts.spec.replicas
    assert job.spec.template.spec.containers == old_job.spec.template.spec.containers
    run = get_run(api, namespace, name)
    assert run["metadata"]["generation"] == 1
    assert run["status"]["observedGeneration"] == 1
    after = {key: writes(obj) for key, obj in children(api, namespace, name).items()}
    remade = {("StatefulSet", sts_name), ("Job", job_name)}
    assert {k: v for k, v in after.items() if k not in remade} == {
        k: v for k, v in before.items() if k not in remade
    }, "a child other than the two was written"
    # the pass a child's event started logs as kopf's do: its lines name the run
    marker = f"[{namespace}/{name}] applied"
    eventually(
        "the second pass's log line", lambda: operator.log_tail(10_000).count(marker) >= 2 or None
    )


def test_operator_restart_creates_no_duplicates(operator, api, namespace):
    body = load_example("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    create_run(api, namespace, body)
    held = reconciled(api, namespace, name)
    before = {key: writes(obj) for key, obj in children(api, namespace, name).items()}
    marker = f"[{namespace}/{name}] applied"
    # logged after the status the wait above reads is written
    eventually("the first pass's log line", lambda: marker in operator.log_tail(10_000) or None)
    assert operator.log_tail(10_000).count(marker) == 1
    operator.stop()
    operator.start()
    # the resume handler reconciles every run: wait until it has handled this run again
    eventually("the resume handler", lambda: operator.log_tail(10_000).count(marker) == 2 or None)
    after = {key: writes(obj) for key, obj in children(api, namespace, name).items()}
    # the same objects (no duplicate, none re-created), and the operator wrote none of them again:
    # server-side apply of an unchanged manifest is a no-op, and workloads whose inputs did not
    # change are not applied at all
    assert after == before
    # nor the run: a pass that changes nothing writes no status (writing.write_status)
    again = get_run(api, namespace, name)
    assert again["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
    assert again["status"] == held["status"]
    assert "Traceback" not in operator.log_tail(200)


def test_a_status_write_over_a_run_deleted_meanwhile_is_no_error(
    kube_cluster, crd, api, namespace, monkeypatch
):
    """A pass that reads a run, then finds it gone when it writes the status (its namespace
    being deleted, as a restart's resume meets the runs of namespaces on their way out): nothing
    to write, no event, the run's series forgotten, and no error (which kopf would log with a
    traceback and retry for a run that is no more)."""
    import asyncio

    import kopf

    from payloadrun_operator.observed import writing
    from payloadrun_operator.observed.status import StatusUpdate
    from payloadrun_operator.platform.kube import KubeClient
    from payloadrun_operator.platform.metrics import OperatorMetrics
    from payloadrun_operator.platform.runtime import Operator
    from payloadrun_operator.platform.settings import OperatorSettings

    body = load_example("singlenode-inline.yaml")
    name = body["metadata"]["name"]
    read = create_run(api, namespace, body)  # as a pass read it
    api["custom"].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    update = StatusUpdate({"phase": "Pending"}, [("Normal", "Applied", "every child was applied")])

    async def write() -> tuple[writing.Write, Any]:
        client = KubeClient()
        client.login(kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
        metrics = OperatorMetrics()
        op = Operator(OperatorSettings(sidecar_image="payloadrun:test"), client, metrics)
        try:
            written = await writing.write_status(op, read, update, "2026-12-05T01:00:00Z")
        finally:
            await client.close()
        return written, metrics.registry.get_sample_value(
            "payloadrun_operator_runs", {"phase": update.phase, "mode": "Unknown"}
        )

    written, series = asyncio.run(write())
    assert written is writing.Write.GONE
    assert series == 0  # observed, then forgotten with the run
    assert run_events(api, namespace, name) == []


def test_delete_collects_children_and_keeps_a_retained_claim(operator, api, namespace):
    body = load_example("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    body["spec"]["payloads"]["volume"]["deletionPolicy"] = "Retain"
    create_run(api, namespace, body)
    reconciled(api, namespace, name)
    claim = api["core"].read_namespaced_persistent_volume_claim(f"{name}-payloads", namespace)
    assert not claim.metadata.owner_references

    api["custom"].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def only_claim_left():
        left = children(api, namespace, name)
        return set(left) == {("PersistentVolumeClaim", f"{name}-payloads")} and left

    eventually("garbage collection of every child but the retained claim", only_claim_left, 60)

    # the same run returns and adopts the claim by name
    create_run(api, namespace, copy.deepcopy(body))
    run = reconciled(api, namespace, name)
    assert run["status"]["claimName"] == f"{name}-payloads"
    again = api["core"].read_namespaced_persistent_volume_claim(f"{name}-payloads", namespace)
    assert again.metadata.uid == claim.metadata.uid


def test_deleting_a_run_collects_its_managed_claim(operator, api, namespace):
    body = load_example("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    create_run(api, namespace, body)
    reconciled(api, namespace, name)
    api["custom"].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    eventually("every child collected", lambda: not children(api, namespace, name) or None, 60)


def test_operator_rejects_what_cel_would_on_a_cluster_without_cel(
    kube_cluster, operator, api, namespace
):
    crd = build_crd()
    no_cel = json.loads(json.dumps(crd).replace('"x-kubernetes-validations"', '"x-dropped"'))

    # structural schemas prune unknown keys: drop the renamed ones for a valid CRD
    def strip(node):
        if isinstance(node, dict):
            node.pop("x-dropped", None)
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    strip(no_cel)
    install_crd(kube_cluster, no_cel)
    try:
        body = load_example("disaggregated-root-rejected.yaml")
        create_run(api, namespace, body)  # accepted: no CEL now
        run = reconciled(api, namespace, body["metadata"]["name"])
        assert run["status"]["phase"] == "Rejected"
        validated = condition_of(run, "Validated")
        assert (validated["status"], validated["reason"]) == ("False", "InvalidSpec")
        assert CEL_MESSAGE in validated["message"]
        ready = condition_of(run, "Ready")  # Ready speaks of the accepted spec: there is none
        assert (ready["status"], ready["reason"]) == ("False", "SpecRejected")
        assert children(api, namespace, body["metadata"]["name"]) == {}

        def warning():
            items = api["core"].list_namespaced_event(namespace).items
            return any(e.type == "Warning" and e.reason == "InvalidSpec" for e in items)

        eventually("a warning event", lambda: warning() or None)
    finally:
        install_crd(kube_cluster, crd)


def test_fifty_runs_at_once_all_reconcile(operator, api, namespace):
    body = load_example("multinode-by-handle.yaml")
    names = [f"run-{i:02d}" for i in range(50)]
    for name in names:
        run = copy.deepcopy(body)
        run["metadata"]["name"] = name
        create_run(api, namespace, run)

    def all_reconciled():
        items = api["custom"].list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)[
            "items"
        ]
        done = [i for i in items if (i.get("status") or {}).get("observedGeneration") == 1]
        return len(done) == 50 and done

    done = eventually("50 runs reconciled", all_reconciled, timeout=120)
    assert {r["status"]["payloadMode"] for r in done} == {"ByHandle"}
    statefulsets = api["apps"].list_namespaced_stateful_set(namespace).items
    jobs = api["batch"].list_namespaced_job(namespace).items
    # inference, orchestrator and trainer per run, no duplicates
    assert (len(statefulsets), len(jobs)) == (50, 100)


def test_operator_metrics(operator, api, namespace):
    import urllib.request

    body = load_example("singlenode-inline.yaml")
    create_run(api, namespace, body)
    reconciled(api, namespace, body["metadata"]["name"])
    text = urllib.request.urlopen(operator.metrics_url, timeout=5).read().decode()
    assert 'payloadrun_operator_reconciles_total{result="applied"}' in text
    assert 'payloadrun_operator_runs{mode="Inline",phase="Provisioning"}' in text
    # what every component exports (docs/metrics.md, "Every component")
    assert 'payloadrun_build_info{component="operator",' in text
    assert "\nprocess_resident_memory_bytes " in text and "\nprocess_open_fds " in text
    assert "_created" not in text


def test_runs_carry_no_finalizer_and_delete_without_the_operator(operator, api, namespace):
    body = load_example("singlenode-inline.yaml")
    name = body["metadata"]["name"]
    create_run(api, namespace, body)
    reconciled(api, namespace, name)

    def passed() -> Any:
        """A status pass of this run is done (it wrote VolumeReady, which the reconcile does
        not), and no other is pending."""
        run = get_run(api, namespace, name)
        kinds = {c["type"] for c in run["status"].get("conditions", [])}
        return "VolumeReady" in kinds and status_caught_up(operator.metrics_url, 1) and run

    run = eventually("a status pass of the run", passed)
    assert not run["metadata"].get("finalizers")
    operator.stop()
    try:
        api["custom"].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

        def gone():
            try:
                get_run(api, namespace, name)
            except ApiException as exc:
                return exc.status == 404
            return None

        eventually("the run deleted with no operator running", gone, 30)
    finally:
        operator.start()


def test_json_logs_name_the_run_they_are_about(operator, api, namespace, tmp_path):
    """With PAYLOADRUN_LOG_FORMAT=json every line the operator writes is one JSON object in the
    sidecars' shape, and kopf's per-object lines carry the run as ``object``."""
    body = load_example("singlenode-inline.yaml")
    name = body["metadata"]["name"]
    log = tmp_path / "operator.json.log"
    operator.stop()  # one operator at a time reconciles this namespace
    try:
        json_op = LocalOperator(
            operator.kubeconfig,
            namespaces=(namespace,),
            env={"PAYLOADRUN_LOG_FORMAT": "json"},
            log_path=log,
        )
        with json_op:
            create_run(api, namespace, body)
            reconciled(api, namespace, name)
    finally:
        operator.start()
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert entries
    for entry in entries:
        assert entry.keys() >= {"timestamp", "severity", "logger", "message"}, entry
    about_run = [e for e in entries if e.get("object", {}).get("name") == name]
    assert about_run, entries
    assert about_run[0]["object"]["namespace"] == namespace
    assert about_run[0]["object"]["kind"] == "PayloadRun"
    assert any(e["message"].startswith("applied ") for e in about_run), about_run


def test_a_kubeconfig_with_an_exec_credential_plugin(operator, api, namespace, tmp_path):
    """EKS, GKE and AKS kubeconfigs get their credentials from a plugin; the operator runs it
    without a client library (as in its image). This plugin hands out the admin certificate."""
    admin = yaml.safe_load(Path(operator.kubeconfig).read_text())
    (user,) = admin["users"]
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {
            "clientCertificateData": base64.b64decode(
                user["user"]["client-certificate-data"]
            ).decode(),
            "clientKeyData": base64.b64decode(user["user"]["client-key-data"]).decode(),
        },
    }
    plugin = tmp_path / "credential-plugin"
    ran = tmp_path / "plugin-ran"
    plugin.write_text(f"#!/bin/sh\ntouch {ran}\ncat <<'EOF'\n{json.dumps(credential)}\nEOF\n")
    plugin.chmod(0o755)
    user["user"] = {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}
    }
    kubeconfig = tmp_path / "exec.kubeconfig"
    kubeconfig.write_text(json.dumps(admin))
    body = load_example("singlenode-inline.yaml")
    operator.stop()  # one operator at a time reconciles this namespace
    try:
        with LocalOperator(
            kubeconfig, namespaces=(namespace,), log_path=tmp_path / "operator.log"
        ) as exec_op:
            create_run(api, namespace, body)
            run = reconciled(api, namespace, body["metadata"]["name"])
            assert "401" not in exec_op.log_tail(400), exec_op.log_tail()
    finally:
        operator.start()
    assert run["status"]["phase"] == "Provisioning" and ran.exists()


# --- a refused child reported ------------------------------------------


def test_a_refused_child_is_in_the_conditions_and_events_until_applied(api, operator, namespace):
    """A ResourceQuota that forbids Services: the run says which child, and why, at once."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-services"},
        "spec": {"hard": {"services": "0"}},
    }
    api["core"].create_namespaced_resource_quota(namespace, quota)
    eventually(
        "the quota's usage counted",
        lambda: api["core"].read_namespaced_resource_quota("no-services", namespace).status.hard,
    )
    run = load_example("multinode-by-handle.yaml")
    create_run(api, namespace, run)
    name = run["metadata"]["name"]

    def applied() -> dict[str, Any] | None:
        conditions = (get_run(api, namespace, name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Applied"), None)

    refused = eventually("Applied=False", lambda: (c := applied()) and c["status"] == "False" and c)
    assert refused["reason"] == "ApplyFailed"
    assert f"Service {namespace}/{name}-" in refused["message"]
    assert "HTTP 403 Forbidden" in refused["message"] and "exceeded quota" in refused["message"]
    status = get_run(api, namespace, name)["status"]
    assert "observedGeneration" not in status  # nothing claims the spec was applied
    assert condition_of(get_run(api, namespace, name), "Ready")["reason"] == "ApplyFailed"

    def warning() -> Any:
        events = api["core"].list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name},type=Warning"
        )
        return [e for e in events.items if e.reason == "ApplyFailed"]

    (event,) = eventually("a Warning event", warning)
    assert "exceeded quota" in event.message

    api["core"].delete_namespaced_resource_quota("no-services", namespace)
    cleared = eventually("Applied=True", lambda: (c := applied()) and c["status"] == "True" and c)
    assert cleared["reason"] == "ChildrenApplied"
    assert reconciled(api, namespace, name)["status"]["observedGeneration"] == 1
