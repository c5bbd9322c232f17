"""Leader election against the real control plane: two operators, one acting, a takeover.

Operators as local processes (the chart's two pods: tests/integration/test_chart_install.py),
on a short lease so the takeover is quick: 6 s, renewed every second, given up after 4 s.
"""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from test_operator import (
    children,
    create_run,
    eventually,
    get_run,
    load_example,
    reconciled,
)

from payloadrun_devkit.local_operator import LocalOperator

pytestmark = pytest.mark.integration
LEASE = "payloadrun-operator"
TIMING = {
    "PAYLOADRUN_LEASE_DURATION_SECONDS": "6",
    "PAYLOADRUN_LEASE_RENEW_DEADLINE_SECONDS": "4",
    "PAYLOADRUN_LEASE_RETRY_SECONDS": "1",
}


def metric(op: LocalOperator, name: str, **labels: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(op.metrics_url, timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def holder(kube_api_client, namespace: str) -> str:
    lease = client.CoordinationV1Api(kube_api_client).read_namespaced_lease(LEASE, namespace)
    return lease.spec.holder_identity or ""


@pytest.fixture
def two_operators(kube_cluster, crd, namespace, tmp_path: Path):
    ops = [
        LocalOperator(
            kube_cluster.kubeconfig,
            namespaces=(namespace,),
            env={**TIMING, "PAYLOADRUN_SIDECAR_IMAGE": "payloadrun:test"},
            log_path=tmp_path / f"operator-{i}.log",
        )
        for i in range(2)
    ]
    for op in ops:
        op.start()
    try:
        yield ops
    finally:
        for op in ops:
            op.stop()


def leader_of(ops: list[LocalOperator]) -> tuple[LocalOperator, LocalOperator]:
    def one_leads():
        leading = [op for op in ops if op.process and metric(op, "payloadrun_operator_leader") == 1]
        return leading if len(leading) == 1 else None

    (leader,) = eventually("exactly one leader", one_leads)
    (standby,) = [op for op in ops if op is not leader]
    return leader, standby


def test_one_acts_the_standby_takes_over_when_the_leader_dies(
    kube_api_client, api, two_operators, namespace
):
    leader, standby = leader_of(two_operators)
    assert holder(kube_api_client, namespace).endswith(f"/{leader.pid}")
    first = load_example("multinode-by-handle.yaml")
    create_run(api, namespace, first)
    reconciled(api, namespace, first["metadata"]["name"])
    # the standby did nothing: no reconcile, no status written, no kopf at all
    assert metric(standby, "payloadrun_operator_reconciles_total", result="applied") == 0
    assert metric(standby, "payloadrun_operator_status_refreshes_total", outcome="written") == 0
    assert metric(leader, "payloadrun_operator_reconciles_total", result="applied") >= 1
    assert "standby: Lease" in standby.log_path.read_text()

    def uids() -> dict:
        found = children(api, namespace, first["metadata"]["name"])
        return {key: obj.metadata.uid for key, obj in found.items()}

    before = uids()

    os.killpg(leader.pid, signal.SIGKILL)  # no release: the standby waits out the lease
    leader.process.wait()
    second = load_example("multinode-by-handle.yaml")
    second["metadata"]["name"] = "after-failover"
    create_run(api, namespace, second)
    reconciled(api, namespace, "after-failover")  # how fast: bench/operator.py
    assert holder(kube_api_client, namespace).endswith(f"/{standby.pid}")
    # the new leader resumed the first run: the same children, none made again
    assert uids() == before
    assert get_run(api, namespace, first["metadata"]["name"])["status"]["phase"]


def test_a_leader_whose_lease_is_taken_stops(kube_api_client, two_operators, namespace):
    leader, standby = leader_of(two_operators)
    standby.stop()
    leases = client.CoordinationV1Api(kube_api_client)
    lease = leases.read_namespaced_lease(LEASE, namespace)
    lease.spec.holder_identity = "someone-else"
    lease.spec.renew_time = datetime.now(UTC) + timedelta(minutes=5)
    leases.replace_namespaced_lease(LEASE, namespace, lease)
    eventually("the leader exits", lambda: leader.process.poll() is not None, timeout=10)
    assert leader.process.returncode == 1
    assert "leader election lost: Lease" in leader.log_path.read_text()


def test_a_clean_stop_hands_over_at_once(kube_api_client, two_operators, namespace):
    leader, standby = leader_of(two_operators)
    leader.stop()
    assert "released Lease" in leader.log_path.read_text()
    eventually("the standby leads", lambda: metric(standby, "payloadrun_operator_leader") == 1)
    lease = client.CoordinationV1Api(kube_api_client).read_namespaced_lease(LEASE, namespace)
    assert lease.spec.lease_transitions >= 1
    assert lease.spec.holder_identity.endswith(f"/{standby.pid}")
