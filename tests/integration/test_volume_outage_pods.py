"""The shared volume dies under a by-handle run with real pods: every inference pod stays in its
Service, the orchestrator's requests get inline answers (counted), the outage is seen, and
answers go back to by handle once the volume returns (issue 33, item 2).

The run's claim is on the node's GlusterFS volume (storage class ``standard``): each pod mounts
it through a FUSE client of its own. The test kills the volume's brick server (SIGKILL: every
client's calls fail at once) and starts it again, waiting on facts only:

- the writer noticed: its payload-root metric says not writable, on every inference pod;
- the kubelet has then probed each writer's readiness ``failureThreshold + 1`` times more (its
  own ``prober_probe_total``): had readiness followed the volume, that many failed probes would
  have taken the pod out, one probe period before the last observation;
- at every observation from the kill on, every inference pod is Ready and ready in the
  EndpointSlices of the Service that ``$PAYLOADRUN_INFERENCE_URL`` names.

A native sidecar's readiness counts toward its pod's: while the writer's ``/readyz`` followed
the volume, the endpoints went from every pod to none ``failureThreshold x periodSeconds``
after the kill, and the orchestrator's requests got "No route to host" exactly when the writer
would have answered them inline.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import Any

import pytest
from pod_helpers import (
    FAKE_VLLM,
    IMAGE,
    SLEEP,
    Sample,
    apply,
    get,
    kubectl,
    kubelet_probe_metrics,
    live_pods,
    node_run,
    pod_metrics,
    running,
    wait_for,
)

from payloadrun.segments import PAYLOAD_FIELD, ROUTED_EXPERTS
from payloadrun.settings import WRITER_METRICS_PORT
from payloadrun.writer.metrics import PREFIX
from payloadrun.writer.root_monitor import RootHealth, change_line
from payloadrun.writer.server import FALLBACK_HEADER, MODE_HEADER
from payloadrun_devcluster.node import NODE_NAME
from payloadrun_operator.api.models import DEFAULT_MOUNT_PATH
from payloadrun_operator.api.names import LABEL_COMPONENT, WRITER_CONTAINER

pytestmark = [pytest.mark.integration, pytest.mark.pod_security("restricted")]

RUN = "outage"
REPLICAS = 2  # "every inference pod": more than one behind the Service
OUTAGE_REQUESTS = 6
# The writer's metrics this test reads (payloadrun/writer/metrics.py)
FALLBACKS = PREFIX + "fallbacks_total"
REQUESTS = PREFIX + "requests_total"
ROOT_WRITABLE = PREFIX + "payload_root_writable"
# Why an answer goes back inline while the volume's server is away (a write fails at once: the
# breaker, for writes that hang, stays closed)
VOLUME_GONE = "volume_gone"
# What the writer logs when the root stops taking files (up to what failed), and when it
# takes them again
NOT_WRITABLE_LINE = change_line(RootHealth(True), RootHealth(False, "")).partition(":")[0]
WRITABLE_AGAIN_LINE = change_line(RootHealth(False, "gone"), RootHealth(True))
# Kubernetes' defaults for a probe that does not set them
DEFAULT_PERIOD_SECONDS, DEFAULT_FAILURE_THRESHOLD = 10, 3

# The orchestrator's generate requests, by handle, through the load-balanced Service it is given
# ($PAYLOADRUN_INFERENCE_URL), argv[1] of them one after the other: for each, the status, the
# writer's mode and fallback headers, the first choice's fields that are not null (by handle,
# the arrays are null and the segments set) and the file of its first segment, or the error
# that stopped it. Standard library only.
GENERATE = """
import json, os, sys, urllib.error, urllib.request
count, mode_header, fallback_header, payload_field = sys.argv[1:5]
url = os.environ['PAYLOADRUN_INFERENCE_URL'] + '/inference/v1/generate'
body = json.dumps({'model': 'fake', 'token_ids': [1, 2, 3], 'sampling_params': {
    'max_tokens': 4, 'extra_args': {'payload_dir': os.environ['PAYLOAD_ROOT'] + '/v0'}}})
answers = []
for _ in range(int(count)):
    request = urllib.request.Request(url, body.encode(), {'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            choice = json.loads(response.read())['choices'][0]
            segments = choice.get(payload_field) or [{}]
            answers.append({'status': response.status,
                            'mode': response.headers.get(mode_header),
                            'fallback': response.headers.get(fallback_header),
                            'fields': sorted(k for k, v in choice.items() if v is not None),
                            'file': segments[0].get('file')})
    except urllib.error.HTTPError as error:
        answers.append({'status': error.code, 'error': error.read().decode()[:300]})
    except OSError as error:
        reason = getattr(error, 'reason', error)
        answers.append({'error': f'{type(reason).__name__}: {reason}'})
print(json.dumps(answers))
"""


# --- the run and what the test reads of it -------------------------------------------------------


def run_manifest() -> dict[str, Any]:
    """A by-handle run (router replay, a claim of the node's GlusterFS class) of two inference
    pods (the fake vLLM behind the writer) and an orchestrator the test execs requests in."""
    return node_run(
        RUN,
        inference={"image": IMAGE, "command": FAKE_VLLM, "replicas": REPLICAS},
        orchestrator={"image": IMAGE, "command": SLEEP},
        trainer={"image": IMAGE, "command": SLEEP},
    )


def component_pods(cluster, namespace: str, component: str) -> list[dict[str, Any]]:
    return [
        p
        for p in live_pods(cluster, namespace, RUN)
        if p["metadata"]["labels"].get(LABEL_COMPONENT) == component
    ]


def writer_readiness(pod: dict[str, Any]) -> tuple[int, int]:
    """The writer's readiness probe as the pod has it: (periodSeconds, failureThreshold)."""
    (writer,) = [c for c in pod["spec"]["initContainers"] if c["name"] == WRITER_CONTAINER]
    probe = writer["readinessProbe"]
    return (
        probe.get("periodSeconds", DEFAULT_PERIOD_SECONDS),
        probe.get("failureThreshold", DEFAULT_FAILURE_THRESHOLD),
    )


def answer_mode(answer: dict[str, Any]) -> str:
    """``handle`` or ``inline`` when the answer is a 200 whose header and body agree on it
    (segments and no inline array, or the inline array and no segments), else what it was."""
    fields = set(answer.get("fields", ()))
    if answer.get("status") == 200:
        if answer["mode"] == "handle" and PAYLOAD_FIELD in fields and ROUTED_EXPERTS not in fields:
            return "handle"
        if answer["mode"] == "inline" and ROUTED_EXPERTS in fields and PAYLOAD_FIELD not in fields:
            return "inline"
    return f"neither: {answer}"


def generate(cluster, namespace: str, orchestrator: str, count: int) -> list[dict[str, Any]]:
    """``count`` generate requests from the orchestrator container through the Service."""
    out = kubectl(
        cluster, namespace, "exec", orchestrator, "-c", "orchestrator", "--",
        "python", "-c", GENERATE, str(count), MODE_HEADER, FALLBACK_HEADER, PAYLOAD_FIELD,
    )  # fmt: skip
    return json.loads(out)


def endpoint_readiness(cluster, namespace: str, service: str) -> dict[str, bool]:
    """Each pod in ``service``'s EndpointSlices: whether its endpoint is ready."""
    slices = get(
        cluster, namespace, "endpointslices", "-l", f"kubernetes.io/service-name={service}"
    )
    return {
        endpoint["targetRef"]["name"]: bool(endpoint.get("conditions", {}).get("ready"))
        for item in slices["items"]
        for endpoint in item.get("endpoints") or []
        if endpoint.get("targetRef", {}).get("kind") == "Pod"
    }


def pod_readiness(cluster, namespace: str, names: list[str]) -> dict[str, bool]:
    """Each pod's Ready condition (what the EndpointSlice controller follows)."""
    found = {p["metadata"]["name"]: p for p in get(cluster, namespace, "pods")["items"]}
    return {
        name: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in found.get(name, {}).get("status", {}).get("conditions", [])
        )
        for name in names
    }


def sample_sum(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(v for n, got, v in samples if n == name and labels.items() <= got.items())


def root_writable(samples: list[Sample]) -> float | None:
    """The writer's payload-root gauge (None while it exports none)."""
    values = [v for n, _, v in samples if n == ROOT_WRITABLE]
    return values[0] if values else None


def readiness_probes(cluster, namespace: str, names: list[str]) -> dict[str, dict[str, float]]:
    """How many times the kubelet has probed each pod's writer for readiness, by result."""
    probes = kubelet_probe_metrics(cluster, NODE_NAME)
    out: dict[str, dict[str, float]] = {}
    for name in names:
        labels = {"namespace": namespace, "pod": name, "container": WRITER_CONTAINER}
        out[name] = {
            result: sample_sum(
                probes, "prober_probe_total", probe_type="Readiness", result=result, **labels
            )
            for result in ("successful", "failed", "unknown")
        }
    return out


def writer_log(cluster, namespace: str, pod: str) -> str:
    return kubectl(cluster, namespace, "logs", pod, "-c", WRITER_CONTAINER)


def answers(path: os.PathLike) -> bool:
    try:
        os.statvfs(path)
        os.listdir(path)
    except OSError:
        return False
    return True


# --- the test ------------------------------------------------------------------------------------


def test_a_dead_brick_keeps_every_inference_pod_in_its_service_and_answers_go_inline(
    operator, namespace
):
    cluster = operator.cluster
    apply(cluster, namespace, run_manifest())
    run = running(cluster, namespace, RUN)
    inference = sorted(
        p["metadata"]["name"] for p in component_pods(cluster, namespace, "inference")
    )
    assert len(inference) == REPLICAS
    (orchestrator_pod,) = component_pods(cluster, namespace, "orchestrator")
    orchestrator = orchestrator_pod["metadata"]["name"]
    # the Service the orchestrator's requests go through: the one its URL names
    (main,) = [c for c in orchestrator_pod["spec"]["containers"] if c["name"] == "orchestrator"]
    url = {e["name"]: e.get("value") for e in main["env"]}["PAYLOADRUN_INFERENCE_URL"]
    service = url.removeprefix("http://").split(".")[0]
    periods = {writer_readiness(p) for p in component_pods(cluster, namespace, "inference")}
    ((period, threshold),) = periods
    # the volume as the node's GlusterFS server has it: the run's directory on the brick
    claim = get(cluster, namespace, "pvc", run["status"]["claimName"])
    flex = get(cluster, namespace, "pv", claim["spec"]["volumeName"])["spec"]["flexVolume"]
    volume = cluster.node.shared_volume()
    assert flex["options"]["volume"] == volume.name

    wait_for(
        f"every inference pod ready in {service}'s endpoints",
        lambda: endpoint_readiness(cluster, namespace, service) == dict.fromkeys(inference, True),
        seen=lambda: endpoint_readiness(cluster, namespace, service),
    )
    last: list[dict[str, Any]] = [{}]  # the last answer, for a failure's message

    def by_handle() -> dict[str, Any] | None:
        last[0] = generate(cluster, namespace, orchestrator, 1)[0]
        return last[0] if answer_mode(last[0]) == "handle" else None

    wait_for("an answer by handle through the Service", by_handle, seen=lambda: last[0])

    def metrics() -> dict[str, list[Sample]]:
        return {p: pod_metrics(cluster, namespace, p, WRITER_METRICS_PORT) for p in inference}

    # the writers have found the root writable since they started (their first probe may have
    # run before the root's directory was made): the outage is a change they see
    wait_for(
        f"every writer's {ROOT_WRITABLE} 1",
        lambda: all(root_writable(s) == 1 for s in metrics().values()),
    )
    logged = {p: writer_log(cluster, namespace, p) for p in inference}
    figures: dict[str, Any] = {"readiness probe": f"every {period} s, {threshold} failures"}
    try:
        before = metrics()
        probed_before = readiness_probes(cluster, namespace, inference)
        volume.kill_brick()
        killed = time.monotonic()

        # --- the outage: nothing leaves the Service, for failureThreshold probes and more ---
        noticed: dict[str, tuple[float, float]] = {}  # pod: (seconds after the kill, probes)
        history: list[tuple[float, int]] = []  # (seconds after the kill, ready endpoints)

        def through_the_window() -> bool:
            probes = readiness_probes(cluster, namespace, inference)
            writers = metrics()
            endpoints = endpoint_readiness(cluster, namespace, service)
            ready = pod_readiness(cluster, namespace, inference)
            at = round(time.monotonic() - killed, 1)
            history.append((at, sum(endpoints.get(p, False) for p in inference)))
            if not all(endpoints.get(p) and ready[p] for p in inference):
                pytest.fail(
                    f"{at} s after the brick was killed, inference pods left the Service "
                    f"{service}: ready endpoints {endpoints}, pods Ready {ready}; ready "
                    f"endpoints over time {history}; the kubelet's readiness probes of the "
                    f"writers {probes}; readiness probe every {period} s, {threshold} failures",
                    pytrace=False,
                )
            for pod in inference:
                if pod not in noticed and root_writable(writers[pod]) == 0:
                    noticed[pod] = (at, sum(probes[pod].values()))
            return len(noticed) == len(inference) and all(
                sum(probes[p].values()) - noticed[p][1] >= threshold + 1 for p in inference
            )

        wait_for(
            f"every writer to report the root not writable ({ROOT_WRITABLE} 0), then "
            f"{threshold + 1} readiness probes of each",
            through_the_window,
            seen=lambda: {"noticed": noticed, "ready endpoints": history[-5:]},
        )
        figures["writer noticed (s after the kill)"] = {p: n[0] for p, n in noticed.items()}
        figures["window (s after the kill)"] = history[-1][0]
        figures["observations, ready endpoints each"] = (len(history), {n for _, n in history})
        # and not one readiness probe of a writer failed meanwhile (none could flap unseen)
        probed = readiness_probes(cluster, namespace, inference)
        figures["writer readiness probes since the kill"] = {
            p: {r: n - probed_before[p][r] for r, n in probed[p].items()} for p in inference
        }
        assert {p: probed[p]["failed"] for p in inference} == {
            p: probed_before[p]["failed"] for p in inference
        }, figures
        for pod in inference:  # one line per change: the outage's
            now = writer_log(cluster, namespace, pod)
            assert now.count(NOT_WRITABLE_LINE) == logged[pod].count(NOT_WRITABLE_LINE) + 1, now

        # --- the orchestrator's requests through the Service: inline, each counted ---
        outage = generate(cluster, namespace, orchestrator, OUTAGE_REQUESTS)
        assert [answer_mode(a) for a in outage] == ["inline"] * OUTAGE_REQUESTS, outage
        reasons = Counter(a["fallback"] for a in outage)
        assert set(reasons) == {VOLUME_GONE}, outage  # the header of every answer: volume_gone
        after = metrics()
        counted = {
            reason: sum(
                sample_sum(after[p], FALLBACKS, reason=reason)
                - sample_sum(before[p], FALLBACKS, reason=reason)
                for p in inference
            )
            for reason in {
                labels["reason"] for n, labels, _ in after[inference[0]] if n == FALLBACKS
            }
        }
        assert {r: n for r, n in counted.items() if n} == reasons
        inline = {"mode": "inline", "code": "200"}
        assert (
            sum(
                sample_sum(after[p], REQUESTS, **inline) - sample_sum(before[p], REQUESTS, **inline)
                for p in inference
            )
            == OUTAGE_REQUESTS
        )
        figures["outage answers by fallback reason"] = dict(reasons)

        # --- the brick returns: by handle again, and the writers say so ---
        volume.start_brick()
        restarted = time.monotonic()
        back = wait_for("an answer by handle again", by_handle, seen=lambda: last[0])
        figures["first answer by handle (s after the brick's start)"] = round(
            time.monotonic() - restarted, 1
        )
        # the file its segments name is on the brick (the volume is mounted at its default path)
        on_brick = (
            volume.brick
            / flex["options"]["subdir"]
            / back["file"].removeprefix(DEFAULT_MOUNT_PATH + "/")
        )
        assert on_brick.is_file(), f"{back['file']} is not on the brick at {on_brick}"
        wait_for(
            f"every writer's {ROOT_WRITABLE} 1 again",
            lambda: all(root_writable(s) == 1 for s in metrics().values()),
        )
        figures["writers writable again (s after the brick's start)"] = round(
            time.monotonic() - restarted, 1
        )
        for pod in inference:
            now = writer_log(cluster, namespace, pod)
            assert now.count(WRITABLE_AGAIN_LINE) == logged[pod].count(WRITABLE_AGAIN_LINE) + 1, now
            assert endpoint_readiness(cluster, namespace, service)[pod]
    finally:
        # the node's volume healthy for the tests after this one
        if volume.brick_pid() is None:
            volume.start_brick()
        wait_for(
            "the provisioner's client of the node's volume to answer again",
            lambda: answers(cluster.node.provisioner_mount()),
        )
        print(f"volume outage figures: {figures}")
