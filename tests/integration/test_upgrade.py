"""Upgrade, rollback and uninstall with a live run (issue 51, items 3 and 4), on the local node,
as a platform team does them: with Helm, with the release's manifests, with the CRD alone.

The previous release is the one ``CHANGELOG.md`` names (0.1.0: the tree of commit 5230ba4, never
tagged), checked out beside this tree (``payloadrun_devkit.previous``); its images are built by
its own ``hack/images.sh`` and imported into the node. One by-handle run lives through it all:

- started by the previous release (``helm install`` of its chart from its checkout), it reaches
  Running: its pods (their uids and restart counts), its workloads (their generations), its
  conditions and its pinned sidecars are recorded, and a payload file is written on its volume;
- ``helm upgrade`` to this tree's chart and images replaces the operator and upgrades the CRD;
  once the new operator has reconciled the run (it replaces the run's NetworkPolicies, as the
  upgrade notes say), nothing of the run restarted or moved: the same pods, no restart, the
  workloads not re-applied, the conditions' transition times and the pinned sidecars (the
  previous image) unchanged, the payload file still there;
- ``helm rollback``: the same under the previous operator again; ``helm uninstall``: the
  operator goes, the CRD (``crds.keep``), the run, its pods and its claim stay;
- the previous release's ``payloadrun.yaml`` (rendered from its chart as ``hack/publish.sh
  manifests`` renders this tree's; 0.1.0 had no such script), applied with ``kubectl apply
  --server-side``: its operator takes the run over unchanged; then this tree's, the same; then
  the uninstall docs/install.md gives (the namespace and the chart's RBAC, never the CRD): the
  CRD and the run stay. The images carry the names the manifests pull (``ghcr.io/payloadrun``)
  in the node's containerd, as a mirror would serve them;
- the third way, for clusters whose admins own CRDs: the CRD alone, then the chart with
  ``crds.install=false``: its operator takes the run over unchanged, its release holds no CRD,
  and its uninstall leaves the CRD.

At the end the session's CRD (this tree's) is applied again, for the tests after this module.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
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
    Release,
    build_previous_images,
    checkout,
    previous_release,
)
from payloadrun_devkit.release import release_version
from payloadrun_devkit.required import skip_or_fail
from payloadrun_operator.api.crd import CRD_FILE
from payloadrun_operator.api.models import GROUP, PLURAL
from payloadrun_operator.api.names import QUEUE_NAME_LABEL

pytestmark = [pytest.mark.integration, pytest.mark.node]

REPO = Path(__file__).resolve().parents[2]
RELEASE = "payloadrun-upgrade"  # its own release and namespace: the e2e module's may be ending
HELM_NS = "payloadrun-upgrade"
MANIFESTS_NS = "payloadrun-system"  # the manifests' own
RUN = "live"
OPERATOR_POD = "app.kubernetes.io/name=payloadrun-operator"
WORKLOADS = ("statefulset", "job")
PAYLOAD = "before-upgrade.bin"
REGISTRY = "ghcr.io/payloadrun"  # where the chart's defaults and the manifests pull from


class LiveRun:
    """The by-handle run of one test, in a namespace of its own."""

    def __init__(self, cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace

    def create(self, labels: dict[str, str]) -> None:
        body = node_run(
            RUN,
            namespace=self.namespace,
            inference={"image": IMAGE, "command": FAKE_VLLM},
            orchestrator={"image": IMAGE, "command": SLEEP},
            trainer={"image": IMAGE, "command": SLEEP, "replicas": 1},
        )
        body["metadata"]["labels"] = labels
        kubectl(self.cluster, self.namespace, "create", "-f", "-", input=json.dumps(body))
        wait_for(
            "the run Running under the previous release",
            lambda: self.get().get("status", {}).get("phase") == "Running",
            seen=lambda: self.get().get("status"),
        )

    def get(self) -> dict[str, Any]:
        return get(self.cluster, self.namespace, "payloadrun", RUN)

    def snapshot(self) -> dict[str, Any]:
        """What must not move across an upgrade: the run's pods (uid, restarts per container),
        its workloads' generations, its conditions' transition times, its pinned sidecars."""
        run = self.get()
        pods = {
            p["metadata"]["name"]: (
                p["metadata"]["uid"],
                {c["name"]: c["restartCount"] for c in p["status"].get("containerStatuses", [])},
            )
            for p in live_pods(self.cluster, self.namespace, RUN)
        }
        selector = f"payloadrun.dev/run={RUN}"
        workloads = {
            f"{w['kind']}/{w['metadata']['name']}": w["metadata"]["generation"]
            for kind in WORKLOADS
            for w in get(self.cluster, self.namespace, kind, "-l", selector)["items"]
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

    def condition(self, ctype: str) -> dict[str, Any] | None:
        conditions = self.get().get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == ctype), None)

    def policies(self) -> dict[str, str]:
        """The run's NetworkPolicies: name -> resourceVersion."""
        selector = f"payloadrun.dev/run={RUN}"
        found = get(self.cluster, self.namespace, "networkpolicy", "-l", selector)["items"]
        return {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in found}

    def wait_reconciled_by_another_operator(self, before: dict[str, str], who: str) -> None:
        """Until every NetworkPolicy of ``before`` has been replaced (an upgrade's first
        reconcile of the run by ``who``)."""
        wait_for(
            f"the run's NetworkPolicies replaced by {who}",
            lambda: all(self.policies().get(n) not in (None, v) for n, v in before.items()),
            seen=lambda: (before, self.policies()),
        )

    def _writer(self, *python: str) -> str:
        (pod,) = [
            p["metadata"]["name"]
            for p in live_pods(self.cluster, self.namespace, RUN)
            if p["metadata"]["labels"].get("app.kubernetes.io/component") == "inference"
        ]
        return kubectl(
            self.cluster, self.namespace, "exec", pod, "-c", "payload-writer", "--", "python",
            "-c", *python,
        )  # fmt: skip

    def write_payload(self) -> None:
        root = self.get()["status"]["payloadRoot"]
        script = "import sys; open(sys.argv[1], 'xb').write(b'x' * 4096)"
        self._writer(script, f"{root}/{PAYLOAD}")

    def payload_files(self) -> list[str]:
        root = self.get()["status"]["payloadRoot"]
        return self._writer("import os, sys; print(*sorted(os.listdir(sys.argv[1])))", root).split()


def operator_ready(cluster, namespace: str, image: str) -> bool:
    """Whether the one operator pod in ``namespace`` runs ``image``, ready (the old one gone).
    The pod's spec names the image: its status may give another name of the same image (the
    node's containerd reports the first of its tags)."""
    pods = get(cluster, namespace, "pods", "-l", OPERATOR_POD)["items"]
    if len(pods) != 1:
        return False
    (container,) = pods[0]["spec"]["containers"]
    statuses = pods[0]["status"].get("containerStatuses") or []
    return container["image"].endswith(image) and bool(statuses) and statuses[0].get("ready")


def operator_log(cluster, namespace: str) -> str:
    found = cluster.kubectl("logs", "-n", namespace, "-l", OPERATOR_POD, "--tail=-1")
    return found.stdout if found.returncode == 0 else ""


@pytest.fixture(scope="module")
def previous(node_cluster, tmp_path_factory) -> tuple[Release, Path]:
    """The previous release's checkout, its images in the node."""
    release = previous_release(REPO)
    try:
        tree = checkout(REPO, release, tmp_path_factory.mktemp("previous") / release.version)
    except PreviousReleaseMissing as missing:
        skip_or_fail(str(missing))
        raise
    node_cluster.load_images(list(build_previous_images(tree, release, cache_dir()).values()))
    return release, tree


@pytest.fixture
def fresh_namespaces(node_cluster, request) -> Iterator[LiveRun]:
    """The namespaces a test names (its run's first) made anew, deleted at its end, and this
    tree's CRD applied again then (a test may leave the previous release's)."""
    cluster = node_cluster
    namespaces: tuple[str, ...] = request.param
    for namespace in namespaces:  # the e2e module deletes payloadrun-system without waiting
        cluster.kubectl("wait", "--for=delete", f"namespace/{namespace}", "--timeout=180s")
        created = cluster.kubectl("create", "namespace", namespace)
        assert created.returncode == 0, created.stderr
    try:
        yield LiveRun(cluster, namespaces[0])
    finally:
        cluster.kubectl("delete", "namespace", *namespaces, "--wait=true", "--timeout=180s")
        applied = cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_FILE)
        )
        assert applied.returncode == 0, applied.stderr
        cluster.wait_established(f"{PLURAL}.{GROUP}")


# ---- the three ways: Helm, the manifests, the CRD alone ----------------------------------------
def chart_values(tag: str, namespace: str) -> list[str]:
    """The images imported into the node (never pulled), for a chart of either version."""
    return [
        "--set", "image.repository=payloadrun-operator", "--set", f"image.tag={tag}",
        "--set", "image.pullPolicy=Never",
        "--set", "sidecars.image.repository=payloadrun", "--set", f"sidecars.image.tag={tag}",
        "--set", "sidecars.image.pullPolicy=Never",
        "--set", f"operator.watchNamespaces={{{namespace}}}",
    ]  # fmt: skip


def helm(cluster, *args: str) -> str:
    done = run_helm(cluster, *args, "--namespace", HELM_NS)
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done.stdout


# the manifests: rendered as hack/publish.sh manifests renders them
def manifests(cluster, chart: Path, version: str, watched: str) -> str:
    """``payloadrun.yaml`` as ``hack/publish.sh manifests`` renders it from ``chart`` at
    ``version``, the operator watching ``watched`` (a value set as docs/install.md says: the
    chart rendered with ``helm template``)."""
    done = run_helm(
        cluster, "template", "payloadrun", str(chart), "--namespace", MANIFESTS_NS,
        "--version", version, "--set", f"operator.watchNamespaces={{{watched}}}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {MANIFESTS_NS}\n{done.stdout}"


def apply_manifests(cluster, text: str) -> None:
    # --force-conflicts: the session's CRD was applied by other field managers (kubectl, helm)
    applied = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=text)
    assert applied.returncode == 0, applied.stderr
    rolled = cluster.kubectl(
        "rollout", "status", "deployment/payloadrun", "-n", MANIFESTS_NS, "--timeout=180s"
    )
    assert rolled.returncode == 0, rolled.stderr


def as_published(cluster, imported: str, version: str) -> None:
    """The node's ``payloadrun[-operator]:<imported>`` also under the name the manifests pull,
    ``ghcr.io/payloadrun/...:<version>`` (pull policy IfNotPresent: found, never pulled)."""
    for image in ("payloadrun", "payloadrun-operator"):
        tagged = cluster.node.ctr(
            "images", "tag", "--force", f"docker.io/library/{image}:{imported}",
            f"{REGISTRY}/{image}:{version}",
        )  # fmt: skip
        assert tagged.returncode == 0, tagged.stderr


# docs/install.md's uninstall of the manifests: all but the CRD (which would take every run)
UNINSTALL = (
    ("delete", "namespace", MANIFESTS_NS, "--wait=true", "--timeout=180s"),
    ("delete", "clusterrole,clusterrolebinding,role,rolebinding", "--all-namespaces",
     "-l", "app.kubernetes.io/instance=payloadrun"),
)  # fmt: skip


@pytest.mark.parametrize("fresh_namespaces", [("upgrade", HELM_NS, MANIFESTS_NS)], indirect=True)
def test_a_live_run_through_helm_upgrade_rollback_uninstall_then_the_manifests(
    node_cluster, kueue, previous, fresh_namespaces
):
    cluster, (release, tree), run = node_cluster, previous, fresh_namespaces
    version = release_version(REPO)
    adopted = subprocess.run(  # the session's CRD, applied with kubectl, goes to this release
        ["bash", str(REPO / "hack" / "adopt-crd.sh"), RELEASE, HELM_NS],
        capture_output=True, text=True, env={**os.environ, **cluster.env()}, check=False,
        timeout=60,
    )  # fmt: skip
    assert adopted.returncode == 0, adopted.stderr
    values = chart_values(release.version, run.namespace)
    helm(cluster, "install", RELEASE, str(tree / "charts" / "payloadrun"), *values, "--wait")
    try:
        run.create(labels={QUEUE_NAME_LABEL: "team-a"})  # which 0.1.0 does not know
        before = run.snapshot()
        assert before["sidecars"] == f"payloadrun:{release.version}"
        run.write_payload()
        policies = run.policies()
        assert policies

        # helm upgrade to this tree: nothing of the run moves
        values = chart_values("e2e", run.namespace)
        helm(cluster, "upgrade", RELEASE, str(REPO / "charts" / "payloadrun"), *values, "--wait")
        wait_for(
            "the new operator ready",
            lambda: operator_ready(cluster, HELM_NS, "payloadrun-operator:e2e"),
        )
        run.wait_reconciled_by_another_operator(policies, "this tree's operator")
        assert run.snapshot() == before
        assert PAYLOAD in run.payload_files()
        # its queue label, which 0.1.0 ignored, does not stop it: Kueue serves its API here,
        # and the run's pods started unqueued, so it runs on, unqueued, and says so
        admitted = wait_for("the Admitted condition", lambda: run.condition("Admitted"))
        assert (admitted["status"], admitted["reason"]) == ("False", "StartedUnqueued")
        assert cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-n", run.namespace,
                               "-o", "name").stdout == ""  # fmt: skip

        # helm rollback: the previous operator again, the run as it was
        policies = run.policies()
        helm(cluster, "rollback", RELEASE, "1", "--wait")
        wait_for(
            "the previous operator ready",
            lambda: operator_ready(cluster, HELM_NS, f"payloadrun-operator:{release.version}"),
        )
        run.wait_reconciled_by_another_operator(policies, "the previous operator")
        assert run.snapshot() == before
    finally:
        uninstalled = run_helm(cluster, "uninstall", RELEASE, "--namespace", HELM_NS, "--wait")
    # helm uninstall: the operator goes; the CRD (crds.keep), the run, its pods and claim stay
    assert uninstalled.returncode == 0, uninstalled.stderr
    wait_for("no operator", lambda: not get(cluster, HELM_NS, "pods", "-l", OPERATOR_POD)["items"])
    assert cluster.kubectl("get", "crd", f"{PLURAL}.{GROUP}").returncode == 0
    assert run.snapshot() == before
    claim = run.get()["status"]["claimName"]
    assert get(cluster, run.namespace, "pvc", claim)["status"]["phase"] == "Bound"

    # the same run, now under the release's manifests: the previous release's, then this tree's
    as_published(cluster, release.version, release.version)
    as_published(cluster, "e2e", version)
    try:
        previous_chart = tree / "charts" / "payloadrun"
        apply_manifests(cluster, manifests(cluster, previous_chart, release.version, run.namespace))
        wait_for(  # the same version as the run's last operator: the policies stay as they are
            "the previous release's operator resuming the run",
            lambda: "Resuming is processed: 1 succeeded" in operator_log(cluster, MANIFESTS_NS),
        )
        assert run.snapshot() == before
        policies = run.policies()
        chart = REPO / "charts" / "payloadrun"
        apply_manifests(cluster, manifests(cluster, chart, version, run.namespace))
        wait_for(
            "the new operator ready",
            lambda: operator_ready(cluster, MANIFESTS_NS, f"payloadrun-operator:{version}"),
        )
        run.wait_reconciled_by_another_operator(policies, "this tree's manifests")
        assert run.snapshot() == before
        assert PAYLOAD in run.payload_files()
    finally:
        for command in UNINSTALL:
            done = cluster.kubectl(*command)
            assert done.returncode == 0, done.stderr
    assert cluster.kubectl("get", "crd", f"{PLURAL}.{GROUP}").returncode == 0
    assert run.snapshot() == before

    # the third way: the CRD alone (a cluster admin's apply of payloadrun-crd.yaml, which is
    # crds/ as it is: test_release_manifests.py), then the chart without it: its operator takes
    # the run over unchanged, and its uninstall leaves the CRD it never owned
    applied = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_FILE)
    )
    assert applied.returncode == 0, applied.stderr
    values = [*chart_values("e2e", run.namespace), "--set", "crds.install=false"]
    helm(cluster, "install", RELEASE, str(REPO / "charts" / "payloadrun"), *values, "--wait")
    try:
        manifest = helm(cluster, "get", "manifest", RELEASE)
        assert "kind: CustomResourceDefinition" not in manifest
        wait_for(
            "the chart's operator resuming the run",
            lambda: "Resuming is processed: 1 succeeded" in operator_log(cluster, HELM_NS),
        )
        assert run.snapshot() == before
    finally:
        uninstalled = run_helm(cluster, "uninstall", RELEASE, "--namespace", HELM_NS, "--wait")
    assert uninstalled.returncode == 0, uninstalled.stderr
    assert cluster.kubectl("get", "crd", f"{PLURAL}.{GROUP}").returncode == 0
    assert run.snapshot() == before
