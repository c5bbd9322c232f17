"""vLLM's answer read into one preallocated buffer (``body.read_body``), not joined from chunks.

Every path a by-handle answer can take is run twice: read the usual way, and read into the
buffer (the threshold lowered to 0 so that small answers take that path too). Both must give the
same answers, files, fallbacks and errors.
"""

from __future__ import annotations

import json
import shutil

import pytest

from payloadrun.codec import decode_npy_base64
from payloadrun.reader import PayloadReader
from payloadrun.segments import ROUTED_EXPERTS, segments_from_json
from payloadrun.writer import body as writer_body

from .conftest import files_under, http, metric

GEN = "/inference/v1/generate"
BIG = {"x-fake-layers": "48", "x-fake-top-k": "8"}  # 384 B of routing per token


@pytest.fixture(params=["buffer", "read"])
def read_path(request, monkeypatch):
    """Which way the writer reads; yields the sizes of the buffers it allocated."""
    sizes: list[int] = []
    real = writer_body.body_buffer

    def spy(size: int):
        sizes.append(size)
        return real(size)

    monkeypatch.setattr(writer_body, "body_buffer", spy)
    threshold = 0 if request.param == "buffer" else 1 << 62
    monkeypatch.setattr(writer_body, "PREALLOCATE_FROM", threshold)
    yield sizes
    assert bool(sizes) == (request.param == "buffer")


def _body(payload_dir, prompt_len=400):
    return json.dumps(
        {
            "token_ids": list(range(prompt_len)),
            "sampling_params": {"max_tokens": 16, "extra_args": {"payload_dir": payload_dir}},
        }
    ).encode()


def test_by_handle_answer_is_the_same_either_way(read_path, writer, fake, root):
    body = _body(f"{root}/v1", prompt_len=3000)
    via = http("POST", writer.url + GEN, body, BIG)
    direct = http("POST", fake.url + GEN, body, BIG)
    assert via.headers["x-payloadrun-mode"] == "handle"
    choice = via.json()["choices"][0]
    segments = segments_from_json(choice["payload"])
    routing = next(s for s in segments if s.field == ROUTED_EXPERTS)
    with PayloadReader(root) as reader:
        back = reader.read(segments, ROUTED_EXPERTS, routing.pos, routing.end)
    inline = decode_npy_base64(direct.json()["choices"][0]["routed_experts"])
    assert back.tobytes() == inline.tobytes()
    reduction = metric(writer, "payloadrun_writer_response_reduction_bytes_total")
    assert reduction == len(direct.body) - len(via.body)
    assert read_path in ([], [len(direct.body)]), "the buffer is sized by the Content-Length"


def test_answer_without_routing_is_parsed_whole_either_way(read_path, writer, fake, root):
    """No routed_experts to cut out: the whole body is parsed as JSON (from the buffer too)."""
    body = _body(f"{root}/v1", prompt_len=50)
    via = http("POST", writer.url + GEN, body, {"x-fake-routed-experts": "0"})
    assert via.status == 200
    assert via.headers["x-payloadrun-mode"] == "handle"
    fields = [s["field"] for s in via.json()["choices"][0]["payload"]]
    assert fields == ["sampling_mask"]


def test_nothing_to_move_goes_back_byte_for_byte_either_way(read_path, writer, fake, root):
    body = _body(f"{root}/v1", prompt_len=50)
    headers = {"x-fake-routed-experts": "0", "x-fake-sampling-mask": "0"}
    via = http("POST", writer.url + GEN, body, headers)
    direct = http("POST", fake.url + GEN, body, headers)
    assert via.headers["x-payloadrun-mode"] == "inline"
    assert via.body == direct.body
    assert files_under(root) == []


def test_fallback_sends_the_answer_back_whole_either_way(read_path, fake, root, start_writer):
    writer = start_writer(fake.url, root)
    body = _body(f"{root}/v1", prompt_len=3000)  # 1.1 MB of routing, 1.5 MB of JSON
    shutil.rmtree(root)
    via = http("POST", writer.url + GEN, body, BIG)
    direct = http("POST", fake.url + GEN, body, BIG)
    assert via.status == 200
    assert via.body == direct.body, "the response must come back whole, inline"
    assert via.headers["x-payloadrun-fallback"] == "volume_gone"
    assert metric(writer, "payloadrun_writer_fallbacks_total", reason="volume_gone") == 1


def test_an_answer_broken_off_is_502_either_way(read_path, writer, fake, root):
    body = _body(f"{root}/v1", prompt_len=3000)
    reply = http("POST", writer.url + GEN, body, {**BIG, "x-fake-disconnect": "body"})
    assert reply.status == 502
    assert "reading the response" in reply.json()["error"]["message"]
    assert files_under(root) == []
    assert metric(writer, "payloadrun_writer_upstream_failures_total", kind="broken") == 1
    # The writer keeps serving.
    assert http("POST", writer.url + GEN, body, BIG).headers["x-payloadrun-mode"] == "handle"


def test_body_buffer_has_what_the_cutter_needs():
    buf = writer_body.body_buffer(3 << 20)
    memoryview(buf)[:5] = b'{"a":'
    assert len(buf) == 3 << 20
    assert buf.find(b'"a"') == 1
    assert bytes(memoryview(buf)[:5]) == b'{"a":'
