"""The follower's first lists (observed/following.py ``Follower.sync``), which every pass waits
for, against the real API server: a list the server refuses is retried on the reflectors'
backoff, from its first step (0.5 s), not after a flat wait.

The refusal here is RBAC's 403 (the operator's account may not list yet, then may); the one
that made this matter is the API server's 429 "storage is (re)initializing" for a CRD installed
a moment before (the chart, then the operator's start), which cannot be had on demand: with a
flat 5 s wait it held back the first pass of every run by 5 s."""

from __future__ import annotations

import asyncio
import logging
import re

import kopf
import pytest
from kubernetes import client

from payloadrun_operator.observed.following import Follower
from payloadrun_operator.observed.watching import BACKOFF_SECONDS
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings

pytestmark = pytest.mark.integration
ACCOUNT = "operator"
RETRIED = re.compile(r"listing the runs and their children failed \(again in ([0-9.]+) s\)")


def grant_lists(rbac: client.RbacAuthorizationV1Api, namespace: str) -> None:
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "lister"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["list", "watch"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "lister"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lister"},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
        },
    )


def test_a_refused_first_list_is_retried_on_the_reflectors_backoff_until_it_is_allowed(
    kube_cluster, kube_api_client, crd, namespace, monkeypatch, caplog
):
    client.CoreV1Api(kube_api_client).create_namespaced_service_account(
        namespace, {"metadata": {"name": ACCOUNT}}
    )
    monkeypatch.setenv(
        "KUBECONFIG", str(kube_cluster.service_account_kubeconfig(namespace, ACCOUNT))
    )
    caplog.set_level(logging.WARNING, logger="payloadrun.following")

    def retried() -> list[str]:
        return [r.getMessage() for r in caplog.records if RETRIED.search(r.getMessage())]

    def retries() -> list[float]:
        return [float(RETRIED.search(message)[1]) for message in retried()]

    async def scenario() -> None:
        kube = KubeClient()
        kube.login(kopf.login_with_kubeconfig(settings=kopf.OperatorSettings()))
        follower = Follower(Operator(OperatorSettings(), kube, OperatorMetrics()))
        try:
            syncing = asyncio.create_task(follower.sync([namespace]))

            async def refused_twice() -> None:  # the first two steps of the backoff
                while len(retries()) < 2:
                    assert not syncing.done(), "listed without the right to"
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(refused_twice(), timeout=60)
            grant_lists(client.RbacAuthorizationV1Api(kube_api_client), namespace)
            await asyncio.wait_for(syncing, timeout=60)
        finally:
            await kube.close()
        assert follower.synced.is_set()

    asyncio.run(scenario())
    waits = retries()
    assert "403 Forbidden" in retried()[0], retried()[0]  # RBAC's refusal, as the server said it
    # every wait is the reflectors' next step, the last one repeated
    steps = [BACKOFF_SECONDS[min(i, len(BACKOFF_SECONDS) - 1)] for i in range(len(waits))]
    assert waits == steps
