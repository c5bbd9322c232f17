"""What a group's pods learn, on the real LeaderWorkerSet (issue 36, item 3): the LeaderWorkerSet
the operator's builders make for a run of two replicas of two pods, applied as built (an inline
run, whose main container idles), and read inside each running process:

- ``PAYLOADRUN_INFERENCE_HEAD_ADDRESS`` is ``$(LWS_LEADER_ADDRESS)``, and the kubelet expands it
  to the leader's address: LWS's webhook put its variables before the operator's;
- the replica's index, the pod's and (one API server a pod) its first DP rank, read from LWS's
  labels by the downward API, are the pod's place in its group;
- every host of the admin URLs resolves, inside a pod, to the pod it names (LWS's own headless
  Service gives them DNS: the operator makes none).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pod_helpers import IMAGE, SLEEP, apply, get, kubectl, wait_for

from builders import context, group_spec
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.env import inference_admin_urls

pytestmark = pytest.mark.integration

RUN = "grp"
PROCESS_ENV = (
    "import json; env = open('/proc/1/environ', 'rb').read().decode().split('\\0'); "
    "wanted = ('LWS_', 'PAYLOADRUN_INF'); "
    "print(json.dumps(dict(e.split('=', 1) for e in env if e.startswith(wanted))))"
)


def built_lws(namespace: str) -> tuple[dict[str, Any], list[str]]:
    """The run's LeaderWorkerSet as the builders make it (with no owner: no run exists here),
    and the hosts of its admin URLs."""
    spec = group_spec(apiServersPerPod=1, image=IMAGE, command=SLEEP, resources=None)
    spec["inference"].pop("resources")
    spec["inference"]["template"] = {
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "vllm", "imagePullPolicy": "Never"}],
        }
    }
    spec["payloads"] = {"mode": "Inline"}
    ctx = context(spec, name=RUN, namespace=namespace)
    (lws,) = [c for c in build_children(ctx) if c["kind"] == "LeaderWorkerSet"]
    lws["metadata"].pop("ownerReferences")
    hosts = [url.split("//")[1].split(":")[0] for url in inference_admin_urls(ctx).split()]
    return lws, hosts


def test_a_groups_pods_learn_their_place_and_their_head(node_cluster, lws, namespace):
    manifest, hosts = built_lws(namespace)
    apply(node_cluster, namespace, manifest)

    def running() -> list[dict[str, Any]] | None:
        pods = get(node_cluster, namespace, "pods", "-l", f"payloadrun.dev/run={RUN}")["items"]
        up = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        return up if len(up) == 4 and len(pods) == 4 else None

    pods = wait_for("4 pods of the run's LeaderWorkerSet running", running)
    ips = {}
    for pod in pods:
        name, labels = pod["metadata"]["name"], pod["metadata"]["labels"]
        group = labels["leaderworkerset.sigs.k8s.io/group-index"]
        worker = labels["leaderworkerset.sigs.k8s.io/worker-index"]
        process = kubectl(
            node_cluster, namespace, "exec", name, "-c", "vllm", "--", "python", "-c", PROCESS_ENV
        )
        env = json.loads(process)
        assert env["LWS_LEADER_ADDRESS"] == f"{RUN}-vllm-{group}.{RUN}-vllm.{namespace}", name
        assert env["PAYLOADRUN_INFERENCE_HEAD_ADDRESS"] == env["LWS_LEADER_ADDRESS"], name
        assert env["PAYLOADRUN_INFERENCE_REPLICA_INDEX"] == group, name
        assert env["PAYLOADRUN_INFERENCE_POD_INDEX"] == worker, name
        assert env["PAYLOADRUN_INFERENCE_DP_START_RANK"] == worker, name
        assert env["PAYLOADRUN_INFERENCE_DP_SIZE"] == "2", name
        ips[name] = pod["status"]["podIP"]

    # every admin URL's host names its pod, through LWS's headless Service
    asker = pods[0]["metadata"]["name"]

    def resolved() -> dict[str, str] | None:
        found = {}
        for host in hosts:
            result = node_cluster.kubectl(
                "-n", namespace, "exec", asker, "-c", "vllm", "--", "getent", "hosts", host
            )
            if result.returncode != 0 or not result.stdout.strip():
                return None
            found[host.split(".")[0]] = result.stdout.split()[0]
        return found

    assert wait_for("every admin URL's host to resolve", resolved, timeout=60) == ips
