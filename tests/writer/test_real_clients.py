"""The HTTP clients orchestrators use, against the writer and straight against the fake vLLM.

Each test asks the same thing both ways and compares what the client gets: through the writer a
client must see what it sees from vLLM (plus the writer's own headers when it asked by handle).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess

import httpx
import openai
import pytest
import requests

from payloadrun_devkit import required

from .conftest import files_under, metric

MODEL = "fake-qwen3-moe"


def _client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)


def _async_client(url):
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)


def _xargs(root):
    return {"vllm_xargs": {"payload_dir": f"{root}/v1"}, "return_token_ids": True}


def test_openai_completions_passthrough_is_what_vllm_answers(writer, fake):
    ask = {"model": MODEL, "prompt": "hello", "max_tokens": 5}
    via = _client(writer.url).completions.create(**ask)
    direct = _client(fake.url).completions.create(**ask)
    assert via.model_dump() == direct.model_dump()


def test_openai_completions_by_handle(writer, fake, root):
    raw = _client(writer.url).completions.with_raw_response.create(
        model=MODEL, prompt="hello", max_tokens=5, extra_body=_xargs(root)
    )
    assert raw.headers["x-payloadrun-mode"] == "handle"
    choice = raw.parse().choices[0]
    direct = _client(fake.url).completions.create(
        model=MODEL, prompt="hello", max_tokens=5, extra_body=_xargs(root)
    )
    assert choice.text == direct.choices[0].text
    assert choice.model_extra["routed_experts"] is None
    assert choice.model_extra["payload"][0]["file"].startswith(f"{root}/v1/")
    assert len(files_under(root)) == 1


def test_openai_chat_by_handle_and_passthrough(writer, fake, root):
    messages = [{"role": "user", "content": "hi"}]
    via = _client(writer.url).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, extra_body=_xargs(root)
    )
    assert via.choices[0].model_extra["payload"]
    plain_via = _client(writer.url).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4
    )
    plain_direct = _client(fake.url).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4
    )
    assert plain_via.model_dump() == plain_direct.model_dump()


def test_openai_streaming_is_relayed_event_for_event(writer, fake, root):
    def events(url):
        stream = _client(url).completions.create(
            model=MODEL, prompt="hey", max_tokens=6, stream=True, extra_body=_xargs(root)
        )
        return [chunk.model_dump() for chunk in stream]

    via, direct = events(writer.url), events(fake.url)
    assert via == direct and len(via) >= 6
    assert files_under(root) == [], "a stream passes through"


def test_async_openai_client_concurrently(writer, fake, root):
    async def main():
        client = _async_client(writer.url)
        direct = _async_client(fake.url)
        asks = [
            {"model": MODEL, "prompt": f"p{i}", "max_tokens": 3, "extra_body": _xargs(root)}
            for i in range(8)
        ]
        via = await asyncio.gather(*(client.completions.create(**a) for a in asks))
        plain = await asyncio.gather(
            client.completions.create(model=MODEL, prompt="x", max_tokens=3),
            direct.completions.create(model=MODEL, prompt="x", max_tokens=3),
        )
        await client.close()
        await direct.close()
        return via, plain

    via, (plain_via, plain_direct) = asyncio.run(main())
    assert all(r.choices[0].model_extra["payload"] for r in via)
    assert len(files_under(root)) == 8
    assert plain_via.model_dump() == plain_direct.model_dump()
    assert metric(writer, "payloadrun_writer_requests_total", mode="handle", code="200") == 8


def _compare(via, direct):
    assert (via.status_code, via.content) == (direct.status_code, direct.content)
    for name in ("content-type", "content-encoding"):
        assert via.headers.get(name) == direct.headers.get(name)


REQUEST = {"prompt": "hello", "max_tokens": 4}


def test_httpx_gzip_request_body_and_compressed_answers(writer, fake):
    body = gzip.compress(json.dumps(REQUEST).encode())
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    for base in (writer.url, fake.url):
        assert (
            httpx.post(base + "/v1/completions", content=body, headers=headers).status_code == 200
        )
    _compare(
        httpx.post(writer.url + "/v1/completions", content=body, headers=headers),
        httpx.post(fake.url + "/v1/completions", content=body, headers=headers),
    )


def test_httpx_chunked_upload_and_keep_alive(writer, fake, root):
    def chunks():
        data = json.dumps({**REQUEST, **_xargs(root)}).encode()
        for i in range(0, len(data), 7):
            yield data[i : i + 7]

    with httpx.Client() as client:
        for _ in range(3):  # one connection, several requests
            via = client.post(writer.url + "/v1/completions", content=chunks())
            assert via.status_code == 200
            assert via.headers["x-payloadrun-mode"] == "handle"
    assert len(files_under(root)) == 3


def test_requests_json_and_chunked_upload(writer, fake):
    _compare(
        requests.post(writer.url + "/v1/completions", json=REQUEST, timeout=30),
        requests.post(fake.url + "/v1/completions", json=REQUEST, timeout=30),
    )
    data = json.dumps(REQUEST).encode()
    with requests.Session() as session:
        via = session.post(writer.url + "/v1/completions", data=iter([data[:5], data[5:]]))
        direct = session.post(fake.url + "/v1/completions", data=iter([data[:5], data[5:]]))
    _compare(via, direct)


@pytest.fixture(scope="module")
def curl() -> str:
    return required.tool("curl", "apt-get install curl")


def _curl(curl, *args):
    result = subprocess.run(
        [curl, "-sS", "--max-time", "30", "-w", "\n%{http_code}", *args],
        capture_output=True,
        check=True,
        timeout=60,
    )
    body, _, status = result.stdout.rpartition(b"\n")
    return int(status), body


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(["-H", "Content-Encoding: gzip"], id="gzip-body"),
        pytest.param(["-H", "Content-Encoding: gzip", "--compressed"], id="gzip-compressed"),
        pytest.param(["-H", "Expect: 100-continue"], id="expect-100"),
        pytest.param(["-H", "Transfer-Encoding: chunked"], id="chunked"),
    ],
)
def test_curl_as_users_run_it(curl, writer, fake, tmp_path, options):
    data = json.dumps(REQUEST).encode()
    path = tmp_path / "request.json"
    path.write_bytes(gzip.compress(data) if "Content-Encoding: gzip" in options else data)
    common = ["-H", "Content-Type: application/json", "--data-binary", f"@{path}", *options]
    via = _curl(curl, *common, writer.url + "/v1/completions")
    direct = _curl(curl, *common, fake.url + "/v1/completions")
    assert via == direct and via[0] == 200


def test_curl_by_handle_with_a_compressing_upstream(curl, writer, fake, root):
    body = json.dumps({**REQUEST, **_xargs(root)})
    status, out = _curl(
        curl,
        "--compressed",
        "-H",
        "x-fake-content-encoding: gzip",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        body,
        writer.url + "/v1/completions",
    )
    assert status == 200
    assert json.loads(out)["choices"][0]["payload"]
