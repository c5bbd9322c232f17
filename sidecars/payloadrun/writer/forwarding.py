"""Which headers a proxy forwards (RFC 9110 section 7.6.1): the message's, not the connection's.

Hop-by-hop headers belong to one connection and are never forwarded, nor any header that
``Connection`` names; aiohttp computes ``Host`` and ``Content-Length`` itself from what it sends.
A by-handle request asks vLLM for an uncompressed answer: the writer has to read it.
"""

from __future__ import annotations

from typing import Any

from multidict import CIMultiDict

from payloadrun.writer.content_coding import IDENTITY

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)
REQUEST_DROP = HOP_BY_HOP | {"host", "content-length"}
RESPONSE_DROP = HOP_BY_HOP | {"content-length"}


def forward_headers(headers: Any, *, drop: frozenset[str]) -> CIMultiDict[str]:
    """The end-to-end headers of a message: ``drop`` and every header ``Connection`` names
    (a proxy must remove those too, RFC 9110 section 7.6.1) are left out."""
    named = {
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
    }
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        lower = key.lower()
        if lower not in drop and lower not in named:
            out.add(key, value)
    return out


def request_headers(headers: Any, *, by_handle: bool) -> CIMultiDict[str]:
    """What goes upstream with a request; by handle, with ``Accept-Encoding: identity``.

    Leaving ``Accept-Encoding`` out would not do: no ``Accept-Encoding`` means any coding is
    acceptable (RFC 9110 section 12.5.3).
    """
    if not by_handle:
        return forward_headers(headers, drop=REQUEST_DROP)
    out = forward_headers(headers, drop=REQUEST_DROP | {"accept-encoding"})
    out["Accept-Encoding"] = IDENTITY
    return out


def response_headers(headers: Any, *, keep_type: bool = True) -> CIMultiDict[str]:
    """What goes back to the client with vLLM's answer (a rewritten answer sets its own type)."""
    return forward_headers(
        headers, drop=RESPONSE_DROP if keep_type else RESPONSE_DROP | {"content-type"}
    )


def is_chunked(headers: Any) -> bool:
    return "chunked" in headers.get("Transfer-Encoding", "").lower()
