"""Many requests at once, and a 60 MB response that must not stall the writer's event loop."""

from __future__ import annotations

import asyncio
import http.client as httpclient
import json
import os
import threading

import aiohttp
import pytest

from payloadrun.codec import decode_npy_base64
from payloadrun.reader import PayloadReader
from payloadrun.segments import ROUTED_EXPERTS, segments_from_json

from .conftest import fake_process, files_under, http, metric

GEN = "/inference/v1/generate"


def _body(i: int, payload_dir: str) -> bytes:
    return json.dumps(
        {
            "token_ids": list(range(i, i + 300 + i)),
            "sampling_params": {"max_tokens": 8, "extra_args": {"payload_dir": payload_dir}},
        }
    ).encode()


async def _post_all(url: str, bodies: list[bytes], headers: dict[str, str]) -> list[bytes]:
    async with aiohttp.ClientSession() as session:

        async def one(body: bytes) -> bytes:
            async with session.post(url, data=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.read()

        return await asyncio.gather(*(one(b) for b in bodies))


def test_64_concurrent_requests_all_by_handle_no_file_half_written(writer, fake, root):
    headers = {"Content-Type": "application/json", "x-fake-layers": "48", "x-fake-top-k": "8"}
    bodies = [_body(i, f"{root}/v{i % 3}") for i in range(64)]
    replies = asyncio.run(_post_all(writer.url + GEN, bodies, headers))
    directs = asyncio.run(_post_all(fake.url + GEN, bodies, headers))

    assert metric(writer, "payloadrun_writer_requests_total", mode="handle", code="200") == 64
    files = []
    with PayloadReader(root) as reader:
        for reply, direct in zip(replies, directs, strict=True):
            (choice,) = json.loads(reply)["choices"]
            segments = segments_from_json(choice["payload"])
            file = segments[0].file
            files.append(file)
            assert os.path.getsize(file) == sum(s.nbytes for s in segments)
            routing = next(s for s in segments if s.field == ROUTED_EXPERTS)
            back = reader.read(segments, ROUTED_EXPERTS, routing.pos, routing.end)
            inline = decode_npy_base64(json.loads(direct)["choices"][0]["routed_experts"])
            assert back.tobytes() == inline.tobytes()
    assert len(set(files)) == 64
    assert sorted(map(str, files_under(root))) == sorted(files), "no stray or partial files"


@pytest.fixture(scope="module")
def big_fake():
    proc = fake_process("--layers", "48", "--top-k", "8", "--no-sampling-mask")
    yield proc
    proc.stop()


def _poll_healthz(port: int, stop: threading.Event, answers: list[int]) -> None:
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=60)
    while not stop.is_set():
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        resp.read()
        answers.append(resp.status)
    conn.close()


def test_a_60_mb_response_does_not_stall_the_event_loop(big_fake, root, start_writer):
    """While a 60 MB body is parsed and written, the loop keeps answering other requests.

    Parsing, decoding and writing run on worker threads, and the base64 is decoded in slices so
    that no single call holds the GIL for long. How long ``/healthz`` waits meanwhile is a
    timing, measured as ratios in ``bench/loop_latency.py``; here, the facts: ``/healthz`` is
    answered while the request is in flight, and every poll is a 200.
    """
    writer = start_writer(big_fake.url, root)
    body = json.dumps(
        {
            "token_ids": list(range(120_000)),
            "sampling_params": {"max_tokens": 16, "extra_args": {"payload_dir": f"{root}/v1"}},
        }
    ).encode()
    stop, answers = threading.Event(), []
    before = metric(writer, "payloadrun_writer_response_reduction_bytes_total")
    poller = threading.Thread(target=_poll_healthz, args=(writer.port, stop, answers))
    poller.start()
    try:
        reply = http("POST", writer.url + GEN, body, timeout=60)
        during = len(answers)  # answered while the request was in flight
    finally:
        stop.set()
        poller.join()
    assert reply.status == 200 and reply.headers["x-payloadrun-mode"] == "handle"
    avoided = metric(writer, "payloadrun_writer_response_reduction_bytes_total") - before
    assert avoided > 60e6
    assert during >= 1, "no /healthz answered while the 60 MB request was in flight"
    assert answers and set(answers) == {200}
