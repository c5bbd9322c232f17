"""Message bodies as the writer holds them: the bytes with their content coding, as one value.

A body travels with the ``Content-Encoding`` it came in (:class:`CodedBody`), so whatever reads
it knows whether to decode it, and a body sent back as received keeps its label. vLLM's whole
answer to a by-handle request (:class:`UpstreamAnswer`) is that body, the headers to send back
with it, and when its last byte came.

Large answers are read into one preallocated buffer (:func:`read_body`), not joined from chunks.
"""

from __future__ import annotations

import contextlib
import mmap
import time
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict

from payloadrun.writer import content_coding
from payloadrun.writer.forwarding import is_chunked, response_headers

# A body: bytes, or the preallocated buffer the writer reads a large response into.
Body = bytes | bytearray | mmap.mmap

# A by-handle response at least this big is read into one buffer sized by its Content-Length.
PREALLOCATE_FROM = 1 << 20


@dataclass(frozen=True, slots=True)
class CodedBody:
    """A body and the content coding it is in (``Content-Encoding`` as received, or None)."""

    data: Body
    encoding: str | None = None

    @property
    def coded(self) -> bool:
        """True when the body must be decoded to be read (a coding other than identity)."""
        return bool(content_coding.codings(self.encoding))

    def decoded(self, limit: int) -> Body:
        """The bytes with every coding undone (at most ``limit`` of them); blocking.

        Raises :class:`~payloadrun.writer.content_coding.CodingError` or
        :class:`~payloadrun.writer.content_coding.TooLarge`.
        """
        if not self.coded:
            return self.data
        return content_coding.decode(self.data, self.encoding, limit)


@dataclass(frozen=True, slots=True)
class UpstreamAnswer:
    """vLLM's whole answer to a by-handle request, read: what the rewrite works on."""

    body: CodedBody
    headers: CIMultiDict[str]  # the end-to-end headers to send back (Content-Type is set anew)
    received: float  # time.perf_counter() when its last byte came from vLLM


def body_buffer(size: int) -> mmap.mmap:
    """A private anonymous mapping of ``size`` bytes, backed by huge pages when the kernel can.

    Reading 45 MB into fresh 4 KiB pages costs about 11,000 page faults (20-25 ms measured);
    with huge pages a few dozen. The mapping has ``find`` and the buffer protocol, which is all
    :mod:`payloadrun.writer.inline` needs, and it is unmapped when the last reference goes.
    """
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no MADV_HUGEPAGE: 4 KiB pages then
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


async def read_body(upstream: aiohttp.ClientResponse) -> bytes | mmap.mmap:
    """vLLM's whole response body, copied once, chunk by chunk, into one preallocated buffer.

    ``ClientResponse.read`` keeps every chunk until the end and then joins them: the chunks and
    the joined copy are all fresh memory, and the join (one 45 MB memcpy) runs on the event loop
    in one go. Here each chunk is copied as it arrives and then freed. A body without a
    Content-Length, or a small one, is read the usual way.
    """
    size = upstream.content_length
    if size is None or is_chunked(upstream.headers) or size < PREALLOCATE_FROM:
        return await upstream.read()
    buf = body_buffer(size)
    view = memoryview(buf)
    filled = 0
    try:
        async for chunk in upstream.content.iter_any():
            end = filled + len(chunk)
            if end > size:
                raise aiohttp.ClientPayloadError(
                    f"response body is longer than its Content-Length of {size} bytes"
                )
            view[filled:end] = chunk
            filled = end
    finally:
        view.release()
    if filled != size:
        raise aiohttp.ClientPayloadError(
            f"response body ended after {filled} of its Content-Length of {size} bytes"
        )
    return buf


async def read_answer(upstream: aiohttp.ClientResponse) -> UpstreamAnswer:
    """Read vLLM's answer to its end (the connection may then serve another request)."""
    data = await read_body(upstream)
    received = time.perf_counter()
    upstream.release()
    return UpstreamAnswer(
        CodedBody(data, upstream.headers.get("Content-Encoding")),
        response_headers(upstream.headers, keep_type=False),
        received,
    )
