"""Proofs that the local control plane is a real Kubernetes API, not a stand-in.

1. A CRD's CEL validation rules (message, messageExpression, a transition rule on oldSelf)
   reject violating objects with the rule's message, through the Python client and `kubectl apply`.
2. Deleting an owner deletes the objects that name it in ownerReferences (the garbage
   collector in kube-controller-manager runs).
3. RBAC is enforced: a service account without a role is denied; with a role it is allowed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from payloadrun_devcluster import LocalCluster
from payloadrun_devcluster.binaries import control_plane_version, read_versions

pytestmark = pytest.mark.integration

GROUP = "celtest.payloadrun.dev"
VERSION = "v1"
PLURAL = "widgets"
KIND = "Widget"
CRD_NAME = f"{PLURAL}.{GROUP}"

MIN_REPLICAS_MESSAGE = "minReplicas must not exceed replicas"
IMMUTABLE_MODE_MESSAGE = "mode is immutable once set"


def widget_crd() -> dict:
    spec_schema = {
        "type": "object",
        "required": ["replicas"],
        "properties": {
            "replicas": {"type": "integer", "minimum": 0},
            "minReplicas": {"type": "integer", "minimum": 0},
            "mode": {
                "type": "string",
                "enum": ["inline", "byHandle"],
                # A transition rule: evaluated on update only, against the stored value.
                "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": IMMUTABLE_MODE_MESSAGE}
                ],
            },
        },
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.minReplicas) || self.minReplicas <= self.replicas",
                "message": MIN_REPLICAS_MESSAGE,
            },
            {
                "rule": "self.replicas <= 10",
                # Neither '...' + string(self.replicas) (the API server's cost estimator rejects
                # string(int) in a messageExpression: budget x100) nor format() (CEL's string
                # library has it from Kubernetes 1.30, and the oldest control plane is 1.29).
                "messageExpression": (
                    "'replicas is ' + (self.replicas > 100 ? 'far ' : '') + 'above the limit of 10'"
                ),
            },
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": "widget",
                "kind": KIND,
                "listKind": f"{KIND}List",
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "properties": {"spec": spec_schema}}
                    },
                }
            ],
        },
    }


def widget(name: str, **spec: object) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


def eventually(
    what: str, check: Callable[[], bool], timeout: float = 60.0, interval: float = 0.25
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def api_error_message(error: ApiException) -> str:
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(error.body)


@pytest.fixture
def widgets_crd(kube_api_client):
    extensions = client.ApiextensionsV1Api(kube_api_client)
    extensions.create_custom_resource_definition(widget_crd())

    def established() -> bool:
        crd = extensions.read_custom_resource_definition(CRD_NAME)
        return any(
            c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])
        )

    eventually(f"CRD {CRD_NAME} to be Established", established, timeout=30)
    yield CRD_NAME
    extensions.delete_custom_resource_definition(CRD_NAME)


def test_the_api_server_is_the_kubernetes_asked_for(kube_cluster: LocalCluster) -> None:
    """The pinned Kubernetes, or the oldest the project claims where hack/test.py's part
    oldest-control-plane asks for it (``PAYLOADRUN_KUBERNETES_VERSION``): what the tests of
    that part ran against is that version's API server."""
    status, version = kube_cluster.request("GET", "/version")
    assert status == 200, version
    assert version["gitVersion"] == control_plane_version(read_versions())


def test_crd_cel_rules_reject_violations_with_their_messages(
    kube_cluster: LocalCluster, kube_api_client, widgets_crd: str, namespace: str, tmp_path
) -> None:
    objects = client.CustomObjectsApi(kube_api_client)

    def create(body: dict) -> dict:
        return objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    # A valid object is stored (the schema and rules do not reject everything).
    created = create(widget("ok", replicas=3, minReplicas=1, mode="inline"))
    assert created["spec"]["replicas"] == 3

    # Python client: the static message of a rule.
    with pytest.raises(ApiException) as rejected:
        create(widget("too-few", replicas=2, minReplicas=5))
    assert rejected.value.status == 422
    assert MIN_REPLICAS_MESSAGE in api_error_message(rejected.value)

    # Python client: a messageExpression, evaluated against the object.
    with pytest.raises(ApiException) as rejected:
        create(widget("too-many", replicas=12))
    assert rejected.value.status == 422
    assert "replicas is above the limit of 10" in api_error_message(rejected.value)
    with pytest.raises(ApiException) as rejected:
        create(widget("far-too-many", replicas=120))
    assert "replicas is far above the limit of 10" in api_error_message(rejected.value)

    # Python client: a transition rule (oldSelf) rejects changing an immutable field.
    with pytest.raises(ApiException) as rejected:
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "ok", {"spec": {"mode": "byHandle"}}
        )
    assert rejected.value.status == 422
    assert IMMUTABLE_MODE_MESSAGE in api_error_message(rejected.value)

    # kubectl apply: the same rule, the same message, a non-zero exit.
    manifest = tmp_path / "violating.json"
    manifest.write_text(json.dumps(widget("applied", replicas=1, minReplicas=4)))
    result = kube_cluster.kubectl("apply", "--namespace", namespace, "-f", str(manifest))
    assert result.returncode != 0, f"kubectl apply accepted a violating object: {result.stdout}"
    assert MIN_REPLICAS_MESSAGE in result.stderr, result.stderr

    # kubectl apply of a valid object succeeds, then changing the immutable field fails.
    manifest.write_text(json.dumps(widget("applied", replicas=1, mode="inline")))
    result = kube_cluster.kubectl("apply", "--namespace", namespace, "-f", str(manifest))
    assert result.returncode == 0, result.stderr
    manifest.write_text(json.dumps(widget("applied", replicas=1, mode="byHandle")))
    result = kube_cluster.kubectl("apply", "--namespace", namespace, "-f", str(manifest))
    assert result.returncode != 0
    assert IMMUTABLE_MODE_MESSAGE in result.stderr, result.stderr


def test_deleting_an_owner_garbage_collects_its_dependents(kube_api_client, namespace: str) -> None:
    core = client.CoreV1Api(kube_api_client)
    owner = core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "owner"}, "data": {"role": "owner"}}
    )
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
    }
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {"name": "dependent", "ownerReferences": [reference]},
            "data": {"role": "dependent"},
        },
    )
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "bystander"}, "data": {"role": "unowned"}}
    )

    # Background propagation (the default): the API server deletes the owner at once and
    # only the garbage collector in kube-controller-manager can delete the dependent.
    core.delete_namespaced_config_map("owner", namespace)

    def dependent_gone() -> bool:
        try:
            core.read_namespaced_config_map("dependent", namespace)
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        return False

    eventually(
        "the garbage collector to delete the dependent ConfigMap", dependent_gone, timeout=90
    )
    assert core.read_namespaced_config_map("bystander", namespace).data == {"role": "unowned"}


def test_service_account_is_denied_without_a_role_and_allowed_with_one(
    kube_cluster: LocalCluster, kube_api_client, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api_client)
    rbac = client.RbacAuthorizationV1Api(kube_api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    sa_kubeconfig = kube_cluster.service_account_kubeconfig(namespace, "reader")
    sa_client = config.new_client_from_config(config_file=str(sa_kubeconfig))
    try:
        as_reader = client.CoreV1Api(sa_client)

        # Authenticated (a valid token) but not authorized: 403 naming the service account.
        with pytest.raises(ApiException) as denied:
            as_reader.list_namespaced_config_map(namespace)
        assert denied.value.status == 403
        assert f"system:serviceaccount:{namespace}:reader" in api_error_message(denied.value)

        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "configmap-reader"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["configmaps"],
                        "verbs": ["get", "list", "watch"],
                    }
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "reader-reads-configmaps"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "configmap-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        )

        def allowed() -> bool:
            try:
                as_reader.list_namespaced_config_map(namespace)
            except ApiException as error:
                if error.status == 403:
                    return False  # the authorizer's informer has not seen the binding yet
                raise
            return True

        eventually("the RoleBinding to take effect", allowed, timeout=30)

        # Only what the role grants: secrets stay forbidden.
        with pytest.raises(ApiException) as still_denied:
            as_reader.list_namespaced_secret(namespace)
        assert still_denied.value.status == 403

        # kubectl with the service account's kubeconfig agrees.
        result = kube_cluster.kubectl(
            "auth", "can-i", "list", "configmaps", "-n", namespace, kubeconfig=sa_kubeconfig
        )
        assert result.stdout.strip() == "yes", result.stdout + result.stderr
        result = kube_cluster.kubectl(
            "auth", "can-i", "list", "secrets", "-n", namespace, kubeconfig=sa_kubeconfig
        )
        assert result.stdout.strip() == "no", result.stdout + result.stderr
    finally:
        sa_client.close()
