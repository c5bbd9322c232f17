"""`helm install` into the local control plane, then the operator with the chart's own identity.

The chart's image is not built for this release (its Deployment's pod cannot pull it): the
operator runs as a local process instead, authenticated with a token of the chart's
ServiceAccount and configured with the environment the chart gives its container, which lets the
test call the API with that identity directly. That proves the RBAC is sufficient (a run
reconciles) and not broader than needed (Secrets and other namespaces are denied). The operator
as the chart's real pod is in ``test_e2e.py``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from example_runs import example_run
from pod_helpers import run_helm

from payloadrun_devkit.local_operator import LocalOperator, operator_env_from_deployment
from payloadrun_devkit.release import release_version

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "payloadrun"
RELEASE = "prun"
SYSTEM_NS = "payloadrun-system"


# what a refused request leaves in the operator's log: the API's reason, or its status code
DENIED = re.compile(r"Forbidden|\b403\b")


def log_messages(log: str) -> list[str]:
    """The messages of the operator's JSON log lines (a line that is not JSON, whole)."""
    messages = []
    for line in log.splitlines():
        try:
            messages.append(str(json.loads(line).get("message", "")))
        except (ValueError, AttributeError):
            messages.append(line)
    return messages


def kubectl_json(cluster, *args: str, kubeconfig=None) -> dict:
    result = cluster.kubectl(*args, "-o", "json", kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def create_namespace(cluster, name: str) -> None:
    status, body = cluster.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    assert status in (201, 409), body


@pytest.fixture(scope="module")
def installed(kube_cluster):
    for ns in ("team-a", "team-b"):
        create_namespace(kube_cluster, ns)
    # the CRD other tests applied with kubectl goes to this release (docs/operations.md)
    adopt = subprocess.run(
        ["bash", str(REPO / "hack" / "adopt-crd.sh"), RELEASE, SYSTEM_NS],
        env={**os.environ, **kube_cluster.env()},
        capture_output=True,
        text=True,
        check=False,
    )
    assert adopt.returncode == 0, adopt.stderr
    install = run_helm(
        kube_cluster,
        "upgrade",
        "--install",
        RELEASE,
        str(CHART),
        "--namespace",
        SYSTEM_NS,
        "--create-namespace",
        "--set",
        "operator.watchNamespaces={team-a}",
        "--set",
        "sidecars.image.repository=registry.local/payloadrun",
        "--set",
        "sidecars.image.tag=test",
    )
    assert install.returncode == 0, install.stderr
    assert f"payloadrun {release_version(REPO)} is installed" in install.stdout  # NOTES.txt
    # the first run it suggests, on the images this install gives runs
    assert "examples/local-node-by-handle.yaml" in install.stdout
    assert "its image set to registry.local/payloadrun:test and" in install.stdout
    yield
    run_helm(kube_cluster, "uninstall", RELEASE, "--namespace", SYSTEM_NS)


def test_installed_objects(kube_cluster, installed):
    crd = kubectl_json(kube_cluster, "get", "crd", "payloadruns.payloadrun.dev")
    assert crd["spec"]["versions"][0]["name"] == "v1alpha1"
    sa = kubectl_json(
        kube_cluster, "get", "serviceaccount", f"{RELEASE}-payloadrun", "-n", SYSTEM_NS
    )
    assert sa["metadata"]["name"] == f"{RELEASE}-payloadrun"
    binding = kubectl_json(
        kube_cluster, "get", "rolebinding", f"{RELEASE}-payloadrun", "-n", "team-a"
    )
    assert binding["roleRef"]["name"] == f"{RELEASE}-payloadrun"
    missing = kube_cluster.kubectl("get", "rolebinding", f"{RELEASE}-payloadrun", "-n", "team-b")
    assert missing.returncode != 0
    dashboards = kubectl_json(
        kube_cluster, "get", "configmap", "-n", SYSTEM_NS, "-l", "grafana_dashboard=1"
    )
    assert len(dashboards["items"]) == 3


def test_the_release_secret_holds_the_crd_twice_within_its_limit(kube_cluster, installed):
    """Helm keeps a release in a Secret (the chart, its CRD template included, and the rendered
    manifest, gzipped), which the API server caps at 1 MiB: the 1.6 MB CRD is in it twice.
    docs/install.md gives the size, as measured here, and the headroom left."""
    status, found = kube_cluster.request(
        "GET",
        f"/api/v1/namespaces/{SYSTEM_NS}/secrets?labelSelector=owner%3Dhelm%2Cname%3D{RELEASE}",
    )
    assert status == 200, found
    latest = max(found["items"], key=lambda s: int(s["metadata"]["labels"]["version"]))
    size = len(base64.b64decode(latest["data"]["release"]))
    assert size < 0.9 * 1024 * 1024, f"the release Secret is {size} bytes, near its 1 MiB limit"
    page = (REPO / "docs" / "install.md").read_text()
    said = re.search(r"about\s+([\d.]+)\s+MB\s+of\s+the\s+Secret's\s+1\s+MiB", page)
    assert said, "docs/install.md gives no size of the release Secret"
    assert float(said[1]) == round(size / 1e6, 1), f"measured {size} bytes; the page says {said[0]}"


def test_operator_with_the_chart_identity(kube_cluster, installed, tmp_path):
    sa_config = kube_cluster.service_account_kubeconfig(
        SYSTEM_NS, f"{RELEASE}-payloadrun", tmp_path / "sa.kubeconfig"
    )
    deploy = kubectl_json(
        kube_cluster, "get", "deployment", f"{RELEASE}-payloadrun", "-n", SYSTEM_NS
    )
    env = operator_env_from_deployment(deploy)

    # denied what it does not need
    for args in (
        ("get", "secrets", "-n", "team-a"),
        ("get", "configmaps", "-n", "team-b"),
        ("get", "payloadruns", "-n", "team-b"),
        ("get", "pods", "-n", "team-b"),
        ("get", "pod", "anything", "-n", "team-a"),  # pods: list only (exit codes, addresses)
        ("delete", "job", "anything", "-n", "team-b"),
        ("delete", "pvc", "anything", "-n", "team-a"),
        ("get", "namespaces"),
        ("delete", "configmap", "anything", "-n", "team-a"),
    ):
        denied = kube_cluster.kubectl(*args, kubeconfig=sa_config)
        assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), (
            args,
            denied.stderr,
        )

    run = example_run("multinode-by-handle.yaml")
    with LocalOperator(
        sa_config, namespaces=("team-a",), env=env, log_path=tmp_path / "op.log"
    ) as op:
        created = kube_cluster.kubectl("apply", "-n", "team-a", "-f", "-", input=json.dumps(run))
        assert created.returncode == 0, created.stderr
        name = run["metadata"]["name"]
        deadline = time.monotonic() + 60
        status = {}
        while time.monotonic() < deadline:
            status = (
                kubectl_json(kube_cluster, "get", "payloadrun", name, "-n", "team-a").get("status")
                or {}
            )
            if status.get("observedGeneration") == 1:
                break
            time.sleep(0.3)
        assert status.get("payloadMode") == "ByHandle", f"{status}\n{op.log_tail()}"
        conditions = {c["type"]: c for c in status["conditions"]}
        assert conditions["Validated"]["status"] == "True"
        assert conditions["Applied"]["status"] == "True", conditions["Applied"]["message"]
        sts = kubectl_json(kube_cluster, "get", "statefulset", f"{name}-inference", "-n", "team-a")
        (writer,) = sts["spec"]["template"]["spec"]["initContainers"]
        # the sidecar image came from the chart's values, not from the run
        assert writer["image"] == "registry.local/payloadrun:test"
        # the identity may post events: a new run posts none, its suspension is news
        suspend = '{"spec": {"suspend": true}}'
        patched = kube_cluster.kubectl(
            "patch", "payloadrun", name, "-n", "team-a", "--type", "merge", "-p", suspend
        )
        assert patched.returncode == 0, patched.stderr
        reasons: set[str] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "SpecSuspended" not in reasons:
            events = kubectl_json(kube_cluster, "get", "events", "-n", "team-a")
            reasons = {e["reason"] for e in events["items"]}
            time.sleep(0.3)
        assert "SpecSuspended" in reasons, f"{reasons}\n{op.log_tail()}"
        # nothing the operator asked for was refused; read in the messages only, since a
        # timestamp (03:05:37.403) or a uid can hold the digits 403
        refused = [m for m in log_messages(op.log_tail(400)) if DENIED.search(m)]
        assert refused == [], op.log_tail()


def test_install_with_renamed_objects_extra_env_and_no_fixed_uid(kube_cluster, tmp_path):
    """The API server accepts what the new values render: a second release beside the first,
    every object named by fullnameOverride, extraEnv (a value and a valueFrom), extraArgs, and
    the OpenShift values (no fixed uid). Pods do not run here: the Deployment object is checked."""
    release, namespace, fullname = "prun-ops", "payloadrun-ops", "ml-operator"
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "fullnameOverride": fullname,
                "extraEnv": [
                    {"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"},
                    {
                        "name": "POD_NAME",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                    },
                ],
                "extraArgs": ["--host=0.0.0.0"],
                "podSecurityContext": {"runAsUser": None, "runAsGroup": None},
                # a second release beside the first: the CRD is the first one's
                "crds": {"install": False},
            }
        )
    )
    install = run_helm(
        kube_cluster,
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--create-namespace",
        "--values",
        str(values),
    )
    try:
        assert install.returncode == 0, install.stderr
        assert f"rollout status deploy/{fullname}" in install.stdout  # NOTES.txt
        deploy = kubectl_json(kube_cluster, "get", "deployment", fullname, "-n", namespace)
        pod = deploy["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["env"][-2:] == [
            {"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"},
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
        ]
        assert operator_env_from_deployment(deploy)["HTTPS_PROXY"] == "http://proxy.internal:3128"
        assert container["args"] == ["--host=0.0.0.0"]
        assert "runAsUser" not in pod["securityContext"]
        assert "runAsGroup" not in pod["securityContext"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["serviceAccountName"] == fullname
        kubectl_json(kube_cluster, "get", "serviceaccount", fullname, "-n", namespace)
        kubectl_json(kube_cluster, "get", "service", f"{fullname}-metrics", "-n", namespace)
        role = kubectl_json(kube_cluster, "get", "clusterrole", fullname)
        assert role["metadata"]["labels"]["app.kubernetes.io/instance"] == release
        binding = kubectl_json(kube_cluster, "get", "clusterrolebinding", fullname)
        assert binding["roleRef"]["name"] == fullname
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": fullname, "namespace": namespace}
        ]
        dashboards = kubectl_json(
            kube_cluster, "get", "configmap", "-n", namespace, "-l", "grafana_dashboard=1"
        )
        assert {cm["metadata"]["name"] for cm in dashboards["items"]} == {
            f"{fullname}-payloadrun-{board}" for board in ("operator", "retention", "writer")
        }
    finally:
        run_helm(kube_cluster, "uninstall", release, "--namespace", namespace)
