"""The operator's /healthz and /metrics on real sockets; a port in use, as the sidecars say it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from payloadrun.serving import Listener, ListenError
from payloadrun_operator.__main__ import listeners
from payloadrun_operator.platform.election import Heartbeat
from payloadrun_operator.platform.health import STALLED_SECONDS, Endpoints, Health, health_app
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_healthz_and_metrics_answer_from_the_start_and_503_once_the_loop_stalls():
    clock = Clock()
    health = Health(Heartbeat(clock))
    config = OperatorSettings(metrics_port=0, health_port=0)
    op = Operator(config, KubeClient(), OperatorMetrics())
    # ports 0 would turn the endpoints off: the listeners of real ports, moved to port 0 here
    found = listeners("127.0.0.1", OperatorSettings(), op, health)
    assert [listener.name for listener in found] == ["metrics", "liveness"]
    endpoints = Endpoints([Listener(x.name, x.app, x.host, 0, x.moved_by) for x in found]).start()
    try:
        urls = endpoints.urls
        assert get(urls["liveness"] + "/healthz") == (200, "ok standby\n")
        health.role = "leader"
        op.metrics.leader.set(1)
        assert get(urls["liveness"] + "/healthz") == (200, "ok leader\n")
        status, text = get(urls["metrics"] + "/metrics")
        assert status == 200 and "\npayloadrun_operator_leader 1.0\n" in text
        health.heartbeat.beat()
        clock.now += STALLED_SECONDS + 1
        status, text = get(urls["liveness"] + "/healthz")
        assert status == 503 and text.startswith("stalled: the event loop has not run")
    finally:
        endpoints.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(urls["liveness"].rsplit(":", 1)[1])), 1)


def test_no_port_no_endpoint():
    op = Operator(OperatorSettings(), KubeClient(), OperatorMetrics())
    off = OperatorSettings(metrics_port=0, health_port=0)
    assert listeners("127.0.0.1", off, op, Health(Heartbeat())) == []


def test_endpoints_that_cannot_bind_raise_the_sidecars_listen_error_and_keep_nothing(busy_port):
    app = health_app(Health(Heartbeat()))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    first = Listener("liveness", app, "127.0.0.1", free, "PAYLOADRUN_X")
    second = Listener("metrics", app, "127.0.0.1", busy_port, "PAYLOADRUN_Y")
    with pytest.raises(ListenError) as caught:
        Endpoints([first, second]).start()
    assert caught.value.strerror == (
        f"cannot listen on port {busy_port}: in use (the metrics address "
        f"127.0.0.1:{busy_port}); choose another port with PAYLOADRUN_Y"
    )
    with socket.socket() as again:  # the first one bound is let go
        again.bind(("127.0.0.1", free))


@pytest.mark.parametrize(
    ("busy", "name", "variable", "what"),
    [
        ("PAYLOADRUN_METRICS_PORT", "metrics", "PAYLOADRUN_METRICS_PORT", "metrics"),
        ("PAYLOADRUN_HEALTH_PORT", "liveness", "PAYLOADRUN_HEALTH_PORT", "/healthz"),
    ],
)
def test_a_port_in_use_is_one_line_naming_the_port_and_the_variable_that_moves_it(
    busy_port, busy, name, variable, what
):
    """The operator's process exits 2 before any election or API call, with the sidecars'
    sentence (payloadrun.serving.ListenError) and no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAYLOADRUN_")}
    env |= {
        "PAYLOADRUN_METRICS_PORT": "0",
        "PAYLOADRUN_HEALTH_PORT": "0",
        busy: str(busy_port),
        "KUBECONFIG": os.devnull,
    }
    result = subprocess.run(
        [sys.executable, "-m", "payloadrun_operator", "--host", "127.0.0.1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"payloadrun-operator: cannot listen on port {busy_port}: in use (the {name} address "
        f"127.0.0.1:{busy_port}); choose another port with {variable} (0 turns {what} off)"
    ]
