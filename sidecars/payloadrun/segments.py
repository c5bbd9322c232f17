"""Payload segments: where a run of fixed-width per-token rows lives in a payload file.

A segment says that ``rows`` rows of one field (``routed_experts`` or ``sampling_mask``), each of
``shape`` elements of ``dtype``, sit back to back at byte ``offset`` of ``file``, and that the first
row belongs to token position ``pos``. It is the handle that travels in responses instead of the
bytes, with the same JSON field names as prime-rl's ``PayloadSegment``.

Segments are immutable and every operation returns a new one, so a segment can be shared between
a trace, its samples and a batch without anyone rewriting another's rows.

An orchestrator's path through this module: :func:`choice_segments` takes them off an answer,
:func:`sample_segments` clips them to a training sample and adds :func:`final_token_row`, and
:func:`files_of` names the files a batch holds for the retention sidecar.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

ROUTED_EXPERTS = "routed_experts"
SAMPLING_MASK = "sampling_mask"

# The two names the wire adds to vLLM's protocol: the request's extra argument naming the version
# directory (``sampling_params.extra_args`` on /generate, ``vllm_xargs`` on the OpenAI routes), and
# the field of each answered choice that holds its segments.
PAYLOAD_DIR_ARG = "payload_dir"
PAYLOAD_FIELD = "payload"

# What a reader puts in cells no segment covers: expert 0 for routing, -1 (no id) for masks.
ROUTING_FILL = 0
MASK_PAD = -1
FIELD_FILL = {ROUTED_EXPERTS: ROUTING_FILL, SAMPLING_MASK: MASK_PAD}

# The dtypes a payload row may have: compact routing ids and int32 mask ids, plus the wider
# integer types a caller may store for other per-token fields.
ALLOWED_DTYPES = frozenset({"uint8", "uint16", "int32", "int64", "uint32", "float16", "float32"})
_ITEMSIZE = {name: np.dtype(name).itemsize for name in ALLOWED_DTYPES}  # np.dtype(str): 1 us

_JSON_KEYS = ("field", "file", "offset", "pos", "rows", "dtype", "shape")


class SegmentError(ValueError):
    """A segment's fields are inconsistent, or its JSON is malformed."""


@dataclass(frozen=True, slots=True)
class Segment:
    """``rows`` rows of ``field`` at byte ``offset`` of ``file``, the first at token ``pos``."""

    field: str
    file: str
    offset: int
    pos: int
    rows: int
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.field:
            raise SegmentError("segment field is empty: name the per-token array it holds")
        if self.dtype not in ALLOWED_DTYPES:
            raise SegmentError(
                f"segment dtype {self.dtype!r} is not supported: use one of "
                f"{sorted(ALLOWED_DTYPES)}"
            )
        for name in ("offset", "pos", "rows"):
            value = getattr(self, name)
            if isinstance(value, np.integer):  # positions computed with numpy are welcome
                value = int(value)
                object.__setattr__(self, name, value)
            if type(value) is not int or value < 0:
                raise SegmentError(f"segment {name} must be an integer >= 0, got {value!r}")
        if type(self.shape) is not tuple:
            object.__setattr__(self, "shape", tuple(self.shape))
        if any(type(d) is not int or d < 0 for d in self.shape):
            raise SegmentError(
                f"segment shape must be non-negative integers, got {list(self.shape)!r}"
            )

    @property
    def end(self) -> int:
        """One past the last token position covered."""
        return self.pos + self.rows

    @property
    def row_bytes(self) -> int:
        return _ITEMSIZE[self.dtype] * math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def clip(self, lo: int, hi: int) -> Segment | None:
        """The part of this segment inside token positions ``[lo, hi)``, or None if empty."""
        start = max(self.pos, lo)
        stop = min(self.end, hi)
        if stop <= start:
            return None
        if start == self.pos and stop == self.end:
            return self
        return self._derive(self.offset + (start - self.pos) * self.row_bytes, start, stop - start)

    def shift(self, delta: int) -> Segment:
        """The same bytes at positions moved by ``delta`` (rebasing to another coordinate)."""
        if self.pos + delta < 0:
            raise SegmentError(
                f"shifting a segment at pos {self.pos} by {delta} would make pos negative"
            )
        return self._derive(self.offset, self.pos + delta, self.rows)

    def final_token(self) -> Segment:
        """A 1-row segment at ``end`` that points at this segment's last row.

        Routing rows stop at the last forwarded token: the final sampled token is never forwarded,
        so it has no row of its own. A training sample still needs a row there, and the inline path
        fills it by copying the previous row; this segment is the by-handle form of that copy.
        """
        if self.rows == 0:
            raise SegmentError("an empty segment has no last row to repeat for the final token")
        return self._derive(self.offset + (self.rows - 1) * self.row_bytes, self.end, 1)

    def _derive(self, offset: int, pos: int, rows: int) -> Segment:
        """A segment of this one's field, file, dtype and shape (checked when this one was made)
        at other non-negative integers: without the checks, which cost more than the rest of a
        multi-turn trace's algebra."""
        seg = object.__new__(Segment)
        for name, value in (
            ("field", self.field),
            ("file", self.file),
            ("offset", offset),
            ("pos", pos),
            ("rows", rows),
            ("dtype", self.dtype),
            ("shape", self.shape),
        ):
            object.__setattr__(seg, name, value)
        return seg

    def to_json(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "file": self.file,
            "offset": self.offset,
            "pos": self.pos,
            "rows": self.rows,
            "dtype": self.dtype,
            "shape": list(self.shape),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Segment:
        if not isinstance(obj, Mapping):
            raise SegmentError(f"a segment must be a JSON object, got {type(obj).__name__}")
        missing = [k for k in _JSON_KEYS if k not in obj]
        if missing:
            raise SegmentError(f"segment {dict(obj)!r} lacks {', '.join(missing)}")
        shape = obj["shape"]
        if not isinstance(shape, list | tuple):
            raise SegmentError(f"segment shape must be a list of integers, got {shape!r}")
        for key in ("field", "file", "dtype"):
            if not isinstance(obj[key], str):
                raise SegmentError(f"segment {key} must be a string, got {obj[key]!r}")
        return cls(
            field=obj["field"],
            file=obj["file"],
            offset=obj["offset"],
            pos=obj["pos"],
            rows=obj["rows"],
            dtype=obj["dtype"],
            shape=tuple(shape),
        )


def segments_from_json(items: Any) -> list[Segment]:
    """Parse a response's ``payload`` list."""
    if not isinstance(items, list):
        raise SegmentError(f"payload must be a list of segments, got {type(items).__name__}")
    return [Segment.from_json(item) for item in items]


def choice_segments(choice: Mapping[str, Any]) -> list[Segment] | None:
    """The segments of one answered choice, or None when the choice carries its arrays inline.

    A writer that could not store a request (its answer has ``X-Payloadrun-Fallback``), and any
    request without a ``payload_dir``, answers with vLLM's inline arrays and no segments: decode
    those with :func:`payloadrun.decode_routed_experts` and
    :func:`payloadrun.decode_sampling_mask` instead.
    """
    if not isinstance(choice, Mapping):
        raise SegmentError(f"a choice must be a JSON object, got {type(choice).__name__}")
    items = choice.get(PAYLOAD_FIELD)
    return None if items is None else segments_from_json(items)


def segments_to_json(segments: list[Segment]) -> list[dict[str, Any]]:
    return [s.to_json() for s in segments]


def clip_all(segments: list[Segment], lo: int, hi: int) -> list[Segment]:
    """Every segment's part inside ``[lo, hi)``, empty parts dropped, order kept."""
    return [c for s in segments if (c := s.clip(lo, hi)) is not None]


def final_token_row(segments: list[Segment], total: int) -> Segment | None:
    """The routing row a sample of ``total`` tokens lacks for its final token, or None.

    Routing rows are end-anchored: they stop at the last forwarded token, ``total - 1``, because
    the final sampled token is never forwarded. A training sample needs a row there too; the
    inline path copies the previous row into a placeholder, and this is the by-handle form of the
    copy: :meth:`Segment.final_token` of the routing segment that ends at ``total - 1``. None when
    no routing segment ends there (no routing captured, or a row already covers the token).
    """
    ends = [s for s in segments if s.field == ROUTED_EXPERTS and s.rows]
    if not ends:
        return None
    last = max(ends, key=lambda s: s.end)
    return last.final_token() if last.end == total - 1 else None


def sample_segments(segments: list[Segment], prompt_len: int, completion_len: int) -> list[Segment]:
    """The segments a training sample of ``prompt_len + completion_len`` tokens reads.

    A response's segments clipped to the sample's positions, plus :func:`final_token_row`. No
    bytes move: only handles, so the rows stay where the writer put them.
    """
    if prompt_len < 0 or completion_len < 0:
        raise SegmentError(
            f"a sample's lengths are >= 0, got prompt_len {prompt_len}, "
            f"completion_len {completion_len}"
        )
    total = prompt_len + completion_len
    clipped = clip_all(segments, 0, total)
    final = final_token_row(clipped, total)
    return clipped if final is None else [*clipped, final]


def files_of(segments: list[Segment]) -> list[str]:
    """The distinct files the segments point into, in first-seen order."""
    return list(dict.fromkeys(s.file for s in segments))
