"""A real run, declared: pod templates, every replica addressable, trainers that rendezvous, a
shared run directory, with real pods on the local node.

The pods run the project's image: the fake vLLM (with prime-rl's admin routes) behind the writer
sidecar, and ``payloadrun.testing.roles`` for prime-rl's orchestrator (answers on its declared
port; fans a weight update out to every replica) and trainers (rendezvous at
``MASTER_ADDR:MASTER_PORT``, reach the orchestrator by its DNS name, fail on request).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from pod_helpers import (
    FAKE_VLLM,
    IMAGE,
    SLEEP,
    apply,
    find,
    get,
    kubectl,
    live_pods,
    node_run,
    running,
    wait_for,
    wait_for_phase,
)

pytestmark = [pytest.mark.integration, pytest.mark.pod_security("restricted")]

ROLES = ["python", "-m", "payloadrun.testing.roles"]
ZMQ_PORT = 5555


def pods_of(cluster, namespace: str, run: str, component: str) -> list[dict[str, Any]]:
    selector = f"payloadrun.dev/run={run},app.kubernetes.io/component={component}"
    items = get(cluster, namespace, "pods", "-l", selector)["items"]
    return sorted(
        (p for p in items if p["status"].get("phase") in ("Pending", "Running")),
        key=lambda p: p["metadata"]["name"],
    )


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return found


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def sh(cluster, namespace: str, pod: str, c: str, script: str) -> str:
    return kubectl(cluster, namespace, "exec", pod, "-c", c, "--", "sh", "-c", script)


# --- every field of a template reaches the pods ------------------------------------------------


@pytest.fixture
def priority_class(node_cluster):
    name = f"rl-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": 1000,
    }
    created = node_cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    assert created.returncode == 0, created.stderr
    yield name
    node_cluster.kubectl("delete", "priorityclass", name)


def test_a_templated_run_reaches_its_pods_with_the_operators_parts(
    operator, namespace, priority_class
):
    cluster = operator.cluster
    (node,) = get(cluster, namespace, "nodes")["items"]
    host = {"kubernetes.io/hostname": node["metadata"]["labels"]["kubernetes.io/hostname"]}
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "rl-configs"},
            "data": {"orch.toml": "max_steps = 20\n"},
        },
    )
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "team-data"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "standard",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )

    def template(main: str, command: list[str], probe: dict[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {"labels": {"team": "rl"}, "annotations": {"owner": "rl-infra"}},
            "spec": {
                "nodeSelector": host,
                "priorityClassName": priority_class,
                "containers": [
                    {
                        "name": main,
                        "image": IMAGE,
                        "command": command,
                        "readinessProbe": probe,
                        "volumeMounts": [
                            {"name": "data", "mountPath": "/data"},
                            {"name": "configs", "mountPath": "/config"},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "team-data"}},
                    {"name": "configs", "configMap": {"name": "rl-configs"}},
                ],
            },
        }

    exec_probe = {"exec": {"command": ["test", "-d", "/data"]}, "periodSeconds": 2}
    http_probe = {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 2}
    apply(
        cluster,
        namespace,
        node_run(
            "fields",
            inference={"template": template("vllm", FAKE_VLLM, http_probe)},
            orchestrator={"template": template("orchestrator", SLEEP, exec_probe)},
            trainer={"template": template("trainer", SLEEP, exec_probe)},
        ),
    )
    running(cluster, namespace, "fields")
    for component, main in (
        ("inference", "vllm"),
        ("orchestrator", "orchestrator"),
        ("trainer", "trainer"),
    ):
        (pod,) = pods_of(cluster, namespace, "fields", component)
        spec = pod["spec"]
        # every field of the template, as the API server has the pod
        assert pod["metadata"]["labels"]["team"] == "rl"
        assert pod["metadata"]["annotations"]["owner"] == "rl-infra"
        assert spec["nodeSelector"] == host
        assert spec["priorityClassName"] == priority_class and spec["priority"] == 1000
        c = container(pod, main)
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts["/data"]["name"] == "data" and not mounts["/data"].get("readOnly")
        assert mounts["/config"]["name"] == "configs"
        assert "readinessProbe" in c
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "team-data"
        # and the operator's parts beside them
        assert pod["metadata"]["labels"]["payloadrun.dev/run"] == "fields"
        assert env_of(c)["PAYLOADRUN_RUN"] == "fields"
        assert volumes["payloads"]["persistentVolumeClaim"]["claimName"] == "fields-payloads"
        if component != "orchestrator":
            assert mounts["/dev/shm"]["name"] == "dshm"
        sidecars = [s["name"] for s in spec.get("initContainers", [])]
        assert (
            sidecars
            == {
                "inference": ["payload-writer"],
                "orchestrator": ["payload-retention"],
                "trainer": [],
            }[component]
        )
        name = pod["metadata"]["name"]
        assert sh(cluster, namespace, name, main, "cat /config/orch.toml") == "max_steps = 20\n"
        # the extra claim is read-write in every role, at the path the template chose
        sh(cluster, namespace, name, main, f"echo {component} > /data/{component}")
    (trainer,) = pods_of(cluster, namespace, "fields", "trainer")
    seen = sh(cluster, namespace, trainer["metadata"]["name"], "trainer", "cat /data/*")
    assert sorted(seen.split()) == ["inference", "orchestrator", "trainer"]
    mounts = {m["mountPath"]: m for m in container(trainer, "trainer")["volumeMounts"]}
    assert mounts["/payloads"]["readOnly"] is True


# --- addresses, rendezvous, the run directory, restarts together -------------------------------


def prime_rl_like(name: str) -> dict[str, Any]:
    trainer = [
        *ROLES,
        "trainer",
        "--orchestrator-port",
        str(ZMQ_PORT),
        "--done-file",
        "/data/done",
        "--fail-file",
        "/tmp/fail",
    ]
    return node_run(
        name,
        runDirectory={"mountPath": "/data"},
        payloads={
            "root": "/data/outputs/payloads",
            "volume": {"size": "1Gi", "storageClassName": "standard"},
        },
        failurePolicy={"backoffLimit": 1},
        inference={"replicas": 2, "image": IMAGE, "command": FAKE_VLLM},
        orchestrator={
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "orchestrator",
                            "image": IMAGE,
                            "command": [*ROLES, "orchestrator", "--port", str(ZMQ_PORT)],
                            "ports": [{"name": "zmq", "containerPort": ZMQ_PORT}],
                        }
                    ]
                }
            }
        },
        trainer={"replicas": 2, "image": IMAGE, "command": trainer},
    )


def logged(cluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    """What a trainer printed so far (nothing while its container is still being created)."""
    out = cluster.kubectl("-n", namespace, "logs", pod, "-c", "trainer")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def admin_state(cluster, namespace: str, orchestrator: str, url: str) -> dict[str, Any]:
    script = f"import urllib.request; print(urllib.request.urlopen('{url}').read().decode())"
    out = kubectl(
        cluster, namespace, "exec", orchestrator, "-c", "orchestrator", "--", "python", "-c", script
    )
    return json.loads(out)


def update_weights(cluster, namespace: str, orchestrator: str, weight_dir: str) -> list[str]:
    """prime-rl's weight update from the orchestrator pod; the replicas it reached."""
    out = kubectl(
        cluster,
        namespace,
        "exec",
        orchestrator,
        "-c",
        "orchestrator",
        "--",
        *ROLES,
        "update-weights",
        weight_dir,
    )
    lines = [json.loads(line) for line in out.splitlines()]
    assert all(next(v for k, v in line.items() if k != "url")["status"] for line in lines)
    return sorted({line["url"] for line in lines})


def weights_reach_every_replica(
    cluster, namespace: str, orchestrator: str, replicas: int, weight_dir: str
) -> list[dict[str, Any]]:
    """A weight update reaches each of the run's ``replicas`` by its own address, and each
    reports the new weight directory; their fake admin states."""
    urls = [
        f"http://prl-inference-{i}.prl-inference-headless.{namespace}.svc:8000/v1"
        for i in range(replicas)
    ]
    assert update_weights(cluster, namespace, orchestrator, weight_dir) == urls
    states = [
        admin_state(cluster, namespace, orchestrator, url.removesuffix("/v1") + "/fake/admin")
        for url in urls
    ]
    assert [state["weight_dir"] for state in states] == [weight_dir] * replicas
    return states


def test_a_prime_rl_run_addresses_every_replica_rendezvous_and_restarts_together(
    operator, namespace
):
    cluster = operator.cluster
    apply(cluster, namespace, prime_rl_like("prl"))
    running(cluster, namespace, "prl")

    # the trainers rendezvous at rank 0 and reach the orchestrator's declared port by DNS name
    trainers = pods_of(cluster, namespace, "prl", "trainer")
    first_attempt = {p["metadata"]["name"] for p in trainers}

    def rendezvoused(pod: str) -> Any:
        events = logged(cluster, namespace, pod)
        return len(events) >= 2 and events

    for pod in trainers:
        events = wait_for(
            f"{pod['metadata']['name']} rendezvous",
            lambda p=pod: rendezvoused(p["metadata"]["name"]),
            timeout=120,
        )
        assert (events[0]["event"], events[0]["world"], events[0]["ranks"]) == (
            "rendezvous",
            2,
            [0, 1],
        )
        assert events[0]["master"] == f"prl-trainer-0.prl-trainer-headless.{namespace}.svc"
        assert events[1]["event"] == "orchestrator"
        assert events[1]["answer"] == "orchestrator prl-orchestrator-0"

    # the run directory: the trainers write weights where inference reads them; the payload root
    # inside it takes the writer's files and is read-only to the trainers
    rank0 = trainers[0]["metadata"]["name"]
    sh(cluster, namespace, rank0, "trainer", "mkdir -p /data/broadcasts/step_1")
    (orchestrator,) = pods_of(cluster, namespace, "prl", "orchestrator")
    orch = orchestrator["metadata"]["name"]
    generate = (
        "import json, os, urllib.request\n"
        "body = {'model': 'fake', 'token_ids': [1, 2, 3], 'sampling_params': {'max_tokens': 4,"
        " 'extra_args': {'payload_dir': os.environ['PAYLOAD_ROOT'] + '/v0'}}}\n"
        "r = urllib.request.Request(os.environ['PAYLOADRUN_INFERENCE_URL'] +"
        " '/inference/v1/generate', json.dumps(body).encode(),"
        " {'Content-Type': 'application/json'})\n"
        "print(json.loads(urllib.request.urlopen(r, timeout=30).read())['choices'][0]"
        "['payload'][0]['file'])\n"
    )
    payload_file = kubectl(
        cluster, namespace, "exec", orch, "-c", "orchestrator", "--", "python", "-c", generate
    ).strip()
    assert payload_file.startswith("/data/outputs/payloads/v0/")
    assert sh(cluster, namespace, rank0, "trainer", f"test -s {payload_file} && echo seen") == (
        "seen\n"
    )
    refused = kubectl(
        cluster,
        namespace,
        "exec",
        rank0,
        "-c",
        "trainer",
        "--",
        "sh",
        "-c",
        f"rm {payload_file} 2>&1; touch /data/outputs/payloads/x 2>&1; touch /data/ok && echo w",
    )
    assert refused.count("Read-only file system") == 2 and refused.endswith("w\n"), refused

    # a weight update reaches every replica through the injected list, and each loads it
    states = weights_reach_every_replica(cluster, namespace, orch, 2, "/data/broadcasts/step_1")
    assert all(s["events"] == ["pause:keep", "update_weights", "resume"] for s in states)

    # three replicas: the list follows (a new orchestrator), the other roles keep their pods
    before = {p["metadata"]["uid"] for p in pods_of(cluster, namespace, "prl", "inference")}
    trainer_uids = {p["metadata"]["uid"] for p in trainers}
    kubectl(
        cluster,
        namespace,
        "patch",
        "payloadrun",
        "prl",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"inference": {"replicas": 3}}}),
    )

    def new_orchestrator() -> Any:
        live = pods_of(cluster, namespace, "prl", "orchestrator")
        urls = [
            env_of(container(p, "orchestrator")).get("PAYLOADRUN_INFERENCE_ADMIN_URLS")
            for p in live
        ]
        ready = [p for p, u in zip(live, urls, strict=True) if u and len(u.split()) == 3]
        return (
            ready
            and all(s.get("ready") for s in ready[0]["status"].get("containerStatuses", []))
            and ready[0]
        )

    orch = wait_for("an orchestrator with three admin URLs", new_orchestrator, timeout=180)[
        "metadata"
    ]["name"]
    running(cluster, namespace, "prl")
    sh(cluster, namespace, rank0, "trainer", "mkdir -p /data/broadcasts/step_2")
    weights_reach_every_replica(cluster, namespace, orch, 3, "/data/broadcasts/step_2")
    after = {p["metadata"]["uid"] for p in pods_of(cluster, namespace, "prl", "inference")}
    assert before < after  # replicas 0 and 1 kept, replica 2 added
    assert {p["metadata"]["uid"] for p in pods_of(cluster, namespace, "prl", "trainer")} == (
        trainer_uids
    )

    # one rank fails: every rank restarts together, counted once against the limit. Rank 0's pod
    # holds the failed attempt's deletion (a finalizer, as a slow node would), so the passes that
    # see the failed Job while it is deleted must neither restart it again nor fail the run.
    hold = json.dumps({"metadata": {"finalizers": ["test.payloadrun.dev/hold"]}})
    kubectl(cluster, namespace, "patch", "pod", rank0, "--type=merge", "-p", hold)
    sh(cluster, namespace, trainers[1]["metadata"]["name"], "trainer", "touch /tmp/fail")

    def being_deleted() -> Any:
        job = find(cluster, namespace, "job", "prl-trainer")
        return job and job["metadata"].get("deletionTimestamp") and job

    wait_for("the failed trainers' Job being deleted", being_deleted, timeout=60)
    time.sleep(5)  # the status reacts to the Job's events within milliseconds: it had time
    held = get(cluster, namespace, "payloadrun", "prl")["status"]
    assert held["phase"] != "Failed", held.get("failure")
    assert held["trainerRestarts"] == 1  # counted once
    kubectl(
        cluster, namespace, "patch", "pod", rank0, "--type=json",
        "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
    )  # fmt: skip

    def restarted() -> Any:
        live = pods_of(cluster, namespace, "prl", "trainer")
        names = {p["metadata"]["name"] for p in live}
        return len(live) == 2 and not names & first_attempt and live

    second = wait_for("both ranks replaced", restarted, timeout=120)
    status = get(cluster, namespace, "payloadrun", "prl")["status"]
    assert status["trainerRestarts"] == 1
    assert status["lastTrainerRestart"]["exitCode"] == 3
    assert status["lastTrainerRestart"]["message"].startswith("trainer rank 1 (pod prl-trainer-1-")
    assert status["phase"] != "Failed"
    events = get(cluster, namespace, "events", "--field-selector", "involvedObject.name=prl")
    assert "TrainersRestarted" in {e["reason"] for e in events["items"]}
    for pod in second:  # the new attempt rendezvouses again
        events = wait_for(
            "a new rendezvous", lambda p=pod: rendezvoused(p["metadata"]["name"]), timeout=120
        )
        assert events[0]["ranks"] == [0, 1]

    # past the limit the run fails, with the rank that failed last
    sh(cluster, namespace, second[0]["metadata"]["name"], "trainer", "touch /tmp/fail")
    failed = wait_for_phase(cluster, namespace, "prl", "Failed")["status"]["failure"]
    assert failed["component"] == "trainer" and failed["exitCode"] == 3
    assert failed["message"].startswith(
        "a trainer rank failed after 1 restart(s) of every rank (spec.failurePolicy.backoffLimit "
        "is 1): BackoffLimitExceeded"
    )
    wait_for("no live pod", lambda: not live_pods(cluster, namespace, "prl") or None)
