"""The operator's API client against the real API server: an answer it does not read is asked
for in protobuf, and a refusal so answered still says what the API server said."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from payloadrun_operator.platform.kube import ChildRefused, KubeClient

pytestmark = pytest.mark.integration


def service(namespace: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "probe", "namespace": namespace, "labels": {"a": "b"}},
        "spec": {"selector": {"a": "b"}, "ports": [{"name": "http", "port": port}]},
    }


def test_an_unread_answer_is_protobuf_and_its_refusal_still_says_why(
    kube_cluster, namespace, monkeypatch
):
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))

    async def apply_twice() -> tuple[dict, dict, ChildRefused]:
        client = KubeClient()
        client.login(kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
        try:
            unread = await client.apply(service(namespace, 80), answer=False)
            read = await client.apply(service(namespace, 81))
            with pytest.raises(ChildRefused) as refused:
                await client.apply(service(namespace, 70000), answer=False)
            # what the API server sends for an unread answer: protobuf, envelope and all
            session = client._session
            assert session is not None
            async with session.get(
                f"{client._server}/api/v1/namespaces/{namespace}/services/probe",
                headers={"Accept": "application/vnd.kubernetes.protobuf, application/json"},
            ) as resp:
                assert resp.content_type == "application/vnd.kubernetes.protobuf"
                assert (await resp.read()).startswith(b"k8s\x00")
            return unread, read, refused.value
        finally:
            await client.close()

    unread, read, refused = asyncio.run(apply_twice())
    assert unread == {}
    assert read["spec"]["ports"][0]["port"] == 81  # a read answer is the object, decoded
    assert (refused.status, refused.reason) == (422, "Invalid")
    assert 'Service "probe" is invalid' in refused.message
    assert "spec.ports[0].port" in refused.message and "70000" in refused.message
