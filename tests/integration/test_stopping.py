"""The operator's passes end before its client closes (its cleanup: handlers.register's
``close``): kopf ends its handlers first, but not the work queue's passes, which the operator
runs itself; one still running used the closed session, and kopf re-raised that at exit (a
traceback, exit status 1; seen once in ``make test``, when
``test_operator_restart_creates_no_duplicates`` stopped the operator during such a pass)."""

from __future__ import annotations

import asyncio
import dataclasses
from urllib.parse import urlsplit

import kopf
import pytest

from payloadrun_devkit.slow_proxy import SlowProxy
from payloadrun_operator.observed.following import Follower
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings
from payloadrun_operator.platform.workqueue import Work, WorkQueue
from payloadrun_operator.reconcile import Reconciler

pytestmark = pytest.mark.integration


def test_stopping_the_work_queue_ends_its_running_passes_and_starts_no_more(
    kube_cluster, namespace, monkeypatch
):
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    url = urlsplit(info.server)

    async def scenario(proxy: SlowProxy) -> tuple[int, int, int]:
        client = KubeClient()
        client.login(dataclasses.replace(info, server=f"https://{url.hostname}:{proxy.port}"))
        op = Operator(OperatorSettings(), client, OperatorMetrics())
        follower = Follower(op)
        follower.synced.set()  # nothing to list: the pass's read is what is held
        passes = WorkQueue(Reconciler(op, follower), workers=8, resume_workers=2)
        passes.start()
        try:
            # a child deleted: the pass reads the run, and gets no answer
            passes.add((namespace, "in-flight"), Work(spec=True))
            while proxy.connections == 0:  # the pass has reached the API server's door
                await asyncio.sleep(0.05)
            running = passes.pending()
            await passes.stop()
            stopped = passes.pending()
            # a child's event, or a retry's timer, after the stop
            passes.add((namespace, "after"), Work(spec=True))
            passes.add((namespace, "later"), Work(spec=True), delay=0.01)
            await asyncio.sleep(0.1)
            return running, stopped, passes.pending()
        finally:
            await client.close()

    with SlowProxy((url.hostname, url.port), delay=60) as proxy:
        running, stopped, after = asyncio.run(scenario(proxy))
    assert (running, stopped, after) == (1, 0, 0)
