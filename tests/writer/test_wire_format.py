"""Responses in vLLM 0.33.0's wire format, moved by handle, read back bitwise equal.

Each request goes through the writer to the fake vLLM, and the same bytes go straight to the fake:
the fake seeds its arrays from the request body, so the direct answer holds the inline arrays the
writer took off. They must come back from the payload file, through the library's reader, equal
bit for bit, and everything else in the response must be unchanged.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest

from payloadrun.codec import decode_npy_base64
from payloadrun.reader import PayloadReader
from payloadrun.segments import ROUTED_EXPERTS, SAMPLING_MASK, segments_from_json

from .conftest import files_under, http, metric

GEN = "/inference/v1/generate"


def _generate(payload_dir, *, n=1, prompt_len=40, max_tokens=12, prompt_start=0, **extra):
    params = {
        "n": n,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_k": 20,
        "logprobs": 0,
        "routed_experts_prompt_start": prompt_start,
        "extra_args": {"payload_dir": payload_dir},
    }
    return {"token_ids": list(range(100, 100 + prompt_len)), "sampling_params": params, **extra}


def _through_and_direct(writer, fake, path, request, headers=None):
    body = json.dumps(request).encode()
    via = http("POST", writer.url + path, body, headers)
    direct = http("POST", fake.url + path, body, headers)
    assert via.status == 200, via.body[:500]
    assert direct.status == 200
    return via, direct


def _check_moved(root, via, direct, *, prompt_lens, prompt_start=0):
    """The by-handle answer equals the inline one with arrays swapped for readable segments."""
    got, want = via.json(), direct.json()
    assert via.headers["x-payloadrun-mode"] == "handle"
    assert len(got["choices"]) == len(want["choices"])
    files = set()
    with PayloadReader(root) as reader:
        for i, (g, w) in enumerate(zip(got["choices"], want["choices"], strict=True)):
            segments = segments_from_json(g["payload"])
            files.update(s.file for s in segments)
            prompt_len = prompt_lens[i]
            completion_len = len(w["token_ids"]) if w.get("token_ids") else 12
            fields = {s.field: s for s in segments}
            if w.get("routed_experts") is not None:
                inline = decode_npy_base64(w["routed_experts"])
                seg = fields[ROUTED_EXPERTS]
                # End-anchored rows equal routed_experts_prompt_start on a colocated server.
                assert seg.pos == prompt_start
                assert seg.end == prompt_len + completion_len - 1
                back = reader.read(segments, ROUTED_EXPERTS, seg.pos, seg.end)
                assert back.dtype == inline.dtype
                assert back.tobytes() == inline.tobytes()
            if w.get("sampling_mask") is not None:
                seg = fields[SAMPLING_MASK]
                assert seg.pos == prompt_len
                rows = reader.read(segments, SAMPLING_MASK, prompt_len, prompt_len + seg.rows)
                assert [[int(t) for t in r if t != -1] for r in rows] == w["sampling_mask"]
                assert [] in w["sampling_mask"]  # empty rows are covered
            expected = copy.deepcopy(w)
            expected["routed_experts"] = None
            if "sampling_mask" in expected:
                expected["sampling_mask"] = None
            expected["payload"] = g["payload"]
            assert g == expected  # logprobs, token ids, text: all as vLLM sent them
    rest_got = {k: v for k, v in got.items() if k != "choices"}
    assert rest_got == {k: v for k, v in want.items() if k != "choices"}
    assert len(files) == 1, "one file per response"
    (file,) = files
    assert file.startswith(str(root))
    size = sum(s.nbytes for c in got["choices"] for s in segments_from_json(c["payload"]))
    assert os.path.getsize(file) == size
    return file


def test_generate_one_choice_uint8_with_masks_and_logprobs(writer, fake, root):
    req = _generate(f"{root}/v3")
    via, direct = _through_and_direct(writer, fake, GEN, req)
    assert direct.json()["choices"][0]["logprobs"]["content"]
    file = _check_moved(root, via, direct, prompt_lens=[40])
    assert decode_npy_base64(direct.json()["choices"][0]["routed_experts"]).dtype == np.uint8
    assert files_under(root) == [root / "v3" / os.path.basename(file)]
    assert len(via.body) < len(direct.body)
    assert metric(writer, "payloadrun_writer_requests_total", mode="handle", code="200") == 1
    # the mask's rows as the file holds them: one per completion token, int32, as wide as the
    # widest row (the others padded with -1)
    mask = direct.json()["choices"][0]["sampling_mask"]
    assert len(mask) == 12
    mask_bytes = len(mask) * max(1, *map(len, mask)) * np.dtype(np.int32).itemsize
    written = metric(writer, "payloadrun_writer_payload_written_bytes_total", field="sampling_mask")
    assert written == mask_bytes
    assert (
        metric(writer, "payloadrun_writer_payload_written_bytes_total", field="routed_experts")
        == (40 + 12 - 1) * 4 * 2
    )
    assert metric(writer, "payloadrun_writer_payload_write_seconds_count") == 1
    reduction = metric(writer, "payloadrun_writer_response_reduction_bytes_total")
    assert reduction == len(direct.body) - len(via.body)
    assert metric(writer, "payloadrun_writer_response_bytes_total", mode="handle") == len(via.body)


def test_generate_several_choices_uint16_with_prompt_start(writer, fake, root):
    req = _generate(f"{root}/v7", n=3, prompt_start=15, max_tokens=9)
    via, direct = _through_and_direct(writer, fake, GEN, req, {"x-fake-experts": "512"})
    arr = decode_npy_base64(direct.json()["choices"][2]["routed_experts"])
    assert arr.dtype == np.uint16 and int(arr.max()) > 255
    assert arr.shape == (40 - 15 + 9 - 1, 4, 2)
    _check_moved(root, via, direct, prompt_lens=[40] * 3, prompt_start=15)


def test_generate_text_mode_and_legacy_path(writer, fake, root):
    req = _generate(f"{root}/v1", output_mode="text")
    via, direct = _through_and_direct(writer, fake, "/generate", req)
    assert isinstance(direct.json()["choices"][0]["text"], str)
    _check_moved(root, via, direct, prompt_lens=[40])


def test_relative_payload_dir_is_under_the_root(writer, fake, root):
    via, direct = _through_and_direct(writer, fake, GEN, _generate("v2"))
    file = _check_moved(root, via, direct, prompt_lens=[40])
    assert os.path.dirname(file) == str(root / "v2")


@pytest.mark.parametrize("return_token_ids", [True, False])
def test_completions_one_prompt(writer, fake, root, return_token_ids):
    req = {
        "model": "fake-qwen3-moe",
        "prompt": "The quick brown fox jumps",
        "max_tokens": 12,
        "logprobs": 2,
        "return_token_ids": return_token_ids,
        "routed_experts_prompt_start": 4,
        "vllm_xargs": {"payload_dir": f"{root}/v4"},
    }
    via, direct = _through_and_direct(writer, fake, "/v1/completions", req)
    assert direct.json()["choices"][0]["logprobs"]["token_logprobs"]
    _check_moved(root, via, direct, prompt_lens=[25], prompt_start=4)


def test_completions_several_token_prompts_and_choices(writer, fake, root):
    req = {
        "model": "fake-qwen3-moe",
        "prompt": [list(range(30)), list(range(50))],
        "n": 2,
        "max_tokens": 12,
        "vllm_xargs": {"payload_dir": f"{root}/v4"},
    }
    via, direct = _through_and_direct(writer, fake, "/v1/completions", req)
    assert len(direct.json()["choices"]) == 4
    _check_moved(root, via, direct, prompt_lens=[30, 30, 50, 50])


def test_chat_completions_several_choices(writer, fake, root):
    req = {
        "model": "fake-qwen3-moe",
        "messages": [{"role": "user", "content": "Say something."}],
        "n": 2,
        "max_tokens": 12,
        "logprobs": True,
        "return_token_ids": True,
        "vllm_xargs": {"payload_dir": f"{root}/v5"},
    }
    via, direct = _through_and_direct(writer, fake, "/v1/chat/completions", req)
    prompt_len = direct.json()["usage"]["prompt_tokens"]
    _check_moved(root, via, direct, prompt_lens=[prompt_len] * 2)


def test_nothing_inline_goes_back_unchanged(writer, fake, root):
    headers = {"x-fake-routed-experts": "0", "x-fake-sampling-mask": "0"}
    via, direct = _through_and_direct(writer, fake, GEN, _generate(f"{root}/v3"), headers)
    assert via.body == direct.body
    assert via.headers["x-payloadrun-mode"] == "inline"
    assert files_under(root) == []
    assert metric(writer, "payloadrun_writer_requests_total", mode="inline", code="200") == 1
