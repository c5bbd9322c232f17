"""Inference replicas that span pods, with real pods on the local node (issue 36, item 7).

One run, by handle, on the real LeaderWorkerSet controller (the ``lws`` fixture, webhooks on):
two replicas of two pods (``podsPerReplica: 2``), two API servers in every pod (``EveryPod``,
``apiServersPerPod: 2`` on ports 8100 and 8101), the fake vLLM as the vllm container, started
from the names the operator and LeaderWorkerSet inject (``--api-servers
$PAYLOADRUN_INFERENCE_API_SERVERS_PER_POD``, ``--worker-index $PAYLOADRUN_INFERENCE_POD_INDEX``,
``--leader-address $PAYLOADRUN_INFERENCE_HEAD_ADDRESS``, ``--group-size $LWS_GROUP_SIZE``). In
one test, as each step builds on the one before (one run: the node's pods are the cost):

1. the leaders are not ready while their workers have not joined (the workers are held back by
   a file in the run directory, so the test sees it: the leader's vLLM answers ``/health`` 503
   naming the missing worker, its writer's ``/readyz`` says so, the pod is not Ready), and the
   run reaches Ready once the file lets them join;
2. a rollout through the inference Service reaches every one of the 8 API servers (each
   request counted once, by the API server that served it), is written by handle and reads back
   exact on a trainer, against the same requests answered inline;
3. ``PAYLOADRUN_INFERENCE_ADMIN_URLS`` names the 8 API servers in order, each reachable from the
   orchestrator's pod; after ``replicas`` 2 -> 3 the new orchestrator's list has the 12, in order;
4. a worker pod deleted: LeaderWorkerSet recreates its whole group (both pods new, its
   ``RecreateGroup`` event naming the pod) while the other replicas answer every request sent to
   their pods meanwhile (none fails); the run's Ready turns False with an event naming the
   LeaderWorkerSet's groups (``<run>-vllm 2/3 groups ready``), and Running again; the time from
   the failure to the group serving again through the Service (its new pods ready endpoints of
   ``<run>-inference``) is printed. The operator does not yet record a group's restart (the
   replica, the pod and its exit code in the status and a Warning event, as it does for the
   trainers' restarts): issue 36 item 5 asks for it, and this test holds what exists.

The module runs one test of about 45 s on a warm node (the LeaderWorkerSet controller's install,
the ``lws`` session fixture, is shared with test_lws.py).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import time
from datetime import datetime
from typing import Any

import numpy as np
import pytest
from pod_helpers import (
    IMAGE,
    SLEEP,
    apply,
    get,
    kubectl,
    node_run,
    patch_run,
    wait_for,
    wait_for_phase,
)

from payloadrun.codec import compact_routed_experts
from payloadrun.testing.processes import FAKE_VLLM_MODULE
from payloadrun_devcluster.lws import GROUP_INDEX_LABEL, WORKER_INDEX_LABEL

pytestmark = [pytest.mark.integration, pytest.mark.pod_security("restricted")]

RUN = "grp"
LWS = f"{RUN}-vllm"
PODS_PER_REPLICA = 2
API_SERVERS_PER_POD = 2
PORT = 8100  # the API servers' first port (the writer keeps its default, 8001)
WRITER_PORT = 8001
WRITER_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}
RUN_DIRECTORY = "/data"
ROOT = f"{RUN_DIRECTORY}/outputs/payloads"
# The workers wait for this file before they start (the leaders do not): the test sees the
# leaders unready while their workers are missing, then lets them join.
GATE = f"{RUN_DIRECTORY}/workers-may-join"
FAKE_VLLM_IN_A_GROUP = (
    f'if [ "$PAYLOADRUN_INFERENCE_POD_INDEX" != 0 ]; then '
    f"until [ -e {GATE} ]; do sleep 0.2; done; fi; "
    f"exec python -m {FAKE_VLLM_MODULE} --host 0.0.0.0 --port {PORT} "
    "--api-servers $PAYLOADRUN_INFERENCE_API_SERVERS_PER_POD "
    "--group-size $LWS_GROUP_SIZE --worker-index $PAYLOADRUN_INFERENCE_POD_INDEX "
    "--leader-address $PAYLOADRUN_INFERENCE_HEAD_ADDRESS"
)

# GET each URL (argv[1], JSON) from inside a pod: [url, status, x-fake-server, body], the status
# None and the error's name when nothing answered.
FETCH = """
import json, sys, urllib.error, urllib.request
out = []
for url in json.loads(sys.argv[1]):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            out.append([url, r.status, r.headers.get("x-fake-server"), r.read().decode()])
    except urllib.error.HTTPError as e:
        out.append([url, e.code, e.headers.get("x-fake-server"), e.read().decode()])
    except OSError as e:
        out.append([url, None, None, f"{type(e).__name__}: {e}"])
print(json.dumps(out))
"""

# The orchestrator's rollout: completions through the inference Service (a new connection each,
# so kube-proxy chooses a pod each time), by handle, until every API server of the admin list
# has served one (at most argv[2] requests); then how many each served, and the same requests
# answered inline by one API server (past the writer).
ROLLOUT = """
import json, os, sys, urllib.request
root, most = sys.argv[1], int(sys.argv[2])
service = os.environ["PAYLOADRUN_INFERENCE_URL"] + "/v1/completions"
bases = [u.removesuffix("/v1") for u in os.environ["PAYLOADRUN_INFERENCE_ADMIN_URLS"].split()]

def post(url, body):
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["choices"][0]

def served():
    return {
        b: json.loads(urllib.request.urlopen(b + "/fake/stats", timeout=5).read()).get(
            "/v1/completions", 0)
        for b in bases
    }

sent = []
counts = served()
while len(sent) < most and not all(counts.values()):
    for _ in bases:
        body = {"model": "fake", "prompt": f"rollout {len(sent)}", "max_tokens": 8,
                "return_token_ids": True, "vllm_xargs": {"payload_dir": root + "/v0"}}
        choice = post(service, body)
        sent.append({"body": body, "payload": choice["payload"],
                     "routed_experts": choice["routed_experts"]})
    counts = served()
inline = [post(bases[0] + "/v1/completions", s["body"])["routed_experts"] for s in sent]
print(json.dumps({"sent": sent, "served": counts, "inline": inline}))
"""

# The trainer reads each response's routed experts (one payload a line on stdin) from its
# read-only mount of the root: their sha256, in order.
READ_BACK = """
import hashlib, json, sys
from payloadrun import PayloadReader, segments_from_json
reader = PayloadReader(sys.argv[1])
out = []
for line in sys.stdin:
    segs = segments_from_json(json.loads(line))
    s = [x for x in segs if x.field == "routed_experts"][0]
    a = reader.read(segs, "routed_experts", s.pos, s.end)
    out.append(hashlib.sha256(a.tobytes()).hexdigest())
print(json.dumps(out))
"""

# Completions to each target (argv[1], JSON: the writers of the replicas that must keep
# serving), a round every 0.1 s at most (the node's 2 cores also recreate the lost group), until
# a line arrives on stdin: "serving" once a first round succeeded, then a summary: the requests
# sent, the failures, the first and last request's time (the node's clock).
PROBER = """
import json, os, select, sys, time, urllib.request
targets = json.loads(sys.argv[1])
sent, failures, first = 0, [], time.time()
said = False
while not select.select([0], [], [], 0.1 if said else 0)[0]:
    for url in targets:
        body = {"model": "fake", "prompt": f"probe {sent}", "max_tokens": 4}
        req = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        at = time.time()
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                json.loads(r.read())["choices"][0]
        except Exception as e:
            failures.append([url, at, f"{type(e).__name__}: {e}"])
        sent += 1
    if not said:
        print("serving" if not failures else json.dumps(failures), flush=True)
        said = True
os.read(0, 64)
print(json.dumps({"sent": sent, "failures": failures, "first": first, "last": time.time()}),
      flush=True)
"""


def group_run() -> dict[str, Any]:
    return node_run(
        RUN,
        runDirectory={"mountPath": RUN_DIRECTORY},
        payloads={"root": ROOT, "volume": {"size": "1Gi", "storageClassName": "standard"}},
        inference={
            "replicas": 2,
            "podsPerReplica": PODS_PER_REPLICA,
            "apiServers": "EveryPod",
            "apiServersPerPod": API_SERVERS_PER_POD,
            "port": PORT,
            "image": IMAGE,
            "command": ["sh", "-c", FAKE_VLLM_IN_A_GROUP],
            # six writers on a node of 2 cores: the operator's default request (500m) each
            # would leave the third replica's pods unscheduled
            "writer": {"resources": WRITER_RESOURCES},
        },
        orchestrator={"image": IMAGE, "command": SLEEP},
        trainer={"image": IMAGE, "command": SLEEP},
    )


def pod_name(replica: int, index: int) -> str:
    """LeaderWorkerSet's names: the leader ``<lws>-<replica>``, its workers ``-<index>``."""
    return f"{LWS}-{replica}" if index == 0 else f"{LWS}-{replica}-{index}"


def admin_urls(namespace: str, replicas: int) -> list[str]:
    """Every API server of every replica: replica by replica, leader first, port by port."""
    return [
        f"http://{pod_name(r, i)}.{LWS}.{namespace}.svc:{PORT + d}/v1"
        for r in range(replicas)
        for i in range(PODS_PER_REPLICA)
        for d in range(API_SERVERS_PER_POD)
    ]


def is_ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def group_pods(cluster, namespace: str) -> dict[tuple[int, int], dict[str, Any]]:
    """The live pods of the run's LeaderWorkerSet by (replica, index in the group)."""
    items = get(cluster, namespace, "pods", "-l", f"leaderworkerset.sigs.k8s.io/name={LWS}")
    return {
        (int(labels[GROUP_INDEX_LABEL]), int(labels[WORKER_INDEX_LABEL])): p
        for p in items["items"]
        if (labels := p["metadata"]["labels"]) and not p["metadata"].get("deletionTimestamp")
    }


def container_state(pod: dict[str, Any], name: str) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return next((s for s in statuses if s["name"] == name), {})


def the_pod(cluster, namespace: str, component: str) -> str:
    """The one ready pod of the run's ``component`` (orchestrator, trainer)."""
    selector = f"payloadrun.dev/run={RUN},app.kubernetes.io/component={component}"

    def ready() -> str | None:
        items = get(cluster, namespace, "pods", "-l", selector)["items"]
        live = [p["metadata"]["name"] for p in items if is_ready(p)]
        return live[0] if len(live) == 1 else None

    return wait_for(f"one ready {component} pod", ready)


def in_pod(cluster, namespace: str, pod: str, container: str, script: str, *args: str) -> Any:
    """``script``'s JSON answer, run with python in ``container`` of ``pod``."""
    out = kubectl(
        cluster, namespace, "exec", pod, "-c", container, "--", "python", "-c", script, *args
    )
    return json.loads(out.splitlines()[-1])


def fetch(cluster, namespace: str, pod: str, urls: list[str]) -> list[list[Any]]:
    return in_pod(cluster, namespace, pod, "orchestrator", FETCH, json.dumps(urls))


def admin_list(pod: dict[str, Any]) -> list[str]:
    (main,) = [c for c in pod["spec"]["containers"] if c["name"] == "orchestrator"]
    env = {e["name"]: e.get("value") for e in main.get("env", [])}
    return env["PAYLOADRUN_INFERENCE_ADMIN_URLS"].split()


def serving_endpoints(cluster, namespace: str) -> dict[str, str]:
    """Pod name -> uid of every ready endpoint of the ``<run>-inference`` Service: the pods its
    clients reach."""
    slices = get(
        cluster,
        namespace,
        "endpointslices",
        "-l",
        f"kubernetes.io/service-name={RUN}-inference",
    )
    return {
        e["targetRef"]["name"]: e["targetRef"]["uid"]
        for s in slices["items"]
        for e in s.get("endpoints") or []
        if e.get("conditions", {}).get("ready") and e.get("targetRef")
    }


def run_events(cluster, namespace: str, reason: str) -> dict[str, str]:
    """uid -> message of every event about the run with ``reason``."""
    events = get(
        cluster,
        namespace,
        "events",
        "--field-selector",
        f"involvedObject.name={RUN},involvedObject.kind=PayloadRun,reason={reason}",
    )
    return {e["metadata"]["uid"]: e["message"] for e in events["items"]}


def running_run(cluster, namespace: str) -> dict[str, Any] | None:
    run = get(cluster, namespace, "payloadrun", RUN)
    return run if run.get("status", {}).get("phase") == "Running" else None


def seen(cluster, namespace: str, orchestrator: str) -> dict[str, Any]:
    """What the groups look like, for a failure's message: each pod's readiness and
    containers, the LeaderWorkerSet's status, what each pod's vLLM and writer say."""
    pods = group_pods(cluster, namespace)
    lws_status = get(cluster, namespace, "leaderworkerset", LWS).get("status")
    urls = [
        f"http://{p['metadata']['name']}.{LWS}.{namespace}.svc:{port}{path}"
        for p in pods.values()
        for port, path in ((PORT, "/fake/group"), (WRITER_PORT, "/readyz"))
    ]
    return {
        "pods": {
            p["metadata"]["name"]: (
                is_ready(p),
                {
                    s["name"]: (s.get("ready"), list(s.get("state", {})))
                    for s in p.get("status", {}).get("containerStatuses") or []
                },
            )
            for p in pods.values()
        },
        "lws": lws_status,
        "answers": fetch(cluster, namespace, orchestrator, urls),
        "run": get(cluster, namespace, "payloadrun", RUN).get("status", {}).get("conditions"),
    }


def recovery_timeline(pods: dict[tuple[int, int], dict[str, Any]], failed: float) -> str:
    """When replica 0's new pods were created, their containers started and the pods became
    ready, in seconds after ``failed`` (the API server's times, to the second)."""

    def after(stamp: str | None) -> str:
        if not stamp:
            return "-"
        return f"+{datetime.fromisoformat(stamp).timestamp() - failed:.0f} s"

    parts = []
    for i in range(PODS_PER_REPLICA):
        pod = pods[(0, i)]
        status = pod.get("status", {})
        started = {
            c["name"]: c.get("state", {}).get("running", {}).get("startedAt")
            for c in (status.get("initContainerStatuses") or [])
            + (status.get("containerStatuses") or [])
        }
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        parts.append(
            f"{pod['metadata']['name']} created {after(pod['metadata']['creationTimestamp'])}, "
            + ", ".join(f"{name} started {after(at)}" for name, at in started.items())
            + f", ready {after(ready['lastTransitionTime'])}"
        )
    return "; ".join(parts)


def test_groups_of_pods_serve_by_handle_follow_replicas_and_recreate_whole(
    lws, operator, namespace
):
    cluster = operator.cluster
    began = time.monotonic()
    apply(cluster, namespace, group_run())

    # --- 1. a leader is not ready until its workers have joined ---------------------------------
    def leaders_waiting() -> dict[tuple[int, int], dict[str, Any]] | None:
        pods = group_pods(cluster, namespace)
        leaders = [pods.get((r, 0)) for r in range(2)]
        started = all(
            leader and "running" in container_state(leader, "vllm").get("state", {})
            for leader in leaders
        )
        return pods if started else None

    pods = wait_for("both leaders' vLLM running", leaders_waiting)
    orchestrator = the_pod(cluster, namespace, "orchestrator")
    leaders = [pod_name(r, 0) for r in range(2)]

    def health_says_missing() -> list[list[Any]] | None:
        urls = [f"http://{p}.{LWS}.{namespace}.svc:{PORT}/health" for p in leaders]
        urls += [f"http://{p}.{LWS}.{namespace}.svc:{WRITER_PORT}/readyz" for p in leaders]
        answers = fetch(cluster, namespace, orchestrator, urls)
        return answers if all(a[1] == 503 for a in answers) else None

    answers = wait_for("the leaders' /health and writers' /readyz at 503", health_says_missing)
    for _url, _status, _server, body in answers[:2]:
        group = json.loads(body)
        assert (group["ready"], group["joined"], group["missing"]) == (False, [], [1]), group
    for _url, _status, _server, body in answers[2:]:
        assert f"127.0.0.1:{PORT}" in body, body  # the writer names the API server not ready
    pods = group_pods(cluster, namespace)
    assert not any(is_ready(pods[(r, 0)]) for r in range(2)), "a leader ready without its worker"

    trainer = the_pod(cluster, namespace, "trainer")
    kubectl(cluster, namespace, "exec", trainer, "-c", "trainer", "--", "touch", GATE)
    running = wait_for(
        f"{RUN} Running",
        lambda: running_run(cluster, namespace),
        seen=lambda: seen(cluster, namespace, orchestrator),
        timeout=120,
    )
    print(f"two groups of two pods Running {time.monotonic() - began:.1f} s after the apply")
    ready = {c["type"]: c for c in running["status"]["conditions"]}["Ready"]
    assert ready["status"] == "True", ready
    groups = fetch(
        cluster,
        namespace,
        orchestrator,
        [f"http://{p}.{LWS}.{namespace}.svc:{PORT}/fake/group" for p in leaders],
    )
    for _url, status, _server, body in groups:
        group = json.loads(body)
        assert (status, group["joined"], group["missing"]) == (200, [1], []), group

    # --- 3. the admin list: every API server, in order, each reachable --------------------------
    orchestrator_pod = get(cluster, namespace, "pod", orchestrator)
    assert admin_list(orchestrator_pod) == admin_urls(namespace, 2)
    reached = fetch(
        cluster,
        namespace,
        orchestrator,
        [u.removesuffix("/v1") + "/health" for u in admin_urls(namespace, 2)],
    )
    assert [(a[1], a[2]) for a in reached] == [
        (200, str(PORT + d)) for _ in range(2 * PODS_PER_REPLICA) for d in range(2)
    ], reached

    # --- 2. a rollout through the Service reaches every API server, by handle, exact ------------
    rollout = in_pod(cluster, namespace, orchestrator, "orchestrator", ROLLOUT, ROOT, "200")
    sent, served = rollout["sent"], rollout["served"]
    print(f"rollout: {len(sent)} requests through the Service, per API server: {served}")
    assert list(served) == [u.removesuffix("/v1") for u in admin_urls(namespace, 2)]
    assert all(served.values()), f"an API server the Service never reached: {served}"
    assert sum(served.values()) == len(sent)  # each request served once, by one API server
    for s in sent:
        assert s["routed_experts"] is None  # by handle: the writer took them out of the answer
        assert s["payload"] and all(seg["file"].startswith(f"{ROOT}/v0/") for seg in s["payload"])
    digests = json.loads(
        kubectl(
            cluster,
            namespace,
            "exec",
            "-i",
            trainer,
            "-c",
            "trainer",
            "--",
            "python",
            "-c",
            READ_BACK,
            ROOT,
            input="".join(json.dumps(s["payload"]) + "\n" for s in sent),
        )
    )
    expected = [
        hashlib.sha256(
            np.ascontiguousarray(
                compact_routed_experts(
                    np.load(io.BytesIO(base64.b64decode(raw)), allow_pickle=False)
                )
            ).tobytes()
        ).hexdigest()
        for raw in rollout["inline"]
    ]
    assert digests == expected

    # --- 3. replicas 2 -> 3: the new orchestrator's list has the 12 -----------------------------
    patch_run(cluster, namespace, RUN, {"spec": {"inference": {"replicas": 3}}})

    def new_orchestrator() -> str | None:
        name = the_pod(cluster, namespace, "orchestrator")
        return name if name != orchestrator else None

    orchestrator = wait_for("an orchestrator with the new list", new_orchestrator)
    assert admin_list(get(cluster, namespace, "pod", orchestrator)) == admin_urls(namespace, 3)
    wait_for_phase(cluster, namespace, RUN, "Running")
    reached = fetch(
        cluster,
        namespace,
        orchestrator,
        [u.removesuffix("/v1") + "/health" for u in admin_urls(namespace, 3)],
    )
    assert [a[1] for a in reached] == [200] * 12, reached

    # --- 4. a worker lost: its group recreated, the others keep answering -----------------------
    before = {at: p["metadata"]["uid"] for at, p in group_pods(cluster, namespace).items()}
    assert set(before) == {(r, i) for r in range(3) for i in range(PODS_PER_REPLICA)}
    others = [
        f"http://{pod_name(r, i)}.{LWS}.{namespace}.svc:{WRITER_PORT}/v1/completions"
        for r in (1, 2)
        for i in range(PODS_PER_REPLICA)
    ]
    not_ready_before = set(run_events(cluster, namespace, "WorkloadsNotReady"))
    prober = subprocess.Popen(
        [
            str(cluster.binaries.kubectl),
            f"--kubeconfig={cluster.kubeconfig}",
            "-n",
            namespace,
            "exec",
            "-i",
            orchestrator,
            "-c",
            "orchestrator",
            "--",
            "python",
            "-c",
            PROBER,
            json.dumps(others),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = prober.stdout.readline().strip()
        assert first == "serving", (first, prober.stderr.read() if not first else "")
        lost = pod_name(0, 1)
        failed_at, failed_wall = time.monotonic(), time.time()
        kubectl(cluster, namespace, "delete", "pod", lost, "--wait=false")

        def group_serving_again() -> dict[str, str] | None:
            serving = serving_endpoints(cluster, namespace)
            fresh = all(
                serving.get(pod_name(0, i)) not in (None, before[(0, i)])
                for i in range(PODS_PER_REPLICA)
            )
            return serving if fresh else None

        serving = wait_for(
            f"replica 0 recreated and serving through {RUN}-inference",
            group_serving_again,
            seen=lambda: serving_endpoints(cluster, namespace),
            timeout=120,
        )
        recovered, recovered_wall = time.monotonic() - failed_at, time.time()
        prober.stdin.write("stop\n")
        prober.stdin.flush()
        summary = json.loads(prober.stdout.readline())
    finally:
        if prober.poll() is None:
            prober.kill()
        prober.wait(timeout=30)
    print(
        f"replica 0 serving again through the Service {recovered:.1f} s after its worker pod "
        f"was deleted; meanwhile {summary['sent']} requests to replicas 1 and 2, "
        f"{len(summary['failures'])} failed"
    )
    print(
        f"  replica 0's timeline: {recovery_timeline(group_pods(cluster, namespace), failed_wall)}"
    )
    joins = kubectl(cluster, namespace, "logs", pod_name(0, 1), "-c", "vllm", "--timestamps")
    print("  its new worker's joins:", [line for line in joins.splitlines() if "worker 1" in line])
    assert summary["failures"] == [], summary["failures"]
    # the requests went on throughout: from before the failure to after the group was back
    assert summary["first"] <= failed_wall and summary["last"] >= recovered_wall, summary
    assert summary["sent"] > len(others)
    after = group_pods(cluster, namespace)
    assert {(r, i): after[(r, i)]["metadata"]["uid"] for r in (1, 2) for i in range(2)} == {
        (r, i): before[(r, i)] for r in (1, 2) for i in range(2)
    }, "another replica's pods were replaced"
    assert all(
        s["restartCount"] == 0
        for r in (1, 2)
        for i in range(2)
        for s in after[(r, i)]["status"]["containerStatuses"]
    )
    assert {pod_name(r, i) for r in range(3) for i in range(2)} <= set(serving)
    # LeaderWorkerSet says which pod made it recreate the group
    lws_events = get(cluster, namespace, "events", "--field-selector", "reason=RecreateGroup")
    assert any(lost in e["message"] for e in lws_events["items"]), lws_events
    # the run's Ready condition went False naming the LeaderWorkerSet's groups, and came back
    new = {
        uid: message
        for uid, message in run_events(cluster, namespace, "WorkloadsNotReady").items()
        if uid not in not_ready_before
    }
    assert any(f"{LWS} 2/3 groups ready" in m for m in new.values()), new
    wait_for_phase(cluster, namespace, RUN, "Running")
