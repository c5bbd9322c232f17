"""The run's NetworkPolicies, as built (enforcement with real pods:
tests/integration/test_policy_enforcement.py).

The rule: every pod of a run reaches every port, of every protocol, of every other pod of the
run; from outside, the scrapers reach the sidecars' metrics ports and the inference clients the
inference Service's port; nothing else."""

import dataclasses

import pytest
from pydantic import ValidationError
from test_builders import SETTINGS, by_kind, context

from payloadrun_operator.api.models import PayloadRunSpec
from payloadrun_operator.desired.admission import spec_errors
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.pinning import inputs_hash, pin_of
from payloadrun_operator.platform.settings import OperatorSettings, SettingsError

COMPONENTS = ("inference", "orchestrator", "trainer")
RUN = {"payloadrun.dev/run": "run1"}
RUN_PODS = {"podSelector": {"matchLabels": RUN}}
TRUST = {"from": [RUN_PODS]}  # no ports: every port of every protocol
PROMETHEUS = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
EVALS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "evals"}}}
ROUTER = {"podSelector": {"matchLabels": {"app": "router"}}}
GATEWAY = {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}}
WRITER, VLLM, WRITER_METRICS, RETENTION_METRICS = 8100, 8000, 9100, 9200


def policies(spec_dict, settings=SETTINGS):
    ctx = dataclasses.replace(context(spec_dict), settings=settings)
    return {
        name.removeprefix("run1-"): child
        for (kind, name), child in by_kind(build_children(ctx)).items()
        if kind == "NetworkPolicy"
    }


def ingress(spec_dict, settings=SETTINGS):
    return {c: p["spec"]["ingress"] for c, p in policies(spec_dict, settings).items()}


def tcp(port):
    return [{"protocol": "TCP", "port": port}]


def with_ports(spec_dict):
    spec_dict["inference"] |= {"port": VLLM, "writer": {"port": WRITER, "metricsPort": 9100}}
    spec_dict["orchestrator"]["retention"] = {"metricsPort": RETENTION_METRICS}
    return spec_dict


def test_one_policy_per_component_selects_its_pods_of_this_run_only(spec_dict):
    found = policies(spec_dict)
    assert sorted(found) == ["inference", "orchestrator", "trainer"]
    for component, policy in found.items():
        assert policy["metadata"]["name"] == f"run1-{component}"
        assert policy["spec"]["podSelector"] == {
            "matchLabels": {**RUN, "app.kubernetes.io/component": component}
        }
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["metadata"]["ownerReferences"][0]["name"] == "run1"


@pytest.mark.parametrize("mode", ["ByHandle", "Inline"])
def test_every_pod_of_the_run_reaches_every_port_of_every_other(spec_dict, mode):
    spec_dict["payloads"] = {"mode": mode}
    for component, rules in ingress(spec_dict).items():
        # the first rule of each: the run's pods, no port list (every port, TCP, UDP and SCTP)
        assert rules[0] == TRUST, component
        # and no other rule names the run's pods (nothing narrower, nothing duplicated)
        assert all(RUN_PODS not in r["from"] for r in rules[1:]), component


def test_by_handle_outsiders_get_the_metrics_ports_and_the_clients_the_writer(spec_dict):
    with_ports(spec_dict)
    spec_dict["inference"]["clients"] = [ROUTER]
    rules = ingress(spec_dict)
    assert rules["inference"] == [
        TRUST,
        {"from": [ROUTER], "ports": tcp(WRITER)},
        {"from": [PROMETHEUS], "ports": tcp(WRITER_METRICS)},
    ]
    assert rules["orchestrator"] == [TRUST, {"from": [PROMETHEUS], "ports": tcp(RETENTION_METRICS)}]
    assert rules["trainer"] == [TRUST]


def test_inline_the_clients_get_vllm_and_no_sidecar_port_is_opened(spec_dict):
    with_ports(spec_dict)
    spec_dict["payloads"] = {"mode": "Inline"}
    spec_dict["inference"]["clients"] = [ROUTER]
    assert ingress(spec_dict) == {
        "inference": [TRUST, {"from": [ROUTER], "ports": tcp(VLLM)}],
        "orchestrator": [TRUST],
        "trainer": [TRUST],
    }


def test_without_clients_the_inference_service_is_the_runs_alone(spec_dict):
    with_ports(spec_dict)
    rules = ingress(spec_dict)["inference"]
    assert rules == [TRUST, {"from": [PROMETHEUS], "ports": tcp(WRITER_METRICS)}]


def test_clients_of_the_operator_and_of_the_run_are_joined_each_once(spec_dict):
    with_ports(spec_dict)
    settings = dataclasses.replace(SETTINGS, inference_clients=(EVALS, ROUTER))
    spec_dict["inference"]["clients"] = [ROUTER, GATEWAY]
    (clients,) = [
        r for r in ingress(spec_dict, settings)["inference"] if r.get("ports") == tcp(WRITER)
    ]
    assert clients["from"] == [EVALS, ROUTER, GATEWAY]


def test_no_scrapers_opens_no_metrics_port(spec_dict):
    """An empty ``from`` would admit every source: a rule without peers is left out."""
    with_ports(spec_dict)
    settings = dataclasses.replace(SETTINGS, metrics_scrapers=())
    assert ingress(spec_dict, settings) == {
        "inference": [TRUST],
        "orchestrator": [TRUST],
        "trainer": [TRUST],
    }
    for rules in ingress(spec_dict, settings).values():
        assert all(r["from"] for r in rules)


def test_a_client_removed_from_the_spec_leaves_the_applied_policy(spec_dict):
    """The operator does not delete children it stops building: the inference policy is built
    with the trust rule alone, so applying it takes the client's rule away."""
    spec_dict["payloads"] = {"mode": "Inline"}
    spec_dict["inference"]["clients"] = [ROUTER]
    assert len(ingress(spec_dict)["inference"]) == 2
    spec_dict["inference"]["clients"] = []
    assert ingress(spec_dict)["inference"] == [TRUST]


def test_clients_change_the_policy_and_roll_no_pod(spec_dict):
    """Clients are no input of any pod template: naming one (or adding the field, for runs made
    before it) changes no component's inputs hash, so no pod is replaced."""
    pin = pin_of(SETTINGS)
    before = {c: inputs_hash(PayloadRunSpec.model_validate(spec_dict), c, pin) for c in COMPONENTS}
    spec_dict["inference"]["clients"] = [ROUTER]
    after = {c: inputs_hash(PayloadRunSpec.model_validate(spec_dict), c, pin) for c in COMPONENTS}
    assert after == before


def test_turned_off_there_are_none(spec_dict):
    off = OperatorSettings(sidecar_image="x", network_policies=False)
    children = build_children(dataclasses.replace(context(spec_dict), settings=off))
    assert [c for c in children if c["kind"] == "NetworkPolicy"] == []
    assert len(children) == len(build_children(context(spec_dict))) - 3


def test_scrapers_and_clients_come_from_the_settings_and_bad_ones_are_refused():
    peers = '[{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]'
    config = OperatorSettings.from_env(
        {"PAYLOADRUN_METRICS_SCRAPERS": peers, "PAYLOADRUN_INFERENCE_CLIENTS": peers}
    )
    expected = ({"namespaceSelector": {"matchLabels": {"team": "obs"}}},)
    assert config.metrics_scrapers == expected and config.inference_clients == expected
    assert OperatorSettings.from_env({}).inference_clients == ()
    for env in ("PAYLOADRUN_METRICS_SCRAPERS", "PAYLOADRUN_INFERENCE_CLIENTS"):
        with pytest.raises(SettingsError, match=rf"{env}.*peer 0 .*pods: Extra inputs"):
            OperatorSettings.from_env({env: '[{"pods": {}}]'})
        with pytest.raises(SettingsError, match=rf"{env}.*JSON list of NetworkPolicy peers"):
            OperatorSettings.from_env({env: "{}"})
        with pytest.raises(SettingsError, match=rf"{env}.*peer 1 .*cannot be combined"):
            both = '{"ipBlock": {"cidr": "1.2.3.4/32"}, "podSelector": {}}'
            OperatorSettings.from_env({env: f'[{{"podSelector": {{}}}}, {both}]'})


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        ({}, "needs podSelector, namespaceSelector or ipBlock"),
        ({"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}}, "cannot be combined"),
        ({"pods": {}}, "pods"),  # pydantic: Extra inputs; the schema: unknown field
        ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}, "Is"),
        ({"ipBlock": {"except": ["10.0.0.0/8"]}}, "cidr"),
        ({"ipBlock": {"cidr": "nope"}}, "'nope' is not a CIDR"),
        ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/33"]}}, "is not a CIDR"),
        ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}, "needs values"),
        (
            {
                "podSelector": {
                    "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                }
            },
            "takes no values",
        ),
        ({"podSelector": {"matchLabels": {"bad key!": "x"}}}, "label key 'bad key!'"),
        ({"namespaceSelector": {"matchLabels": {"team": "x y"}}}, "label value 'x y'"),
    ],
)
def test_a_run_naming_a_bad_client_is_refused_with_the_reason(spec_dict, peer, message):
    spec_dict["inference"]["clients"] = [peer]
    with pytest.raises(ValidationError, match=message):
        PayloadRunSpec.model_validate(spec_dict)
    spec, errors = spec_errors({"metadata": {"name": "run1"}, "spec": spec_dict})
    assert spec is None and any(message in e for e in errors), errors
