"""Content codings on both legs: compressed request bodies and compressing upstreams."""

from __future__ import annotations

import gzip
import json
import zlib

from aiohttp import web

from .conftest import ServerThread, fake_posts, files_under, http, metric

GEN = "/inference/v1/generate"
COMPLETIONS = "/v1/completions"


def _request(payload_dir=None, prompt_len=12):
    body = {"token_ids": list(range(prompt_len)), "sampling_params": {"max_tokens": 4}}
    if payload_dir is not None:
        body["sampling_params"]["extra_args"] = {"payload_dir": payload_dir}
    return json.dumps(body).encode()


def test_a_gzip_request_body_passes_through_as_received(writer, fake):
    """The defect: the body went upstream decoded but still labelled gzip (a 500 upstream)."""
    raw = gzip.compress(json.dumps({"prompt": "hello", "max_tokens": 3}).encode())
    headers = {"Content-Encoding": "gzip"}
    via = http("POST", writer.url + COMPLETIONS, raw, headers)
    direct = http("POST", fake.url + COMPLETIONS, raw, headers)
    assert (via.status, via.body) == (direct.status, direct.body) == (200, direct.body)
    assert metric(writer, "payloadrun_writer_requests_total", mode="passthrough", code="200") == 1


def test_a_deflate_request_naming_payload_dir_goes_by_handle(writer, fake, root):
    raw = zlib.compress(_request(f"{root}/v1"))
    via = http("POST", writer.url + GEN, raw, {"Content-Encoding": "deflate"})
    assert via.status == 200, via.body
    assert via.headers["x-payloadrun-mode"] == "handle"
    assert via.json()["choices"][0]["payload"]
    assert len(files_under(root)) == 1


def test_a_bad_payload_dir_is_refused_through_gzip_too(writer, fake, root):
    raw = gzip.compress(_request(f"{root}/v1/../v2"))
    via = http("POST", writer.url + GEN, raw, {"Content-Encoding": "gzip"})
    assert via.status == 400
    assert via.json()["error"]["param"] == "payload_dir"
    assert fake_posts(fake) == 0


def test_a_body_in_a_coding_the_writer_cannot_read_goes_as_sent(writer, fake, root):
    """The upstream answers it as it would answer the client directly."""
    headers = {"Content-Encoding": "x-unknown"}
    via = http("POST", writer.url + GEN, _request(f"{root}/v1"), headers)
    direct = http("POST", fake.url + GEN, _request(f"{root}/v1"), headers)
    assert (via.status, via.body) == (direct.status, direct.body)
    assert files_under(root) == []


def test_a_corrupt_gzip_body_is_answered_by_the_upstream(writer, fake):
    headers = {"Content-Encoding": "gzip"}
    via = http("POST", writer.url + GEN, b"\x1f\x8bnot gzip", headers)
    direct = http("POST", fake.url + GEN, b"\x1f\x8bnot gzip", headers)
    assert via.status == direct.status != 200


def test_a_compressed_request_that_unpacks_past_the_limit_is_refused(fake, root, start_writer):
    writer = start_writer(fake.url, root, max_request_bytes=1 << 20)
    raw = gzip.compress(b" " * (2 << 20) + _request(f"{root}/v1"))
    via = http("POST", writer.url + GEN, raw, {"Content-Encoding": "gzip"})
    assert via.status == 413
    assert "Content-Encoding" in via.json()["error"]["message"]
    assert fake_posts(fake) == 0


def _recording_upstream(answer):
    """An upstream that records the headers it got and answers with ``answer()``."""
    seen: list[dict[str, str]] = []

    async def handle(request):
        await request.read()
        seen.append(dict(request.headers))
        return answer()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return ServerThread(app).start(), seen


def test_a_by_handle_request_asks_the_upstream_for_identity(root, start_writer):
    """No Accept-Encoding means any coding is acceptable (RFC 9110 12.5.3): say identity."""
    upstream, seen = _recording_upstream(lambda: web.json_response({"choices": []}))
    try:
        writer = start_writer(upstream.url, root)
        headers = {"Accept-Encoding": "gzip, br"}
        http("POST", writer.url + GEN, _request(f"{root}/v1"), headers)
        http("POST", writer.url + GEN, _request(), headers)
    finally:
        upstream.stop()
    assert seen[0]["Accept-Encoding"] == "identity"
    assert seen[1]["Accept-Encoding"] == "gzip, br", "passthrough keeps the client's"


def test_a_compressing_upstream_still_gets_its_answer_by_handle(writer, fake, root):
    """The defect: a gzip answer went back inline with neither mode nor fallback header."""
    for coding in ("gzip", "deflate"):
        knob = {"x-fake-content-encoding": coding}
        via = http("POST", writer.url + GEN, _request(f"{root}/v1"), knob)
        assert via.status == 200
        assert via.headers["x-payloadrun-mode"] == "handle", coding
        assert "content-encoding" not in via.headers
        choice = via.json()["choices"][0]
        assert choice["routed_experts"] is None and choice["payload"]
    assert len(files_under(root)) == 2
    assert metric(writer, "payloadrun_writer_requests_total", mode="handle", code="200") == 2


def test_an_answer_in_a_coding_the_writer_cannot_read_says_so(writer, fake, root):
    knob = {"x-fake-content-encoding": "compress"}
    via = http("POST", writer.url + GEN, _request(f"{root}/v1"), knob)
    direct = http("POST", fake.url + GEN, _request(f"{root}/v1"), knob)
    assert via.status == 200
    assert via.body == direct.body
    assert via.headers["content-encoding"] == "compress"
    assert via.headers["x-payloadrun-mode"] == "inline"
    assert via.headers["x-payloadrun-fallback"] == "content_encoding"
    assert metric(writer, "payloadrun_writer_fallbacks_total", reason="content_encoding") == 1
    assert files_under(root) == []


def test_a_by_handle_answer_that_is_not_json_says_so(root, start_writer):
    """A 200 that is not a JSON completion cannot be acted on: the client is told why."""
    page = "<html>a proxy's page</html>"
    upstream, _ = _recording_upstream(lambda: web.Response(text=page, content_type="text/html"))
    try:
        writer = start_writer(upstream.url, root)
        via = http("POST", writer.url + GEN, _request(f"{root}/v1"))
    finally:
        upstream.stop()
    assert (via.status, via.body.decode()) == (200, page)
    assert via.headers["x-payloadrun-mode"] == "inline"
    assert via.headers["x-payloadrun-fallback"] == "bad_response"
    assert metric(writer, "payloadrun_writer_fallbacks_total", reason="bad_response") == 1
