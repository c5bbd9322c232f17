"""Leader election against the real control plane: two operators, one acting, a takeover.

Operators as local processes (the chart's two pods: tests/integration/test_chart_install.py),
on a short lease so the takeover is quick: 6 s, renewed every second, given up after 4 s.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading
import time
import urllib.parse
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
from payloadrun_devkit.slow_proxy import SlowProxy
from payloadrun_operator.__main__ import login
from payloadrun_operator.platform import election

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
        # an operator that exited leads nothing (and has no metrics endpoint to ask)
        alive = [op for op in ops if op.process and op.process.poll() is None]
        leading = [op for op in alive if metric(op, "payloadrun_operator_leader") == 1]
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
    # the pass counts its reconcile once its status write has answered: the test may read the
    # status first (it did once in a warm make test on 2026-12-07)
    eventually(
        "the leader counts its reconcile",
        lambda: metric(leader, "payloadrun_operator_reconciles_total", result="applied") >= 1,
    )
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


class RecordingLeaseApi(election.LeaseApi):
    """The real Lease calls, each one's method and answer recorded."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, int]] = []

    def _call(self, method, path, body, timeout):
        status, payload = super()._call(method, path, body, timeout)
        self.calls.append((method, status))
        return status, payload

    def connected_socket(self) -> socket.socket:
        assert self._connection is not None and self._connection.sock is not None
        return self._connection.sock


@pytest.fixture
def elector(kube_cluster, namespace, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api = RecordingLeaseApi(login, namespace, LEASE)
    yield election.Elector(api, "in-process/1", election.Timing(6, 4, 1))
    api._disconnect()


def test_a_leader_renews_with_one_write_on_one_connection(elector):
    api = elector.api
    assert elector.try_once()  # no Lease yet: created
    sock = api.connected_socket()
    api.calls.clear()
    for _ in range(3):
        assert elector.try_once()
    # client-go's fast path: the Lease as last written, no read before each renewal
    assert api.calls == [("PUT", 200)] * 3
    assert api.connected_socket() is sock  # no new connection, no TLS handshake per renewal


def test_a_renewal_over_a_connection_the_server_dropped_goes_on_a_new_one(elector):
    api = elector.api
    assert elector.try_once()
    dropped = api.connected_socket()
    dropped.shutdown(socket.SHUT_RDWR)  # as an idle timeout or a restart does
    api.calls.clear()
    assert elector.try_once()
    assert api.calls == [("PUT", 200)]  # sent again, on a new connection
    assert api.connected_socket() is not dropped and dropped.fileno() == -1


def test_a_leader_whose_lease_changed_reads_it_and_steps_down(kube_api_client, elector, namespace):
    assert elector.try_once()
    leases = client.CoordinationV1Api(kube_api_client)
    lease = leases.read_namespaced_lease(LEASE, namespace)
    lease.spec.holder_identity = "someone-else"
    leases.replace_namespaced_lease(LEASE, namespace, lease)
    elector.api.calls.clear()
    assert not elector.try_once()
    # the optimistic renewal refused, the Lease read: held by another, not yet expired
    assert elector.api.calls == [("PUT", 409), ("GET", 200)]
    assert not elector.leading
    assert holder(kube_api_client, namespace) == "someone-else"


@pytest.fixture
def slow_api_server(kube_cluster, monkeypatch):
    """The API server behind a proxy that holds its answers back (``proxy.delay``), and a
    login that goes through it."""
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    info = login()
    url = urllib.parse.urlsplit(info.server)
    with SlowProxy((url.hostname, url.port)) as proxy:
        through = dataclasses.replace(info, server=f"https://{url.hostname}:{proxy.port}")
        yield proxy, lambda: through


def keep_for(elector: election.Elector, seconds: float) -> tuple[list[str], float | None]:
    """Run the renewals for ``seconds`` (or until lost): why it was lost, and when."""
    stop = threading.Event()
    lost: list[str] = []
    lost_at: list[float] = []

    def on_lost(why: str) -> None:
        lost.append(why)
        lost_at.append(time.monotonic())

    renewals = threading.Thread(target=elector.keep, args=(stop, election.Heartbeat(), on_lost))
    renewals.start()
    renewals.join(seconds)
    stop.set()
    renewals.join()
    return lost, (lost_at[0] if lost_at else None)


def test_a_leader_whose_api_server_answers_slowly_keeps_its_lease(slow_api_server, namespace):
    """Answers that take longer than a retry period, but come before the renew deadline, keep
    the leader leading (client-go's renewals wait until the deadline): a busy API server must
    not make the operator exit while every renewal would be answered."""
    proxy, through = slow_api_server
    api = RecordingLeaseApi(through, namespace, LEASE)
    elector = election.Elector(api, "in-process/1", election.Timing(10, 8, 1))
    assert elector.try_once()  # connected, leading
    proxy.delay = 3.0  # three retry periods, well inside the renew deadline
    api.calls.clear()
    lost, _ = keep_for(elector, 10)
    assert lost == []
    assert len(api.calls) >= 2 and set(api.calls) == {("PUT", 200)}
    api._disconnect()


def test_a_leader_whose_api_server_hangs_stops_before_its_lease_expires(slow_api_server, namespace):
    """A renewal that gets no answer is given up at the renew deadline, not after it: the
    leader stops before a standby may take the Lease (a lease duration after it last changed)."""
    proxy, through = slow_api_server
    api = RecordingLeaseApi(through, namespace, LEASE)
    timing = election.Timing(6, 4, 1)
    elector = election.Elector(api, "in-process/1", timing)
    assert elector.try_once()
    proxy.delay = 60.0  # no answer before the test ends
    lost, lost_at = keep_for(elector, 30)
    assert lost == ["the Lease could not be renewed for 4 s"]
    assert lost_at is not None and elector.renewed_at is not None
    assert timing.renew_deadline <= lost_at - elector.renewed_at < timing.lease_duration
    api._disconnect()
