"""What RFC 9110/9112 ask of a transparent proxy, one test per rule.

- Content-Encoding (9110 8.4): a property of the representation; the writer forwards a coded
  request body as received and never re-labels one (tests/writer/test_content_coding.py).
- Transfer-Encoding (9112 6.1, 7): hop-by-hop framing; each leg has its own.
- Expect (9110 10.1.1): the writer answers 100-continue itself.
- Connection (9110 7.6.1): the headers it names and the listed hop-by-hop headers are removed.
- Via (9110 7.6.3): not added, by decision (docs/writer.md, HTTP contract).
- Trailers (9110 6.5): a proxy may drop them; the writer does.
"""

from __future__ import annotations

import socket

from aiohttp import web

from .conftest import ServerThread, http


def _echo_upstream():
    """An upstream that answers with the request's headers, body length and framing."""

    async def handle(request):
        body = await request.read()
        return web.json_response(
            {
                "headers": dict(request.headers),
                "length": len(body),
                "chunked": "Transfer-Encoding" in request.headers,
            },
            headers={"Connection": "X-Hop", "X-Hop": "1", "Keep-Alive": "timeout=5", "X-End": "2"},
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return ServerThread(app).start()


def _raw(url, request: bytes, *, then: bytes = b"") -> bytes:
    """Send ``request`` (``Connection: close``), then ``then`` once an interim answer came;
    everything the writer sent until it closed."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        got = b""
        if then:
            got = sock.recv(65536)
            sock.sendall(then)
        while chunk := sock.recv(65536):
            got += chunk
        return got


def test_connection_and_the_headers_it_names_stay_on_their_hop(root, start_writer):
    upstream = _echo_upstream()
    try:
        writer = start_writer(upstream.url, root)
        reply = http(
            "POST",
            writer.url + "/v1/models",
            b"{}",
            {"Connection": "keep-alive, X-Secret", "X-Secret": "s", "X-Kept": "k", "TE": "x"},
        )
    finally:
        upstream.stop()
    seen = {k.lower() for k in reply.json()["headers"]}
    assert "x-kept" in seen
    assert not seen & {"x-secret", "te"}
    assert reply.json()["headers"].get("Connection", "keep-alive") == "keep-alive"
    assert "x-hop" not in reply.headers and "keep-alive" not in reply.headers
    assert reply.headers["x-end"] == "2"


def test_transfer_encoding_is_each_legs_own(root, start_writer):
    """A chunked upload reaches the upstream whole, framed by the writer (Content-Length)."""
    upstream = _echo_upstream()
    try:
        writer = start_writer(upstream.url, root)
        got = _raw(
            writer.url,
            b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
            b"\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\nX-Trailer: t\r\n\r\n",
        )
    finally:
        upstream.stop()
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b'"length": 7' in body and b'"chunked": false' in body
    assert b"X-Trailer" not in body, "trailers are dropped"


def test_expect_100_continue_is_answered_by_the_writer(writer, fake):
    body = b'{"prompt": "hi", "max_tokens": 2}'
    got = _raw(
        writer.url,
        b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nConnection: close\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n",
        then=body,
    )
    assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert b"HTTP/1.1 200 OK" in got


def test_no_via_is_added(writer, fake):
    reply = http("GET", writer.url + "/v1/models")
    assert reply.status == 200 and "via" not in reply.headers
