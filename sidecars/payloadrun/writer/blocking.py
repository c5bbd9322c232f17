"""The writer's blocking work, run on its thread pool: decoding and parsing bodies, writing
payload files, serializing.

Each function here runs on a worker thread, never on the event loop: a vLLM response with router
replay is tens of MB of JSON, and parsing it or fsyncing its file would stall every other request
for that long. They take bytes and return bytes plus what happened, so the loop only moves bytes
and counts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from payloadrun.codec import CodecError
from payloadrun.failures import failure_reason
from payloadrun.paths import PayloadPathError
from payloadrun.reasons import Fallback
from payloadrun.store import PayloadStore, PayloadWriteError
from payloadrun.vllm import dumps
from payloadrun.writer import content_coding
from payloadrun.writer.body import Body, CodedBody
from payloadrun.writer.inline import cut_routed_experts, restore_into_choices
from payloadrun.writer.plan import (
    Endpoint,
    Mode,
    RequestError,
    RequestPlan,
    apply_segments,
    may_name_payload_dir,
    plan_payload,
    plan_request,
)

# The most bytes a by-handle answer is decoded to (its content coding undone): the in-flight
# budget reserved it whole, so this only stops a runaway decompression.
ANSWER_DECODE_LIMIT = 1 << 40


def admit_request(
    store: PayloadStore | None,
    endpoint: Endpoint,
    request: CodedBody,
    limit: int = 256 * 1024 * 1024,
) -> RequestPlan | None:
    """The by-handle plan of a request body, None to pass it through.

    Raises :class:`RequestError` when the request names a ``payload_dir`` the writer refuses:
    not a string, outside the payload root, not ``v<digits>``, through ``..``, a percent-encoded
    character or a symlink (all checked by ``PayloadRoot.version_dir``). A body that is not JSON
    passes through: vLLM answers it with its own 400. A compressed body is decoded here, a copy
    to read (at most ``limit`` bytes, else :class:`~payloadrun.writer.content_coding.TooLarge`);
    one in a coding the writer cannot read, or not valid in it, passes through as sent.
    """
    try:
        body = request.decoded(limit)
    except content_coding.CodingError:
        return None
    if not may_name_payload_dir(body):
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    plan = plan_request(endpoint, parsed)
    if plan is not None and store is not None:
        check_payload_dir(store, plan)
    return plan


def check_payload_dir(store: PayloadStore, plan: RequestPlan) -> None:
    """Refuse the request's ``payload_dir`` (:class:`RequestError`) when the volume shows it
    outside the root (a symlink, say). A volume that cannot be asked now (its server is away)
    refuses nothing: vLLM still answers, and the write checks the path again, or sends the
    answer back inline."""
    try:
        store.root.version_dir(plan.payload_dir)
    except PayloadPathError as exc:
        raise RequestError(str(exc), plan.payload_dir) from exc
    except OSError:
        pass


@dataclass(slots=True)
class RewriteResult:
    """What became of one by-handle response; ``body`` is what aiohttp sends as it is, in the
    content coding ``encoding`` (None: identity, a new body or vLLM's decoded one)."""

    mode: Mode
    body: bytes | bytearray
    fallback: Fallback | None = None  # why it went back inline (payloadrun.reasons)
    detail: str = ""
    write_seconds: float | None = None
    written: dict[str, int] = field(default_factory=dict)
    file: str | None = None  # the payload file written, by handle
    encoding: str | None = None
    reduction: int = 0  # bytes of vLLM's (decoded) answer not sent, by handle


def _sendable(body: Body) -> bytes | bytearray:
    """The body as aiohttp sends it without a warning: a buffer becomes bytes (one copy, done
    here on a worker thread, and only when the response goes back as vLLM sent it)."""
    return body if isinstance(body, bytes | bytearray) else bytes(body)


def _inline(
    body: Body, reason: Fallback, detail: str, encoding: str | None = None
) -> RewriteResult:
    return RewriteResult(
        Mode.INLINE, _sendable(body), fallback=reason, detail=detail, encoding=encoding
    )


def parse_response(body: Body) -> Any:
    """The response as JSON, its routed-experts strings left as views into ``body`` when possible.

    See :mod:`payloadrun.writer.inline` for why; the result is the same either way once the
    codec has decoded the strings.
    """
    cut = cut_routed_experts(body)
    if cut is not None:
        response = json.loads(cut.skeleton)
        if restore_into_choices(response, cut.values):
            return response
    return json.loads(_sendable(body))


@dataclass(slots=True)
class Prepared:
    """A by-handle answer parsed and planned, its arrays not yet written: what the write needs,
    and ``body`` (decoded) to send back inline instead when the write does not happen in time."""

    body: Body
    response: Any
    payload: Any  # plan.PayloadPlan


def prepare_response(
    store: PayloadStore | None, plan: RequestPlan, answer: CodedBody
) -> Prepared | RewriteResult:
    """Decode, parse and plan vLLM's answer; a :class:`RewriteResult` when it goes back as it is
    (nothing to write, or it cannot be taken apart), else what :func:`write_prepared` writes.

    A body in a content coding is decoded first; one the writer cannot decode goes back as
    received, coding and all (the client may read what the writer cannot).
    """
    try:
        body = answer.decoded(ANSWER_DECODE_LIMIT)
    except (content_coding.CodingError, content_coding.TooLarge) as exc:
        detail = f"Content-Encoding {answer.encoding}: {exc}"
        return _inline(answer.data, Fallback.CONTENT_ENCODING, detail, answer.encoding)
    try:
        response = parse_response(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return _inline(body, Fallback.BAD_RESPONSE, f"upstream body is not JSON: {exc}")
    try:
        payload = plan_payload(plan, response)
    except CodecError as exc:
        return _inline(body, Fallback.BAD_PAYLOAD, str(exc))
    if payload.empty:
        return RewriteResult(Mode.INLINE, _sendable(body))
    if store is None:
        return _inline(body, Fallback.VOLUME_GONE, "the payload root is not available")
    return Prepared(body, response, payload)


def write_prepared(store: PayloadStore, plan: RequestPlan, prepared: Prepared) -> RewriteResult:
    """Write the arrays of a prepared answer to one file and return the smaller body (or the
    original one, inline, with the reason the write failed). Touches the volume: the server runs
    it on its write threads, under the write deadline."""
    body, response, payload = prepared.body, prepared.response, prepared.payload
    started = time.perf_counter()
    try:
        segments = store.write(plan.payload_dir, payload.parts)
    except PayloadWriteError as exc:
        return _inline(body, Fallback.of(exc.reason), str(exc))
    except PayloadPathError as exc:  # v<k> was replaced by a symlink since the request came in
        return _inline(body, Fallback.PERMISSION, str(exc))
    except OSError as exc:  # checking payload_dir on a volume whose server is away, say
        return _inline(body, Fallback.of(failure_reason(exc)), str(exc))
    elapsed = time.perf_counter() - started
    apply_segments(response, payload, segments)
    sent = dumps(response)
    return RewriteResult(
        Mode.HANDLE,
        sent,
        write_seconds=elapsed,
        written=payload.bytes_by_field(),
        file=segments[0].file if segments else None,
        reduction=max(0, len(body) - len(sent)),
    )


def inline_instead(prepared: Prepared, reason: Fallback, detail: str) -> RewriteResult:
    """vLLM's answer as it would go back inline, for a write that did not happen in time."""
    return _inline(prepared.body, reason, detail)


def rewrite_response(
    store: PayloadStore | None, plan: RequestPlan, answer: CodedBody
) -> RewriteResult:
    """Take the inline arrays off a vLLM response, write them, and return the smaller body.

    Whatever goes wrong, the caller gets a body to send: the original one, untouched, with the
    reason it stayed inline. No response is lost to a full disk or a missing volume. The three
    steps in one call, on one thread, with no deadline: the server splits them
    (:func:`prepare_response` on the request pool, :func:`write_prepared` on its write threads).
    """
    prepared = prepare_response(store, plan, answer)
    if isinstance(prepared, RewriteResult):
        return prepared
    assert store is not None
    return write_prepared(store, plan, prepared)
