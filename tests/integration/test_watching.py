"""The children's watches (observed/watching.py) against the real API server: the operator's
children only, every change after the list, across the server's own ends of the watch.

A watch from a version too old (410 Gone, which the reflector answers with a list) cannot be had
from this API server on demand: its watch cache answers a watch from resourceVersion 1 with the
objects as ADDED events, before and after etcd is compacted (checked), until its own window has
moved on, which takes minutes. tests/operator/test_watch_events.py holds the reflector's step
for that event."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf
import pytest

from payloadrun_operator.api.kinds import CLAIM
from payloadrun_operator.api.names import FIELD_MANAGER, LABEL_MANAGED_BY
from payloadrun_operator.observed.watching import Reflector, WatchSettings
from payloadrun_operator.platform.kube import KubeClient

pytestmark = pytest.mark.integration
MANAGED = {LABEL_MANAGED_BY: FIELD_MANAGER}


def claim(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "none-here",  # never bound: nothing else writes it
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def test_a_reflector_follows_the_operators_children_across_the_servers_ends_of_its_watch(
    kube_cluster, api, namespace, monkeypatch
):
    core = api["core"]
    core.create_namespaced_persistent_volume_claim(namespace, claim("before", MANAGED))
    core.create_namespaced_persistent_volume_claim(namespace, claim("not-ours", {}))
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    listed: list[set[str]] = []
    events: list[tuple[str, str]] = []

    async def follow() -> dict[str, Any]:
        client = KubeClient()
        client.login(kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
        reflector = Reflector(
            client,
            CLAIM,
            namespace,
            WatchSettings(
                server_timeout=1, inactivity_timeout=30
            ),  # ended by the server each second
            listed=lambda kind, scope, items: listed.append({i["metadata"]["name"] for i in items}),
            observed=lambda kind, event: events.append(
                (event["type"], event["object"]["metadata"]["name"])
            ),
        )
        task = asyncio.create_task(reflector.run())

        async def seen(expected: tuple[str, str]) -> None:
            deadline = time.monotonic() + 30
            while expected not in events:
                assert time.monotonic() < deadline, f"{expected} never came: {events}"
                await asyncio.sleep(0.05)

        try:
            while not listed:
                await asyncio.sleep(0.05)
            await asyncio.sleep(2.5)  # past two of the server's ends of the watch
            await asyncio.to_thread(
                core.create_namespaced_persistent_volume_claim, namespace, claim("after", MANAGED)
            )
            await asyncio.to_thread(
                core.create_namespaced_persistent_volume_claim, namespace, claim("also-not", {})
            )
            await seen(("ADDED", "after"))
            await asyncio.to_thread(
                core.delete_namespaced_persistent_volume_claim, "after", namespace
            )
            await seen(("DELETED", "after"))
            return {"lists": reflector.lists, "version": reflector.version}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()

    result = asyncio.run(follow())
    assert listed[0] == {"before"}  # the operator's children only
    assert result["lists"] == 1 and len(listed) == 1  # the server's ends are not lists
    assert int(result["version"]) > 0  # where the next watch would start
    names = {name for _, name in events}
    assert names <= {"after"}, events  # nothing of the list again, nothing not ours
    # the one change, once each, in order, across the server's ends of the watch
    assert [e for e in events if e[0] != "MODIFIED"] == [("ADDED", "after"), ("DELETED", "after")]
