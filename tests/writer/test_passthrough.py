"""Everything that does not ask for by-handle passes through byte for byte, streams included."""

from __future__ import annotations

import http.client as httpclient
import json
import time

import pytest

from .conftest import fake_config, files_under, http, metric

GEN = "/inference/v1/generate"


def _gen(**params):
    return {"token_ids": list(range(20)), "sampling_params": {"max_tokens": 8, **params}}


@pytest.mark.parametrize(
    ("path", "request_body"),
    [
        (GEN, _gen()),
        (GEN, _gen(extra_args={"other": "value"})),
        ("/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 5}),
        # vLLM ignores unknown top-level fields: only vllm_xargs reaches extra_args.
        ("/v1/completions", {"model": "m", "prompt": "hi", "extra_args": {"payload_dir": "v1"}}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "é"}]}),
    ],
)
def test_requests_without_payload_dir_pass_through_byte_for_byte(
    writer, fake, root, path, request_body
):
    body = json.dumps(request_body, ensure_ascii=False).encode()
    via = http("POST", writer.url + path, body)
    direct = http("POST", fake.url + path, body)
    assert via.status == direct.status == 200
    assert via.body == direct.body
    assert json.loads(via.body)["choices"][0]["routed_experts"]  # arrays stayed inline
    assert via.headers["content-type"] == direct.headers["content-type"]
    assert "x-payloadrun-mode" not in via.headers
    assert files_under(root) == []
    assert metric(writer, "payloadrun_writer_requests_total", mode="passthrough", code="200") == 1
    assert metric(writer, "payloadrun_writer_response_bytes_total", mode="passthrough") == len(
        via.body
    )


@pytest.mark.parametrize(
    ("path", "request_body"),
    [
        (GEN, {**_gen(extra_args={"payload_dir": "v1"}), "stream": True}),
        (
            "/v1/completions",
            {"prompt": "hello", "stream": True, "vllm_xargs": {"payload_dir": "v1"}},
        ),
    ],
)
def test_streaming_passes_through_unchanged_even_with_payload_dir(
    writer, fake, root, path, request_body
):
    body = json.dumps(request_body).encode()
    via = http("POST", writer.url + path, body)
    direct = http("POST", fake.url + path, body)
    assert via.status == 200
    assert via.headers["content-type"].startswith("text/event-stream")
    assert via.headers.get("transfer-encoding") == "chunked"
    assert via.body == direct.body
    assert via.body.endswith(b"data: [DONE]\n\n")
    assert files_under(root) == []


def test_streaming_is_relayed_as_it_arrives(writer, fake, root):
    """The first event reaches the client while vLLM is still streaming: the client that hangs
    up at its first event cuts the fake's stream short (a relay that waited for the whole
    stream would hand over its first event only once the fake had sent its last)."""
    conn = httpclient.HTTPConnection("127.0.0.1", writer.port, timeout=10)
    body = json.dumps({**_gen(max_tokens=200), "stream": True}).encode()
    headers = {"Content-Type": "application/json", "x-fake-stream-interval": "0.05"}
    conn.request("POST", GEN, body, headers)
    resp = conn.getresponse()
    first = resp.read1(65536)
    assert first.startswith(b"data: {")
    assert b"[DONE]" not in first
    conn.close()  # at the first event
    deadline = time.monotonic() + 30  # a bound for a broken relay, not a timing
    while fake_config(fake).stats["aborted"] != 1:
        assert time.monotonic() < deadline, "the fake's stream was not cut short"
        time.sleep(0.02)
    assert files_under(root) == []


def test_other_paths_and_methods_pass_through(writer, fake):
    via = http("GET", writer.url + "/v1/models")
    direct = http("GET", fake.url + "/v1/models")
    assert via.status == 200 and via.body == direct.body
    missing = http("GET", writer.url + "/no/such/path?x=%2F")
    assert missing.status == 404 == http("GET", fake.url + "/no/such/path?x=%2F").status
    health = http("GET", writer.url + "/health")
    assert health.status == 200 and health.body == b""


@pytest.mark.parametrize("status", [400, 404, 500, 503])
def test_vllm_errors_come_back_as_vllm_sent_them(writer, fake, root, status):
    body = json.dumps(_gen(extra_args={"payload_dir": f"{root}/v1"})).encode()
    headers = {"x-fake-status": str(status)}
    via = http("POST", writer.url + GEN, body, headers)
    direct = http("POST", fake.url + GEN, body, headers)
    assert via.status == status
    assert via.body == direct.body
    assert via.json()["error"]["code"] == status
    assert files_under(root) == []
    assert (
        metric(writer, "payloadrun_writer_requests_total", mode="passthrough", code=str(status))
        == 1
    )


def test_invalid_json_goes_to_vllm_which_answers_400(writer, fake):
    via = http("POST", writer.url + GEN, b'{"payload_dir": nope')
    assert via.status == 400
    assert "JSON decode error" in via.json()["error"]["message"]
