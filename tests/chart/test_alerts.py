"""The alerting rules: promtool's unit tests, the chart's PrometheusRule, the runbooks.

One source: charts/payloadrun/alerts/payloadrun.rules.yaml, a plain Prometheus rules file. The
chart renders its groups into a PrometheusRule; the test here proves the two are the same rules
(and both pass ``promtool check rules``), so they cannot drift. tests/alerts/*.test.yaml are
``promtool test rules`` files: each alert fires with the labels and annotations expected, and
stays silent below its threshold or for less than its ``for``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from payloadrun_devkit import required

from .conftest import CHART, REPO, refused, render, run_helm

RULES = CHART / "alerts" / "payloadrun.rules.yaml"
UNIT_TESTS = sorted((REPO / "tests" / "alerts").glob("*.test.yaml"))
OPERATIONS = REPO / "docs" / "operations.md"
RUNBOOKS = "https://github.com/payloadrun/payloadrun/blob/main/docs/operations.md#"
THRESHOLD = re.compile(r">\s*([0-9]+)\s*$")


@pytest.fixture(scope="session")
def promtool() -> str:
    """Debian's prometheus package ships promtool (hack/prometheus.sh installs it)."""
    return required.tool("promtool", "bash hack/prometheus.sh installs Debian's prometheus")


def run_promtool(promtool: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def groups_of(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["groups"]


def alerts_of(groups: list[dict]) -> dict[str, dict]:
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def rendered_rule(helm: str, *sets: str) -> dict:
    docs = render(helm, "alerts.enabled=true", *sets)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return rule


# --- the rules file and its unit tests -----------------------------------------------------------


def test_the_rules_file_is_valid(promtool):
    result = run_promtool(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_passes_its_unit_tests(promtool):
    assert UNIT_TESTS, "no promtool tests under tests/alerts/"
    result = run_promtool(promtool, "test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "mistake",
    ["a wrong severity", "firing expected too early", "an annotation with another value"],
)
def test_a_wrong_expectation_fails(promtool, tmp_path, mistake):
    """The harness can fail: the same test with one expectation wrong must not pass."""
    source = REPO / "tests" / "alerts" / "retention.test.yaml"
    test = yaml.safe_load(source.read_text())
    test["rule_files"] = [str(RULES)]
    case = test["tests"][0]  # PayloadrunPendingBatchesHigh: silent at 14m, firing at 15m
    silent, firing = case["alert_rule_test"][:2]
    assert silent["exp_alerts"] == [] and firing["exp_alerts"]
    if mistake == "a wrong severity":
        firing["exp_alerts"][0]["exp_labels"]["severity"] = "critical"
    elif mistake == "firing expected too early":
        silent["exp_alerts"] = firing["exp_alerts"]
    else:
        firing["exp_alerts"][0]["exp_annotations"]["summary"] = "PayloadRun rl/glm: 6 batches"
    wrong = tmp_path / "wrong.test.yaml"
    wrong.write_text(yaml.safe_dump(test))
    result = run_promtool(promtool, "test", "rules", str(wrong))
    assert result.returncode != 0, result.stdout
    assert "FAILED" in result.stdout + result.stderr
    assert "PayloadrunPendingBatchesHigh" in result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_silent():
    fired: set[str] = set()
    silent: set[str] = set()
    for path in UNIT_TESTS:
        spec = yaml.safe_load(path.read_text())
        assert spec["rule_files"] == ["../../charts/payloadrun/alerts/payloadrun.rules.yaml"], path
        for case in spec["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check["exp_alerts"] else silent).add(check["alertname"])
    alerts = set(alerts_of(groups_of(RULES)))
    assert alerts - fired == set(), "alerts no test sees firing"
    assert alerts - silent == set(), "alerts no test sees staying silent"
    assert (fired | silent) - alerts == set(), "tests of alerts that do not exist"


def test_every_alert_has_a_severity_a_for_its_annotations_and_a_runbook():
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in OPERATIONS.read_text().splitlines()
        if line.startswith("#")
    }
    for name, rule in alerts_of(groups_of(RULES)).items():
        assert name.startswith("Payloadrun"), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule.get("for"), f"{name} has no for: a single bad scrape would page"
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        url = annotations["runbook_url"]
        assert url == RUNBOOKS + name.lower(), f"{name}: runbook_url {url}"
        assert name.lower() in headings, f"docs/operations.md has no section {name}"


def test_every_metric_the_rules_use_is_exported():
    """A renamed metric would leave an alert silently matching nothing."""
    from prometheus_client import CollectorRegistry

    from payloadrun.retention.metrics import RetentionMetrics
    from payloadrun.writer.metrics import WriterMetrics
    from payloadrun_operator.platform.metrics import OperatorMetrics

    registries = [
        WriterMetrics().registry,
        RetentionMetrics(CollectorRegistry()).registry,
        OperatorMetrics().registry,
    ]
    families = [family for registry in registries for family in registry.collect()]
    # a labelled metric with no child yet has a family but no sample
    exported = {f.name for f in families} | {s.name for f in families for s in f.samples}
    used = {
        name
        for rule in alerts_of(groups_of(RULES)).values()
        for name in re.findall(r"\bpayloadrun_[a-z_]+", rule["expr"])
    }
    assert used, "the rules use no payloadrun metric?"
    assert used - exported == set()


# --- the chart's PrometheusRule ------------------------------------------------------------------


def test_the_prometheus_rule_is_the_rules_file(helm, promtool, tmp_path):
    rule = rendered_rule(helm, "alerts.labels.release=kube-prometheus-stack")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "payloadrun-system"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # the chart's default thresholds are the file's own: not one character differs
    assert rule["spec"]["groups"] == groups_of(RULES)
    extracted = tmp_path / "rendered.rules.yaml"
    extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = run_promtool(promtool, "check", "rules", str(extracted))
    assert result.returncode == 0, result.stdout + result.stderr


def test_thresholds_are_values(helm, promtool, tmp_path):
    rule = rendered_rule(
        helm,
        "alerts.thresholds.PayloadrunPendingBatchesHigh=10",
        "alerts.thresholds.PayloadrunDirectoryBytesHigh=500000000000",
    )
    alerts = alerts_of(rule["spec"]["groups"])
    assert alerts["PayloadrunPendingBatchesHigh"]["expr"] == (
        "payloadrun_retention_pending_batches > 10"
    )
    assert alerts["PayloadrunDirectoryBytesHigh"]["expr"] == (
        "payloadrun_retention_directory_bytes > 500000000000"
    )
    # everything else as in the file
    plain = alerts_of(groups_of(RULES))
    for name in plain.keys() - {"PayloadrunPendingBatchesHigh", "PayloadrunDirectoryBytesHigh"}:
        assert alerts[name] == plain[name]
    extracted = tmp_path / "rendered.rules.yaml"
    extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    assert run_promtool(promtool, "check", "rules", str(extracted)).returncode == 0


def test_every_threshold_value_is_a_thresholded_alert_of_the_file():
    import json

    values = yaml.safe_load((CHART / "values.yaml").read_text())["alerts"]["thresholds"]
    schema = json.loads((CHART / "values.schema.json").read_text())
    in_schema = schema["properties"]["alerts"]["properties"]["thresholds"]["properties"]
    assert set(values) == set(in_schema)
    alerts = alerts_of(groups_of(RULES))
    for name, default in values.items():
        match = THRESHOLD.search(alerts[name]["expr"])
        assert match, f"{name}'s expression must end with > N for the chart to set N"
        assert int(match.group(1)) == default, f"values.yaml's {name} differs from the file"


def test_alerts_are_off_by_default(helm):
    assert not [d for d in render(helm) if d["kind"] == "PrometheusRule"]


def test_the_monitors_name_the_jobs_the_rules_select(helm):
    docs = render(helm, "podMonitor.enabled=true", "serviceMonitor.enabled=true")
    (pod_monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    (service_monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]

    def job(endpoint: dict) -> str:
        (relabel,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        return relabel["replacement"]

    jobs = {e["port"]: job(e) for e in pod_monitor["spec"]["podMetricsEndpoints"]}
    assert jobs == {"writer-metrics": "payloadrun-writer", "metrics": "payloadrun-retention"}
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert job(endpoint) == "payloadrun-operator"
    expressions = " ".join(rule["expr"] for rule in alerts_of(groups_of(RULES)).values())
    for name in ("payloadrun-writer", "payloadrun-retention", "payloadrun-operator"):
        assert name in expressions


def test_lint_with_alerts(helm):
    run_helm(helm, "lint", "--strict", str(CHART), "--set", "alerts.enabled=true")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "alerts.thresholds.PayloadrunSidecarDown=1",
            "additional properties 'PayloadrunSidecarDown'",
        ),
        ("alerts.thresholds.PayloadrunPendingBatchesHigh=-1", "minimum: got -1"),
        ("alerts.labels.release=null", "/alerts/labels/release"),
    ],
)
def test_schema_refuses_bad_alert_values(helm, value, message):
    error = refused(helm, value)
    assert message in error, error
