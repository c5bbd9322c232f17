"""The local vLLM API servers one writer fronts, and which of them takes each request.

A pod may run several vLLM API servers, one per data-parallel rank on consecutive ports (prime-rl's
multi-node layout, issue 36); one writer fronts all of them (``--upstream`` lists their base URLs,
comma-separated). kube-proxy balances per connection, and a client's keep-alive pool keeps the
connections it opened, so the writer spreads per request: each request goes to the upstream with
the fewest requests in flight, ties broken round robin (:func:`pick`). A request stays with its
upstream to the end of its answer, streamed or not.

An upstream that refused a connection (or did not accept one within ``--connect-timeout``) is
*down* for :data:`DOWN_SECONDS`: :func:`pick` passes it over while another is up, and the request
that met the failure goes on to an upstream it has not tried (nothing reached vLLM, so sending it
again cannot run a generation twice). An answer from it, or its ``/health`` answering in a
readiness check, puts it back up at once.

:func:`parse_upstreams` and :func:`pick` are pure; :class:`Upstreams` holds the counts (one event
loop touches them, so no lock). No aiohttp here: the operator imports the writer's config, which
imports this module.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

# Seconds an upstream that failed to connect is passed over while another is up.
DOWN_SECONDS = 2.0


def parse_upstreams(value: str) -> tuple[str, ...]:
    """The base URLs of a comma-separated ``--upstream`` (one URL: one upstream), each without
    its trailing ``/``; an error naming the URL that is not ``http(s)://HOST[:PORT][/PATH]``."""
    parts = [part.strip() for part in value.split(",")]
    if not any(parts):
        raise ValueError(
            "no upstream: give vLLM's base URL, or several comma-separated "
            "(http://127.0.0.1:8000,http://127.0.0.1:8001)"
        )
    urls: list[str] = []
    for index, part in enumerate(parts):
        if not part:
            raise ValueError(
                f"upstream list {value!r} has an empty entry (number {index + 1}): separate "
                "base URLs with single commas"
            )
        urls.append(_checked_url(part))
    seen: set[str] = set()
    for url in urls:
        if url in seen:
            raise ValueError(
                f"upstream {url} is listed twice in {value!r}: it would take twice its share"
            )
        seen.add(url)
    return tuple(urls)


def _checked_url(raw: str) -> str:
    problem = None
    try:
        parts = urlsplit(raw)
        port = parts.port  # raises on a port that is not a number in range
    except ValueError as exc:
        parts, port, problem = None, None, str(exc)
    if parts is not None and problem is None:
        if parts.scheme not in ("http", "https"):
            problem = "its scheme must be http or https"
        elif not parts.hostname:
            problem = "it has no host"
        elif parts.query or parts.fragment:
            problem = "a base URL has no query or fragment"
        elif port == 0:
            problem = "port 0 is no port"
    if problem is not None:
        raise ValueError(
            f"upstream {raw!r} is not a base URL ({problem}): write "
            "http://HOST:PORT, for example http://127.0.0.1:8000"
        )
    return raw.rstrip("/")


def pick(
    in_flight: Sequence[int], down: Sequence[bool], start: int, skip: Collection[int] = ()
) -> int | None:
    """The index of the upstream a request goes to, or None when every one is in ``skip``.

    Up before down (a down upstream only when every other not skipped is down too), then the
    fewest requests in flight; among equals, the first at or after ``start``, counting round the
    end (the caller passes one past its last pick, so sequential requests take turns).
    """
    best: int | None = None
    count = len(in_flight)
    for step in range(count):
        i = (start + step) % count
        if i in skip:
            continue
        if best is None or (down[i], in_flight[i]) < (down[best], in_flight[best]):
            best = i
    return best


@dataclass(eq=False)
class Upstream:
    """One local API server: its base URL (as configured, without a trailing ``/``: also the
    metrics' label), the requests sent to it that have not ended, and until when it is down
    (monotonic seconds)."""

    url: str
    in_flight: int = 0
    down_until: float = 0.0

    def is_down(self, now: float) -> bool:
        return self.down_until > now


class Upstreams:
    """The upstreams of one writer and the state :func:`pick` decides on."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.all = tuple(Upstream(url) for url in urls)
        self._next = 0

    def take(self, now: float, tried: Collection[Upstream] = ()) -> Upstream | None:
        """The upstream for a request (its in-flight count taken), or None when it has tried
        every one. :meth:`release` gives the count back when the request ends."""
        ups = self.all
        if len(ups) == 1:  # one upstream: nothing to decide
            chosen: Upstream | None = None if tried else ups[0]
        else:
            skip = [i for i, up in enumerate(ups) if up in tried] if tried else ()
            index = pick(
                [up.in_flight for up in ups], [up.is_down(now) for up in ups], self._next, skip
            )
            chosen = None if index is None else ups[index]
            if index is not None:
                self._next = (index + 1) % len(ups)
        if chosen is not None:
            chosen.in_flight += 1
        return chosen

    @staticmethod
    def release(upstream: Upstream) -> None:
        upstream.in_flight -= 1

    @staticmethod
    def connect_failed(upstream: Upstream, now: float) -> None:
        upstream.down_until = now + DOWN_SECONDS

    @staticmethod
    def answered(upstream: Upstream) -> None:
        upstream.down_until = 0.0
