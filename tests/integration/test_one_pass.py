"""The operator's one pass (reconcile.Reconciler) and its one work queue against the real API
server, in this process, with the real follower (its lists and watches): a pass composes each
pod template once; a new run costs one status write, kopf's record in it; a pass that changes
nothing writes nothing; and, with the client instrumented, no two writes of one run are ever in
flight at once, every write comes from inside a pass, and a burst of child events during a pass
is at most one more pass.

Requests are counted as the client sends them (every one reaches the API server); the
compositions at the composing function itself (the real one runs)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
import pytest
from example_runs import example_run

from payloadrun_operator.api.kinds import JOB
from payloadrun_operator.api.models import GROUP, KIND, PLURAL, VERSION
from payloadrun_operator.api.names import API_VERSION
from payloadrun_operator.observed.following import Follower
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings
from payloadrun_operator.platform.workqueue import Again, RunKey, Work, WorkQueue
from payloadrun_operator.reconcile import RECORD, Reconciler

pytestmark = pytest.mark.integration

ONCE_EACH = {"inference": 1, "orchestrator": 1, "trainer": 1}
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
IN_PASS: contextvars.ContextVar[RunKey | None] = contextvars.ContextVar("in_pass", default=None)


class CountingClient(KubeClient):
    """The operator's client, recording each request it sends (method, path), the pass it was
    sent from (None: outside every pass), and the most status writes of one run in flight at
    once."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, RunKey | None]] = []
        self.in_flight: dict[RunKey, int] = {}
        self.most_in_flight = 0

    async def _request(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        key = IN_PASS.get()
        self.sent.append((method, path, key))
        if not (method == "PATCH" and path.endswith("/status") and PLURAL in path):
            return await super()._request(method, path, what, **kwargs)
        key = key or ("", "")
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight[key])
        try:
            await asyncio.sleep(0.01)  # widen the window another write of the run could use
            return await super()._request(method, path, what, **kwargs)
        finally:
            self.in_flight[key] -= 1

    def status_writes(self) -> list[str]:
        return [p for m, p, _ in self.sent if m == "PATCH" and p.endswith("/status")]

    def events(self) -> list[str]:
        return [p for m, p, _ in self.sent if m == "POST" and p.endswith("/events")]

    def writes_outside_a_pass(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, key in self.sent if m in WRITES and key is None]


class Overlaps:
    """A pass wrapped to count its passes of each run in flight (``running``), and the most
    of one run ever in flight at once (``most``)."""

    def __init__(self, one_pass: Callable[[RunKey, Work], Awaitable[Again | None]]) -> None:
        self.one_pass = one_pass
        self.running: dict[RunKey, int] = {}
        self.most = 0

    async def __call__(self, key: RunKey, work: Work) -> Again | None:
        self.running[key] = self.running.get(key, 0) + 1
        self.most = max(self.most, self.running[key])
        try:
            return await self.one_pass(key, work)
        finally:
            self.running[key] -= 1


def marked(reconciler: Reconciler) -> Callable[[RunKey, Work], Awaitable[Again | None]]:
    """The pass, with every request it sends marked as its own."""

    async def one_pass(key: RunKey, work: Work) -> Again | None:
        IN_PASS.set(key)
        return await reconciler(key, work)

    return one_pass


async def operator_parts(namespace: str) -> tuple[CountingClient, Operator, Follower]:
    client = CountingClient()
    op = Operator(OperatorSettings(sidecar_image="payloadrun:test"), client, OperatorMetrics())
    client.login(kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
    follower = Follower(op)
    return client, op, follower


@pytest.mark.parametrize("example", ["multinode-by-handle.yaml", "singlenode-inline.yaml"])
def test_a_new_run_costs_one_status_write_and_a_pass_that_changes_nothing_writes_nothing(
    kube_cluster, crd, api, namespace, compositions, monkeypatch, example
):
    """The pass writes the spec's verdict, what the children say (VolumeReady, Ready) and
    kopf's record of the handled spec in one status write, composing each template once; a
    pass over the run as it then is (its spec side again, or a child's event) writes nothing,
    and kopf sees no change to handle."""
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    body = example_run(example)
    name = body["metadata"]["name"]
    key = (namespace, name)
    api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    async def passes() -> None:
        client, op, follower = await operator_parts(namespace)
        follower.start([namespace])
        reconcile = Reconciler(op, follower)
        try:
            await asyncio.wait_for(follower.synced.wait(), 60)

            async def run() -> dict[str, Any]:
                found = await client.get(API_VERSION, KIND, namespace, name)
                assert found is not None
                return found

            created = await run()
            assert RECORD.fetch(body=kopf.Body(created)) is None  # kopf: a creation
            client.sent.clear()
            assert await reconcile(key, Work(created, spec=True)) is None
            assert compositions == ONCE_EACH
            assert len(client.status_writes()) == 1 and client.events() == []
            held = await run()
            types = {c["type"] for c in held["status"]["conditions"]}
            assert {"Validated", "Applied", "VolumeReady", "Ready"} <= types
            assert held["status"]["observedGeneration"] == 1
            # kopf's record is the status's digest of what was handled: no change to handle,
            # and nothing of kopf's in the run's metadata
            assert RECORD.fetch(body=kopf.Body(held)) == RECORD.build(body=kopf.Body(held))
            assert not (held["metadata"].get("annotations") or {})

            # the spec side again, over the run as it now is: once each, nothing written
            client.sent.clear()
            compositions.clear()
            await reconcile(key, Work(held, spec=True))
            assert compositions == ONCE_EACH
            # and a child's event's pass, from the cached run: nothing composed or written
            follower.observe(KIND, {"type": "MODIFIED", "object": held})
            compositions.clear()
            await reconcile(key, Work())
            assert compositions == {}
            assert client.status_writes() == [] and client.events() == []
            after = await run()
            assert after["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
            assert after["status"] == held["status"]
        finally:
            await follower.stop()
            await client.close()

    asyncio.run(passes())


def test_one_pass_of_a_run_at_a_time_every_write_from_a_pass_and_a_burst_coalesces(
    kube_cluster, crd, api, namespace, monkeypatch
):
    """The operator's queue and pass, wired as handlers.register wires them, under bursts: 40
    child events at once, twice (the cache filled by the follower's lists, no watch running, so
    the events are the test's alone), then a status write that meets a conflict (the run's
    annotations changed under a pass that read it before). Every write the client sends comes from
    inside a pass, no two passes of the run and no two of its status writes are ever in flight
    at once, and the events that arrive during a pass are one more pass, not forty."""
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    body = example_run("multinode-by-handle.yaml")
    name = body["metadata"]["name"]
    key = (namespace, name)
    api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    async def bursts() -> tuple[CountingClient, list[int], int, int]:
        client, op, follower = await operator_parts(namespace)
        overlaps = Overlaps(marked(Reconciler(op, follower)))
        passes = WorkQueue(overlaps, workers=8, resume_workers=2)
        follower.notify = lambda k, spec: passes.add(k, Work(spec=spec))
        await follower.sync([namespace])  # the lists alone: no watch delivers anything
        passes.start()
        try:
            created = await client.get(API_VERSION, KIND, namespace, name)
            assert created is not None
            await passes.process(key, Work(created, spec=True))  # kopf's create handler
            while passes.pending():
                await asyncio.sleep(0.01)
            assert len(client.status_writes()) == 1
            job = follower.cache.children[(namespace, JOB.kind, f"{name}-trainer")]

            def forty_events() -> None:  # as one chunk of a watch delivers them
                for _ in range(40):
                    follower.observe_child(JOB, {"type": "MODIFIED", "object": job})

            counted = []
            # during a pass (a retry's: the run read, its children applied), then between passes
            for during in (True, False):
                before = passes.passes
                if during:
                    passes.add(key, Work(spec=True))
                    while not overlaps.running.get(key):
                        await asyncio.sleep(0)
                forty_events()
                assert bool(overlaps.running.get(key)) is during
                while passes.pending():
                    await asyncio.sleep(0.01)
                counted.append(passes.passes - before)
            # a conflict: a pass over the run as it was, after an annotation changed it again
            api["custom"].patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"annotations": {"a": "1"}}}
            )
            labelled = await client.get(API_VERSION, KIND, namespace, name)
            assert labelled is not None
            api["custom"].patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"annotations": {"b": "2"}}}
            )
            conflicts = len(client.status_writes())
            await passes.process(key, Work(labelled, spec=True))
            while passes.pending():  # the spec side owed again, read from the API server
                await asyncio.sleep(0.01)
            return client, counted, len(client.status_writes()) - conflicts, overlaps.most
        finally:
            await passes.stop()
            await client.close()

    client, counted, after_conflict, passes_at_once = asyncio.run(bursts())
    assert client.writes_outside_a_pass() == []
    assert client.most_in_flight == 1 and passes_at_once == 1
    assert counted == [2, 1]  # the pass under way and one more; then one
    assert after_conflict == 2  # the one refused (409), then the one over the run as it is
    run = api["custom"].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    assert run["metadata"]["annotations"] == {"a": "1", "b": "2"}
    # the annotations' change handled after the conflict: its digest recorded
    assert run["status"]["observedDigest"] == RECORD.digest(run)
