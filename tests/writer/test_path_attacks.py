"""A payload_dir that could lead out of the payload root: 400, nothing forwarded or written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import fake_posts, http, metric

GEN = "/inference/v1/generate"


def _attacks(root, tmp_path):
    outside = tmp_path / "outside"
    return {
        "outside the root": str(outside / "v1"),
        "system directory": "/etc/v1",
        "root itself": str(root),
        "not v<digits>": f"{root}/x1",
        "digits then letters": f"{root}/v1a",
        "no digits": f"{root}/v",
        "negative": f"{root}/v-1",
        "too deep": f"{root}/v1/v2",
        "dot-dot inside": f"{root}/v1/../v2",
        "dot-dot to the parent": f"{root}/../payloads/v1",
        "relative dot-dot": "../v1",
        "dot segment": f"{root}/./v1",
        "encoded slash": f"{root}%2Fv1",
        "encoded slash lower": f"{root}/v1%2f..%2f..%2fetc",
        "encoded dots": "%2e%2e/v1",
        "encoded name": f"{root}/%76%31",
        "backslash": f"{root}\\v1",
        "NUL byte": f"{root}/v1\x00",
        "symlink out": f"{root}/v9",
        "empty": "",
    }


@pytest.fixture
def attacks(root, tmp_path):
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", root / "v9")
    return _attacks(root, tmp_path)


def _all_files(tmp_path):
    return sorted(p for p in tmp_path.rglob("*") if p.is_file())


@pytest.mark.parametrize("name", list(_attacks(Path("/r"), Path("/t"))))
def test_generate_refuses(writer, fake, root, tmp_path, attacks, name):
    value = attacks[name]
    body = {"token_ids": [1, 2, 3], "sampling_params": {"extra_args": {"payload_dir": value}}}
    reply = http("POST", writer.url + GEN, json.dumps(body).encode())
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["code"] == 400 and error["param"] == "payload_dir"
    assert error["value"] == value
    assert repr(value) in error["message"]
    assert fake_posts(fake) == 0, "nothing may reach vLLM"
    assert _all_files(tmp_path) == []
    assert metric(writer, "payloadrun_writer_requests_total", mode="rejected", code="400") == 1


@pytest.mark.parametrize("value", [42, ["v1"], {"dir": "v1"}, True])
def test_non_string_payload_dir_is_refused(writer, fake, tmp_path, value):
    body = {"prompt": "hi", "vllm_xargs": {"payload_dir": value}}
    reply = http("POST", writer.url + "/v1/completions", json.dumps(body).encode())
    assert reply.status == 400
    assert "payload_dir must be a non-empty string" in reply.json()["error"]["message"]
    assert fake_posts(fake) == 0
    assert _all_files(tmp_path) == []


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openai_endpoints_refuse_through_vllm_xargs(writer, fake, root, tmp_path, attacks, path):
    body = {
        "prompt": "hi",
        "messages": [{"role": "user", "content": "hi"}],
        "vllm_xargs": {"payload_dir": attacks["symlink out"]},
    }
    reply = http("POST", writer.url + path, json.dumps(body).encode())
    assert reply.status == 400
    assert "symlink" in reply.json()["error"]["message"]
    assert fake_posts(fake) == 0
    assert _all_files(tmp_path) == []


def test_streaming_requests_are_checked_too(writer, fake, root, tmp_path, attacks):
    body = {
        "token_ids": [1],
        "stream": True,
        "sampling_params": {"extra_args": {"payload_dir": attacks["dot-dot inside"]}},
    }
    assert http("POST", writer.url + GEN, json.dumps(body).encode()).status == 400
    assert fake_posts(fake) == 0


def test_escaped_key_is_still_found(writer, fake, tmp_path, attacks):
    value = attacks["system directory"]
    key = "payload\\u005fdir"  # "payload_dir" with a JSON escape
    raw = json.dumps({"token_ids": [1], "sampling_params": {"extra_args": {"KEY": value}}})
    raw = raw.replace("KEY", key)
    reply = http("POST", writer.url + GEN, raw.encode())
    assert reply.status == 400
    assert fake_posts(fake) == 0


def test_null_payload_dir_asks_for_nothing(writer, fake, root):
    body = {"token_ids": [1, 2], "sampling_params": {"extra_args": {"payload_dir": None}}}
    reply = http("POST", writer.url + GEN, json.dumps(body).encode())
    assert reply.status == 200
    assert reply.json()["choices"][0]["routed_experts"]
    assert list(root.iterdir()) == []
