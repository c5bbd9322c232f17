"""A run's lifecycle with real pods on the local node: upgrades, rollout, suspend, the end.

The operator runs as a host process (:class:`LocalOperator`), so each test can restart it, or
start it again with other settings (an upgrade), against a control plane whose node runs the
runs' pods from the images ``hack/images.sh`` builds (the fake vLLM behind the writer sidecar;
orchestrator and trainer containers that sleep, exit 0 or fail as each test needs).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pod_helpers import (
    FAKE_VLLM,
    IMAGE,
    NEXT_IMAGE,
    SLEEP,
    apply,
    find,
    get,
    kubectl,
    live_pods,
    patch_run,
    pods,
    restricted,
    running,
    wait_for,
    wait_for_phase,
)

from payloadrun_operator.api.models import GROUP
from payloadrun_operator.api.names import INPUTS_ANNOTATION, ROLLOUT_ANNOTATION

pytestmark = [pytest.mark.integration, pytest.mark.pod_security("restricted")]
# The orchestrator of the end-to-end runs: one request by handle through the writer (a payload
# file on the volume), policy step 7 to its retention sidecar, then it waits to be stopped.
ORCHESTRATE = [
    "python",
    "-c",
    "import json, os, signal, sys, time, urllib.request\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # PID 1: stop when asked\n"
    "from payloadrun.retention.client import RetentionClient\n"
    "root = os.environ['PAYLOAD_ROOT']\n"
    "body = {'model': 'fake', 'token_ids': [1, 2, 3],\n"
    "        'sampling_params': {'max_tokens': 4, 'extra_args': {'payload_dir': root + '/v0'}}}\n"
    "request = urllib.request.Request(os.environ['PAYLOADRUN_INFERENCE_URL']\n"
    "    + '/inference/v1/generate', json.dumps(body).encode(),\n"
    "    {'Content-Type': 'application/json'})\n"
    "for attempt in range(60):\n"
    "    try:\n"
    "        urllib.request.urlopen(request, timeout=10).read(); break\n"
    "    except OSError:\n"
    "        time.sleep(1)\n"
    "RetentionClient().policy_updated(7)\n"
    "print('policy_updated 7', flush=True)\n"
    "time.sleep(10**9)\n",
]


# --- helpers ------------------------------------------------------------------------------------


def run_manifest(
    name: str,
    *,
    orchestrator: list[str] = SLEEP,
    trainer: list[str] = SLEEP,
    trainers: int = 1,
    **spec: Any,
) -> dict[str, Any]:
    """The run, its own containers restricted-compliant (the namespaces enforce restricted)."""
    run = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "PayloadRun",
        "metadata": {"name": name},
        "spec": {
            "routerReplay": True,
            "payloads": {"volume": {"size": "1Gi", "storageClassName": "standard"}},
            "inference": {
                "image": IMAGE,
                "command": FAKE_VLLM,
            },
            "orchestrator": {"image": IMAGE, "command": orchestrator},
            "trainer": {"image": IMAGE, "command": trainer, "replicas": trainers},
            **spec,
        },
    }
    return restricted(run)


def templates(cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """Each workload's pod template, generation and uid, as the API server has them (None while
    one of them does not exist)."""
    out = {}
    for kind, component in (
        ("statefulset", "inference"),
        ("job", "orchestrator"),
        ("job", "trainer"),
    ):
        obj = find(cluster, namespace, kind, f"{name}-{component}")
        if obj is None:
            return None
        out[component] = {
            "template": json.dumps(obj["spec"]["template"], sort_keys=True),
            "generation": obj["metadata"]["generation"],
            "uid": obj["metadata"]["uid"],
            "inputs": obj["metadata"]["annotations"][INPUTS_ANNOTATION],
        }
    return out


def sidecar_images(cluster, namespace: str, name: str) -> set[str]:
    images = set()
    for pod in live_pods(cluster, namespace, name):
        for container in pod["spec"].get("initContainers", []):
            images.add(container["image"])
    return images


# --- upgrades and rollout ----------------------------------------------------------------------


def test_restart_and_upgrade_leave_a_live_run_alone_new_runs_get_the_new_sidecars(
    operator, namespace
):
    cluster = operator.cluster
    apply(cluster, namespace, run_manifest("live"))
    run = running(cluster, namespace, "live")
    assert run["status"]["sidecars"]["image"] == IMAGE
    before = templates(cluster, namespace, "live")
    pod_uids = {p["metadata"]["uid"] for p in live_pods(cluster, namespace, "live")}

    # a restart with the same settings: kopf resumes the run and reconciles it
    operator.start()
    wait_for("the restarted operator's reconcile", lambda: operator.reconciled() >= 1)
    assert templates(cluster, namespace, "live") == before

    # an upgrade: new sidecar image defaults
    operator.start(sidecar_image=NEXT_IMAGE)
    wait_for("the upgraded operator's reconcile", lambda: operator.reconciled() >= 1)
    # and its status passes: every run its start listed refreshed, and none pending
    wait_for("the upgraded operator's status passes", operator.caught_up)
    assert templates(cluster, namespace, "live") == before
    assert {p["metadata"]["uid"] for p in live_pods(cluster, namespace, "live")} == pod_uids
    assert get(cluster, namespace, "payloadrun", "live")["status"]["sidecars"]["image"] == IMAGE

    # a new run gets the new defaults
    apply(cluster, namespace, run_manifest("fresh"))
    fresh = running(cluster, namespace, "fresh")
    assert fresh["status"]["sidecars"]["image"] == NEXT_IMAGE
    assert sidecar_images(cluster, namespace, "fresh") == {f"{NEXT_IMAGE}"}

    # the explicit rollout moves the live run onto the new sidecars: inference and the
    # orchestrator roll, the trainers (no sidecar, same fsGroup) do not
    kubectl(cluster, namespace, "annotate", "payloadrun", "live", f"{ROLLOUT_ANNOTATION}=now")

    def rolled() -> Any:
        status = get(cluster, namespace, "payloadrun", "live")["status"]
        return status["sidecars"].get("rollout") == "now" and status["sidecars"]["image"]

    assert wait_for("the rollout", rolled) == NEXT_IMAGE
    after = wait_for(
        "the rolled workloads",
        lambda: (
            (t := templates(cluster, namespace, "live"))
            and t["orchestrator"]["uid"] != before["orchestrator"]["uid"]
            and t
        ),
    )
    assert after["inference"]["template"] != before["inference"]["template"]
    assert NEXT_IMAGE in after["inference"]["template"]
    assert after["trainer"] == before["trainer"]
    running(cluster, namespace, "live")
    wait_for(
        "the live run's pods on the new sidecars",
        lambda: sidecar_images(cluster, namespace, "live") == {NEXT_IMAGE},
    )


def test_changing_one_components_spec_rolls_that_component_only(operator, namespace):
    cluster = operator.cluster
    apply(cluster, namespace, run_manifest("scale"))
    running(cluster, namespace, "scale")
    before = templates(cluster, namespace, "scale")
    patch_run(cluster, namespace, "scale", {"spec": {"trainer": {"replicas": 2}}})

    def trainer_replaced() -> Any:
        after = templates(cluster, namespace, "scale")  # None: deleted, not created again yet
        return after and after["trainer"]["uid"] != before["trainer"]["uid"] and after

    after = wait_for("the trainer Job replaced", trainer_replaced)
    assert after["inference"] == before["inference"]
    assert after["orchestrator"] == before["orchestrator"]
    assert get(cluster, namespace, "job", "scale-trainer")["spec"]["parallelism"] == 2
    running(cluster, namespace, "scale")


# --- suspend -------------------------------------------------------------------------------------


def test_suspend_stops_every_pod_and_keeps_the_claim_and_resume_brings_them_back(
    operator, namespace
):
    cluster = operator.cluster
    apply(cluster, namespace, run_manifest("pause", orchestrator=ORCHESTRATE))
    run = running(cluster, namespace, "pause")
    root = run["status"]["payloadRoot"]
    claim = run["status"]["claimName"]
    before = templates(cluster, namespace, "pause")

    patch_run(cluster, namespace, "pause", {"spec": {"suspend": True}})
    suspended = wait_for_phase(cluster, namespace, "pause", "Suspended")
    wait_for("no pod of the run", lambda: not pods(cluster, namespace, "pause") or None)
    conditions = {c["type"]: c for c in suspended["status"]["conditions"]}
    assert conditions["Suspended"]["status"] == "True"
    assert get(cluster, namespace, "pvc", claim)["status"]["phase"] == "Bound"
    # the templates are as they were: only whether they have pods changed
    paused = templates(cluster, namespace, "pause")
    assert {c: t["template"] for c, t in paused.items()} == {
        c: t["template"] for c, t in before.items()
    }

    patch_run(cluster, namespace, "pause", {"spec": {"suspend": False}})
    resumed = running(cluster, namespace, "pause")
    assert resumed["status"]["payloadRoot"] == root
    conditions = {c["type"]: c for c in resumed["status"]["conditions"]}
    assert (conditions["Suspended"]["status"], conditions["Suspended"]["reason"]) == (
        "False",
        "Resumed",
    )
    # the retention sidecar starts again on the same root and replays its journal
    (orchestrator,) = [
        p for p in live_pods(cluster, namespace, "pause") if "orchestrator" in p["metadata"]["name"]
    ]
    env = {e["name"]: e.get("value") for e in orchestrator["spec"]["initContainers"][0]["env"]}
    assert env["PAYLOAD_ROOT"] == root
    log = kubectl(
        cluster, namespace, "logs", orchestrator["metadata"]["name"], "-c", "payload-retention"
    )
    assert "restarted" in log, log


# --- the end -------------------------------------------------------------------------------------


def test_a_run_whose_trainers_exit_0_succeeds_and_releases_what_it_holds(operator, namespace):
    cluster = operator.cluster
    apply(
        cluster,
        namespace,
        run_manifest(
            "done",
            orchestrator=ORCHESTRATE,
            trainer=["python", "-m", "payloadrun.testing.roles", "idle", "--until", "/tmp/done"],
            trainers=2,
        ),
    )
    run = running(cluster, namespace, "done")
    claim = run["status"]["claimName"]
    volume = get(cluster, namespace, "pvc", claim)["spec"]["volumeName"]
    source = get(cluster, namespace, "pv", volume)["spec"]["flexVolume"]
    assert source["options"] == {"volume": "prnode", "subdir": volume}  # the node's GlusterFS
    host_dir = cluster.node_dir / "shared-volume" / "brick" / volume  # the server's own copy
    root_on_host = host_dir / run["status"]["payloadRoot"].removeprefix("/payloads/")
    wait_for("a payload file", lambda: list(root_on_host.glob("v0/*.bin")))

    # the orchestrator's step 7 reached its retention sidecar; then both ranks exit 0
    def component(name: str) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in live_pods(cluster, namespace, "done")
            if p["metadata"]["labels"].get("app.kubernetes.io/component") == name
        ]

    (orchestrator,) = component("orchestrator")
    wait_for("the orchestrator's policy step", lambda: "policy_updated 7" in kubectl(
        cluster, namespace, "logs", orchestrator, "-c", "orchestrator"
    ))  # fmt: skip
    for trainer in component("trainer"):
        kubectl(cluster, namespace, "exec", trainer, "-c", "trainer", "--", "touch", "/tmp/done")

    done = wait_for_phase(cluster, namespace, "done", "Succeeded")
    status = done["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Complete"]["status"] == "True"
    assert conditions["Complete"]["reason"] == "TrainersSucceeded"
    assert status["completionTime"] and status["lastStep"] == 7
    # nothing of the run runs on: inference and the orchestrator hold no GPU any more
    assert get(cluster, namespace, "statefulset", "done-inference")["spec"]["replicas"] == 0
    assert get(cluster, namespace, "job", "done-orchestrator")["spec"]["suspend"] is True
    wait_for("no live pod", lambda: not live_pods(cluster, namespace, "done") or None)

    # the payload files go (the cleanup Job); the claim goes with the run (deletionPolicy Delete)
    def released() -> Any:
        conds = {
            c["type"]: c
            for c in get(cluster, namespace, "payloadrun", "done")["status"]["conditions"]
        }
        released = conds.get("PayloadsReleased", {})
        return released.get("status") == "True" and released

    assert wait_for("PayloadsReleased", released)["reason"] == "FilesDeleted"
    assert get(cluster, namespace, "job", "done-cleanup")["status"]["succeeded"] == 1
    assert not root_on_host.exists()
    assert get(cluster, namespace, "pvc", claim)["status"]["phase"] == "Bound"
    # an operator restart changes nothing of a finished run
    operator.start()
    wait_for("the restarted operator's reconcile", lambda: operator.reconciled() >= 1)
    wait_for("the restarted operator's status passes", operator.caught_up)
    assert get(cluster, namespace, "payloadrun", "done")["status"]["phase"] == "Succeeded"
    assert not live_pods(cluster, namespace, "done")
    assert not root_on_host.exists()


def test_a_run_whose_trainer_keeps_failing_fails_and_keeps_what_debugging_needs(
    operator, namespace
):
    cluster = operator.cluster
    apply(
        cluster,
        namespace,
        run_manifest(
            "broken",
            trainer=["python", "-c", "import sys; print('loss is nan'); sys.exit(3)"],
            failurePolicy={"backoffLimit": 1},
        ),
    )
    failed = wait_for_phase(cluster, namespace, "broken", "Failed")
    status = failed["status"]
    failure = status["failure"]
    assert (failure["component"], failure["reason"], failure["exitCode"]) == (
        "trainer",
        "BackoffLimitExceeded",
        3,
    )
    assert status["completionTime"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["reason"] == "TrainerFailed"
    events = get(cluster, namespace, "events", "--field-selector", "involvedObject.name=broken")
    assert "TrainerFailed" in {e["reason"] for e in events["items"]}
    # the failed pods and their logs stay; the rest stops; the volume stays for debugging
    assert "loss is nan" in kubectl(cluster, namespace, "logs", failure["pod"], "-c", "trainer")
    wait_for("no live pod", lambda: not live_pods(cluster, namespace, "broken") or None)
    assert get(cluster, namespace, "pvc", status["claimName"])["status"]["phase"] == "Bound"

    def kept() -> Any:
        conds = {
            c["type"]: c
            for c in get(cluster, namespace, "payloadrun", "broken")["status"]["conditions"]
        }
        return conds.get("PayloadsReleased", {}).get("reason")

    assert wait_for("PayloadsReleased", kept) == "KeptAfterFailure"
