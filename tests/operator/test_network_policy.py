"""The run's NetworkPolicies, as built (enforcement with real pods: tests/integration)."""

import dataclasses

import pytest
from test_builders import by_kind, context

from payloadrun_operator.builders import build_children
from payloadrun_operator.networkpolicy import port_ranges_except
from payloadrun_operator.settings import OperatorSettings, SettingsError

RUN = {"payloadrun.dev/run": "run1"}
ORCHESTRATOR = {
    "podSelector": {"matchLabels": {**RUN, "app.kubernetes.io/component": "orchestrator"}}
}
TRAINERS = {"podSelector": {"matchLabels": {**RUN, "app.kubernetes.io/component": "trainer"}}}
RUN_PODS = {"podSelector": {"matchLabels": RUN}}
PROMETHEUS = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def policies(spec_dict):
    children = by_kind(build_children(context(spec_dict)))
    return {
        name.removeprefix("run1-"): child["spec"]
        for (kind, name), child in children.items()
        if kind == "NetworkPolicy"
    }


def test_port_ranges_leave_out_exactly_the_excluded_ports():
    assert port_ranges_except([]) == [{"protocol": "TCP", "port": 1, "endPort": 65535}]
    assert port_ranges_except([8100, 8101, 1, 65535]) == [
        {"protocol": "TCP", "port": 2, "endPort": 8099},
        {"protocol": "TCP", "port": 8102, "endPort": 65534},
    ]
    assert port_ranges_except([3]) == [
        {"protocol": "TCP", "port": 1, "endPort": 2},
        {"protocol": "TCP", "port": 4, "endPort": 65535},
    ]


def with_ports(spec_dict):
    spec_dict["inference"] |= {"port": 8000, "writer": {"port": 8100, "metricsPort": 9100}}
    spec_dict["orchestrator"]["retention"] = {"metricsPort": 9200}
    return spec_dict


def test_by_handle_the_writer_is_open_to_the_orchestrator_only(spec_dict):
    inference = policies(with_ports(spec_dict))["inference"]
    writer, vllm, writer_metrics = 8100, 8000, 9100
    assert inference["podSelector"] == {
        "matchLabels": {**RUN, "app.kubernetes.io/component": "inference"}
    }
    assert inference["policyTypes"] == ["Ingress"]
    rules = inference["ingress"]
    assert {"from": [ORCHESTRATOR], "ports": [{"protocol": "TCP", "port": writer}]} in rules
    assert {"from": [RUN_PODS], "ports": [{"protocol": "TCP", "port": vllm}]} in rules
    assert {"from": [PROMETHEUS], "ports": [{"protocol": "TCP", "port": writer_metrics}]} in rules
    (trainer_rule,) = [r for r in rules if r["from"] == [TRAINERS]]
    opened = {
        p for r in trainer_rule["ports"] for p in range(r["port"], r.get("endPort", r["port"]) + 1)
    }
    assert writer not in opened and writer_metrics not in opened and vllm in opened
    # nobody else gets the writer's port
    for r in rules:
        if r["from"] != [ORCHESTRATOR]:
            assert all(p.get("port") != writer for p in r.get("ports", [])), r


def test_inline_has_no_writer_rule(spec_dict):
    spec_dict["payloads"] = {"mode": "Inline"}
    rules = policies(spec_dict)["inference"]["ingress"]
    assert [r["from"] for r in rules] == [[RUN_PODS], [TRAINERS]]
    assert rules[1]["ports"] == [{"protocol": "TCP", "port": 1, "endPort": 65535}]


def test_trainers_admit_only_their_peers_on_every_port(spec_dict):
    assert policies(spec_dict)["trainer"]["ingress"] == [{"from": [TRAINERS]}]


def test_orchestrator_opens_the_ports_its_template_declares_and_its_metrics(spec_dict):
    with_ports(spec_dict)
    spec_dict["orchestrator"]["template"] = {
        "spec": {"containers": [{"name": "orchestrator", "ports": [{"containerPort": 7000}]}]}
    }
    rules = policies(spec_dict)["orchestrator"]["ingress"]
    assert rules == [
        {"from": [RUN_PODS], "ports": [{"protocol": "TCP", "port": 7000}]},
        {"from": [PROMETHEUS], "ports": [{"protocol": "TCP", "port": 9200}]},
    ]


def test_turned_off_there_are_none(spec_dict):
    off = OperatorSettings(sidecar_image="x", network_policies=False)
    children = build_children(dataclasses.replace(context(spec_dict), settings=off))
    assert [c for c in children if c["kind"] == "NetworkPolicy"] == []
    assert len(children) == len(build_children(context(spec_dict))) - 3


def test_scrapers_come_from_the_settings_and_bad_ones_are_refused():
    peers = '[{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]'
    config = OperatorSettings.from_env({"PAYLOADRUN_METRICS_SCRAPERS": peers})
    assert config.metrics_scrapers == ({"namespaceSelector": {"matchLabels": {"team": "obs"}}},)
    with pytest.raises(SettingsError, match=r"PAYLOADRUN_METRICS_SCRAPERS.*NetworkPolicy peers"):
        OperatorSettings.from_env({"PAYLOADRUN_METRICS_SCRAPERS": '[{"pods": {}}]'})
