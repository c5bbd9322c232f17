"""The fake vLLM answers with the real one's fields and JSON types, on every endpoint it serves.

Every other writer test trusts the fake (``payloadrun.testing.fakevllm``) to speak vLLM's wire
format. This module holds it to that: the same requests go to the fake and to a real vLLM
(``real_vllm``), and each answer is reduced to its shape, every JSON path with the set of JSON
types seen there (list items merged under ``[]``, stream events merged over the stream), and the
shapes must be equal, statuses and content types too.

Endpoints the fake serves, from its ``build_app``: ``POST /inference/v1/generate`` (plain, n > 1
with logprobs and prompt ids, text output mode, streams), ``POST /v1/completions`` and
``POST /v1/chat/completions`` (the same, and streams), their 400 answers, ``GET /v1/models`` and
``GET /health``. Not compared: ``POST /generate``, the same handler under the name prime-rl's
servers use (vLLM answers it 404), and the fake's own ``GET /fake/stats``.

The one allowance, named and minimal (:data:`FILLED_ONLY_WITH_CAPTURE`): the fake fills
``choices[].routed_experts`` and ``choices[].sampling_mask`` where a vLLM without routed-expert
capture or sampling-mask replay (any CPU vLLM) answers ``null``. Only when the real server's value
there is ``null`` in every answer may the fake's be the filled type; a vLLM that fills them (a GPU
one with ``--enable-return-routed-experts``, ``PAYLOADRUN_VLLM_URL``) gets no allowance at all.
The fake with its arrays switched off (``x-fake-routed-experts: 0``, ``x-fake-sampling-mask: 0``)
must match with no allowance anywhere.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from .conftest import RealVLLM, ServerThread, http

# vLLM fills these only with routed-expert capture (--enable-return-routed-experts: a GPU) and
# sampling-mask replay (--return-sampling-mask: Model Runner V2, a GPU); the fake always does.
FILLED_ONLY_WITH_CAPTURE = {
    "choices[].routed_experts": "str",  # base64 of np.save bytes
    "choices[].sampling_mask": "list",  # list[list[int]], one list per completion token
}
# objects whose keys are data, not field names: completions' top logprobs, token text -> logprob
MAPS = {"choices[].logprobs.top_logprobs[]"}

ARRAYS_OFF = {"x-fake-routed-experts": "0", "x-fake-sampling-mask": "0"}

Shape = dict[str, set[str]]


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    for kind, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if isinstance(value, kind):
            return name
    return "list" if isinstance(value, list) else "object"


def shape(value: Any, path: str = "", into: Shape | None = None) -> Shape:
    """Every JSON path in ``value`` with the types seen there (list items merged under ``[]``)."""
    into = {} if into is None else into
    into.setdefault(path or "$", set()).add(json_type(value))
    if isinstance(value, dict):
        for key, item in value.items():
            name = "<key>" if path in MAPS else key
            shape(item, f"{path}.{name}" if path else name, into)
    elif isinstance(value, list):
        for item in value:
            shape(item, path + "[]", into)
    return into


def coalesced(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stream's events as vLLM's output collector sends them to a reader that took none of
    them in time: one event per choice, its fields the last value each had, where a value is not
    ``null`` (the first event's ``prompt_token_ids`` with the last event's finish reason)."""
    top: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for event in events:
        for key, value in event.items():
            if key != "choices" and (value is not None or key not in top):
                top[key] = value
        for choice in event.get("choices") or ():
            merged = choices.setdefault(choice.get("index", 0), {})
            for key, value in choice.items():
                if value is not None or key not in merged:
                    merged[key] = value
    return [{**top, "choices": [choice]} for _, choice in sorted(choices.items())]


def answer_shape(status: int, content_type: str, body: bytes) -> tuple[int, str, Shape, Shape]:
    """An answer as the contract sees it, and the shape of the same stream coalesced
    (:func:`coalesced`): a stream is the union of its events' shapes (anything else: both its
    shape)."""
    kind = content_type.split(";", maxsplit=1)[0].strip()
    if kind == "text/event-stream":
        blocks = body.decode().split("\n\n")
        assert blocks[-2:] == ["data: [DONE]", ""], body[-200:]
        merged: Shape = {}
        events = []
        for block in blocks[:-2]:
            assert block.startswith("data: "), block
            events.append(json.loads(block.removeprefix("data: ")))
            shape(events[-1], into=merged)
        whole: Shape = {}
        for event in coalesced(events):
            shape(event, into=whole)
        return status, kind, merged, whole
    whole = shape(json.loads(body)) if body else {}
    return status, kind, whole, whole


def allow_capture(real: Shape, fake: Shape) -> Shape:
    """``fake`` with the allowance applied: where the real server answered only ``null`` at a
    path of :data:`FILLED_ONLY_WITH_CAPTURE`, the fake's filled type there (and what is inside
    it) is set aside. Anything else the fake has there still counts."""
    fake = {path: set(types) for path, types in fake.items()}
    for path, filled in FILLED_ONLY_WITH_CAPTURE.items():
        if real.get(path) != {"null"} or path not in fake:
            continue
        fake[path].discard(filled)
        fake[path].add("null") if not fake[path] else None
        for inner in [p for p in fake if p.startswith(path + "[")]:
            del fake[inner]
    return fake


def differences(real: Shape, fake: Shape) -> list[str]:
    out = []
    for path in sorted(real.keys() | fake.keys()):
        r, f = sorted(real.get(path, ())), sorted(fake.get(path, ()))
        if r != f:
            out.append(f"{path}: vLLM {r or 'absent'}, fake {f or 'absent'}")
    return out


USER = [{"role": "user", "content": "w9 w10"}]
SAME_EVERY_RUN = {"seed": 7, "ignore_eos": True}  # the same tokens every run, max_tokens of them

# (name, method, path, body): sent as they are to both servers ("model" is filled in per server)
REQUESTS: list[tuple[str, str, str, Any]] = [
    ("models", "GET", "/v1/models", None),
    ("health", "GET", "/health", None),
    (
        "generate",
        "POST",
        "/inference/v1/generate",
        {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 4, **SAME_EVERY_RUN}},
    ),
    (
        "generate-n2-logprobs-prompt-ids-prompt-start",
        "POST",
        "/inference/v1/generate",
        {
            "token_ids": [5, 6, 7],
            "return_token_ids": True,
            "sampling_params": {
                "max_tokens": 3,
                "n": 2,
                "logprobs": 1,
                "routed_experts_prompt_start": 1,
                "extra_args": {"payload_dir": "/nonexistent/v1"},
                **SAME_EVERY_RUN,
            },
        },
    ),
    (
        "generate-text-mode",
        "POST",
        "/inference/v1/generate",
        {
            "token_ids": [5, 6],
            "output_mode": "text",
            "sampling_params": {"max_tokens": 3, "logprobs": 1, **SAME_EVERY_RUN},
        },
    ),
    (
        "generate-stream",
        "POST",
        "/inference/v1/generate",
        {
            "token_ids": [5, 6],
            "stream": True,
            "return_token_ids": True,
            "sampling_params": {"max_tokens": 3, "n": 2, "logprobs": 1, **SAME_EVERY_RUN},
        },
    ),
    (
        "generate-stream-text-mode",
        "POST",
        "/inference/v1/generate",
        {
            "token_ids": [5, 6],
            "stream": True,
            "output_mode": "text",
            "sampling_params": {"max_tokens": 3, **SAME_EVERY_RUN},
        },
    ),
    (
        "generate-n0",
        "POST",
        "/inference/v1/generate",
        {"token_ids": [5], "sampling_params": {"n": 0}},
    ),
    (
        "generate-prompt-start-past-prompt",
        "POST",
        "/inference/v1/generate",
        {"token_ids": [5, 6], "sampling_params": {"routed_experts_prompt_start": 9}},
    ),
    (
        "completions",
        "POST",
        "/v1/completions",
        {"prompt": "w5 w6", "max_tokens": 4, **SAME_EVERY_RUN},
    ),
    (
        "completions-n2-logprobs-token-ids-prompt-start",
        "POST",
        "/v1/completions",
        {
            "prompt": "w5 w6",
            "max_tokens": 3,
            "n": 2,
            "logprobs": 1,
            "return_token_ids": True,
            "routed_experts_prompt_start": 1,
            "vllm_xargs": {"payload_dir": "/nonexistent/v1"},
            **SAME_EVERY_RUN,
        },
    ),
    (
        "completions-stream",
        "POST",
        "/v1/completions",
        {"prompt": "w5 w6", "max_tokens": 3, "stream": True, **SAME_EVERY_RUN},
    ),
    (
        "completions-stream-n2-logprobs-token-ids",
        "POST",
        "/v1/completions",
        {
            "prompt": "w5 w6",
            "max_tokens": 3,
            "n": 2,
            "logprobs": 1,
            "return_token_ids": True,
            "stream": True,
            **SAME_EVERY_RUN,
        },
    ),
    ("completions-max-tokens-0", "POST", "/v1/completions", {"prompt": "w5", "max_tokens": -1}),
    (
        "chat",
        "POST",
        "/v1/chat/completions",
        {"messages": USER, "max_tokens": 4, **SAME_EVERY_RUN},
    ),
    (
        "chat-n2-logprobs-token-ids-prompt-start",
        "POST",
        "/v1/chat/completions",
        {
            "messages": USER,
            "max_tokens": 3,
            "n": 2,
            "logprobs": True,
            "top_logprobs": 1,
            "return_token_ids": True,
            "routed_experts_prompt_start": 1,
            **SAME_EVERY_RUN,
        },
    ),
    (
        "chat-stream",
        "POST",
        "/v1/chat/completions",
        {"messages": USER, "max_tokens": 3, "stream": True, **SAME_EVERY_RUN},
    ),
    (
        "chat-stream-n2-logprobs-token-ids",
        "POST",
        "/v1/chat/completions",
        {
            "messages": USER,
            "max_tokens": 3,
            "n": 2,
            "logprobs": True,
            "return_token_ids": True,
            "stream": True,
            **SAME_EVERY_RUN,
        },
    ),
]


def ask(url: str, model: str, method: str, path: str, body: Any, headers: dict[str, str]):
    if body is not None:
        body = copy.deepcopy(body)
        if path.startswith("/v1/"):
            body = {"model": model, **body}
    reply = http(method, url + path, body, headers=headers, timeout=120)
    return answer_shape(reply.status, reply.headers.get("content-type", ""), reply.body)


@pytest.mark.parametrize("arrays", ["arrays-on", "arrays-off"])
@pytest.mark.parametrize(("name", "method", "path", "body"), REQUESTS, ids=[r[0] for r in REQUESTS])
def test_fake_vllm_answers_with_real_vllms_fields_and_types(
    real_vllm: RealVLLM, fake: ServerThread, arrays, name, method, path, body
):
    real_status, real_kind, real, real_coalesced = ask(
        real_vllm.url, real_vllm.model, method, path, body, {}
    )
    headers = ARRAYS_OFF if arrays == "arrays-off" else {}
    fake_model = http("GET", fake.url + "/v1/models").json()["data"][0]["id"]
    fake_status, fake_kind, fake_shape, fake_coalesced = ask(
        fake.url, fake_model, method, path, body, headers
    )
    assert (fake_status, fake_kind) == (real_status, real_kind)
    if real == real_coalesced:
        # vLLM sent each choice in one event: its output collector merges the deltas a slow
        # reader has not taken yet (on a busy machine, the whole of a short stream, the first
        # event's prompt_token_ids with the last one's finish reason), so the fake's stream is
        # compared coalesced the same way
        fake_shape = fake_coalesced
    if arrays == "arrays-on":
        fake_shape = allow_capture(real, fake_shape)
    problems = differences(real, fake_shape)
    assert not problems, f"the fake drifted from vLLM on {name}:\n" + "\n".join(problems)


def test_the_allowance_sets_aside_only_filled_capture_fields():
    """The allowance is exactly as wide as it says: a filled array where vLLM sent null, nothing
    else, and nothing at all when vLLM filled it."""
    real = shape({"choices": [{"routed_experts": None, "sampling_mask": None, "x": 1}]})
    fake = shape({"choices": [{"routed_experts": "AAA=", "sampling_mask": [[1, 2], []], "x": 1}]})
    assert differences(real, allow_capture(real, fake)) == []
    drifted = shape({"choices": [{"routed_experts": 7, "sampling_mask": None, "x": "1"}]})
    assert differences(real, allow_capture(real, drifted)) == [
        "choices[].routed_experts: vLLM ['null'], fake ['int']",
        "choices[].x: vLLM ['int'], fake ['str']",
    ]
    filled = shape({"choices": [{"routed_experts": "AAA=", "sampling_mask": [[3]], "x": 1}]})
    assert differences(filled, allow_capture(filled, fake)) == []
    assert differences(filled, allow_capture(filled, shape({"choices": [{"x": 1}]}))) != []


def test_a_stream_coalesced_is_one_event_a_choice_with_each_fields_last_value():
    """What a stream vLLM merged (one event a choice) is compared on: the fake's stream
    coalesced the same way, the first event's prompt_token_ids with the last one's finish
    reason (a fake compared on its last events alone lacked the prompt ids)."""
    events = [
        {"choices": [{"index": i, "text": "a", "finish_reason": None, "prompt_token_ids": [1],
                      "weight_versions": None}]}
        for i in (0, 1)
    ] + [
        {"choices": [{"index": i, "text": "b", "finish_reason": "length",
                      "prompt_token_ids": None, "weight_versions": [0]}]}
        for i in (0, 1)
    ]  # fmt: skip
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    _, kind, merged, whole = answer_shape(200, "text/event-stream", body.encode())
    assert kind == "text/event-stream"
    assert merged["choices[].finish_reason"] == {"null", "str"}
    assert merged["choices[].prompt_token_ids"] == {"list", "null"}
    assert whole["choices[].finish_reason"] == {"str"}
    assert whole["choices[].prompt_token_ids"] == {"list"}
    assert whole["choices[].weight_versions"] == {"list"}
    assert [c["choices"][0]["text"] for c in coalesced(events)] == ["b", "b"]
    one_a_choice = coalesced(events)
    merged_by_vllm = "".join(f"data: {json.dumps(e)}\n\n" for e in one_a_choice)
    _, _, as_sent, as_coalesced = answer_shape(
        200, "text/event-stream", (merged_by_vllm + "data: [DONE]\n\n").encode()
    )
    assert as_sent == as_coalesced == whole
