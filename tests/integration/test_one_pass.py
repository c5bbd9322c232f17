"""One pass of the operator against the real API server, in this process: the reconcile
composes each pod template once (admission builds the children it then applies), and a pass
that changes nothing (a reconcile and a status refresh over a run that already holds their
status) sends no status write and no event: the run's resourceVersion stays.

Requests are counted as the client sends them (every one reaches the API server); the
compositions at the composing function itself (the real one runs)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
from example_runs import example_run

from payloadrun_operator import handlers
from payloadrun_operator.api.kinds import CHILD_KINDS
from payloadrun_operator.api.models import GROUP, KIND, PLURAL, VERSION
from payloadrun_operator.api.names import API_VERSION, MANAGED_SELECTOR
from payloadrun_operator.observed import readiness
from payloadrun_operator.observed.following import Cache, Follower
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings

pytestmark = pytest.mark.integration

ONCE_EACH = {"inference": 1, "orchestrator": 1, "trainer": 1}
NOW = "2026-12-04T11:00:00Z"


class CountingClient(KubeClient):
    """The operator's client, recording each request it sends (method, path)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    async def _request(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        self.sent.append((method, path))
        return await super()._request(method, path, what, **kwargs)

    def status_writes(self) -> list[str]:
        return [p for m, p in self.sent if m == "PATCH" and p.endswith("/status")]

    def events(self) -> list[str]:
        return [p for m, p in self.sent if m == "POST" and p.endswith("/events")]


async def cached_children(op: Operator, namespace: str) -> Cache:
    """The follower's cache of the namespace, filled as its sync fills it: one list a kind."""
    cache = Cache()
    for api_version, kind in CHILD_KINDS:
        listed = await op.client.list_objects(api_version, kind, namespace, MANAGED_SELECTOR)
        cache.replace(kind, namespace, listed)
    return cache


@pytest.mark.parametrize("example", ["multinode-by-handle.yaml", "singlenode-inline.yaml"])
def test_a_pass_composes_each_template_once_and_one_that_changes_nothing_writes_nothing(
    kube_cluster, crd, api, namespace, compositions, monkeypatch, example
):
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    body = example_run(example)
    name = body["metadata"]["name"]
    api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    logger = logging.getLogger("test_one_pass")

    async def passes() -> None:
        client = CountingClient()
        op = Operator(OperatorSettings(sidecar_image="payloadrun:test"), client, OperatorMetrics())
        client.login(kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
        try:

            async def run() -> dict[str, Any]:
                found = await client.get(API_VERSION, KIND, namespace, name)
                assert found is not None
                return found

            # the first reconcile: every child built once, applied, the status written once
            await handlers.reconcile(op, kopf.Body(await run()), logger)
            assert compositions == ONCE_EACH
            assert len(client.status_writes()) == 1
            reconciled = await run()
            assert reconciled["status"]["observedGeneration"] == 1
            assert readiness.follows(reconciled)

            # the first refresh writes what the children say (Ready, VolumeReady)
            cache = await cached_children(op, namespace)
            first = await readiness.refresh_run(op, reconciled, cache.children, NOW)
            assert first.written and len(client.status_writes()) == 2

            # the same pass again, over the run as it now is: nothing changed, nothing written
            held = await run()
            client.sent.clear()
            compositions.clear()
            await handlers.reconcile(op, kopf.Body(held), logger)
            assert compositions == ONCE_EACH  # once per pass
            cache = await cached_children(op, namespace)
            again = await readiness.refresh_run(op, held, cache.children, NOW)
            assert not again.written
            assert client.status_writes() == [] and client.events() == []
            after = await run()
            assert after["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
            assert after["status"] == held["status"]
        finally:
            await client.close()

    asyncio.run(passes())


def test_with_the_followers_cache_a_new_run_costs_one_status_write_and_its_record(
    kube_cluster, crd, api, namespace, monkeypatch
):
    """The reconcile writes what the follower would compute from its cache (VolumeReady, Ready)
    with its own part, and kopf's record of the handled spec in the same write: the follower's
    pass over the run as it then is writes nothing, and kopf sees no change to handle."""
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    body = example_run("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    async def passes() -> None:
        client = CountingClient()
        op = Operator(OperatorSettings(sidecar_image="payloadrun:test"), client, OperatorMetrics())
        client.login(kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
        follower = Follower(op, lambda: NOW)
        follower.start([namespace])
        try:
            await asyncio.wait_for(follower.synced.wait(), 60)
            created = await client.get(API_VERSION, KIND, namespace, name)
            assert created is not None
            assert handlers.RECORD.fetch(body=kopf.Body(created)) is None  # kopf: a creation
            client.sent.clear()
            await handlers.reconcile(op, kopf.Body(created), logging.getLogger("one"), follower)
            assert len(client.status_writes()) == 1 and client.events() == []
            run = await client.get(API_VERSION, KIND, namespace, name)
            assert run is not None
            types = {c["type"] for c in run["status"]["conditions"]}
            assert {"Validated", "Applied", "VolumeReady", "Ready"} <= types
            # kopf's record is the status's digest of what was handled: no change to handle,
            # and nothing of kopf's in the run's metadata
            assert handlers.RECORD.fetch(body=kopf.Body(run)) == handlers.RECORD.build(
                body=kopf.Body(run)
            )
            assert not (run["metadata"].get("annotations") or {})
            # the follower's pass over the run as it is now, from its cache: nothing to write
            refreshed = await readiness.refresh_run(op, run, follower.cache.children, NOW)
            assert not refreshed.written
            assert len(client.status_writes()) == 1 and client.events() == []
        finally:
            await follower.stop()
            await client.close()

    asyncio.run(passes())
