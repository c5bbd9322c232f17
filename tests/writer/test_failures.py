"""Failure modes: a payload that cannot be written goes back inline; vLLM failing is a 502/504."""

from __future__ import annotations

import http.client as httpclient
import json
import shutil

import pytest

from .conftest import (
    fake_config,
    files_under,
    free_port,
    http,
    metric,
    mount_tmpfs,
    umount,
    wait_for_metric,
)

GEN = "/inference/v1/generate"
BIG = {"x-fake-layers": "48", "x-fake-top-k": "8"}  # 384 B of routing per token


def _body(payload_dir, prompt_len=400):
    return json.dumps(
        {
            "token_ids": list(range(prompt_len)),
            "sampling_params": {"max_tokens": 16, "extra_args": {"payload_dir": payload_dir}},
        }
    ).encode()


def _assert_inline_fallback(writer, fake, body, reason):
    via = http("POST", writer.url + GEN, body, BIG)
    direct = http("POST", fake.url + GEN, body, BIG)
    assert via.status == 200
    assert via.body == direct.body, "the response must come back whole, inline"
    assert via.headers["x-payloadrun-mode"] == "inline"
    assert via.headers["x-payloadrun-fallback"] == reason
    assert metric(writer, "payloadrun_writer_fallbacks_total", reason=reason) == 1
    assert metric(writer, "payloadrun_writer_requests_total", mode="inline", code="200") == 1
    assert (
        metric(writer, "payloadrun_writer_payload_written_bytes_total", field="routed_experts") == 0
    )


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    if not mount_tmpfs(mnt, "size=64k"):
        pytest.skip("cannot mount a small tmpfs here (needs root and mount rights)")
    yield mnt
    umount(mnt)


def test_disk_full_sends_inline_and_leaves_no_file(fake, small_fs, start_writer):
    writer = start_writer(fake.url, small_fs)
    _assert_inline_fallback(writer, fake, _body(f"{small_fs}/v1"), "no_space")
    assert files_under(small_fs) == []
    # A small payload still fits: the writer keeps working once there is room.
    small = http("POST", writer.url + GEN, _body(f"{small_fs}/v1", prompt_len=8))
    assert small.headers["x-payloadrun-mode"] == "handle"
    assert len(files_under(small_fs)) == 1


def test_read_only_volume_sends_inline(fake, tmp_path, start_writer):
    mnt = tmp_path / "ro"
    if not mount_tmpfs(mnt, "ro,size=64k"):
        pytest.skip("cannot mount a tmpfs here (needs root and mount rights)")
    try:
        writer = start_writer(fake.url, mnt)
        _assert_inline_fallback(writer, fake, _body(f"{mnt}/v1"), "permission")
        ready = http("GET", writer.url + "/readyz")
        assert ready.status == 200, "readiness never depends on the volume"
        assert "not writable" in ready.json()["payload_root"]
        assert metric(writer, "payloadrun_writer_payload_root_writable") == 0
        assert http("GET", writer.url + "/healthz").status == 200
    finally:
        umount(mnt)


def test_volume_gone_sends_inline(fake, root, start_writer):
    writer = start_writer(fake.url, root)
    body = _body(f"{root}/v1")
    shutil.rmtree(root)
    _assert_inline_fallback(writer, fake, body, "volume_gone")
    assert not root.exists()


def test_root_missing_at_start_then_mounted(fake, tmp_path, start_writer):
    root = tmp_path / "later"
    writer = start_writer(fake.url, root, root_probe_interval=0.01)
    ready = http("GET", writer.url + "/readyz")
    assert ready.status == 200 and "is not a directory" in ready.json()["payload_root"]
    assert http("GET", writer.url + "/healthz").status == 200
    _assert_inline_fallback(writer, fake, _body(f"{root}/v1"), "volume_gone")
    root.mkdir()
    reply = http("POST", writer.url + GEN, _body(f"{root}/v1"))
    assert reply.headers["x-payloadrun-mode"] == "handle"
    wait_for_metric(writer, "payloadrun_writer_payload_root_writable", 1)
    assert http("GET", writer.url + "/readyz").json()["payload_root"] == "ok"


def test_readiness_follows_vllm_health(writer, fake):
    assert http("GET", writer.url + "/readyz").json() == {
        "ready": True,
        "upstream": "ok",
        "payload_root": "ok",
    }
    fake_config(fake).health_status = 503
    ready = http("GET", writer.url + "/readyz")
    assert ready.status == 503
    assert "/health answered 503" in ready.json()["upstream"]
    assert http("GET", writer.url + "/healthz").status == 200
    fake_config(fake).health_status = 200
    assert http("GET", writer.url + "/readyz").status == 200


def test_vllm_unreachable_is_502(root, start_writer):
    writer = start_writer(f"http://127.0.0.1:{free_port()}", root)
    for body in (_body(f"{root}/v1"), b'{"token_ids":[1],"sampling_params":{}}'):
        reply = http("POST", writer.url + GEN, body)
        assert reply.status == 502
        message = reply.json()["error"]["message"]
        assert "unreachable" in message and "check that vLLM is running" in message
    assert metric(writer, "payloadrun_writer_upstream_failures_total", kind="unreachable") == 2
    ready = http("GET", writer.url + "/readyz")
    assert ready.status == 503 and "unreachable" in ready.json()["upstream"]
    assert http("GET", writer.url + "/healthz").status == 200
    assert files_under(root) == []


@pytest.mark.parametrize("by_handle", [True, False])
def test_vllm_too_slow_is_504(fake, root, start_writer, by_handle):
    writer = start_writer(fake.url, root, read_timeout=0.3)
    body = _body(f"{root}/v1") if by_handle else b'{"token_ids":[1],"sampling_params":{}}'
    reply = http("POST", writer.url + GEN, body, {"x-fake-delay": "1.5"})
    assert reply.status == 504
    assert "did not answer in time" in reply.json()["error"]["message"]
    assert metric(writer, "payloadrun_writer_upstream_failures_total", kind="timeout") == 1
    assert files_under(root) == []


@pytest.mark.parametrize("by_handle", [True, False])
def test_vllm_closing_without_answer_is_502(writer, fake, root, by_handle):
    body = _body(f"{root}/v1") if by_handle else b'{"token_ids":[1],"sampling_params":{}}'
    reply = http("POST", writer.url + GEN, body, {"x-fake-disconnect": "headers"})
    assert reply.status == 502
    assert f"vLLM at {fake.url} failed" in reply.json()["error"]["message"]
    assert metric(writer, "payloadrun_writer_upstream_failures_total", kind="broken") == 1


def test_vllm_breaking_off_a_by_handle_body_is_502(writer, fake, root):
    reply = http("POST", writer.url + GEN, _body(f"{root}/v1"), {"x-fake-disconnect": "body"})
    assert reply.status == 502
    assert "reading the response" in reply.json()["error"]["message"]
    assert files_under(root) == []


def test_vllm_breaking_off_a_passthrough_body_cuts_the_client(writer, fake):
    body = b'{"token_ids":[1,2,3],"sampling_params":{"max_tokens":64}}'
    with pytest.raises((httpclient.IncompleteRead, ConnectionError)):
        http("POST", writer.url + GEN, body, {"x-fake-disconnect": "body"})
    assert metric(writer, "payloadrun_writer_upstream_failures_total", kind="broken") == 1
    assert http("GET", writer.url + "/healthz").status == 200
