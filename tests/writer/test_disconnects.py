"""Hang-ups: each ends in one counted outcome, one log line, no traceback, no file left.

Nothing here waits a fixed time: each step waits, with a timeout, for the fact it needs (the
fake vLLM received the request, its answer found its client gone, the writer counted the
disconnect, the writer stopped).
"""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from payloadrun.writer import server as writer_server

from .conftest import fake_config, fake_posts, files_under, http, metric

GEN = "/inference/v1/generate"


def _body(payload_dir=None, stream=False, max_tokens=4):
    params = {"max_tokens": max_tokens}
    if payload_dir is not None:
        params["extra_args"] = {"payload_dir": payload_dir}
    body = {"token_ids": list(range(12)), "sampling_params": params}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def _wait_for(predicate, timeout=10.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _send_and_hang_up(url, body, headers, *, when, read=0):
    """Send a POST over a raw socket, read ``read`` bytes of the answer, close once ``when()``."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(
            f"POST {GEN} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{head}\r\n".encode()
            + body
        )
        got = b""
        while len(got) < read:
            got += sock.recv(65536)
        _wait_for(when, what="the moment to hang up")


def _disconnected(writer):
    return metric(writer, "payloadrun_writer_requests_total", mode="disconnected", code="499")


def _served(writer):
    total = 0.0
    for family in writer.app[writer_server.WRITER_KEY].metrics.registry.collect():
        if family.name == "payloadrun_writer_requests":
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


def _assert_one_quiet_line(caplog):
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], [
        r.getMessage() for r in caplog.records
    ]
    lines = [r for r in caplog.records if "ended before its answer was sent" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    caplog.set_level(logging.INFO, logger="payloadrun")
    return caplog


@pytest.mark.parametrize("by_handle", [True, False])
def test_a_client_that_hangs_up_before_vllm_answers(writer, fake, root, logs, by_handle):
    """The defect: an ERROR with a traceback and a request missing from requests_total."""
    body = _body(f"{root}/v1" if by_handle else None)
    # the fake holds its answer a while: the client hangs up once the request reached it
    _send_and_hang_up(writer.url, body, {"x-fake-delay": "0.6"}, when=lambda: fake_posts(fake))
    _wait_for(lambda: _disconnected(writer) == 1)
    # the fake's answer, once made, found the writer gone: it never reached the writer, so
    # nothing is written for nobody
    _wait_for(lambda: fake_config(fake).stats["aborted"] == 1, what="the fake's answer")
    assert files_under(root) == []
    assert _served(writer) == 1, "one request, one outcome"
    _assert_one_quiet_line(logs)


def test_a_client_that_hangs_up_mid_stream(writer, fake, logs):
    knobs = {"x-fake-stream-interval": "0.05"}
    body = _body(stream=True, max_tokens=60)
    _send_and_hang_up(writer.url, body, knobs, when=lambda: True, read=1)
    _wait_for(lambda: _disconnected(writer) == 1)
    _wait_for(lambda: fake_config(fake).stats["aborted"] == 1)  # the upstream request went too
    assert _served(writer) == 1
    _assert_one_quiet_line(logs)


def test_a_file_written_for_a_client_that_left_is_deleted(writer, fake, root, logs, monkeypatch):
    """The client leaves while its payload is being written: the file goes with it."""
    original = writer_server.write_prepared

    started, written = [], []

    def slow_rewrite(*args):
        started.append(True)
        # the rewrite runs on until the writer has counted its client gone
        _wait_for(lambda: _disconnected(writer) == 1, what="the disconnect")
        result = original(*args)
        written.append(result.file)
        return result

    monkeypatch.setattr(writer_server, "write_prepared", slow_rewrite)
    _send_and_hang_up(writer.url, _body(f"{root}/v1"), {}, when=lambda: started)
    _wait_for(lambda: _disconnected(writer) == 1)
    _wait_for(lambda: written)
    assert written[0] is not None and written[0].startswith(str(root))
    _wait_for(lambda: files_under(root) == [])
    assert metric(writer, "payloadrun_writer_requests_total", mode="handle", code="200") == 0
    _assert_one_quiet_line(logs)


def test_vllm_breaking_off_a_body_is_one_warning_without_traceback(writer, fake, logs):
    reply_error = None
    try:
        http("POST", writer.url + GEN, _body(), {"x-fake-disconnect": "body"})
    except Exception as exc:  # the client sees a cut body
        reply_error = exc
    assert reply_error is not None
    _wait_for(lambda: metric(writer, "payloadrun_writer_upstream_failures_total", kind="broken"))
    writer.stop()  # once stopped, everything it had to log about the request is logged
    assert not [r for r in logs.records if r.levelno >= logging.ERROR or r.exc_info]
    assert len([r for r in logs.records if "broke off a response" in r.getMessage()]) == 1
    assert _served(writer) == 1
