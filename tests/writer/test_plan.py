"""The writer's decisions, as pure functions over parsed JSON (no servers)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from payloadrun.codec import CodecError, encode_npy_base64
from payloadrun.segments import Segment
from payloadrun.writer.blocking import parse_response
from payloadrun.writer.inline import cut_routed_experts, restore_into_choices
from payloadrun.writer.plan import (
    ChoiceLengths,
    Endpoint,
    RequestError,
    RequestPlan,
    apply_segments,
    choice_lengths,
    endpoint_of,
    may_name_payload_dir,
    plan_payload,
    plan_request,
)


@pytest.mark.parametrize(
    ("method", "path", "endpoint"),
    [
        ("POST", "/inference/v1/generate", Endpoint.GENERATE),
        ("POST", "/generate", Endpoint.GENERATE),
        ("POST", "/v1/completions", Endpoint.COMPLETIONS),
        ("POST", "/v1/chat/completions/", Endpoint.CHAT),
        ("GET", "/v1/completions", None),
        ("POST", "/v1/embeddings", None),
        ("POST", "/v1/completions/render", None),
    ],
)
def test_endpoint_of(method, path, endpoint):
    assert endpoint_of(method, path) is endpoint


def test_only_bodies_that_can_name_payload_dir_are_parsed():
    assert may_name_payload_dir(b'{"vllm_xargs":{"payload_dir":"v1"}}')
    assert may_name_payload_dir(b'{"payload\\u005fdir":"v1"}')
    assert not may_name_payload_dir(b'{"prompt":"hello"}')


def test_generate_reads_sampling_params_extra_args():
    plan = plan_request(
        Endpoint.GENERATE,
        {
            "token_ids": [1, 2, 3],
            "sampling_params": {
                "n": 2,
                "routed_experts_prompt_start": 2,
                "extra_args": {"payload_dir": "/r/v4"},
            },
        },
    )
    assert plan == RequestPlan(Endpoint.GENERATE, "/r/v4", 2, (3,), 2, False)


@pytest.mark.parametrize("endpoint", [Endpoint.COMPLETIONS, Endpoint.CHAT])
def test_openai_endpoints_read_vllm_xargs_only(endpoint):
    asked = {"vllm_xargs": {"payload_dir": "v1"}, "routed_experts_prompt_start": 7, "stream": True}
    plan = plan_request(endpoint, asked)
    assert plan.payload_dir == "v1" and plan.prompt_start == 7 and plan.stream
    # vLLM ignores unknown top-level fields, so these never reach SamplingParams.extra_args.
    assert plan_request(endpoint, {"extra_args": {"payload_dir": "v1"}}) is None
    assert plan_request(endpoint, {"payload_dir": "v1"}) is None
    assert plan_request(endpoint, {"vllm_xargs": {"payload_dir": None}}) is None


def test_completions_prompt_lengths_from_token_prompts():
    plan = plan_request(
        Endpoint.COMPLETIONS,
        {"prompt": [[1, 2], [3, 4, 5]], "n": 2, "vllm_xargs": {"payload_dir": "v1"}},
    )
    assert plan.prompt_lens == (2, 3) and plan.n == 2
    text = plan_request(Endpoint.COMPLETIONS, {"prompt": "hi", "vllm_xargs": {"payload_dir": "v1"}})
    assert text.prompt_lens is None


@pytest.mark.parametrize("value", [3, "", ["v1"]])
def test_payload_dir_must_be_a_string(value):
    with pytest.raises(RequestError, match="payload_dir must be a non-empty string") as info:
        plan_request(Endpoint.CHAT, {"vllm_xargs": {"payload_dir": value}})
    assert info.value.value == value


def _plan(endpoint=Endpoint.GENERATE, **kw):
    return RequestPlan(endpoint, "v1", **kw)


def test_lengths_prefer_token_ids_then_usage():
    response = {"usage": {"prompt_tokens": 10, "completion_tokens": 4}, "choices": [{}]}
    assert choice_lengths(_plan(), response, {"token_ids": [1, 2]}) == ChoiceLengths(10, 2)
    assert choice_lengths(_plan(), response, {}) == ChoiceLengths(10, 4)
    response["prompt_token_ids"] = [0] * 12
    assert choice_lengths(_plan(), response, {}).prompt == 12


def test_lengths_of_several_completions_prompts():
    plan = _plan(Endpoint.COMPLETIONS, prompt_lens=(5, 9), n=2)
    response = {"usage": {"prompt_tokens": 28}, "choices": [{}, {}, {}, {}]}
    assert choice_lengths(plan, response, {"index": 3}) == ChoiceLengths(9, None)
    text_prompts = _plan(Endpoint.COMPLETIONS)  # strings: their token counts are not known
    assert choice_lengths(text_prompts, response, {"index": 0}).prompt is None


def _choice(rows, tokens, mask=None):
    experts = np.arange(rows * 2 * 2, dtype=np.uint8).reshape(rows, 2, 2)
    return {
        "token_ids": list(range(tokens)),
        "routed_experts": encode_npy_base64(experts),
        "sampling_mask": mask,
        "logprobs": {"content": [1]},
    }


def test_routing_is_end_anchored_and_mask_starts_at_the_prompt():
    response = {
        "usage": {"prompt_tokens": 6},
        "choices": [_choice(6 + 3 - 1 - 2, 3, [[5], [], [7, 8]])],
    }
    payload = plan_payload(_plan(prompt_start=2), response)
    routing, mask = payload.parts
    assert routing.pos == 2 and routing.rows.shape == (6, 2, 2)
    assert mask.pos == 6 and mask.rows.tolist() == [[5, -1], [-1, -1], [7, 8]]
    assert payload.owners == (0, 0)
    assert payload.bytes_by_field() == {"routed_experts": 24, "sampling_mask": 24}


def test_routing_without_lengths_starts_at_routed_experts_prompt_start():
    response = {"choices": [{"routed_experts": _choice(5, 1)["routed_experts"]}] * 2}
    payload = plan_payload(_plan(Endpoint.CHAT, prompt_start=4), response)
    assert [p.pos for p in payload.parts] == [4, 4]
    assert payload.owners == (0, 1)


def test_choices_without_arrays_are_left_alone():
    response = {"choices": [{"routed_experts": None, "sampling_mask": None}]}
    assert plan_payload(_plan(), response).empty


@pytest.mark.parametrize(
    ("response", "message"),
    [
        ({"error": "x"}, "no choices list"),
        ({"choices": ["x"]}, "choice 0 is str"),
        ({"choices": [{"routed_experts": "!!"}]}, "not valid base64"),
        ({"choices": [{"sampling_mask": [[1]]}]}, "states no prompt length"),
        (
            {
                "usage": {"prompt_tokens": 2},
                "choices": [{"token_ids": [1, 2], "sampling_mask": [[1]]}],
            },
            "1 rows but the choice has 2 completion tokens",
        ),
        (
            {"usage": {"prompt_tokens": 2}, "choices": [_choice(9, 2)]},
            "9 routing rows do not fit",
        ),
    ],
)
def test_undecodable_responses_are_codec_errors(response, message):
    with pytest.raises(CodecError, match=message):
        plan_payload(_plan(), response)


def test_apply_segments_swaps_arrays_for_payload_and_keeps_the_rest():
    response = {"usage": {"prompt_tokens": 4}, "choices": [_choice(4, 1, [[1]]), {"x": 1}]}
    payload = plan_payload(_plan(), response)
    segs = [
        Segment(p.field, "/r/v1/f.bin", 0, p.pos, len(p.rows), p.rows.dtype.name, p.rows.shape[1:])
        for p in payload.parts
    ]
    out = apply_segments(response, payload, segs)
    first = out["choices"][0]
    assert first["routed_experts"] is None and first["sampling_mask"] is None
    assert [s["field"] for s in first["payload"]] == ["routed_experts", "sampling_mask"]
    assert first["logprobs"] == {"content": [1]}
    assert out["choices"][1] == {"x": 1}


def test_cut_body_parses_to_the_same_response():
    experts = encode_npy_base64(np.ones((3, 2, 2), np.uint16))
    response = {"choices": [{"index": 0, "routed_experts": experts, "text": 'a "quoted" \\ text'}]}
    body = json.dumps(response, separators=(",", ":")).encode()
    cut = cut_routed_experts(body)
    assert cut is not None and len(cut.skeleton) < len(body) - len(experts) + 40
    parsed = parse_response(body)
    assert bytes(parsed["choices"][0]["routed_experts"]) == experts.encode()
    assert parsed["choices"][0]["text"] == response["choices"][0]["text"]


def test_cut_falls_back_when_a_match_is_outside_the_choices():
    body = b'{"kv_transfer_params":{"routed_experts":"QUFB"},"choices":[{"routed_experts":"QUFB"}]}'
    cut = cut_routed_experts(body)
    assert not restore_into_choices(json.loads(cut.skeleton), cut.values)
    assert parse_response(body) == json.loads(body)


def test_cut_refuses_escaped_values():
    assert cut_routed_experts(b'{"choices":[{"routed_experts":"QU\\/B"}]}') is None
    assert parse_response(b'{"choices":[{"routed_experts":"QU\\/B"}]}')["choices"][0] == {
        "routed_experts": "QU/B"
    }
