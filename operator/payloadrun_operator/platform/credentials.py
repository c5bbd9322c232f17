"""Log in from a kubeconfig whose user runs an exec credential plugin, with no client library.

kopf reads a kubeconfig's static credentials itself (token, client certificate, a cached
auth-provider token) and leaves everything else to a client library: with the ``kubernetes``
package installed, kopf's ``login_via_client`` would run the plugin. The operator image has no
client library (it would cost memory for nothing else), so kubeconfigs of managed clusters, whose
users get their token from a plugin (``aws eks get-token``, ``gke-gcloud-auth-plugin``,
``kubelogin``), are served here: the plugin runs as ``kubectl`` runs it
(client.authentication.k8s.io ``ExecCredential``, non-interactive), and its token or client
certificate and its expiry go to kopf, which logs in again when they expire or the API server
answers 401. In a pod the service account is used and none of this runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import kopf
import yaml

EXEC_TIMEOUT_S = 60
DEFAULT_EXEC_API = "client.authentication.k8s.io/v1"


def kubeconfig_paths(env: dict[str, str] | None = None) -> list[Path]:
    """The files ``KUBECONFIG`` names (``~/.kube/config`` when unset), as kopf reads them."""
    env = os.environ if env is None else env
    value = env.get("KUBECONFIG") or ""
    if not value and Path("~/.kube/config").expanduser().exists():
        value = "~/.kube/config"
    return [Path(p.strip()).expanduser() for p in value.split(os.pathsep) if p.strip()]


@dataclasses.dataclass(frozen=True)
class CurrentUser:
    """The current context's user and cluster, and the kubeconfig file the user came from."""

    name: str
    user: dict[str, Any]
    cluster: dict[str, Any]
    source: Path


def current_user(paths: list[Path]) -> CurrentUser | None:
    """The current context's user, merged across ``paths`` as kopf and kubectl merge them:
    the first ``current-context`` and the first definition of each name win."""
    current: str | None = None
    contexts: dict[str, dict[str, Any]] = {}
    clusters: dict[str, dict[str, Any]] = {}
    users: dict[str, tuple[dict[str, Any], Path]] = {}
    for path in paths:
        config = yaml.safe_load(path.read_text()) or {}
        current = current or config.get("current-context")
        for item in config.get("contexts") or []:
            contexts.setdefault(item["name"], item.get("context") or {})
        for item in config.get("clusters") or []:
            clusters.setdefault(item["name"], item.get("cluster") or {})
        for item in config.get("users") or []:
            users.setdefault(item["name"], (item.get("user") or {}, path))
    context = contexts.get(current or "")
    if context is None or context.get("user") not in users:
        return None
    user, source = users[context["user"]]
    return CurrentUser(context["user"], user, clusters.get(context.get("cluster"), {}), source)


def exec_info(spec: dict[str, Any], cluster: dict[str, Any]) -> dict[str, Any]:
    """The ``KUBERNETES_EXEC_INFO`` a plugin reads (the cluster only when it asks for it)."""
    info: dict[str, Any] = {"interactive": False}
    if spec.get("provideClusterInfo"):
        info["cluster"] = {
            "server": cluster.get("server"),
            "certificate-authority-data": cluster.get("certificate-authority-data"),
            "insecure-skip-tls-verify": cluster.get("insecure-skip-tls-verify", False),
            "config": (cluster.get("extensions") or [{}])[0].get("extension"),
        }
    return {
        "apiVersion": spec.get("apiVersion", DEFAULT_EXEC_API),
        "kind": "ExecCredential",
        "spec": info,
    }


def run_plugin(user: CurrentUser) -> dict[str, Any]:
    """Run the user's exec plugin; its ``ExecCredential`` status (token or certificate, expiry).

    A command with a directory in it is relative to its kubeconfig's directory, as in kubectl.
    """
    spec = user.user["exec"]
    command = str(spec.get("command") or "")
    if not command:
        raise kopf.LoginError(f"the kubeconfig user {user.name!r} has an exec without a command")
    if os.sep in command and not os.path.isabs(command):
        command = str(user.source.parent / command)
    env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []}}
    env["KUBERNETES_EXEC_INFO"] = json.dumps(exec_info(spec, user.cluster))
    argv = [command, *(spec.get("args") or [])]
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=EXEC_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        hint = spec.get("installHint") or "install it, or put it on PATH"
        raise kopf.LoginError(
            f"the kubeconfig user {user.name!r} gets its credentials from {command!r}, which "
            f"was not found: {hint.strip()}"
        ) from None
    except subprocess.TimeoutExpired:
        raise kopf.LoginError(
            f"the credential plugin {command!r} (kubeconfig user {user.name!r}) did not answer "
            f"in {EXEC_TIMEOUT_S} s"
        ) from None
    if done.returncode != 0:
        raise kopf.LoginError(
            f"the credential plugin {command!r} (kubeconfig user {user.name!r}) failed with "
            f"exit status {done.returncode}: {done.stderr.strip()[-500:]}"
        )
    try:
        status = json.loads(done.stdout)["status"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise kopf.LoginError(
            f"the credential plugin {command!r} (kubeconfig user {user.name!r}) did not print "
            f"an ExecCredential with a status: {done.stdout.strip()[:200]!r}"
        ) from None
    if not status.get("token") and not status.get("clientCertificateData"):
        raise kopf.LoginError(
            f"the credential plugin {command!r} (kubeconfig user {user.name!r}) returned "
            "neither a token nor a client certificate"
        )
    return status


def expiry(status: dict[str, Any]) -> datetime | None:
    stamp = status.get("expirationTimestamp")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None


def login_with_kubeconfig(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's kubeconfig login, plus the token or certificate of an exec plugin when the
    current user has one; None without a kubeconfig."""
    info = kopf.login_with_kubeconfig(**kwargs)
    if info is None:
        return None
    user = current_user(kubeconfig_paths())
    if user is None or not user.user.get("exec"):
        return info
    status = run_plugin(user)
    given: dict[str, Any] = {"expiration": expiry(status)}
    if status.get("token"):
        given["token"] = status["token"]
    if status.get("clientCertificateData"):
        given |= {
            "certificate_data": status["clientCertificateData"],
            "private_key_data": status.get("clientKeyData"),
            "certificate_path": None,
            "private_key_path": None,
        }
    return dataclasses.replace(info, **given)
