"""``render`` of examples/prime-rl-moe-multinode.yaml, field by field: prime-rl's SLURM layout of
multi-node MoE replicas (two replicas of two nodes, two API servers a node) as the operator builds
it, run as users run the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_render import documents, render

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "prime-rl-moe-multinode.yaml"
RUN = "glm-moe-grpo"
LWS = f"{RUN}-vllm"
NAMESPACE = "default"


@pytest.fixture(scope="module")
def children() -> dict[tuple[str, str], dict]:
    result = render("-f", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    return {(c["kind"], c["metadata"]["name"]): c for c in documents(result.stdout)}


def containers(pod: dict) -> dict[str, dict]:
    spec = pod["spec"]
    return {c["name"]: c for c in spec["containers"] + spec.get("initContainers", [])}


def env(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_replicas_are_a_leader_worker_set_of_two_groups_of_two(children):
    workloads = sorted(k for k in children if k[0] in ("StatefulSet", "LeaderWorkerSet", "Job"))
    assert workloads == [
        ("Job", f"{RUN}-orchestrator"),
        ("Job", f"{RUN}-trainer"),
        ("LeaderWorkerSet", LWS),
    ]
    spec = children["LeaderWorkerSet", LWS]["spec"]
    assert spec["replicas"] == 2
    assert spec["startupPolicy"] == "LeaderCreated"
    group = spec["leaderWorkerTemplate"]
    assert group["size"] == 2
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    # no headless Service of the operator's for the groups: LWS's own, named after it
    assert ("Service", f"{RUN}-inference-headless") not in children
    assert ("Service", LWS) not in children


@pytest.mark.parametrize("template", ["leaderTemplate", "workerTemplate"])
def test_every_pod_runs_two_api_servers_behind_one_writer_and_learns_its_group(children, template):
    pod = children["LeaderWorkerSet", LWS]["spec"]["leaderWorkerTemplate"][template]
    parts = containers(pod)
    vllm, writer = parts["vllm"], parts["payload-writer"]
    assert [(p["name"], p["containerPort"]) for p in vllm["ports"]] == [
        ("http", 8100),
        ("http-1", 8101),
    ]
    assert (
        env(writer)["PAYLOADRUN_WRITER_UPSTREAM"] == "http://127.0.0.1:8100,http://127.0.0.1:8101"
    )
    assert env(writer)["PAYLOAD_ROOT"] == "/data/outputs/payloads"
    group = env(vllm)
    assert group["PAYLOADRUN_INFERENCE_HEAD_ADDRESS"] == "$(LWS_LEADER_ADDRESS)"
    assert group["PAYLOADRUN_INFERENCE_DP_SIZE"] == "4"
    assert group["PAYLOADRUN_INFERENCE_API_SERVERS_PER_POD"] == "2"
    assert group["PAYLOADRUN_INFERENCE_DP_RPC_PORT"] == "13345"  # prime-rl 559b447's default
    assert group["PAYLOADRUN_INFERENCE_POD_INDEX"] == {
        "fieldRef": {"fieldPath": "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']"}
    }
    assert group["PAYLOADRUN_INFERENCE_REPLICA_INDEX"] == {
        "fieldRef": {"fieldPath": "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']"}
    }
    # two API servers a pod: the first rank needs a product, which the command computes
    assert "PAYLOADRUN_INFERENCE_DP_START_RANK" not in group
    assert pod["spec"]["subdomain"] == LWS
    mounts = {m["mountPath"] for m in vllm["volumeMounts"]}
    assert {"/data", "/dev/shm", "/config"} <= mounts


def test_the_orchestrator_calls_every_api_server_and_learns_the_world_size(children):
    orchestrator = containers(children["Job", f"{RUN}-orchestrator"]["spec"]["template"])
    values = env(orchestrator["orchestrator"])
    expected = [  # LWS's names: <lws>-<group> leaders, <lws>-<group>-<w> workers
        f"http://{host}.{LWS}.{NAMESPACE}.svc:{port}/v1"
        for i in range(2)
        for host in (f"{LWS}-{i}", f"{LWS}-{i}-1")
        for port in (8100, 8101)
    ]
    assert values["PAYLOADRUN_INFERENCE_ADMIN_URLS"].split(" ") == expected
    # 8 API servers x 4 GPUs each (8 GPUs a pod over its 2 API servers)
    assert values["PAYLOADRUN_INFERENCE_WORLD_SIZE"] == "32"
    assert values["PAYLOADRUN_INFERENCE_URL"] == f"http://{RUN}-inference.{NAMESPACE}.svc:8001"
    trainer = containers(children["Job", f"{RUN}-trainer"]["spec"]["template"])
    assert env(trainer["trainer"])["PAYLOADRUN_INFERENCE_WORLD_SIZE"] == "32"


def test_the_service_reaches_every_pods_writer(children):
    service = children["Service", f"{RUN}-inference"]["spec"]
    # every pod of every group (no worker-index: in EveryPod the workers serve too)
    assert service["selector"] == {
        "payloadrun.dev/run": RUN,
        "app.kubernetes.io/component": "inference",
    }
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["ports"]] == [
        ("http", 8001, 8001),  # the writer's port, by handle
        ("writer-metrics", 9401, 9401),
    ]
