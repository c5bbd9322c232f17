"""Upgrade, rollback and uninstall with a live run (issue 51, item 4), on the local node, as a
platform team does them with Helm.

The previous release is the one ``CHANGELOG.md`` names (0.1.0: the tree of commit 5230ba4, never
tagged), checked out beside this tree; its images are built by its own ``hack/images.sh`` and
imported into the node, and its chart is installed from its checkout, its CRD with it. Then:

- a by-handle run started by it reaches Ready: its pods (their uids and restart counts), its
  workloads (their generations), its conditions and its pinned sidecars are recorded, and a
  payload file is written on its volume through its writer;
- ``helm upgrade`` to this tree's chart and images replaces the operator and upgrades the CRD;
  once the new operator has reconciled the run (it replaces the run's NetworkPolicies, as the
  upgrade notes say), nothing of the run restarted or moved: the same pods, no restart, the
  workloads not re-applied, the conditions' transition times and the pinned sidecars (0.1.0's
  image) unchanged, the payload file still there;
- ``helm rollback`` to the previous release: the same holds under its operator;
- ``helm uninstall``: the operator goes; the CRD, the run, its pods and its claim stay
  (``crds.keep``), as docs/operations.md says.

At the end the session's CRD (this tree's) is applied again, for the tests after this module.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pod_helpers import (
    FAKE_VLLM,
    IMAGE,
    SLEEP,
    get,
    kubectl,
    live_pods,
    node_run,
    run_helm,
    wait_for,
)

from payloadrun_devcluster.binaries import cache_dir
from payloadrun_devkit.previous import (
    PreviousReleaseMissing,
    build_previous_images,
    checkout,
    previous_release,
)
from payloadrun_devkit.required import skip_or_fail
from payloadrun_operator.api.crd import CRD_FILE
from payloadrun_operator.api.models import GROUP, PLURAL

pytestmark = [pytest.mark.integration, pytest.mark.node]

REPO = Path(__file__).resolve().parents[2]
RELEASE = "payloadrun-upgrade"  # its own release and namespace: the e2e module's may be ending
SYSTEM_NS = "payloadrun-upgrade"
NAMESPACE = "upgrade"
RUN = "live"
OPERATOR_POD = "app.kubernetes.io/name=payloadrun-operator"
WORKLOADS = ("statefulset", "job")
PAYLOAD = "before-upgrade.bin"


def chart_values(tag: str) -> list[str]:
    """The images imported into the node (never pulled), for a chart of either version."""
    return [
        "--set", "image.repository=payloadrun-operator", "--set", f"image.tag={tag}",
        "--set", "image.pullPolicy=Never",
        "--set", "sidecars.image.repository=payloadrun", "--set", f"sidecars.image.tag={tag}",
        "--set", "sidecars.image.pullPolicy=Never",
        "--set", f"operator.watchNamespaces={{{NAMESPACE}}}",
    ]  # fmt: skip


def helm(cluster, *args: str) -> str:
    done = run_helm(cluster, *args, "--namespace", SYSTEM_NS)
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done.stdout


def operator_image(cluster) -> str:
    deployment = get(
        cluster, SYSTEM_NS, "deployment", "-l", "app.kubernetes.io/instance=" + RELEASE
    )
    (found,) = deployment["items"]
    return found["spec"]["template"]["spec"]["containers"][0]["image"]


def operator_ready(cluster, image: str) -> bool:
    """Whether the release's one operator pod runs ``image`` and is ready (the old one gone)."""
    pods = get(cluster, SYSTEM_NS, "pods", "-l", OPERATOR_POD)["items"]
    return len(pods) == 1 and all(
        c["image"].endswith(image) and c.get("ready")
        for c in pods[0]["status"].get("containerStatuses", []) or [{}]
    )


def the_run(cluster) -> dict[str, Any]:
    return get(cluster, NAMESPACE, "payloadrun", RUN)


def snapshot(cluster) -> dict[str, Any]:
    """What must not move across an upgrade: the run's pods (uid, restarts per container), its
    workloads' generations, its conditions' transition times, its pinned sidecars."""
    run = the_run(cluster)
    pods = {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            {c["name"]: c["restartCount"] for c in p["status"].get("containerStatuses", [])},
        )
        for p in live_pods(cluster, NAMESPACE, RUN)
    }
    workloads = {
        f"{w['kind']}/{w['metadata']['name']}": w["metadata"]["generation"]
        for kind in WORKLOADS
        for w in get(cluster, NAMESPACE, kind, "-l", f"payloadrun.dev/run={RUN}")["items"]
    }
    conditions = {
        c["type"]: (c["status"], c["reason"], c["lastTransitionTime"])
        for c in run["status"].get("conditions", [])
        if c["type"] in ("Ready", "Validated", "VolumeReady")
    }
    return {
        "pods": pods,
        "workloads": workloads,
        "conditions": conditions,
        "sidecars": run["status"]["sidecars"]["image"],
        "phase": run["status"]["phase"],
    }


def policies(cluster) -> dict[str, str]:
    """The run's NetworkPolicies: name -> resourceVersion."""
    found = get(cluster, NAMESPACE, "networkpolicy", "-l", f"payloadrun.dev/run={RUN}")["items"]
    return {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in found}


def writer_pod(cluster) -> str:
    pods = [
        p for p in live_pods(cluster, NAMESPACE, RUN)
        if p["metadata"]["labels"].get("app.kubernetes.io/component") == "inference"
    ]  # fmt: skip
    return pods[0]["metadata"]["name"]


def payload_files(cluster) -> list[str]:
    out = kubectl(
        cluster, NAMESPACE, "exec", writer_pod(cluster), "-c", "payload-writer", "--",
        "python", "-c", "import os, sys; print('\\n'.join(sorted(os.listdir(sys.argv[1]))))",
        the_run(cluster)["status"]["payloadRoot"],
    )  # fmt: skip
    return out.split()


@pytest.fixture(scope="module")
def previous(node_cluster, tmp_path_factory):
    """The previous release's checkout, its images in the node."""
    release = previous_release(REPO)
    try:
        tree = checkout(REPO, release, tmp_path_factory.mktemp("previous") / release.version)
    except PreviousReleaseMissing as missing:
        skip_or_fail(str(missing))
        raise
    node_cluster.load_images(list(build_previous_images(tree, release, cache_dir()).values()))
    return release, tree


@pytest.fixture(scope="module")
def installed(node_cluster, previous):
    """The previous release installed by its own chart, its operator watching ``NAMESPACE``;
    at the end: uninstalled, the namespaces gone, this tree's CRD applied again."""
    release, tree = previous
    cluster = node_cluster
    for namespace in (SYSTEM_NS, NAMESPACE):
        cluster.kubectl("create", "namespace", namespace)
    adopted = subprocess.run(
        ["bash", str(REPO / "hack" / "adopt-crd.sh"), RELEASE, SYSTEM_NS],
        capture_output=True, text=True, env={**os.environ, **cluster.env()}, check=False,
        timeout=60,
    )  # fmt: skip
    assert adopted.returncode == 0, adopted.stderr
    try:
        helm(cluster, "install", RELEASE, str(tree / "charts" / "payloadrun"),
             *chart_values(release.version), "--wait", "--timeout", "180s")  # fmt: skip
        yield release
    finally:
        run_helm(cluster, "uninstall", RELEASE, "--namespace", SYSTEM_NS, "--wait")
        cluster.kubectl("delete", "namespace", NAMESPACE, SYSTEM_NS, "--wait=true",
                        "--timeout=120s")  # fmt: skip
        applied = cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_FILE)
        )
        assert applied.returncode == 0, applied.stderr
        cluster.wait_established(f"{PLURAL}.{GROUP}")


def test_a_live_run_survives_upgrade_rollback_and_uninstall(node_cluster, installed):
    cluster = node_cluster
    previous_version = installed.version
    body = node_run(
        RUN,
        namespace=NAMESPACE,
        inference={"image": IMAGE, "command": FAKE_VLLM},
        orchestrator={"image": IMAGE, "command": SLEEP},
        trainer={"image": IMAGE, "command": SLEEP, "replicas": 1},
    )
    kubectl(cluster, NAMESPACE, "create", "-f", "-", input=json.dumps(body))
    wait_for(
        "the run Running under the previous release",
        lambda: the_run(cluster).get("status", {}).get("phase") == "Running",
        seen=lambda: the_run(cluster).get("status"),
    )
    before = snapshot(cluster)
    assert before["sidecars"].endswith(f"payloadrun:{previous_version}")
    root = the_run(cluster)["status"]["payloadRoot"]
    kubectl(
        cluster, NAMESPACE, "exec", writer_pod(cluster), "-c", "payload-writer", "--",
        "python", "-c", "import sys; open(sys.argv[1], 'xb').write(b'x' * 4096)",
        f"{root}/{PAYLOAD}",
    )  # fmt: skip
    old_policies = policies(cluster)
    assert old_policies

    # helm upgrade to this tree: the new operator reconciles the run (its policies replaced,
    # as the upgrade notes say) and nothing else of the run moves
    helm(cluster, "upgrade", RELEASE, str(REPO / "charts" / "payloadrun"), *chart_values("e2e"),
         "--wait", "--timeout", "180s")  # fmt: skip
    assert operator_image(cluster).endswith("payloadrun-operator:e2e")
    wait_for("the new operator ready", lambda: operator_ready(cluster, "payloadrun-operator:e2e"))
    wait_for(
        "the run's NetworkPolicies replaced by the new operator",
        lambda: all(policies(cluster).get(n) not in (None, v) for n, v in old_policies.items()),
        seen=lambda: (old_policies, policies(cluster)),
    )
    assert snapshot(cluster) == before
    assert PAYLOAD in payload_files(cluster)

    # helm rollback: the previous operator again, the run as it was
    upgraded_policies = policies(cluster)
    helm(cluster, "rollback", RELEASE, "1", "--wait", "--timeout", "180s")
    wait_for(
        "the previous operator ready",
        lambda: operator_ready(cluster, f"payloadrun-operator:{previous_version}"),
    )
    wait_for(
        "the run's NetworkPolicies replaced by the previous operator",
        lambda: all(
            policies(cluster).get(n) not in (None, v) for n, v in upgraded_policies.items()
        ),
        seen=lambda: (upgraded_policies, policies(cluster)),
    )
    assert snapshot(cluster) == before
    assert PAYLOAD in payload_files(cluster)

    # helm uninstall: the operator goes, the CRD (crds.keep), the run, its pods and claim stay
    helm(cluster, "uninstall", RELEASE, "--wait")
    wait_for(
        "no operator pod", lambda: not get(cluster, SYSTEM_NS, "pods", "-l", OPERATOR_POD)["items"]
    )
    assert cluster.kubectl("get", "crd", f"{PLURAL}.{GROUP}").returncode == 0
    assert snapshot(cluster) == before
    claim = the_run(cluster)["status"]["claimName"]
    assert get(cluster, NAMESPACE, "pvc", claim)["status"]["phase"] == "Bound"
