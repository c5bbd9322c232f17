"""The operator's own passes end before its client closes (its cleanup: handlers.register's
``close``): kopf ends its handlers first, but not the passes the operator started itself for a
child's event (:class:`handlers.Requeue`); one still running used the closed session, and kopf
re-raised that at exit (a traceback, exit status 1; seen once in ``make test``, when
``test_operator_restart_creates_no_duplicates`` stopped the operator during such a pass)."""

from __future__ import annotations

import asyncio
import dataclasses
from urllib.parse import urlsplit

import kopf
import pytest

from payloadrun_devkit.slow_proxy import SlowProxy
from payloadrun_operator.handlers import Requeue, RunLocks, utc_now
from payloadrun_operator.observed.following import Follower
from payloadrun_operator.platform import heap
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings

pytestmark = pytest.mark.integration


def test_stopping_the_requeue_ends_its_running_passes_and_starts_no_more(
    kube_cluster, namespace, monkeypatch
):
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    url = urlsplit(info.server)

    async def scenario(proxy: SlowProxy) -> tuple[int, int, int]:
        client = KubeClient()
        client.login(dataclasses.replace(info, server=f"https://{url.hostname}:{proxy.port}"))
        op = Operator(OperatorSettings(), client, OperatorMetrics())
        requeue = Requeue(
            op, Follower(op, utc_now), RunLocks(), asyncio.Semaphore(8), heap.Drain(None)
        )
        try:
            requeue((namespace, "in-flight"))  # its read of the run gets no answer
            while proxy.connections == 0:  # the pass has reached the API server's door
                await asyncio.sleep(0.05)
            running = requeue.passes
            await requeue.stop()
            stopped = requeue.passes
            requeue((namespace, "after"))  # a child's event, or a retry's timer, after the stop
            requeue((namespace, "later"), delay=0.01)
            await asyncio.sleep(0.1)
            return running, stopped, requeue.passes
        finally:
            await client.close()

    with SlowProxy((url.hostname, url.port), delay=60) as proxy:
        running, stopped, after = asyncio.run(scenario(proxy))
    assert (running, stopped, after) == (1, 0, 0)
