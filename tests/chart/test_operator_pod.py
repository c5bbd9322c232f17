"""The operator pod's values: priorityClassName, the security contexts, extraEnv and extraArgs."""

import re

import pytest
import yaml

from .conftest import CHART, REPO, env_of, operator_container, refused, render, run_helm

RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def pod_spec(docs):
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    return deploy["spec"]["template"]["spec"]


def test_priority_class_name(helm):
    pod = pod_spec(render(helm, "priorityClassName=system-cluster-critical"))
    assert pod["priorityClassName"] == "system-cluster-critical"


def test_extra_env_comes_after_the_chart_settings(helm, tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "extraEnv": [
                    {"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"},
                    {
                        "name": "NODE_NAME",
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                    },
                ]
            }
        )
    )
    container = operator_container(render(helm, values=values))
    names = [e["name"] for e in container["env"]]
    assert names[-2:] == ["HTTPS_PROXY", "NODE_NAME"]
    assert all(n.startswith("PAYLOADRUN_") for n in names[:-2])
    assert container["env"][-2] == {"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"}
    assert container["env"][-1] == {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    # the chart's own settings keep their values (and stay strings)
    default_env = env_of(operator_container(render(helm)))
    assert {n: v for n, v in env_of(container).items() if n in default_env} == default_env


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["extraEnv[0].name=PAYLOADRUN_METRICS_PORT", "extraEnv[0].value=9500"],
            "extraEnv[0] sets PAYLOADRUN_METRICS_PORT, which the chart sets from its values: "
            "remove it from extraEnv and set the chart's value instead",
        ),
        (
            ["extraEnv[0].name=A", "extraEnv[0].value=x", "extraEnv[1].name=A"],
            "extraEnv[1] sets A, as extraEnv[0] does: keep one of them",
        ),
    ],
)
def test_extra_env_sets_each_name_once(helm, sets, message):
    args = ["template", "rel", str(CHART)]
    for s in sets:
        args += ["--set-string", s]
    result = run_helm(helm, *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_extra_args_come_after_the_chart_args(helm):
    container = operator_container(render(helm, "extraArgs={--namespace=ml,--host=0.0.0.0}"))
    assert container["args"] == ["--namespace=ml", "--host=0.0.0.0"]
    verbose = operator_container(
        render(helm, "operator.verbose=true", "extraArgs={--namespace=ml}")
    )
    assert verbose["args"] == ["--verbose", "--namespace=ml"]


def test_security_contexts_are_values(helm):
    docs = render(
        helm,
        "podSecurityContext.fsGroup=2000",
        "podSecurityContext.runAsUser=1001",
        "securityContext.readOnlyRootFilesystem=false",
    )
    pod = pod_spec(docs)
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1001,
        "runAsGroup": 65532,
        "fsGroup": 2000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert operator_container(docs)["securityContext"] == {
        **RESTRICTED_CONTAINER,
        "readOnlyRootFilesystem": False,
    }


def openshift_snippet() -> str:
    """The values the docs give OpenShift users, so this test proves what they copy."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text[text.index("### OpenShift") :]
    match = re.search(r"^```yaml\n(.*?)^```", section, re.S | re.M)
    assert match, "docs/operations.md's OpenShift section lost its values snippet"
    return match.group(1)


@pytest.mark.parametrize("how", ["values file", "--set"])
def test_openshift_drops_the_fixed_uid_and_keeps_the_rest(helm, tmp_path, how):
    if how == "values file":
        values = tmp_path / "openshift.yaml"
        values.write_text(openshift_snippet())
        assert yaml.safe_load(values.read_text())["podSecurityContext"]["runAsUser"] is None
        docs = render(helm, values=values)
    else:
        docs = render(
            helm, "podSecurityContext.runAsUser=null", "podSecurityContext.runAsGroup=null"
        )
    # Helm deletes a default set to null: the keys are gone, not rendered as null
    assert pod_spec(docs)["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert operator_container(docs)["securityContext"] == RESTRICTED_CONTAINER


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("priorityClassName=High_Priority", "at '/priorityClassName': 'High_Priority' does not"),
        ("extraEnv={HTTPS_PROXY}", "at '/extraEnv/0': got string, want object"),
        ("extraEnv[0].value=x", "at '/extraEnv/0': missing property 'name'"),
        (
            "extraEnv[0].name=A,extraEnv[0].value=8",
            "at '/extraEnv/0/value': got number, want string",
        ),
        ("extraEnv[0].name=A,extraEnv[0].valuefrom.x=y", "additional properties 'valuefrom'"),
        ("extraArgs=--verbose", "at '/extraArgs': got string, want array"),
        ("extraArgs[0]=1", "at '/extraArgs/0': got number, want string"),
        ("podSecurityContext.runAsUser=root", "at '/podSecurityContext/runAsUser': got string"),
        ("podSecurityContext.runAsUsr=1", "additional properties 'runAsUsr' not allowed"),
        ("podSecurityContext.seccompProfile.type=Default", "/podSecurityContext/seccompProfile"),
        ("securityContext.privilegd=true", "additional properties 'privilegd' not allowed"),
        ("securityContext.capabilities.drop=ALL", "at '/securityContext/capabilities/drop'"),
        ("securityContext=strict", "at '/securityContext': got string, want object"),
    ],
)
def test_schema_rejects_bad_pod_values(helm, value, message):
    error = refused(helm, value)
    assert message in error, error
