"""Exec credential plugins in a kubeconfig, run without a client library (credentials.py)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import kopf
import pytest
import yaml

from payloadrun_operator.platform import credentials

PLUGIN = """#!{python}
import json, os, sys
with open(os.environ["SEEN"], "w") as f:
    json.dump({{"info": json.loads(os.environ["KUBERNETES_EXEC_INFO"]), "argv": sys.argv[1:],
               "region": os.environ.get("REGION")}}, f)
if os.environ.get("FAIL"):
    sys.exit("token service said no")
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {status}}}))
"""


def kubeconfig(tmp_path: Path, user: dict, monkeypatch) -> Path:
    path = tmp_path / "config" / "kubeconfig"
    path.parent.mkdir(exist_ok=True)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "eks", "cluster": {"server": "https://10.0.0.1"}}],
        "users": [{"name": "arn:aws:eks:us-east-1:1:cluster/x", "user": user}],
        "contexts": [
            {
                "name": "ctx",
                "context": {"cluster": "eks", "user": "arn:aws:eks:us-east-1:1:cluster/x"},
            }
        ],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


def plugin(tmp_path: Path, status: dict, monkeypatch) -> Path:
    """An executable plugin in the kubeconfig's directory; it records what it was given."""
    (tmp_path / "config").mkdir(exist_ok=True)
    script = tmp_path / "config" / "get-token"
    script.write_text(PLUGIN.format(python=sys.executable, status=json.dumps(status)))
    script.chmod(0o755)
    monkeypatch.setenv("SEEN", str(tmp_path / "seen.json"))
    return script


def login() -> kopf.ConnectionInfo | None:
    return credentials.login_with_kubeconfig(settings=kopf.OperatorSettings())


def test_an_exec_plugin_gives_the_token_and_its_expiry(tmp_path, monkeypatch):
    plugin(
        tmp_path, {"token": "k8s-aws-v1.abc", "expirationTimestamp": "2026-12-01T10:15:00Z"},
        monkeypatch,
    )  # fmt: skip
    exec_spec = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": "./get-token",  # relative to the kubeconfig's directory, as in kubectl
        "args": ["--cluster-name", "x"],
        "env": [{"name": "REGION", "value": "us-east-1"}],
        "interactiveMode": "IfAvailable",
        "provideClusterInfo": True,
    }
    kubeconfig(tmp_path, {"exec": exec_spec}, monkeypatch)
    info = login()
    assert info is not None and info.server == "https://10.0.0.1"
    assert info.token == "k8s-aws-v1.abc"
    assert info.as_http_headers()["Authorization"] == "Bearer k8s-aws-v1.abc"
    assert info.expiration == datetime(2026, 12, 1, 10, 15, tzinfo=UTC)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == ["--cluster-name", "x"] and seen["region"] == "us-east-1"
    assert seen["info"]["apiVersion"] == "client.authentication.k8s.io/v1beta1"
    assert seen["info"]["kind"] == "ExecCredential"
    assert seen["info"]["spec"]["interactive"] is False
    assert seen["info"]["spec"]["cluster"]["server"] == "https://10.0.0.1"


def test_an_exec_plugin_may_give_a_client_certificate(tmp_path, monkeypatch):
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    key = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
    script = plugin(tmp_path, {"clientCertificateData": pem, "clientKeyData": key}, monkeypatch)
    kubeconfig(tmp_path, {"exec": {"command": str(script)}}, monkeypatch)
    info = login()
    assert info is not None and info.token is None and info.expiration is None
    assert (info.certificate_data, info.private_key_data) == (pem, key)


def test_static_credentials_are_kopfs_own(tmp_path, monkeypatch):
    kubeconfig(tmp_path, {"token": "static"}, monkeypatch)
    assert login() == kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    assert login().token == "static"


@pytest.mark.parametrize(
    ("exec_spec", "env", "message"),
    [
        (
            {"command": "aws-iam-nowhere", "installHint": "install the AWS CLI"},
            {},
            "gets its credentials from 'aws-iam-nowhere', which was not found: install the AWS CLI",
        ),
        (
            {"command": "./get-token"},
            {"FAIL": "1"},
            "failed with exit status 1: token service said no",
        ),
        ({"command": ""}, {}, "has an exec without a command"),
    ],
)
def test_a_plugin_that_fails_is_a_login_error_that_says_why(
    tmp_path, monkeypatch, exec_spec, env, message
):
    plugin(tmp_path, {"token": "t"}, monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    kubeconfig(tmp_path, {"exec": exec_spec}, monkeypatch)
    with pytest.raises(kopf.LoginError, match=message):
        login()


def test_a_plugin_that_prints_no_credential(tmp_path, monkeypatch):
    plugin(tmp_path, {}, monkeypatch)
    kubeconfig(tmp_path, {"exec": {"command": "./get-token"}}, monkeypatch)
    with pytest.raises(kopf.LoginError, match="neither a token nor a client certificate"):
        login()
