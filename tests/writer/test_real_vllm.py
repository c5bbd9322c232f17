"""The writer in front of a real vLLM (``real_vllm``: hack/vllm.sh's CPU vLLM, or
``PAYLOADRUN_VLLM_URL``).

vLLM captures routed experts only on a GPU, so on a CPU machine these tests check the rest of the
contract against the real thing: every response passes through the writer byte for byte (n > 1,
streams and error answers included), and vLLM accepts what the writer reads or forwards:
``payload_dir`` (``sampling_params.extra_args`` on the tokens-in endpoint, ``vllm_xargs`` on the
OpenAI ones) and ``routed_experts_prompt_start``. Sampling masks need vLLM's Model Runner V2, which
the CPU build refuses to start without (a test below pins that, so a vLLM that can will say so).

A recording tap sits between the writer and vLLM and keeps the exact bytes vLLM sent, since two
vLLM answers never match byte for byte (ids and timestamps).
"""

from __future__ import annotations

import json
import subprocess
from typing import NamedTuple

import aiohttp
import pytest
from aiohttp import web

from .conftest import RealVLLM, ServerThread, files_under, free_port, http


class Answer(NamedTuple):
    status: int
    body: bytes


class Tap:
    """A recording relay: forwards each request to vLLM and keeps the raw answers, by request.

    Its port is one the kernel chose, which another process on the machine may have been told
    was free a moment before (``free_port``) and may probe for health: a test reads the answers
    to its own request (:meth:`answered`), not whatever reached the port."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.answers: dict[tuple[str, str], list[Answer]] = {}

    def answered(self, method: str, path: str) -> list[Answer]:
        """vLLM's answers to ``method path``, in order."""
        return self.answers.get((method, path), [])

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
            self.answers.setdefault((request.method, request.path), []).append(
                Answer(resp.status, raw)
            )
            return web.Response(
                status=resp.status,
                body=raw,
                headers={"Content-Type": resp.headers.get("Content-Type", "")},
            )


@pytest.fixture
def tapped(real_vllm: RealVLLM, root, start_writer):
    tap = Tap(real_vllm.url)
    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", tap.handle)
    server = ServerThread(app).start()
    writer = start_writer(server.url, root)
    yield writer, tap
    server.stop()


def _with_model(real_vllm: RealVLLM, path: str, body: dict) -> dict:
    return {"model": real_vllm.model, **body} if path.startswith("/v1/") else body


def _post_with_payload_dir(writer, path: str, body: dict, payload_dir: str):
    """POST ``body`` through the writer with ``payload_dir`` where vLLM's endpoint takes it
    (``sampling_params.extra_args`` on the tokens-in endpoint, ``vllm_xargs`` elsewhere)."""
    args = (
        body["sampling_params"]["extra_args"] if "sampling_params" in body else body["vllm_xargs"]
    )
    args["payload_dir"] = payload_dir
    reply = http("POST", writer.url + path, json.dumps(body).encode(), timeout=120)
    assert reply.status == 200, reply.body[:300]
    return reply


def _events(raw: bytes) -> list[dict]:
    """The JSON events of a Server-Sent Events body that ends with ``data: [DONE]``."""
    blocks = raw.decode().split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""], raw[-200:]
    return [json.loads(block.removeprefix("data: ")) for block in blocks[:-2]]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "w5 w6 w7", "max_tokens": 8, "temperature": 0}),
        (
            "/v1/completions",
            {"prompt": "w5 w6", "max_tokens": 8, "logprobs": 2, "return_token_ids": True},
        ),
        ("/v1/completions", {"prompt": ["w5 w6", "w7"], "max_tokens": 4, "n": 2}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "w9"}], "max_tokens": 6},
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "w9"}], "max_tokens": 4, "n": 3},
        ),
        ("/v1/completions", {"prompt": "w5", "max_tokens": 6, "stream": True}),
        ("/v1/completions", {"prompt": "w5", "max_tokens": 4, "n": 2, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w9"}], "stream": True}),
        ("/inference/v1/generate", {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 6}}),
        (
            "/inference/v1/generate",
            {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 4, "n": 3, "logprobs": 1}},
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [5, 6], "sampling_params": {"max_tokens": 6}, "stream": True},
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [5, 6], "sampling_params": {"max_tokens": 3, "n": 2}, "stream": True},
        ),
    ],
)
def test_real_vllm_answers_pass_through_byte_for_byte(tapped, real_vllm, root, path, body):
    writer, tap = tapped
    body = _with_model(real_vllm, path, body)
    reply = http("POST", writer.url + path, json.dumps(body).encode(), timeout=120)
    assert reply.status == 200, reply.body[:300]
    (sent,) = tap.answered("POST", path)
    assert reply.body == sent.body
    assert files_under(root) == []
    n = body.get("n", body.get("sampling_params", {}).get("n", 1))
    prompts = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1
    if body.get("stream"):
        events = _events(reply.body)
        indexes = {c["index"] for e in events for c in e["choices"]}
    else:
        indexes = {c["index"] for c in reply.json()["choices"]}
    assert indexes == set(range(n * prompts))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/inference/v1/generate",
            {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 6, "extra_args": {}}},
        ),
        (
            "/inference/v1/generate",
            {
                "token_ids": [5, 6, 7, 8],
                "sampling_params": {
                    "max_tokens": 4,
                    "n": 2,
                    "routed_experts_prompt_start": 2,
                    "extra_args": {},
                },
            },
        ),
        ("/v1/completions", {"prompt": "w5 w6", "max_tokens": 6, "vllm_xargs": {}}),
        (
            "/v1/completions",
            {
                "prompt": "w5 w6 w7",
                "max_tokens": 4,
                "n": 2,
                "routed_experts_prompt_start": 3,
                "vllm_xargs": {},
            },
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "w9"}], "max_tokens": 6, "vllm_xargs": {}},
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "w9"}],
                "max_tokens": 4,
                "routed_experts_prompt_start": 1,
                "vllm_xargs": {},
            },
        ),
    ],
)
def test_real_vllm_accepts_payload_dir_where_the_writer_reads_it(
    tapped, real_vllm, root, path, body
):
    """vLLM takes the request (``routed_experts_prompt_start`` and n > 1 too). Without capture
    (CPU) nothing is inline to move: the answer goes back as vLLM sent it; with capture (a GPU
    vLLM) the writer answers by handle."""
    writer, tap = tapped
    body = _with_model(real_vllm, path, body)
    reply = _post_with_payload_dir(writer, path, body, f"{root}/v1")
    assert "x-payloadrun-fallback" not in reply.headers
    choices = reply.json()["choices"]
    n = body.get("n", body.get("sampling_params", {}).get("n", 1))
    assert [c["index"] for c in choices] == list(range(n))
    (answer,) = tap.answered("POST", path)
    sent = json.loads(answer.body)["choices"]
    if all(c.get("routed_experts") is None and c.get("sampling_mask") is None for c in sent):
        # no capture (any CPU vLLM): nothing to move, vLLM's answer as sent
        assert reply.headers["x-payloadrun-mode"] == "inline"
        assert reply.body == answer.body
        assert files_under(root) == []
    else:  # a vLLM with capture on (PAYLOADRUN_VLLM_URL on a GPU): the arrays go to files
        assert reply.headers["x-payloadrun-mode"] == "handle"
        assert all(c["routed_experts"] is None and c["payload"] for c in choices)
        assert files_under(root)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/inference/v1/generate",
            {
                "token_ids": [5, 6],
                "sampling_params": {"max_tokens": 4, "n": 2, "extra_args": {}},
                "stream": True,
            },
        ),
        ("/v1/completions", {"prompt": "w5", "max_tokens": 4, "stream": True, "vllm_xargs": {}}),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "w9"}],
                "max_tokens": 4,
                "stream": True,
                "vllm_xargs": {},
            },
        ),
    ],
)
def test_real_vllm_streams_with_payload_dir_pass_through(tapped, real_vllm, root, path, body):
    """A stream is never taken apart, ``payload_dir`` or not: every event as vLLM sent it."""
    writer, tap = tapped
    body = _with_model(real_vllm, path, body)
    reply = _post_with_payload_dir(writer, path, body, f"{root}/v1")
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert [reply.body] == [a.body for a in tap.answered("POST", path)]
    assert _events(reply.body)
    assert files_under(root) == []


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", {"model": "no-such-model", "prompt": "w5", "max_tokens": 2}, 404),
        ("/v1/completions", {"prompt": "w5", "max_tokens": -1}, 400),
        ("/v1/completions", {"prompt": "w5", "max_tokens": 10**8}, 400),  # > max_model_len
        (
            "/v1/completions",
            {"prompt": "w5", "max_tokens": 2, "routed_experts_prompt_start": 9, "vllm_xargs": {}},
            400,
        ),
        ("/inference/v1/generate", {"token_ids": [5]}, 400),
        ("/inference/v1/generate", {"token_ids": [], "sampling_params": {"max_tokens": 2}}, 400),
        (
            "/inference/v1/generate",
            {"token_ids": [5], "sampling_params": {"max_tokens": 2, "n": 0, "extra_args": {}}},
            400,
        ),
        (
            "/inference/v1/generate",
            {
                "token_ids": [5, 6],
                "sampling_params": {
                    "max_tokens": 2,
                    "routed_experts_prompt_start": 5,
                    "extra_args": {},
                },
            },
            400,
        ),
        ("/inference/v1/generate", b'{"token_ids": [5', 400),
        ("/v1/no-such-endpoint", {}, 404),
    ],
)
def test_real_vllm_error_answers_pass_through_unchanged(
    tapped, real_vllm, root, path, body, status
):
    """vLLM's own errors (404, 400 from validation, from its checks) reach the client as sent,
    with a ``payload_dir`` too: the writer has nothing to take off an error."""
    writer, tap = tapped
    if isinstance(body, dict):
        body = json.loads(json.dumps(body))  # a copy: the parameters stay as declared
        if path.startswith("/v1/c"):
            body = {"model": real_vllm.model, **body}
        args = body.get("vllm_xargs", body.get("sampling_params", {}).get("extra_args"))
        if args is not None:
            args["payload_dir"] = f"{root}/v1"
        body = json.dumps(body).encode()
    reply = http("POST", writer.url + path, body, timeout=120)
    (sent,) = tap.answered("POST", path)
    assert reply.status == status == sent.status, reply.body[:300]
    assert reply.body == sent.body
    assert "x-payloadrun-fallback" not in reply.headers
    if reply.headers["content-type"].startswith("application/json") and b'"error"' in reply.body:
        assert reply.json()["error"]["code"] == status
    assert files_under(root) == []


def test_real_vllm_health_and_models_pass_through(tapped):
    writer, tap = tapped
    models = http("GET", writer.url + "/v1/models").body
    assert [models] == [a.body for a in tap.answered("GET", "/v1/models")]
    assert http("GET", writer.url + "/health").status == 200
    assert http("GET", writer.url + "/readyz").status == 200


def test_cpu_vllm_cannot_return_sampling_masks(real_vllm: RealVLLM, tmp_path):
    """vLLM's ``--return-sampling-mask`` needs Model Runner V2, which needs Triton on a GPU: the
    CPU build refuses to start with it, so no test here sees a real mask (the fake's masks are
    checked against vLLM's protocol instead). When a CPU vLLM can, this fails: then test masks."""
    if real_vllm.server is None:
        pytest.skip("an external vLLM: whether it returns masks is its own configuration")
    server = real_vllm.server
    result = subprocess.run(
        [
            str(server.vllm),
            "serve",
            str(server.model),
            "--enforce-eager",
            "--dtype",
            "float32",
            "--enable-scale-out",
            "--return-sampling-mask",
            "--logprobs-mode",
            "processed_logprobs",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),  # never bound: the configuration is refused first
        ],
        capture_output=True,
        text=True,
        env=server.vllm_env,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode != 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "sampling distribution replay requires Model Runner V2" in result.stderr
