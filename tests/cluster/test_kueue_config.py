"""Kueue's install on the local node, its pure parts: the manager's configuration, which webhooks
are scoped, the overlay on upstream's config/default, and the queue objects tests create."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from payloadrun_devcluster import addons, kueue
from payloadrun_devcluster.binaries import BinariesMissing, expected_binaries
from payloadrun_devkit.required import skip_or_fail

SCOPED = {"matchLabels": {"payloadrun.dev/kueue-tests": "true"}}

RENDERED = """\
apiVersion: v1
kind: Namespace
metadata:
  name: kueue-system
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  labels:
    app.kubernetes.io/name: kueue
  name: kueue-mutating-webhook-configuration
webhooks:
- admissionReviewVersions:
  - v1
  clientConfig:
    service:
      name: kueue-webhook-service
      namespace: kueue-system
      path: /mutate-batch-v1-job
  failurePolicy: Fail
  name: mjob.kb.io
  namespaceSelector:
    matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
      - kube-system
  rules:
  - apiGroups:
    - batch
    resources:
    - jobs
  sideEffects: None
- admissionReviewVersions:
  - v1
  clientConfig:
    service:
      name: kueue-webhook-service
  name: mworkload.kb.io
  rules:
  - apiGroups:
    - kueue.x-k8s.io
    resources:
    - workloads
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: kueue-validating-webhook-configuration
webhooks:
- name: vpod.kb.io
  namespaceSelector:
    matchExpressions: []
"""


def test_the_webhooks_upstream_scopes_by_namespace_are_found_in_its_render():
    assert kueue.namespace_scoped_webhooks(RENDERED) == {
        ("MutatingWebhookConfiguration", "kueue-mutating-webhook-configuration"): ["mjob.kb.io"],
        ("ValidatingWebhookConfiguration", "kueue-validating-webhook-configuration"): [
            "vpod.kb.io"
        ],
    }


def test_the_manager_looks_at_labelled_namespaces_and_serves_no_aggregated_api():
    config = kueue.manager_configuration()
    assert config["managedJobsNamespaceSelector"] == SCOPED
    assert config["manageJobsWithoutQueueName"] is False
    assert config["featureGates"] == {"VisibilityOnDemand": False}
    assert "externalFrameworks" not in config["integrations"]
    assert {"batch/job", "pod", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset"} <= set(
        config["integrations"]["frameworks"]
    )


def test_the_overlay_scopes_the_webhooks_and_leaves_the_visibility_api_out():
    scoped = {("MutatingWebhookConfiguration", "m"): ["mjob.kb.io", "mpod.kb.io"]}
    kustomization = kueue.overlay("../base", "localhost/payloadrun-kueue:v0-abc", scoped)
    assert kustomization["resources"] == ["../base"]
    deployment, config_map, webhooks, *visibility = kustomization["patches"]

    assert deployment["target"] == {"group": "apps", "kind": "Deployment", "name": kueue.DEPLOYMENT}
    ops = json.loads(deployment["patch"])
    container = "/spec/template/spec/containers/0"
    assert {op["path"]: op["value"] for op in ops if op["op"] == "replace"} == {
        f"{container}/image": "localhost/payloadrun-kueue:v0-abc",
        f"{container}/imagePullPolicy": "Never",
        f"{container}/resources/requests/cpu": kueue.CPU_REQUEST,
    }
    # each replaced field guarded by a test of upstream's value (or name) before it
    assert {op["path"]: op["value"] for op in ops if op["op"] == "test"} == {
        f"{container}/name": kueue.CONTAINER,
        f"{container}/imagePullPolicy": "Always",
        f"{container}/resources/requests/cpu": kueue.UPSTREAM_CPU_REQUEST,
    }

    assert config_map["target"]["name"] == kueue.CONFIG_MAP
    (op,) = json.loads(config_map["patch"])
    assert (op["op"], op["path"]) == ("replace", f"/data/{kueue.CONFIG_KEY}")
    assert json.loads(op["value"]) == kueue.manager_configuration()

    patch = json.loads(webhooks["patch"])
    assert (patch["kind"], patch["metadata"]["name"]) == ("MutatingWebhookConfiguration", "m")
    assert patch["webhooks"] == [
        {"name": name, "namespaceSelector": {"$patch": "replace", **SCOPED}}
        for name in ("mjob.kb.io", "mpod.kb.io")
    ]

    assert [json.loads(p["patch"]) for p in visibility] == [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": name},
            "$patch": "delete",
        }
        for name in ("v1beta1.visibility.kueue.x-k8s.io", "v1beta2.visibility.kueue.x-k8s.io")
    ]


def test_a_quota_is_a_flavor_a_cluster_queue_of_it_and_a_local_queue_feeding_it():
    flavor, cq, lq = kueue.quota(
        "ns",
        {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": 2},
        name="q",
        node_labels={"pool": "gpu"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        preempt_lower_priority=True,
    )
    assert flavor["kind"] == "ResourceFlavor" and flavor["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert flavor["spec"] == {
        "nodeLabels": {"pool": "gpu"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    assert cq["kind"] == "ClusterQueue" and cq["metadata"] == {"name": "q"}
    (group,) = cq["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    assert group["flavors"] == [
        {
            "name": "q",
            "resources": [
                {"name": "cpu", "nominalQuota": "4"},
                {"name": "memory", "nominalQuota": "8Gi"},
                {"name": "nvidia.com/gpu", "nominalQuota": "2"},
            ],
        }
    ]
    assert cq["spec"]["namespaceSelector"] == {}  # every namespace; null would admit none
    assert cq["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority"}
    assert lq == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "q", "namespace": "ns"},
        "spec": {"clusterQueue": "q"},
    }
    assert "preemption" not in kueue.cluster_queue("q", "f", {"cpu": 1})["spec"]
    assert kueue.workload_priority_class("high", 1000) == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": "high"},
        "value": 1000,
    }


def test_the_pinned_version_is_where_build_sh_puts_it():
    build = kueue.expected_build({"KUEUE_VERSION": "v9.9.9"})
    assert build.manager.parent.name == "kueue-v9.9.9" and build.manager.name == "manager"
    assert build.default_kustomization == build.config / "default"


def test_a_missing_build_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("PAYLOADRUN_CACHE", str(tmp_path))
    with pytest.raises(BinariesMissing, match=r"bash cluster/build\.sh"):
        kueue.find_build()


def test_upstreams_config_renders_with_the_overlay(tmp_path):
    """With the pinned build present: kubectl's kustomize renders it, and it differs from
    upstream's own render exactly by the changes the overlay lists."""
    try:
        build = kueue.find_build()
    except BinariesMissing as error:
        skip_or_fail(str(error))
    kubectl = expected_binaries().kubectl
    if not os.access(kubectl, os.X_OK):
        skip_or_fail(f"kubectl is not built: {kubectl}")

    def render(directory: Path) -> str:
        return subprocess.run(
            [str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, check=True
        ).stdout

    upstream_text = render(build.default_kustomization)
    scoped = kueue.namespace_scoped_webhooks(upstream_text)
    overlay_dir = tmp_path / "overlay"
    overlay_dir.mkdir()
    (overlay_dir / "kustomization.yaml").write_text(
        json.dumps(
            kueue.overlay(
                addons.relative_to(build.default_kustomization, overlay_dir), "x:y", scoped
            )
        )
    )

    def objects(text: str) -> dict[tuple[str, str], dict]:
        return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(text) if o}

    upstream, ours = objects(upstream_text), objects(render(overlay_dir))
    assert set(upstream) - set(ours) == {
        ("APIService", name) for name in kueue.VISIBILITY_API_SERVICES
    }
    assert set(ours) <= set(upstream)
    changed = {key for key in ours if ours[key] != upstream[key]}
    hooks = {key for key in changed if key[0] in kueue.WEBHOOK_KINDS}
    assert changed - hooks == {
        ("ConfigMap", kueue.CONFIG_MAP),
        ("Deployment", kueue.DEPLOYMENT),
    }
    for key in hooks:
        theirs = {w["name"]: w for w in upstream[key]["webhooks"]}
        mine = {w["name"]: w for w in ours[key]["webhooks"]}
        assert set(mine) == set(theirs), key
        for name, hook in mine.items():
            if name in scoped[key]:  # upstream's namespace scope, replaced by the label's
                assert hook["namespaceSelector"] == SCOPED, name
                rest = {k: v for k, v in hook.items() if k != "namespaceSelector"}
                assert rest == {k: v for k, v in theirs[name].items() if k != "namespaceSelector"}
            else:
                assert hook == theirs[name], name
        # the scoped ones are exactly those on other APIs' objects
        assert sorted(scoped[key]) == sorted(
            name
            for name, hook in mine.items()
            if {g for rule in hook["rules"] for g in rule["apiGroups"]} != {kueue.GROUP}
        )
    assert len(scoped) == 2 and all(len(names) > 10 for names in scoped.values())

    (container,) = ours[("Deployment", kueue.DEPLOYMENT)]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "x:y" and container["imagePullPolicy"] == "Never"
    assert container["resources"]["requests"]["cpu"] == kueue.CPU_REQUEST
    config = ours[("ConfigMap", kueue.CONFIG_MAP)]["data"][kueue.CONFIG_KEY]
    assert yaml.safe_load(config) == kueue.manager_configuration()
