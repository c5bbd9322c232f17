"""The local vLLM API servers one writer fronts, and which of them takes each request.

A pod may run several vLLM API servers, one per data-parallel rank on consecutive ports (prime-rl's
multi-node layout, issue 36); one writer fronts all of them (``--upstream`` lists their base URLs,
comma-separated). kube-proxy balances per connection, and a client's keep-alive pool keeps the
connections it opened, so the writer spreads per request: each request goes to the upstream with
the fewest requests in flight, ties broken round robin (:func:`pick`). A request stays with its
upstream to the end of its answer, streamed or not.

A request that names its session (the ``X-Session-ID`` header, :data:`SESSION_HEADER`: verifiers
sends it with every turn of a rollout, and prime-rl's router hashes it to pick an engine) goes to
its session's upstream instead, whatever the counts: the turns of a multi-turn rollout re-send the
conversation so far, and only the engine that served the previous turn holds it in its prefix
cache. The session's upstream is the first of :func:`session_order` (rendezvous hashing of the
session over the upstreams' URLs) that is up, so a session moves only when its upstream is down,
and only its own sessions move: they come back as soon as it is up again.

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

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

# Seconds an upstream that failed to connect is passed over while another is up.
DOWN_SECONDS = 2.0

# The request header that names a multi-turn rollout's session (verifiers' SESSION_ID_HEADER,
# the header prime-rl's router hashes with its consistent_hash policy).
SESSION_HEADER = "X-Session-ID"


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


def session_order(session: str, urls: Sequence[str]) -> list[int]:
    """The upstreams' indices in ``session``'s order of preference (rendezvous hashing: each
    upstream's weight is a hash of the session and its URL, the heaviest first). Stable across
    processes and restarts; removing an upstream moves only the sessions it was first for."""
    weights = [
        hashlib.blake2b(f"{session}\n{url}".encode(), digest_size=8).digest() for url in urls
    ]
    return sorted(range(len(urls)), key=lambda i: weights[i], reverse=True)


def pick_for_session(
    order: Sequence[int], down: Sequence[bool], skip: Collection[int] = ()
) -> int | None:
    """A session's upstream: the first of ``order`` (:func:`session_order`) that is up and not in
    ``skip``; when every one left is down, the first of those; None when every one is skipped."""
    left = [i for i in order if i not in skip]
    return next((i for i in left if not down[i]), left[0] if left else None)


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
        self.urls = tuple(urls)
        self._next = 0

    def take(
        self, now: float, tried: Collection[Upstream] = (), session: str | None = None
    ) -> Upstream | None:
        """The upstream for a request (its in-flight count taken), or None when it has tried
        every one: its ``session``'s when it names one, else the least busy.
        :meth:`release` gives the count back when the request ends."""
        ups = self.all
        if len(ups) == 1:  # one upstream: nothing to decide
            chosen: Upstream | None = None if tried else ups[0]
        else:
            skip = [i for i, up in enumerate(ups) if up in tried] if tried else ()
            down = [up.is_down(now) for up in ups]
            if session:
                index = pick_for_session(session_order(session, self.urls), down, skip)
            else:
                index = pick([up.in_flight for up in ups], down, self._next, skip)
                if index is not None:
                    self._next = (index + 1) % len(ups)
            chosen = None if index is None else ups[index]
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
