"""The Helm chart: lint, rendering with default and other values, the schema, the CRD copy."""

import json
import re

import pytest

from payloadrun_operator.api.crd import CHART_CRD_FILE, build_crd, render_chart_template

from .conftest import CHART, REPO, VERSION, by_kind, env_of, refused, render, run_helm


def test_lint(helm):
    run_helm(helm, "lint", "--strict", str(CHART))


def test_chart_crd_is_the_generated_one(helm):
    assert (REPO / CHART_CRD_FILE).read_text() == render_chart_template(), (
        f"{CHART_CRD_FILE} drifted from the models: regenerate it with "
        f"`python -m payloadrun_operator.api.crd --chart > {CHART_CRD_FILE}`"
    )
    # a template, so `helm upgrade` upgrades it (Helm never upgrades a chart's crds/)
    assert not (CHART / "crds").exists()
    (crd,) = by_kind(render(helm, crd=True))["CustomResourceDefinition"]
    assert crd["spec"] == build_crd()["spec"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert (
        "annotations"
        not in by_kind(render(helm, "crds.keep=false", crd=True))["CustomResourceDefinition"][0][
            "metadata"
        ]
    )
    assert "CustomResourceDefinition" not in by_kind(render(helm, "crds.install=false", crd=True))


def test_defaults(helm):
    kinds = by_kind(render(helm))
    assert sorted(kinds) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    (deploy,) = kinds["Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    # one pod acts, on the leader election's Lease; an upgrade starts the new one as a standby
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (election,) = kinds["Role"]
    assert election["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [deploy["metadata"]["name"]],
            "verbs": ["get", "update"],
        },
    ]
    env = env_of(pod["containers"][0])
    assert env["PAYLOADRUN_LEASE_NAME"] == deploy["metadata"]["name"]
    assert env["PAYLOADRUN_LEASE_NAMESPACE"] == deploy["metadata"]["namespace"]
    # the restrictive defaults, exactly (podSecurityContext and securityContext in values.yaml)
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "priorityClassName" not in pod
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "args" not in container
    assert container["image"] == f"ghcr.io/payloadrun/payloadrun-operator:{VERSION}"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["port"] == "health"
    # Ready within a second of /healthz answering, not a readiness period later; time to start
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/healthz", "port": "health"}
    assert startup["periodSeconds"] == 1
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30
    assert container["resources"]["limits"]["memory"] == "512Mi"
    env = env_of(container)
    # the sidecar defaults flow from the chart to the operator, so runs name no sidecar image
    assert env["PAYLOADRUN_SIDECAR_IMAGE"] == f"ghcr.io/payloadrun/payloadrun:{VERSION}"
    assert json.loads(env["PAYLOADRUN_WRITER_RESOURCES"])["limits"]["memory"] == "4Gi"
    # structured logs in a cluster, the operator's and the sidecars' alike
    assert env["PAYLOADRUN_LOG_FORMAT"] == env["PAYLOADRUN_SIDECAR_LOG_FORMAT"] == "json"
    assert env["PAYLOADRUN_NAMESPACES"] == ""
    assert pod["serviceAccountName"] == "rel-payloadrun"
    dashboards = [c for c in kinds["ConfigMap"] if c["metadata"]["labels"].get("grafana_dashboard")]
    assert len(dashboards) == 3
    for cm in dashboards:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_rbac_grants_only_what_the_operator_calls(helm):
    roles = {r["metadata"]["name"]: r for r in by_kind(render(helm))["ClusterRole"]}
    assert sorted(roles) == ["rel-payloadrun", "rel-payloadrun-kueue"]
    role = roles["rel-payloadrun"]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    resources = {r for _, r, _ in granted}
    assert "secrets" not in resources and "*" not in resources
    assert not any(verb in ("deletecollection", "*", "update") for _, _, verb in granted)
    # deletes: only a Job whose template changed (a Job's template is immutable)
    # and a queued run's Workload whose pod sets changed while it held quota (Kueue refuses to
    # change them: a new Workload is queued)
    deletes = {(group, resource) for group, resource, verb in granted if verb == "delete"}
    assert deletes == {("batch", "jobs"), ("kueue.x-k8s.io", "workloads")}
    # pods: listed only (a failed Job's exit code, the orchestrator's address)
    assert {verb for _, resource, verb in granted if resource == "pods"} == {"list"}
    # pod templates: created as dry runs only (a group run's templates checked)
    assert {verb for _, resource, verb in granted if resource == "podtemplates"} == {"create"}
    # events: posted (core and events.k8s.io), and listed in the core group only (a
    # LeaderWorkerSet's Warnings, by field selector): never watched, never deleted
    events = {(g, v) for g, r, v in granted if r == "events"}
    assert events == {(g, v) for g in ("", "events.k8s.io") for v in ("create", "patch")} | {
        ("", "list")
    }
    assert ("payloadrun.dev", "payloadruns/status", "patch") in granted
    assert ("apps", "statefulsets", "create") in granted
    assert ("batch", "jobs", "create") in granted
    assert "deployments" not in resources
    # LeaderWorkerSets: applied (create + patch), read and followed; never deleted (the garbage
    # collector takes them with their run), no status of theirs written
    lws = {(r, v) for g, r, v in granted if g == "leaderworkerset.x-k8s.io"}
    assert lws == {("leaderworkersets", v) for v in ("get", "list", "watch", "create", "patch")}
    # Kueue: the run's Workload applied, followed, replaced; its status patched (the quota back
    # after an eviction, Finished); the cluster-scoped flavors and priority classes only read
    kueue = {(r, v) for g, r, v in granted if g == "kueue.x-k8s.io"}
    verbs = ("get", "list", "watch", "create", "patch", "delete")
    assert kueue == {("workloads", v) for v in verbs} | {("workloads/status", "patch")}
    assert roles["rel-payloadrun-kueue"]["rules"] == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["resourceflavors", "workloadpriorityclasses"],
            "verbs": ["get"],
        }
    ]


def test_namespaced_install(helm):
    kinds = by_kind(
        render(
            helm,
            "operator.watchNamespaces={team-a,team-b}",
            "podMonitor.enabled=true",
            "serviceMonitor.enabled=true",
        )
    )
    # cluster-wide only the read of Kueue's cluster-scoped flavors and priority classes
    (cluster_binding,) = kinds["ClusterRoleBinding"]
    assert cluster_binding["roleRef"]["name"] == "rel-payloadrun-kueue"
    bindings = {
        b["metadata"]["namespace"]
        for b in kinds["RoleBinding"]
        if b["roleRef"]["kind"] == "ClusterRole"
    }
    assert bindings == {"team-a", "team-b"}
    (deploy,) = kinds["Deployment"]
    assert env_of(deploy["spec"]["template"]["spec"]["containers"][0])["PAYLOADRUN_NAMESPACES"] == (
        "team-a,team-b"
    )
    (pm,) = kinds["PodMonitor"]
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} == {"writer-metrics", "metrics"}
    assert "ServiceMonitor" in kinds


def test_non_default_values(helm):
    kinds = by_kind(
        render(
            helm,
            "image.tag=1.2.3",
            "sidecars.image.repository=registry.local/pr",
            "sidecars.image.tag=v9",
            "dashboards.enabled=false",
            "metrics.service.enabled=false",
            "serviceAccount.name=custom",
            "operator.verbose=true",
            "operator.logFormat=plain",
            "sidecars.logFormat=plain",
        )
    )
    (deploy,) = kinds["Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(":1.2.3")
    assert container["args"] == ["--verbose"]
    assert env_of(container)["PAYLOADRUN_LOG_FORMAT"] == "plain"
    assert env_of(container)["PAYLOADRUN_SIDECAR_LOG_FORMAT"] == "plain"
    assert env_of(container)["PAYLOADRUN_SIDECAR_IMAGE"] == "registry.local/pr:v9"
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "custom"
    assert "Service" not in kinds and "ConfigMap" not in kinds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("image.pullPolicy=Sometimes", "value must be one of 'Always', 'IfNotPresent', 'Never'"),
        ("metrics.port=70000", "/metrics/port"),
        ("operator.resyncSeconds=0", "/operator/resyncSeconds"),
        ("operator.replicas=0", "/operator/replicas"),
        ("operator.leaderElection.leaseDuration=1", "/operator/leaderElection/leaseDuration"),
        ("operator.watchNamespaces={Not_A_Namespace}", "/operator/watchNamespaces/0"),
        ("serviceMonitor.interval=often", "/serviceMonitor/interval"),
        ("sidecars.logFormat=yaml", "/sidecars/logFormat"),
        ("replicas=2", "additional properties 'replicas' not allowed"),
    ],
)
def test_schema_rejects_bad_values(helm, value, message):
    error = refused(helm, value)
    assert message in error, error


def test_dashboards_are_generated_and_portable():
    import subprocess
    import sys

    check = subprocess.run(
        [sys.executable, str(REPO / "hack" / "dashboards.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout
    for path in (CHART / "dashboards").glob("*.json"):
        text = path.read_text()
        board = json.loads(text)
        assert "__inputs" not in board and "DS_PROMETHEUS" not in text
        assert board["uid"].startswith("payloadrun-")
        assert board["schemaVersion"] >= 39
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[0] == "datasource"
        for panel in board["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}"


def test_every_variable_the_chart_sets_is_a_setting_of_the_operator(helm):
    """The chart writes the operator's variable names in YAML: a rename in the operator's
    settings must fail here, not crash-loop (or silently ignore) the chart's pod."""
    from payloadrun.settings import settings_of
    from payloadrun_operator.platform.settings import OperatorSettings

    known = {s.env for s, _ in settings_of(OperatorSettings).values() if s.env}
    (deploy,) = by_kind(render(helm))["Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    set_by_chart = {name for name in env_of(container) if name.startswith("PAYLOADRUN_")}
    assert set_by_chart and set_by_chart <= known, set_by_chart - known


def test_network_policy_peers_reach_the_operator_as_they_were_given(helm, tmp_path):
    """metricsFrom and inferenceFrom become the operator's JSON peers, parsed as its settings
    parse them; inferenceFrom is empty unless set (the run's own pods only)."""
    from payloadrun_operator.platform.settings import OperatorSettings

    evals = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "evals"}}}
    gateway = {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}}
    values = tmp_path / "values.yaml"
    values.write_text(
        json.dumps({"operator": {"networkPolicy": {"inferenceFrom": [evals, gateway]}}})
    )
    for rendered, clients in ((render(helm), ()), (render(helm, values=values), (evals, gateway))):
        (deploy,) = by_kind(rendered)["Deployment"]
        env = env_of(deploy["spec"]["template"]["spec"]["containers"][0])
        config = OperatorSettings.from_env(
            {k: v for k, v in env.items() if k.endswith(("_SCRAPERS", "_CLIENTS"))}
        )
        assert config.inference_clients == clients
        assert config.metrics_scrapers == (
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            },
        )


@pytest.mark.parametrize(
    "value",
    [
        "operator.networkPolicy.inferenceFrom[0].pods.app=x",
        "operator.networkPolicy.inferenceFrom[0].podSelector.matchLabel.app=x",
        "operator.networkPolicy.metricsFrom[0].ipBlock.except[0]=10.0.0.0/8",
    ],
)
def test_schema_rejects_peers_the_api_would_refuse(helm, value):
    field = value.split(".")[2].split("[")[0]
    error = refused(helm, value)
    assert f"/operator/networkPolicy/{field}/0" in error, error


def test_schema_rejects_an_ip_block_beside_a_selector(helm, tmp_path):
    values = tmp_path / "values.yaml"
    both = {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}
    values.write_text(json.dumps({"operator": {"networkPolicy": {"inferenceFrom": [both]}}}))
    result = run_helm(helm, "template", "rel", str(CHART), "--values", str(values), check=False)
    assert result.returncode != 0 and "/operator/networkPolicy/inferenceFrom/0" in result.stderr, (
        result.stderr
    )


def test_the_notes_suggest_examples_that_exist_and_need_no_gpu():
    """NOTES.txt, what `helm install` prints: the run it suggests trying runs on any cluster."""
    named = re.findall(r"examples/([\w.-]+\.yaml)", (CHART / "templates" / "NOTES.txt").read_text())
    assert named
    for name in named:
        example = REPO / "examples" / name
        assert example.is_file(), name
        assert "nvidia.com/gpu" not in example.read_text(), f"{name} needs GPUs"
