"""Many requests at once, and a 60 MB response that must not stall the writer's event loop."""

from __future__ import annotations

import asyncio
import http.client as httpclient
import json
import os
import threading
import time

import aiohttp
import numpy as np
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


def _poll_healthz(port: int, stop: threading.Event, latencies: list[float]) -> None:
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=10)
    while not stop.is_set():
        start = time.perf_counter()
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        latencies.append(time.perf_counter() - start)
        time.sleep(0.005)
    conn.close()


def test_a_60_mb_response_does_not_stall_the_event_loop(big_fake, root, start_writer):
    """While a 60 MB body is parsed and written, the loop keeps answering within a few ms.

    Parsing, decoding and writing run on worker threads, and the base64 is decoded in slices so
    that no single call holds the GIL for long.
    """
    writer = start_writer(big_fake.url, root)
    body = json.dumps(
        {
            "token_ids": list(range(120_000)),
            "sampling_params": {"max_tokens": 16, "extra_args": {"payload_dir": f"{root}/v1"}},
        }
    ).encode()
    stop, latencies = threading.Event(), []
    poller = threading.Thread(target=_poll_healthz, args=(writer.port, stop, latencies))
    started = time.perf_counter()
    before = metric(writer, "payloadrun_writer_response_reduction_bytes_total")
    poller.start()
    try:
        reply = http("POST", writer.url + GEN, body, timeout=60)
    finally:
        stop.set()
        poller.join()
    took = time.perf_counter() - started
    assert reply.status == 200 and reply.headers["x-payloadrun-mode"] == "handle"
    avoided = metric(writer, "payloadrun_writer_response_reduction_bytes_total") - before
    assert avoided > 60e6
    assert len(latencies) > 10
    worst = max(latencies)
    # Generous for a loaded 2-core machine (about 70 ms seen); doing the work on the loop stalls
    # it for about 800 ms.
    assert worst < 0.25, f"/healthz stalled {worst * 1e3:.0f} ms during a {took:.2f} s request"
    assert np.median(latencies) < 0.05
