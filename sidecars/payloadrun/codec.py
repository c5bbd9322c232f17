"""Turning what vLLM returns inline into payload rows, and back.

Two per-token arrays travel by handle:

- ``routed_experts``: the MoE router's chosen expert ids, ``[rows, layers, top_k]``. vLLM returns
  one row per *forwarded* token; the last sampled token is never forwarded, so the rows end one
  token before the end of the sequence. Rows are anchored there: they cover
  ``[prompt_len + completion_len - 1 - rows, prompt_len + completion_len - 1)``, which stays right
  when vLLM skips leading prompt tokens (``routed_experts_prompt_start``) or when a decode instance
  only reports rows from its first forward.
- ``sampling_mask``: for completion token ``i`` (position ``prompt_len + i``), the token ids that
  survived top-k/top-p/min-p. It arrives as CSR ``{ids, counts}`` (one count per completion token,
  0 meaning no mask there) and is stored as int32 rows ``[completion_len, widest]`` padded with -1.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pybase64
from numpy.lib import format as npy_format

from payloadrun.segments import MASK_PAD, ROUTED_EXPERTS, SAMPLING_MASK

_MAX_EXPERT_ID = np.iinfo(np.uint16).max


class CodecError(ValueError):
    """An inline payload could not be decoded, or an array has the wrong form."""


@dataclass(frozen=True, slots=True)
class PositionedRows:
    """Rows of one field and the token position of the first row."""

    field: str
    rows: np.ndarray
    pos: int


def compact_routed_experts(experts: np.ndarray) -> np.ndarray:
    """Expert ids as uint8 or uint16, C-contiguous.

    uint8 and uint16 arrays keep their dtype: it is vLLM's capturer's, fixed by the model's expert
    count (uint16 above 256 experts), so every answer of a run has the same one, and a multi-turn
    trace's turns read back in the dtype verifiers' inline path has (a uint16 answer whose ids
    happen to fit in a byte must not come back uint8). Any other integer dtype (a form that
    carries ids as int32 or int64) becomes uint8 when every id fits, else uint16.

    Raises when the array is not 3-D ``[tokens, layers, top_k]``, not of an integer dtype, holds a
    negative id, or holds an id above 65535 (no model has that many experts per layer; such a value
    means the array is not routing ids).
    """
    arr = np.asarray(experts)
    if arr.ndim != 3:
        raise CodecError(
            f"routed experts must be 3-D [tokens, layers, top_k], got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise CodecError(
            f"routed experts must hold integer expert ids, got dtype {arr.dtype}: "
            "pass the ids, not router logits or weights"
        )
    if arr.size == 0:
        return np.ascontiguousarray(arr, dtype=np.uint8)
    if arr.dtype == np.uint8:  # every uint8 is a valid id: nothing to scan
        return np.ascontiguousarray(arr)
    if arr.dtype == np.uint16:  # the capturer's dtype above 256 experts: every id is valid
        return np.ascontiguousarray(arr)
    # Unsigned ids are never negative: one pass (max) decides; signed ones need min too.
    if np.issubdtype(arr.dtype, np.signedinteger):
        lo = int(arr.min())
        if lo < 0:
            raise CodecError(f"routed experts hold a negative expert id ({lo})")
    hi = int(arr.max())
    if hi > _MAX_EXPERT_ID:
        raise CodecError(
            f"routed experts hold expert id {hi}, above the uint16 limit {_MAX_EXPERT_ID}"
        )
    dtype = np.uint8 if hi <= np.iinfo(np.uint8).max else np.uint16
    return np.ascontiguousarray(arr, dtype=dtype)


def routing_pos(prompt_len: int, completion_len: int, rows: int) -> int:
    """Token position of the first routing row, anchored at the last forwarded token."""
    pos = prompt_len + completion_len - 1 - rows
    if pos < 0:
        raise CodecError(
            f"{rows} routing rows do not fit a sequence of {prompt_len} prompt and "
            f"{completion_len} completion tokens (at most {prompt_len + completion_len - 1} "
            "tokens are forwarded)"
        )
    return pos


def routing_rows(experts: np.ndarray, prompt_len: int, completion_len: int) -> PositionedRows:
    rows = compact_routed_experts(experts)
    return PositionedRows(ROUTED_EXPERTS, rows, routing_pos(prompt_len, completion_len, len(rows)))


def mask_rows_from_csr(ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """CSR ``{ids, counts}`` to int32 rows ``[len(counts), widest]`` padded with -1.

    A count of 0 is a row of -1. When every count is 0 the rows are one column wide, so every
    completion token still has a row.
    """
    ids = np.asarray(ids)
    counts = np.asarray(counts)
    if ids.ndim != 1 or counts.ndim != 1:
        raise CodecError(
            f"sampling mask ids and counts must be 1-D, got shapes {ids.shape} and {counts.shape}"
        )
    if counts.size and int(counts.min()) < 0:
        raise CodecError(f"sampling mask counts hold a negative count ({int(counts.min())})")
    total = int(counts.sum()) if counts.size else 0
    if total != ids.size:
        raise CodecError(
            f"sampling mask counts add up to {total} but there are {ids.size} ids: "
            "the CSR form needs one count per completion token"
        )
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) > np.iinfo(np.int32).max):
        raise CodecError("sampling mask ids must be token ids in [0, 2**31)")
    n = counts.size
    widest = max(1, int(counts.max()) if n else 1)
    rows = np.full((n, widest), MASK_PAD, dtype=np.int32)
    if ids.size:
        counts64 = counts.astype(np.int64)
        row_of = np.repeat(np.arange(n), counts64)
        starts = np.cumsum(counts64) - counts64
        col_of = np.arange(ids.size) - np.repeat(starts, counts64)
        rows[row_of, col_of] = ids
    return rows


def mask_rows(ids: np.ndarray, counts: np.ndarray, prompt_len: int) -> PositionedRows:
    return PositionedRows(SAMPLING_MASK, mask_rows_from_csr(ids, counts), prompt_len)


def csr_from_mask_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`mask_rows_from_csr` (padding dropped)."""
    rows = np.asarray(rows)
    keep = rows != MASK_PAD
    return rows[keep].astype(np.int32), keep.sum(axis=1).astype(np.int32)


# --- inline wire forms ---------------------------------------------------------------------------


# Long strings are decoded a slice at a time: one call on a 40 MB string holds the GIL long
# enough to stall an event loop running on another thread (the writer's). pybase64 (SIMD, the
# decoder vLLM itself uses) is about 8 times faster than the standard library's.
_B64_SLICE = 1 << 20  # characters; a multiple of 4, so every slice is whole base64 quanta

Base64Text = str | bytes | bytearray | memoryview


def _b64decode(text: Base64Text, what: str) -> np.ndarray:
    """Strict base64 (alphabet and padding checked), from a str or any bytes-like object.

    The bytes come back as one uint8 array filled slice by slice, not as slices joined: numpy
    backs a large array with huge pages, so 32 MB of routing cost a few page faults instead of
    8,000, and there is no second 32 MB copy. Every slice is decoded with ``validate=True`` and
    only the last one may end in padding, so this is exactly as strict as one call on the whole.
    """
    size = len(text)
    out = np.empty((size + 3) // 4 * 3, dtype=np.uint8)
    filled = 0
    try:
        for start in range(0, size, _B64_SLICE):
            piece = text[start : start + _B64_SLICE]
            if start + _B64_SLICE < size and piece[-1:] in ("=", b"="):
                raise binascii.Error("Excess data after padding")
            decoded = pybase64.b64decode(piece, validate=True)
            end = filled + len(decoded)
            if end > out.size:  # impossible for validated base64; never write past the end
                raise binascii.Error(f"more than {out.size} bytes from {size} characters")
            out[filled:end] = np.frombuffer(decoded, dtype=np.uint8)
            filled = end
    except (binascii.Error, ValueError) as exc:
        raise CodecError(f"{what} is not valid base64: {exc}") from exc
    return out[:filled]


def encode_npy_base64(arr: np.ndarray) -> str:
    """vLLM's inline form: base64 of ``np.save`` bytes (``utils.serial_utils.numpy2base64``)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


_NPY_MAX_HEADER = 10_000  # np.load's default max_header_size
_NPY_HEADER_READERS = {  # format version: (header length field, numpy's header parser)
    (1, 0): ("<H", npy_format.read_array_header_1_0),
    (2, 0): ("<I", npy_format.read_array_header_2_0),
}
# numpy reads a header with ast.literal_eval, and CPython 3.11 keeps the AST constructor's
# recursion depth in state its threads share: the writer's request threads reading headers at
# once failed with "SystemError: AST constructor recursion depth mismatch" (cpython gh-106905,
# a 500 in make test). The header np.save writes (vLLM's numpy2base64 is np.save) is read here
# without ast, and faster; any other goes through numpy, one thread at a time.
_NPY_SAVE_HEADER = re.compile(
    r"\{'descr': '([<>|=]?[A-Za-z]\d*)', 'fortran_order': (True|False), "
    r"'shape': \((\d+(?:, \d+)*,?)?\), \} *\n"
)
_NUMPY_HEADER = threading.Lock()


def npy_save_header(text: str) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """(shape, fortran_order, dtype) of an .npy header as np.save writes it; None for any other
    (numpy's own reader decides those)."""
    match = _NPY_SAVE_HEADER.fullmatch(text)
    if match is None:
        return None
    descr, fortran_order, dims = match.groups()
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError):
        return None
    shape = tuple(int(d) for d in dims.rstrip(",").split(", ")) if dims else ()
    return shape, fortran_order == "True", dtype


def load_npy(raw: np.ndarray) -> np.ndarray:
    """``np.load(BytesIO(raw), allow_pickle=False)``, returning a view into ``raw`` (no copy).

    np.load on a byte stream reads the data 256 KiB at a time into a new array, two more copies
    of every byte; here numpy's own functions parse the header and the data stays where the
    decoder put it; a header as np.save writes it is read without numpy's ``ast`` (see
    :func:`npy_save_header`). Anything unusual (format 3.0, a header over np.load's 10,000-byte
    limit, zero-size items) goes through np.load itself, with its own checks and messages. Raises
    ValueError as np.load does: bad magic string, bad header, object dtype, data cut short.
    """
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    magic_end = npy_format.MAGIC_LEN
    version = npy_format.read_magic(io.BytesIO(raw[:magic_end].tobytes()))
    reader = _NPY_HEADER_READERS.get(version)
    if reader is not None:
        length_format, read_header = reader
        length_end = magic_end + struct.calcsize(length_format)
        if raw.size >= length_end:
            (header_len,) = struct.unpack(length_format, raw[magic_end:length_end].tobytes())
            if header_len <= _NPY_MAX_HEADER:
                offset = length_end + header_len
                header = npy_save_header(raw[length_end:offset].tobytes().decode("latin1"))
                if header is None:
                    head = io.BytesIO(raw[:offset].tobytes())
                    head.seek(magic_end)
                    with _NUMPY_HEADER:
                        header = read_header(head, max_header_size=_NPY_MAX_HEADER)
                shape, fortran_order, dtype = header
                if dtype.hasobject:
                    raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
                if dtype.itemsize:
                    count = math.prod(shape)
                    need = count * dtype.itemsize
                    if raw.size - offset < need:
                        raise ValueError(
                            f"EOF: reading array data, expected {need} bytes "
                            f"got {raw.size - offset}"
                        )
                    arr = np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
                    if fortran_order:
                        return arr.reshape(shape[::-1]).transpose()
                    return arr.reshape(shape)
    with _NUMPY_HEADER:
        return np.load(io.BytesIO(raw), allow_pickle=False)


def decode_npy_base64(text: Base64Text) -> np.ndarray:
    raw = _b64decode(text, "routed_experts")
    try:
        return load_npy(raw)
    except (ValueError, OSError, EOFError) as exc:
        raise CodecError(f"routed_experts is not a base64 .npy array: {exc}") from exc


def encode_prime_rl(arr: np.ndarray, start: int) -> dict[str, Any]:
    """prime-rl's inline form ``{data, shape, start, dtype}``."""
    arr = np.ascontiguousarray(arr)
    return {
        "data": base64.b64encode(arr.tobytes()).decode("ascii"),
        "shape": list(arr.shape),
        "start": start,
        "dtype": arr.dtype.name,
    }


def decode_prime_rl(obj: Mapping[str, Any]) -> tuple[np.ndarray, int]:
    missing = [k for k in ("data", "shape", "dtype") if k not in obj]
    if missing:
        raise CodecError(f"inline routed_experts object lacks {', '.join(missing)}")
    try:
        dtype = np.dtype(obj["dtype"])
    except TypeError as exc:
        raise CodecError(f"inline routed_experts has unknown dtype {obj['dtype']!r}") from exc
    raw = _b64decode(obj["data"], "routed_experts.data")
    shape = tuple(obj["shape"])
    expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if len(raw) != expected:
        raise CodecError(
            f"inline routed_experts has {len(raw)} bytes but shape {list(shape)} of {dtype} "
            f"needs {expected}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape), int(obj.get("start") or 0)


def decode_routed_experts(value: Any) -> tuple[np.ndarray, int | None]:
    """Decode any inline routed-experts form: the array and its stated start, if any.

    vLLM's OpenAI server sends a base64 ``.npy`` string and states no start (the request's
    ``routed_experts_prompt_start`` says where it began); prime-rl's form carries ``start``. A
    plain nested list is accepted too. The base64 may also come as bytes (a writer that cut the
    string out of the raw response body without decoding it as JSON).
    """
    if isinstance(value, str | bytes | bytearray | memoryview):
        return decode_npy_base64(value), None
    if isinstance(value, Mapping):
        arr, start = decode_prime_rl(value)
        return arr, start
    if isinstance(value, list):
        return np.asarray(value), None
    raise CodecError(
        f"routed_experts must be a base64 .npy string (or bytes), a {{data, shape, start, "
        f"dtype}} object or a nested list, got {type(value).__name__}"
    )


def _int32_vector(value: Any, what: str) -> np.ndarray:
    if isinstance(value, str):
        raw = _b64decode(value, what)
        if len(raw) % 4:
            raise CodecError(f"{what} has {len(raw)} bytes, not a whole number of int32 values")
        return np.frombuffer(raw, dtype="<i4")
    if isinstance(value, Sequence):
        return np.asarray(value, dtype=np.int64)
    if isinstance(value, np.ndarray):
        return value
    raise CodecError(f"{what} must be a list of integers or base64 int32, got {type(value)}")


def decode_sampling_mask(value: Any) -> tuple[np.ndarray, np.ndarray]:
    """Decode an inline sampling mask to CSR ``(ids, counts)``.

    Accepts the packed CSR object ``{ids, counts}`` (lists, or base64 of little-endian int32) and
    a list of per-token id lists.
    """
    if isinstance(value, Mapping):
        if "ids" not in value or "counts" not in value:
            raise CodecError(f"sampling_mask object needs ids and counts, got keys {sorted(value)}")
        return (
            _int32_vector(value["ids"], "sampling_mask.ids"),
            _int32_vector(value["counts"], "sampling_mask.counts"),
        )
    if isinstance(value, list):
        counts = np.fromiter((len(r) for r in value), dtype=np.int64, count=len(value))
        ids = np.fromiter((t for r in value for t in r), dtype=np.int64)
        return ids, counts
    raise CodecError(
        f"sampling_mask must be a {{ids, counts}} object or a list of id lists, "
        f"got {type(value).__name__}"
    )


def encode_sampling_mask_csr(ids: np.ndarray, counts: np.ndarray) -> dict[str, str]:
    """The packed CSR form with base64 little-endian int32 vectors."""
    return {
        "ids": base64.b64encode(np.asarray(ids, dtype="<i4").tobytes()).decode("ascii"),
        "counts": base64.b64encode(np.asarray(counts, dtype="<i4").tobytes()).decode("ascii"),
    }
