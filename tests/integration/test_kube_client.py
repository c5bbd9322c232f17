"""The operator's API client against the real API server: an answer it does not read is asked
for in protobuf, and a refusal so answered still says what the API server said; a burst of calls
shares a bounded pool of kept-alive connections, and watches take none of it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kopf
import pytest

from payloadrun_operator.platform.kube import CALL_CONNECTIONS, ChildRefused, KubeClient

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
            session = client._sessions.calls
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


def connections_to(port: int) -> set[int]:
    """This process's established TCP connections to ``port`` on loopback: their local ports."""
    mine = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed since the listing (a resolver's thread, say)
            continue
        if target.startswith("socket:["):
            mine.add(target[len("socket:[") : -1])
    found = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port and inode in mine:
                found.add(int(local.rsplit(":", 1)[1], 16))
    return found


def test_a_burst_of_calls_shares_a_bounded_pool_and_watches_take_none_of_it(
    kube_cluster, namespace, monkeypatch
):
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    port = urlsplit(kube_cluster.server).port
    before = connections_to(port)  # the tests' own client's pool, idle meanwhile

    async def bursts() -> tuple[set[int], set[int], set[int]]:
        client = KubeClient()
        client.login(kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
        _, version = await client.list_collection("v1", "ConfigMap", namespace)
        listed = connections_to(port)  # with the list's, kept alive in the calls' pool
        # as many watches as the calls' pool has connections, each holding one open
        watches = [
            asyncio.create_task(
                anext(client.watch("v1", "ConfigMap", namespace, resource_version=version))
            )
            for _ in range(CALL_CONNECTIONS)
        ]
        try:
            for _ in range(600):  # 30 s
                if len(connections_to(port) - listed) >= CALL_CONNECTIONS:
                    break
                assert not any(watch.done() for watch in watches), "a watch ended"
                await asyncio.sleep(0.05)
            watching = connections_to(port) - listed

            async def burst() -> set[int]:
                calls = [client.list_objects("v1", "Service", namespace) for _ in range(64)]
                # with the watches in the calls' pool, these would wait for ever
                await asyncio.wait_for(asyncio.gather(*calls), timeout=60)
                return connections_to(port) - before - watching

            return watching, await burst(), await burst()
        finally:
            for watch in watches:
                watch.cancel()
            await client.close()

    watching, first, second = asyncio.run(bursts())
    assert len(watching) == CALL_CONNECTIONS
    assert 1 <= len(first) <= CALL_CONNECTIONS
    assert second <= first  # kept alive: the second burst opened no connection
