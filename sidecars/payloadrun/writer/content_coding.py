"""Content codings (RFC 9110 section 8.4): reading through a compressed body without changing it.

The writer never re-labels a body. A request body goes upstream as the client sent it, coding,
bytes and headers untouched, so vLLM answers it exactly as it would answer the client directly;
the writer decodes a copy only to look for ``payload_dir`` (and refuse a bad one). A by-handle
response is decoded because the writer must take it apart; what the client then gets is a new
body, sent as ``identity``.

``decode`` runs on a worker thread. It is bounded: a small gzip body can unpack to gigabytes, so
it stops at ``limit`` bytes.
"""

from __future__ import annotations

import zlib

try:  # aiohttp's optional brotli support; without it a br body is a coding the writer cannot read
    import brotli  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    brotli = None

IDENTITY = "identity"


class CodingError(ValueError):
    """A body in a coding the writer cannot read, or one that is not valid in its coding."""


class TooLarge(ValueError):
    """A body that decodes to more than the limit."""


def codings(header: str | None) -> list[str]:
    """The codings of a ``Content-Encoding`` value in the order they were applied, identity out."""
    if not header:
        return []
    return [c.strip().lower() for c in header.split(",") if c.strip().lower() not in ("", IDENTITY)]


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    d = zlib.decompressobj(wbits)
    out = d.decompress(data, limit + 1)
    if len(out) > limit:
        raise TooLarge(f"decodes to more than {limit} bytes")
    if not d.eof:
        raise CodingError("truncated")
    return out + d.flush()


def _decode_one(data: bytes, coding: str, limit: int) -> bytes:
    try:
        if coding in ("gzip", "x-gzip"):
            return _inflate(data, 16 + zlib.MAX_WBITS, limit)
        if coding == "deflate":  # zlib-wrapped per the RFC; raw deflate from old servers too
            try:
                return _inflate(data, zlib.MAX_WBITS, limit)
            except zlib.error:
                return _inflate(data, -zlib.MAX_WBITS, limit)
        if coding == "br" and brotli is not None:
            out = brotli.decompress(data)
            if len(out) > limit:
                raise TooLarge(f"decodes to more than {limit} bytes")
            return out
    except zlib.error as exc:
        raise CodingError(f"not valid {coding}: {exc}") from exc
    except TooLarge:
        raise
    except Exception as exc:  # brotli.error
        raise CodingError(f"not valid {coding}: {exc}") from exc
    raise CodingError(f"content coding {coding!r} is not one the writer reads (gzip, deflate)")


def decode(data: bytes, header: str | None, limit: int) -> bytes:
    """``data`` with every coding named in ``header`` undone, last applied first."""
    for coding in reversed(codings(header)):
        data = _decode_one(bytes(data), coding, limit)
    return data
