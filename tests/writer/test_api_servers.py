"""One writer in front of every vLLM API server of its pod (issue 36), as real processes.

The fake vLLM serves several API servers from one process on consecutive ports, each naming its
port in ``x-fake-server`` and counting its own requests (``/fake/stats``); the writer runs as
``payloadrun writer --upstream URL,URL,...``. Everything waits on facts: counters, headers,
``/readyz`` answers.
"""

from __future__ import annotations

import http.client as httpclient
import json
import re
import time
import urllib.request
from collections import Counter
from urllib.parse import urlsplit

import pytest

from payloadrun.testing.fakegroup import GROUP_PATH
from payloadrun.testing.fakevllm import SERVER_HEADER
from payloadrun.testing.processes import fake_vllm, free_port, writer
from payloadrun.writer.upstreams import DOWN_SECONDS

from .conftest import CREATED, http
from .test_wire_format import GEN, _check_moved, _generate

COMPLETIONS = "/v1/completions"


def _completion(i: int) -> bytes:
    return json.dumps({"prompt": f"request {i}", "max_tokens": 2}).encode()


def _stats(url: str) -> dict[str, int]:
    return http("GET", url + "/fake/stats").json()


def _port(url: str) -> str:
    return str(urlsplit(url).port)


def scrape(process) -> dict[tuple[str, str], float]:
    """(name, upstream label) -> value of the writer's per-upstream series."""
    with urllib.request.urlopen(process.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    found = {}
    for name, upstream, value in re.findall(
        r'^(payloadrun_writer_upstream_\w+)\{upstream="([^"]+)"\} (\S+)$', text, re.M
    ):
        found[name, upstream] = float(value)
    return found


def wait_ready(url: str, want: int, timeout: float = 30.0):
    """``/readyz`` until it answers ``want``; its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        reply = http("GET", url + "/readyz")
        if reply.status == want or time.monotonic() > deadline:
            return reply
        time.sleep(0.02)


@pytest.fixture
def four(tmp_path):
    with fake_vllm("--created", str(CREATED), api_servers=4) as fake:
        yield fake


def test_requests_through_one_writer_reach_every_api_server_in_turn(four, tmp_path):
    upstream = ",".join(four.urls)
    with writer(upstream, tmp_path / "payloads") as w:
        parts = urlsplit(w.url)
        conn = httpclient.HTTPConnection(parts.hostname, parts.port, timeout=30)
        served = []
        try:  # one keep-alive connection: kube-proxy would pin it to one pod's port for good
            for i in range(40):
                conn.request("POST", COMPLETIONS, _completion(i), {"Content-Type": "x"})
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200
                served.append(resp.getheader(SERVER_HEADER))
        finally:
            conn.close()
        ports = [_port(url) for url in four.urls]
        assert served == ports * 10  # fewest in flight (all 0 in turn): round robin
        for url in four.urls:
            assert _stats(url)[COMPLETIONS] == 10
        series = scrape(w)
        for url in four.urls:
            assert series["payloadrun_writer_upstream_requests_total", url] == 10
            assert series["payloadrun_writer_upstream_requests_in_flight", url] == 0
            assert series["payloadrun_writer_upstream_connect_failures_total", url] == 0


def test_a_stream_stays_with_its_api_server_and_the_others_take_the_rest(four, tmp_path):
    with writer(",".join(four.urls[:2]), tmp_path / "payloads") as w:
        parts = urlsplit(w.url)
        stream = httpclient.HTTPConnection(parts.hostname, parts.port, timeout=30)
        body = json.dumps({"prompt": "long", "max_tokens": 16, "stream": True}).encode()
        # 16 events 0.5 s apart: open for 8 s, far longer than the requests below take
        stream.request("POST", COMPLETIONS, body, {"x-fake-stream-interval": "0.5"})
        resp = stream.getresponse()
        assert resp.status == 200
        first = resp.readline()  # the first event arrived: the stream is in flight
        assert first.startswith(b"data: ")
        busy = resp.getheader(SERVER_HEADER)
        idle = next(_port(u) for u in four.urls[:2] if _port(u) != busy)
        busy_url = next(u for u in four.urls[:2] if _port(u) == busy)
        assert scrape(w)["payloadrun_writer_upstream_requests_in_flight", busy_url] == 1
        others = [http("POST", w.url + COMPLETIONS, _completion(i)) for i in range(5)]
        assert [r.headers[SERVER_HEADER] for r in others] == [idle] * 5  # not in turn
        stream.close()


def test_a_session_stays_on_its_busy_api_server_and_the_rest_go_to_the_idle_one(four, tmp_path):
    """A multi-turn rollout's turns (one X-Session-ID) reach the engine that holds its prefix in
    cache, however busy; requests without a session still go where fewest are in flight."""
    session = {"X-Session-ID": "rollout-7"}
    with writer(",".join(four.urls[:2]), tmp_path / "payloads") as w:
        first = http("POST", w.url + COMPLETIONS, _completion(0), session)
        mine = first.headers[SERVER_HEADER]
        other = next(_port(u) for u in four.urls[:2] if _port(u) != mine)
        mine_url = next(u for u in four.urls[:2] if _port(u) == mine)
        parts = urlsplit(w.url)
        stream = httpclient.HTTPConnection(parts.hostname, parts.port, timeout=30)
        body = json.dumps({"prompt": "long turn", "max_tokens": 16, "stream": True}).encode()
        stream.request("POST", COMPLETIONS, body, {"x-fake-stream-interval": "0.5", **session})
        resp = stream.getresponse()
        assert resp.readline().startswith(b"data: ")  # in flight on the session's server
        assert resp.getheader(SERVER_HEADER) == mine
        assert scrape(w)["payloadrun_writer_upstream_requests_in_flight", mine_url] == 1
        turns = [http("POST", w.url + COMPLETIONS, _completion(i), session) for i in (1, 2)]
        assert [r.headers[SERVER_HEADER] for r in turns] == [mine, mine]  # busy, still its own
        others = [http("POST", w.url + COMPLETIONS, _completion(i)) for i in range(3, 6)]
        assert [r.headers[SERVER_HEADER] for r in others] == [other] * 3
        stream.close()


def test_a_session_moves_only_while_its_api_server_is_gone(tmp_path):
    """Its server refuses connections: the session's turns go to the other; once the server is
    back (the writer's readiness check sees it), they return to it."""
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    with fake_vllm(port=ports[1]), writer(",".join(urls), tmp_path / "payloads") as w:
        # sessions whose own server is the first (which is not running yet) and the second
        with fake_vllm(port=ports[0]):
            wait_ready(w.url, 200)
            seen = {
                s: http("POST", w.url + COMPLETIONS, _completion(0), {"X-Session-ID": s})
                for s in (f"rollout-{i}" for i in range(12))
            }
            on = {s: r.headers[SERVER_HEADER] for s, r in seen.items()}
        away = [s for s, port in on.items() if port == str(ports[0])]
        stay = [s for s, port in on.items() if port == str(ports[1])]
        assert away and stay, on
        gone = [http("POST", w.url + COMPLETIONS, _completion(1), {"X-Session-ID": s})
                for s in away + stay]  # fmt: skip
        assert {r.headers[SERVER_HEADER] for r in gone} == {str(ports[1])}
        with fake_vllm(port=ports[0]):
            assert wait_ready(w.url, 200).status == 200
            back = {
                s: http("POST", w.url + COMPLETIONS, _completion(2), {"X-Session-ID": s})
                for s in away + stay
            }
            assert {s: r.headers[SERVER_HEADER] for s, r in back.items()} == on


def test_by_handle_from_the_second_api_server_reads_back_exact(four, tmp_path):
    root = tmp_path / "payloads"
    root.mkdir()
    with writer(",".join(four.urls[:2]), root) as w:
        first = http("POST", w.url + GEN, _generate(f"{root}/v1", prompt_len=30))
        assert first.headers[SERVER_HEADER] == _port(four.urls[0])
        request = _generate(f"{root}/v1", prompt_len=40)
        via = http("POST", w.url + GEN, json.dumps(request).encode())
        assert via.status == 200, via.body[:300]
        assert via.headers[SERVER_HEADER] == _port(four.urls[1])  # the second took it
        direct = http("POST", four.urls[1] + GEN, json.dumps(request).encode())
        _check_moved(root, via, direct, prompt_lens=[40])


def test_readiness_names_the_upstream_that_is_not_healthy(four, tmp_path):
    missing = f"http://127.0.0.1:{free_port()}"
    upstream = ",".join([*four.urls[:2], missing])
    with writer(upstream, tmp_path / "payloads") as w:
        reply = wait_ready(w.url, 503)
        assert reply.status == 503
        body = reply.json()
        assert body["ready"] is False
        assert body["upstream"].startswith(f"vLLM at {missing} is unreachable")
        for healthy in four.urls[:2]:
            assert healthy not in body["upstream"]
        # it comes up: ready, with no restart of the writer
        with fake_vllm(port=urlsplit(missing).port):
            assert wait_ready(w.url, 200).json()["upstream"] == "ok"


def test_readiness_names_an_api_server_that_answers_503(tmp_path):
    # a group's leader without its worker answers /health 503: an API server not ready yet
    with (
        fake_vllm() as plain,
        fake_vllm("--group-size", "2", ready_path=GROUP_PATH) as leader,
        writer(f"{plain.url},{leader.url}", tmp_path / "payloads") as w,
    ):
        body = wait_ready(w.url, 503).json()
        assert body["upstream"] == f"vLLM at {leader.url} is not healthy: /health answered 503"


def test_a_refused_connection_goes_on_to_a_working_api_server(four, tmp_path):
    missing = f"http://127.0.0.1:{free_port()}"
    with writer(f"{missing},{four.urls[0]}", tmp_path / "payloads") as w:
        began = time.monotonic()
        replies = [http("POST", w.url + COMPLETIONS, _completion(i)) for i in range(6)]
        took = time.monotonic() - began
        assert [r.status for r in replies] == [200] * 6
        assert Counter(r.headers[SERVER_HEADER] for r in replies) == {_port(four.urls[0]): 6}
        series = scrape(w)
        # The first request tries the first upstream (nothing in flight, none down yet: the
        # writer has not checked them), is refused, and goes on; the refusal puts it down for
        # DOWN_SECONDS, while the others pass it over. So exactly one refusal when the six took
        # less than that (milliseconds each); on a machine so slow they did not, it is tried once
        # more after each DOWN_SECONDS, never sooner.
        refused = series["payloadrun_writer_upstream_connect_failures_total", missing]
        assert 1 <= refused <= 1 + took // DOWN_SECONDS, (refused, took)
        assert series["payloadrun_writer_upstream_requests_total", four.urls[0]] == 6
        assert series["payloadrun_writer_upstream_requests_total", missing] == 0
        text = urllib.request.urlopen(w.metrics_url, timeout=10).read().decode()
        assert 'payloadrun_writer_upstream_failures_total{kind="unreachable"} 0.0' in text


def test_every_api_server_refusing_is_one_502_naming_the_list(tmp_path):
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with writer(",".join(dead), tmp_path / "payloads") as w:
        reply = http("POST", w.url + COMPLETIONS, _completion(0))
        assert reply.status == 502
        message = reply.json()["error"]["message"]
        assert "is unreachable" in message and ",".join(dead) in message
        series = scrape(w)
        failures = [series["payloadrun_writer_upstream_connect_failures_total", u] for u in dead]
        assert failures == [1, 1]
