"""Cutting vLLM's base64 ``routed_experts`` strings out of a raw body before parsing the rest.

A router-replay response is almost all one base64 string per choice (33.9 MB measured). Parsing
it with :func:`json.loads` scans it character by character and copies it into a ``str``, in one
call that holds the GIL for hundreds of ms: the writer's event loop, on another thread, would
stall for that long. vLLM serializes with Starlette (compact separators, no escaping of ``/``),
so each value is found with two ``bytes.find`` calls and kept as a zero-copy ``memoryview``;
only the small rest is parsed as JSON. The codec decodes the views a slice at a time.

Safety: inside a valid JSON string every ``"`` is escaped, so ``"routed_experts":"`` can only
match an object key and the start of its string value, and base64 contains no ``"`` or ``\\``.
Whenever that does not hold (an escape inside the value, a match outside ``choices``), the caller
parses the whole body instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from payloadrun.segments import ROUTED_EXPERTS
from payloadrun.writer.body import Body

_KEY = b'"' + ROUTED_EXPERTS.encode() + b'":"'
# Parses to "\x00payloadrun-inline:<k>": a NUL is never part of a base64 value.
_PLACEHOLDER_PREFIX = "\x00payloadrun-inline:"


@dataclass(frozen=True, slots=True)
class CutBody:
    """The body with each routed-experts string replaced by a placeholder, and the strings."""

    skeleton: bytes
    values: tuple[memoryview, ...]


def cut_routed_experts(body: Body) -> CutBody | None:
    """The body's routed-experts strings cut out, or None when there are none to cut."""
    view = memoryview(body)
    pieces: list[bytes | memoryview] = []
    values: list[memoryview] = []
    pos = 0
    while (key := body.find(_KEY, pos)) >= 0:
        start = key + len(_KEY)
        end = body.find(b'"', start)
        if end < 0 or body.find(b"\\", start, end) >= 0:
            return None
        pieces.append(view[pos : start - 1])
        pieces.append(b'"\\u0000payloadrun-inline:%d"' % len(values))
        values.append(view[start:end])
        pos = end + 1
    if not values:
        return None
    pieces.append(view[pos:])
    return CutBody(b"".join(pieces), tuple(values))


def restore_into_choices(response: Any, values: tuple[memoryview, ...]) -> bool:
    """Put the cut strings back (as bytes-like views) into ``response["choices"]``.

    True when every cut string was found in a choice; False means one sat elsewhere in the body
    and the caller must parse the whole body instead.
    """
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(choices, list):
        return False
    restored = 0
    for choice in choices:
        value = choice.get(ROUTED_EXPERTS) if isinstance(choice, dict) else None
        if isinstance(value, str) and value.startswith(_PLACEHOLDER_PREFIX):
            index = int(value[len(_PLACEHOLDER_PREFIX) :])
            choice[ROUTED_EXPERTS] = values[index]
            restored += 1
    return restored == len(values)
