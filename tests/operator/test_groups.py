"""Inference replicas that span pods: a LeaderWorkerSet of groups, field by field, in both layouts
of API servers (every pod, or the leader only), with several API servers per pod; and the rules
that keep a run of one-pod, one-server replicas exactly as it was."""

from __future__ import annotations

import copy

import pytest

from builders import (
    OWNER,
    by_kind,
    children_of,
    container,
    context,
    env_of,
    group_spec,
    group_templates,
    run_spec,
)
from payloadrun_operator.desired import networkpolicy
from payloadrun_operator.desired.builders import build_children, build_run, workload_of
from payloadrun_operator.desired.shape import InferenceShape, port_errors

LWS_LABELS = {
    "app.kubernetes.io/name": "payloadrun",
    "app.kubernetes.io/instance": "run1",
    "app.kubernetes.io/component": "inference",
    "app.kubernetes.io/managed-by": "payloadrun-operator",
    "payloadrun.dev/run": "run1",
}
WORKER_INDEX = "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']"
GROUP_INDEX = "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']"


def hosts_of(urls: str) -> list[str]:
    return urls.split(" ")


# --- the LeaderWorkerSet -------------------------------------------------------------------------


def test_a_replica_of_two_pods_is_a_leader_worker_set_not_a_stateful_set():
    children = children_of(group_spec())
    assert sorted(k for k in children if k[0] in ("StatefulSet", "LeaderWorkerSet", "Service")) == [
        ("LeaderWorkerSet", "run1-vllm"),
        ("Service", "run1-inference"),
        ("Service", "run1-orchestrator-headless"),
        ("Service", "run1-trainer-headless"),
    ]
    lws = children[("LeaderWorkerSet", "run1-vllm")]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    meta = lws["metadata"]
    assert meta["namespace"] == "ml"
    assert meta["labels"] == LWS_LABELS
    assert meta["ownerReferences"] == [OWNER]
    assert list(meta["annotations"]) == ["payloadrun.dev/inputs"]
    spec = lws["spec"]
    assert {k: v for k, v in spec.items() if k != "leaderWorkerTemplate"} == {
        "replicas": 2,
        "startupPolicy": "LeaderCreated",
        "networkConfig": {"subdomainPolicy": "Shared"},
    }
    templates = spec["leaderWorkerTemplate"]
    assert sorted(templates) == ["leaderTemplate", "restartPolicy", "size", "workerTemplate"]
    assert templates["size"] == 2
    assert templates["restartPolicy"] == "RecreateGroupOnPodRestart"


def test_built_run_names_the_leader_worker_set_as_the_inference_workload():
    built = build_run(context(group_spec()))
    assert workload_of(built.ctx, "inference") == ("LeaderWorkerSet", "run1-vllm")
    assert built.workload("inference")["kind"] == "LeaderWorkerSet"
    templates = built.workload("inference")["spec"]["leaderWorkerTemplate"]
    assert templates["leaderTemplate"] is built.pods["inference"]
    assert templates["workerTemplate"] is built.pods["inference-worker"]
    assert workload_of(context(run_spec()), "inference") == ("StatefulSet", "run1-inference")


def test_a_suspended_group_run_has_no_groups():
    lws = children_of(group_spec(), active=False)[("LeaderWorkerSet", "run1-vllm")]
    assert lws["spec"]["replicas"] == 0


@pytest.mark.parametrize("which", ["leader", "worker"])
def test_every_pod_serves_two_api_servers_behind_one_writer(which):
    leader, worker = group_templates(group_spec())
    pod = {"leader": leader, "worker": worker}[which]
    assert pod["metadata"] == {"labels": LWS_LABELS}
    spec = pod["spec"]
    assert spec["subdomain"] == "run1-vllm"
    assert spec["restartPolicy"] == "Always"
    assert spec["securityContext"] == {"fsGroup": 65532, "fsGroupChangePolicy": "OnRootMismatch"}
    assert spec["volumes"] == [
        {"name": "payloads", "persistentVolumeClaim": {"claimName": "run1-payloads"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    vllm = container(spec, "vllm")
    assert vllm["ports"] == [
        {"name": "http", "containerPort": 8100},
        {"name": "http-1", "containerPort": 8101},
    ]
    assert vllm["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert vllm["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    (writer,) = spec["initContainers"]
    assert writer["name"] == "payload-writer"
    writer_env = env_of(writer)
    assert writer_env["PAYLOADRUN_WRITER_UPSTREAM"] == "http://127.0.0.1:8100,http://127.0.0.1:8101"
    assert writer_env["PAYLOADRUN_WRITER_PORT"] == "8001"
    assert writer["volumeMounts"] == [
        {"name": "payloads", "mountPath": "/payloads", "readOnly": False}
    ]


@pytest.mark.parametrize("which", ["leader", "worker"])
def test_every_pod_learns_its_group_after_lws_own_variables(which):
    leader, worker = group_templates(group_spec(dataParallelRpcPort=29600))
    vllm = container({"leader": leader, "worker": worker}[which]["spec"], "vllm")
    env = vllm["env"]
    assert [e["name"] for e in env] == [
        "PAYLOADRUN_RUN",
        "PAYLOADRUN_RUN_ID",
        "PAYLOADRUN_PAYLOAD_MODE",
        "PAYLOADRUN_ORCHESTRATOR_HOST",
        "PAYLOADRUN_INFERENCE_REPLICA_INDEX",
        "PAYLOADRUN_INFERENCE_POD_INDEX",
        "PAYLOADRUN_INFERENCE_HEAD_ADDRESS",
        "PAYLOADRUN_INFERENCE_DP_SIZE",
        "PAYLOADRUN_INFERENCE_API_SERVERS_PER_POD",
        "PAYLOADRUN_INFERENCE_DP_RPC_PORT",
    ]
    values = env_of(vllm)
    assert values["PAYLOADRUN_INFERENCE_REPLICA_INDEX"] == {"fieldRef": {"fieldPath": GROUP_INDEX}}
    assert values["PAYLOADRUN_INFERENCE_POD_INDEX"] == {"fieldRef": {"fieldPath": WORKER_INDEX}}
    # LWS's pod webhook puts LWS_LEADER_ADDRESS first in every container's env (pod_utils.go,
    # addEnvVarsIfNotExists), so this reference resolves
    assert values["PAYLOADRUN_INFERENCE_HEAD_ADDRESS"] == "$(LWS_LEADER_ADDRESS)"
    assert values["PAYLOADRUN_INFERENCE_DP_SIZE"] == "4"  # 2 pods x 2 API servers
    assert values["PAYLOADRUN_INFERENCE_API_SERVERS_PER_POD"] == "2"
    assert values["PAYLOADRUN_INFERENCE_DP_RPC_PORT"] == "29600"
    # pod x 2 needs arithmetic: not given rather than given wrong
    assert "PAYLOADRUN_INFERENCE_DP_START_RANK" not in values


def test_with_one_api_server_a_pod_its_first_dp_rank_is_its_index():
    leader, worker = group_templates(group_spec(apiServersPerPod=1))
    for pod in (leader, worker):
        values = env_of(container(pod["spec"], "vllm"))
        assert values["PAYLOADRUN_INFERENCE_DP_START_RANK"] == {
            "fieldRef": {"fieldPath": WORKER_INDEX}
        }
        assert values["PAYLOADRUN_INFERENCE_DP_SIZE"] == "2"
        assert values["PAYLOADRUN_INFERENCE_DP_RPC_PORT"] == "29550"  # vLLM's default


def test_the_admin_urls_name_every_api_server_in_order_and_follow_replicas():
    children = children_of(group_spec())
    job = children[("Job", "run1-orchestrator")]
    env = env_of(container(job["spec"]["template"], "orchestrator"))
    assert hosts_of(env["PAYLOADRUN_INFERENCE_ADMIN_URLS"]) == [
        "http://run1-vllm-0.run1-vllm.ml.svc:8100/v1",
        "http://run1-vllm-0.run1-vllm.ml.svc:8101/v1",
        "http://run1-vllm-0-1.run1-vllm.ml.svc:8100/v1",
        "http://run1-vllm-0-1.run1-vllm.ml.svc:8101/v1",
        "http://run1-vllm-1.run1-vllm.ml.svc:8100/v1",
        "http://run1-vllm-1.run1-vllm.ml.svc:8101/v1",
        "http://run1-vllm-1-1.run1-vllm.ml.svc:8100/v1",
        "http://run1-vllm-1-1.run1-vllm.ml.svc:8101/v1",
    ]
    settings = children[("ConfigMap", "run1-settings")]["data"]
    assert settings["inferenceAdminUrls"] == env["PAYLOADRUN_INFERENCE_ADMIN_URLS"]
    three = children_of(group_spec(replicas=3))[("Job", "run1-orchestrator")]
    urls = hosts_of(
        env_of(container(three["spec"]["template"], "orchestrator"))[
            "PAYLOADRUN_INFERENCE_ADMIN_URLS"
        ]
    )
    assert len(urls) == 12 and urls[-1] == "http://run1-vllm-2-1.run1-vllm.ml.svc:8101/v1"


def test_the_orchestrator_and_the_trainers_learn_the_inference_world_size():
    children = children_of(group_spec())
    for job, name in (("run1-orchestrator", "orchestrator"), ("run1-trainer", "trainer")):
        pod = children[("Job", job)]["spec"]["template"]
        # 2 replicas x 2 pods x 8 GPUs: 8 API servers of 4 GPUs each
        assert env_of(container(pod, name))["PAYLOADRUN_INFERENCE_WORLD_SIZE"] == "32"
    assert children[("ConfigMap", "run1-settings")]["data"]["inferenceWorldSize"] == "32"


def test_the_world_size_counts_each_templates_gpus_and_nothing_else():
    spec = group_spec(resources=None)
    spec["inference"].pop("resources")
    gpus = {"limits": {"nvidia.com/gpu": "4", "amd.com/gpu": 8}}
    spec["inference"]["template"] = {"spec": {"containers": [{"name": "vllm", "resources": gpus}]}}
    spec["inference"]["workerTemplate"] = {
        "spec": {
            "containers": [
                {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": 2}}},
                {
                    "name": "helper",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                },
            ]
        }
    }
    pod = children_of(spec)[("Job", "run1-trainer")]["spec"]["template"]
    # 2 replicas x (leader 4 + 1 worker x 2): another vendor's GPUs and other containers' not
    assert env_of(container(pod, "trainer"))["PAYLOADRUN_INFERENCE_WORLD_SIZE"] == "12"
    spec["inference"]["template"] = spec["inference"]["workerTemplate"] = None
    pod = children_of(spec)[("Job", "run1-trainer")]["spec"]["template"]
    assert "PAYLOADRUN_INFERENCE_WORLD_SIZE" not in env_of(container(pod, "trainer"))


def test_the_load_balanced_service_reaches_every_pod_and_lws_names_them():
    children = children_of(group_spec())
    service = children[("Service", "run1-inference")]
    assert service["spec"]["selector"] == {
        "payloadrun.dev/run": "run1",
        "app.kubernetes.io/component": "inference",
    }
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [8001, 9401]
    # no headless Service of the operator's: LWS's own, run1-vllm, is the pods' subdomain
    assert ("Service", "run1-inference-headless") not in children
    assert ("Service", "run1-vllm") not in children


# --- the Leader layout ---------------------------------------------------------------------------


def test_in_the_leader_layout_only_leaders_serve_and_have_a_writer():
    spec = group_spec(apiServers="Leader", podsPerReplica=3)
    children = children_of(spec)
    leader, worker = group_templates(spec)
    assert [c["name"] for c in leader["spec"]["initContainers"]] == ["payload-writer"]
    assert "initContainers" not in worker["spec"]
    assert [v["name"] for v in worker["spec"]["volumes"]] == ["dshm"]  # no payload volume
    assert "ports" not in container(worker["spec"], "vllm")
    assert [p["containerPort"] for p in container(leader["spec"], "vllm")["ports"]] == [8100, 8101]
    service = children[("Service", "run1-inference")]
    assert service["spec"]["selector"] == {
        "payloadrun.dev/run": "run1",
        "app.kubernetes.io/component": "inference",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    orchestrator = children[("Job", "run1-orchestrator")]["spec"]["template"]
    assert hosts_of(
        env_of(container(orchestrator, "orchestrator"))["PAYLOADRUN_INFERENCE_ADMIN_URLS"]
    ) == [
        "http://run1-vllm-0.run1-vllm.ml.svc:8100/v1",
        "http://run1-vllm-0.run1-vllm.ml.svc:8101/v1",
        "http://run1-vllm-1.run1-vllm.ml.svc:8100/v1",
        "http://run1-vllm-1.run1-vllm.ml.svc:8101/v1",
    ]
    # 2 replicas x 3 pods x 8 GPUs: 4 API servers of 12 GPUs each
    assert (
        env_of(container(orchestrator, "orchestrator"))["PAYLOADRUN_INFERENCE_WORLD_SIZE"] == "48"
    )
    lead = env_of(container(leader["spec"], "vllm"))
    assert lead["PAYLOADRUN_INFERENCE_DP_SIZE"] == "2"
    assert lead["PAYLOADRUN_INFERENCE_DP_START_RANK"] == "0"
    assert lead["PAYLOADRUN_INFERENCE_API_SERVERS_PER_POD"] == "2"
    work = env_of(container(worker["spec"], "vllm"))
    assert work["PAYLOADRUN_INFERENCE_DP_SIZE"] == "2"
    assert work["PAYLOADRUN_INFERENCE_HEAD_ADDRESS"] == "$(LWS_LEADER_ADDRESS)"
    assert "PAYLOADRUN_INFERENCE_DP_START_RANK" not in work
    assert "PAYLOADRUN_INFERENCE_API_SERVERS_PER_POD" not in work


def test_in_the_leader_layout_workers_still_mount_a_run_directory_on_the_payload_volume():
    spec = group_spec(apiServers="Leader")
    spec["runDirectory"] = {"mountPath": "/data"}
    _, worker = group_templates(spec)
    assert [v["name"] for v in worker["spec"]["volumes"]] == ["payloads", "dshm"]
    assert {"name": "payloads", "mountPath": "/data"} in container(worker["spec"], "vllm")[
        "volumeMounts"
    ]


@pytest.mark.parametrize("mode", ["Inline", "ByHandle"])
def test_inline_there_is_no_writer_and_the_service_targets_vllm(mode):
    spec = group_spec()
    spec["payloads"] = {"mode": mode}
    children = children_of(spec)
    leader, worker = group_templates(spec)
    for pod in (leader, worker):
        assert ("initContainers" in pod["spec"]) == (mode == "ByHandle")
    ports = children[("Service", "run1-inference")]["spec"]["ports"]
    assert ports[0]["targetPort"] == (8100 if mode == "Inline" else 8001)


# --- templates -----------------------------------------------------------------------------------


def test_the_worker_template_defaults_to_the_leaders_and_may_differ():
    spec = group_spec()
    spec["inference"]["template"] = {
        "metadata": {"labels": {"team": "a"}},
        "spec": {"priorityClassName": "high"},
    }
    leader, worker = group_templates(spec)
    assert leader["spec"]["priorityClassName"] == worker["spec"]["priorityClassName"] == "high"
    assert worker["metadata"]["labels"]["team"] == "a"
    spec["inference"]["workerTemplate"] = {"spec": {"priorityClassName": "low"}}
    leader, worker = group_templates(spec)
    assert (leader["spec"]["priorityClassName"], worker["spec"]["priorityClassName"]) == (
        "high",
        "low",
    )
    assert "team" not in worker["metadata"]["labels"]
    assert worker["metadata"]["labels"] | LWS_LABELS == worker["metadata"]["labels"]


def test_the_network_rule_of_the_run_covers_every_pod_of_every_group():
    ctx = context(group_spec())
    children = by_kind(build_children(ctx))
    leader, worker = group_templates(group_spec())
    policy = children[("NetworkPolicy", "run1-inference")]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    trusted = networkpolicy.run_pods("run1")["podSelector"]["matchLabels"]
    assert policy["spec"]["ingress"][0] == networkpolicy.trust_rule("run1")
    for pod in (leader, worker):
        labels = pod["metadata"]["labels"]
        assert selected.items() <= labels.items()  # the policy applies to it
        assert trusted.items() <= labels.items()  # every pod of the run reaches it on any port


# --- collisions ----------------------------------------------------------------------------------


def errors_of(spec):
    return list(build_run(context(spec)).errors)


def test_the_writers_port_among_the_api_servers_ports_is_refused_with_the_fields():
    spec = group_spec(port=8000)  # 8000, 8001: the writer's default port is 8001
    assert errors_of(spec) == [
        "spec.inference.writer.port 8001 is one of the vLLM API servers' ports "
        "(spec.inference.port 8000 .. 8001, spec.inference.apiServersPerPod 2), in the same pod: "
        "give one of them another port"
    ]
    spec = group_spec(apiServersPerPod=8, port=9394)  # up to 9401, the writer's metrics
    assert errors_of(spec) == [
        "spec.inference.writer.metricsPort 9401 is one of the vLLM API servers' ports "
        "(spec.inference.port 9394 .. 9401, spec.inference.apiServersPerPod 8), in the same pod: "
        "give one of them another port"
    ]
    spec["payloads"] = {"mode": "Inline"}  # no writer, no collision
    assert errors_of(spec) == []


def test_one_server_per_pod_on_the_writers_port_is_refused_too():
    spec = run_spec()
    spec["inference"]["port"] = 8001
    assert errors_of(spec) == [
        "spec.inference.writer.port 8001 is spec.inference.port, vLLM's port, in the same pod: "
        "give one of them another port"
    ]


def test_the_rpc_port_among_the_ports_of_the_head_is_refused():
    assert errors_of(group_spec(dataParallelRpcPort=8101)) == [
        "spec.inference.dataParallelRpcPort 8101 is one of the vLLM API servers' ports "
        "(spec.inference.port 8100 .. 8101, spec.inference.apiServersPerPod 2) too, on the "
        "replica's head: choose another port"
    ]
    assert errors_of(group_spec(dataParallelRpcPort=9401)) == [
        "spec.inference.dataParallelRpcPort 9401 is spec.inference.writer.metricsPort too, on "
        "the replica's head: choose another port"
    ]


def test_ports_past_65535_are_refused():
    assert port_errors(InferenceShape(1, 2, "EveryPod", 8, 65530), {}, 29550) == [
        "spec.inference.port 65530 with spec.inference.apiServersPerPod 8 needs ports up to "
        "65537, past 65535: lower spec.inference.port"
    ]


def test_a_template_port_of_another_container_on_the_writers_port_is_refused_in_both():
    spec = group_spec()
    spec["inference"]["workerTemplate"] = {
        "spec": {
            "containers": [{"name": "proxy", "image": "p", "ports": [{"containerPort": 8001}]}]
        }
    }
    assert errors_of(spec) == [
        "spec.inference.workerTemplate.spec.containers[proxy].ports: container proxy declares "
        "port 8001, which the writer "
        "sidecar listens on in the same pod: use another port (or change the operator's in the "
        "spec)"
    ]


def api_server_port_clash(port: int, where: str, container_kind: str = "containers") -> str:
    return (
        f"{where}.spec.{container_kind}[proxy].ports: container proxy declares port {port}, the "
        f"port of {'http' if port == 8000 else f'http-{port - 8100}'} in the main container "
        "vllm of the same pod (one of the two could not bind it): use another port"
    )


@pytest.mark.parametrize("mode", ["ByHandle", "Inline"])
def test_another_container_on_an_api_servers_port_is_refused_in_a_one_pod_replica(mode):
    """Kubernetes only warns of a duplicate port; at run time that rank could not bind."""
    spec = run_spec()
    spec["payloads"] = {"mode": mode}
    spec["inference"]["template"] = {"spec": {"initContainers": [
        {"name": "proxy", "image": "p", "restartPolicy": "Always",
         "ports": [{"containerPort": 8000}]}]}}  # fmt: skip
    assert errors_of(spec) == [
        api_server_port_clash(8000, "spec.inference.template", "initContainers")
    ]


@pytest.mark.parametrize("mode", ["ByHandle", "Inline"])
@pytest.mark.parametrize("template", ["template", "workerTemplate"])
def test_another_container_on_an_api_servers_port_is_refused_in_a_group(mode, template):
    spec = group_spec()
    spec["payloads"] = {"mode": mode}
    spec["inference"][template] = {"spec": {"containers": [
        {"name": "proxy", "image": "p", "ports": [{"containerPort": 8101}]}]}}  # fmt: skip
    where = f"spec.inference.{template}"
    errors = errors_of(spec)
    # the template serves both pods of a group when it is the only one given
    assert set(errors) == {api_server_port_clash(8101, where)}, errors


def test_the_main_containers_own_api_server_ports_are_merged_not_refused():
    spec = group_spec()
    spec["inference"]["template"] = {"spec": {"containers": [
        {"name": "vllm", "ports": [{"containerPort": 8100, "name": "http-0"}]}]}}  # fmt: skip
    assert errors_of(spec) == []
    leader, _ = group_templates(spec)
    (vllm,) = [c for c in leader["spec"]["containers"] if c["name"] == "vllm"]
    assert [p["containerPort"] for p in vllm["ports"]] == [8100, 8101]


def test_another_container_on_torchruns_port_is_refused():
    spec = run_spec()
    spec["trainer"]["template"] = {"spec": {"containers": [
        {"name": "helper", "image": "x", "ports": [{"containerPort": 29500}]}]}}  # fmt: skip
    (error,) = errors_of(spec)
    assert error.startswith(
        "spec.trainer.template.spec.containers[helper].ports: container helper declares port "
        "29500, the port of dist in the main container trainer of the same pod"
    ), error


def test_lws_labels_and_variables_in_a_template_are_refused():
    spec = group_spec()
    spec["inference"]["template"] = {
        "metadata": {"labels": {"leaderworkerset.sigs.k8s.io/worker-index": "0"}},
        "spec": {
            "containers": [{"name": "vllm", "env": [{"name": "LWS_LEADER_ADDRESS", "value": "x"}]}]
        },
    }
    assert errors_of(spec) == [
        "spec.inference.template.metadata.labels sets leaderworkerset.sigs.k8s.io/worker-index, "
        "a label LeaderWorkerSet (the pods of run1-vllm) sets on its pods: remove it",
        "spec.inference.template: container vllm sets env LWS_LEADER_ADDRESS, which "
        "LeaderWorkerSet's pod webhook sets in every container, replacing yours: remove it",
    ]  # once each, though the workers use the same template


def test_the_operators_group_variables_in_a_template_are_refused():
    spec = group_spec()
    spec["inference"]["workerTemplate"] = {
        "spec": {
            "containers": [
                {"name": "vllm", "env": [{"name": "PAYLOADRUN_INFERENCE_POD_INDEX", "value": "1"}]}
            ]
        }
    }
    (error,) = errors_of(spec)
    assert error.startswith(
        "spec.inference sets env PAYLOADRUN_INFERENCE_POD_INDEX in the vllm container, which the "
        "operator sets itself"
    )


def test_a_worker_templates_fs_group_must_agree_with_the_others():
    spec = group_spec()
    spec["inference"]["template"] = {"spec": {"securityContext": {"fsGroup": 1000}}}
    spec["inference"]["workerTemplate"] = {"spec": {"securityContext": {"fsGroup": 2000}}}
    (error,) = errors_of(spec)
    assert error.startswith(
        "the pod templates set different securityContext.fsGroup values (spec.inference.template "
        "1000, spec.inference.workerTemplate 2000)"
    )


def test_a_worker_template_that_names_its_pods_is_refused_with_their_names():
    spec = group_spec()
    spec["inference"]["workerTemplate"] = {"spec": {"hostname": "w"}}
    assert errors_of(spec) == [
        "spec.inference.workerTemplate.spec.hostname is set, but the operator names the inference "
        "pods (their DNS names are <run>-vllm-<replica> and <run>-vllm-<replica>-<pod>): remove it"
    ]


# --- one pod, several API servers; one pod, one API server ---------------------------------------


def test_one_pod_with_two_api_servers_stays_a_stateful_set_with_every_server_listed():
    spec = run_spec()
    spec["inference"] |= {"apiServersPerPod": 2, "port": 8100}
    children = children_of(spec)
    pod = children[("StatefulSet", "run1-inference")]["spec"]["template"]["spec"]
    assert [p["containerPort"] for p in container(pod, "vllm")["ports"]] == [8100, 8101]
    upstream = env_of(pod["initContainers"][0])["PAYLOADRUN_WRITER_UPSTREAM"]
    assert upstream == "http://127.0.0.1:8100,http://127.0.0.1:8101"
    assert not any(n.startswith("PAYLOADRUN_INFERENCE_") for n in env_of(container(pod, "vllm")))
    orchestrator = children[("Job", "run1-orchestrator")]["spec"]["template"]
    assert hosts_of(
        env_of(container(orchestrator, "orchestrator"))["PAYLOADRUN_INFERENCE_ADMIN_URLS"]
    ) == [
        "http://run1-inference-0.run1-inference-headless.ml.svc:8100/v1",
        "http://run1-inference-0.run1-inference-headless.ml.svc:8101/v1",
        "http://run1-inference-1.run1-inference-headless.ml.svc:8100/v1",
        "http://run1-inference-1.run1-inference-headless.ml.svc:8101/v1",
    ]


def test_the_layout_fields_at_their_defaults_build_exactly_what_a_run_without_them_does():
    """A run created before these fields existed, and one that states their defaults, have the
    same children, byte for byte (their inputs' hashes leave the defaults out)."""
    before = run_spec()
    before["inference"]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    stated = copy.deepcopy(before)
    stated["inference"] |= {
        "podsPerReplica": 1,
        "apiServers": "EveryPod",
        "apiServersPerPod": 1,
        "dataParallelRpcPort": 29550,
    }
    assert build_children(context(stated)) == build_children(context(before))
    children = children_of(before)
    for job, name in (("run1-orchestrator", "orchestrator"), ("run1-trainer", "trainer")):
        env = env_of(container(children[("Job", job)]["spec"]["template"], name))
        assert "PAYLOADRUN_INFERENCE_WORLD_SIZE" not in env  # as before the field existed
    assert "inferenceWorldSize" not in children[("ConfigMap", "run1-settings")]["data"]


def test_a_change_of_the_inference_gpus_moves_the_inputs_of_those_told_the_world_size():
    """The orchestrator and the trainers are built again when the world size they are told
    changes; runs of one-server replicas are not told it, and their inputs stay."""
    eight, four = group_spec(), group_spec(resources={"limits": {"nvidia.com/gpu": 4}})
    for component in ("orchestrator", "trainer"):
        assert context(eight).inputs(component) != context(four).inputs(component)
    single_eight, single_four = run_spec(), run_spec()
    single_eight["inference"]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    single_four["inference"]["resources"] = {"limits": {"nvidia.com/gpu": 4}}
    for component in ("orchestrator", "trainer"):
        assert context(single_eight).inputs(component) == context(single_four).inputs(component)
