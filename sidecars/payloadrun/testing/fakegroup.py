"""The fake vLLM's multi-node group: a leader that is not ready until its workers have joined.

vLLM spread over several pods (a LeaderWorkerSet group: data parallelism with its DP coordinator
on the leader, or tensor/pipeline parallelism with ``--nnodes``) serves only once every rank has
reached the leader, and stops serving when one goes: the coordinator fails the engine. The fake
reproduces what the operator and its tests can see of that, over plain HTTP:

- index 0 is the **leader**: it serves, but its ``/health`` answers 503 until every worker
  (indices 1 to size - 1) has joined, and again as soon as one has missed its heartbeats;
- a **worker** joins its leader (``POST /fake/join`` on the leader's first API server, with its
  index and the group's size) and keeps doing so every heartbeat interval, retrying for as long
  as the leader does not answer. Its own API servers (every pod serving: llm-d's wide-EP layout)
  answer ``/health`` 200 only while the leader takes its heartbeats; with ``--no-http`` (only the
  leader serves) it serves nothing, and ``--joined-file`` is there while it is joined.

The leader counts a worker lost when no heartbeat came for ``timeout`` seconds (as vLLM's
coordinator misses a rank's), so a killed worker turns the leader unready within that time.
The variables LeaderWorkerSet's webhook injects (``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE``,
``LWS_WORKER_INDEX``) are the defaults of the flags. :func:`group_status` is the decision, pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

log = logging.getLogger("payloadrun.fakevllm")

JOIN_PATH = "/fake/join"
GROUP_PATH = "/fake/group"
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
GROUP_SIZE_ENV = "LWS_GROUP_SIZE"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"


@dataclass(frozen=True)
class GroupStatus:
    """What the leader knows of its workers: joined and heard from in time, never heard from,
    or heard from once and then silent too long (lost)."""

    size: int
    joined: tuple[int, ...]
    missing: tuple[int, ...]
    lost: tuple[int, ...]

    @property
    def ready(self) -> bool:
        return not self.missing and not self.lost

    def body(self) -> dict[str, Any]:
        expected = self.size - 1
        if self.ready:
            summary = f"all {expected} workers joined"
        else:
            summary = f"{len(self.joined)} of {expected} workers joined"
            if self.lost:
                summary += f"; lost (no heartbeat in time): {', '.join(map(str, self.lost))}"
        return {
            "ready": self.ready,
            "group_size": self.size,
            "joined": list(self.joined),
            "missing": list(self.missing),
            "lost": list(self.lost),
            "message": summary,
        }


def group_status(
    size: int, last_heard: Mapping[int, float], now: float, timeout: float
) -> GroupStatus:
    """The leader's view at ``now``: a worker is joined while its last heartbeat is at most
    ``timeout`` seconds old, lost once older, missing while never heard."""
    joined, missing, lost = [], [], []
    for index in range(1, size):
        heard = last_heard.get(index)
        if heard is None:
            missing.append(index)
        elif now - heard > timeout:
            lost.append(index)
        else:
            joined.append(index)
    return GroupStatus(size, tuple(joined), tuple(missing), tuple(lost))


def split_leader_address(value: str, default_port: int) -> tuple[str, int]:
    """``HOST`` (LeaderWorkerSet's variable: the leader pod's DNS name) or ``HOST:PORT``."""
    value = value.strip()
    if value.count(":") > 1 and not value.startswith("["):  # a bare IPv6 address, no port
        return value, default_port
    host, sep, port = value.rpartition(":")
    if not sep or "]" in port:  # no port, or a bare IPv6 address in brackets
        return value.strip("[]"), default_port
    if not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ValueError(
            f"leader address {value!r} is not HOST or HOST:PORT (for example "
            f"my-run-vllm-0.my-run-vllm or 10.0.0.5:{default_port})"
        )
    return host.strip("[]"), int(port)


@dataclass
class Group:
    """This process's place in its group, and (on the leader) what its workers said."""

    size: int = 1
    index: int = 0
    leader: tuple[str, int] | None = None  # workers: where the leader's first API server is
    interval: float = 1.0  # seconds between a worker's heartbeats
    timeout: float = 5.0  # seconds without one after which the leader counts a worker lost
    joined_file: Path | None = None
    last_heard: dict[int, float] = field(default_factory=dict)
    heartbeats: int = 0  # a worker's accepted heartbeats (tests wait on it)
    joined: bool = False  # a worker: its last heartbeat was accepted
    _lost_said: set[int] = field(default_factory=set)  # the leader logged these as lost

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"group size must be at least 1, got {self.size}")
        if not 0 <= self.index < self.size:
            raise ValueError(
                f"worker index {self.index} is outside the group of {self.size} (0 to "
                f"{self.size - 1}; 0 is the leader)"
            )
        if self.is_worker and self.leader is None:
            raise ValueError(
                f"worker {self.index} has no leader address: set --leader-address or "
                f"{LEADER_ADDRESS_ENV}"
            )

    @property
    def is_leader(self) -> bool:
        return self.index == 0 and self.size > 1

    @property
    def is_worker(self) -> bool:
        return self.index > 0

    def status(self) -> GroupStatus:
        return group_status(self.size, self.last_heard, time.monotonic(), self.timeout)

    def health(self) -> tuple[int, dict[str, Any] | None]:
        """The status and body of ``/health`` on this process's API servers: 200 with no body
        (vLLM's) alone or with the whole group; 503 with what is missing otherwise."""
        if self.is_leader:
            status = self.status()
            if set(status.lost) - self._lost_said:
                log.warning("leader: %s", status.body()["message"])
            self._lost_said = set(status.lost)
            return (200, None) if status.ready else (503, status.body())
        if self.is_worker and not self.joined:
            return 503, {"ready": False, "message": f"worker {self.index} has not joined yet"}
        return 200, None

    # --- the leader's routes ---

    async def join(self, request: web.Request) -> web.Response:
        """A worker's join or heartbeat: ``{"index": I, "group_size": G}``."""
        try:
            data = await request.json()
            index, size = int(data["index"]), int(data["group_size"])
        except (ValueError, KeyError, TypeError):
            return web.json_response(
                {"error": 'the body must be {"index": <int>, "group_size": <int>}'}, status=400
            )
        if not self.is_leader:
            return web.json_response(
                {"error": f"this is index {self.index} of a group of {self.size}, not a leader"},
                status=409,
            )
        if size != self.size or not 0 < index < self.size:
            return web.json_response(
                {
                    "error": f"worker {index} of a group of {size} cannot join a leader of a "
                    f"group of {self.size} (workers 1 to {self.size - 1})"
                },
                status=409,
            )
        first = index not in self.last_heard
        self.last_heard[index] = time.monotonic()
        if first:
            log.info("worker %d joined (%s)", index, self.status().body()["message"])
        return web.json_response(self.status().body())

    async def report(self, _request: web.Request) -> web.Response:
        body = self.status().body() if self.is_leader else {}
        body.update(index=self.index, group_size=self.size, heartbeats=self.heartbeats)
        body["worker_joined"] = self.joined
        return web.json_response(body)

    # --- a worker's side ---

    async def keep_joining(self) -> None:
        """Join the leader and send a heartbeat every interval, for as long as this runs."""
        assert self.leader is not None
        host, port = self.leader
        url = f"http://{host if ':' not in host else f'[{host}]'}:{port}{JOIN_PATH}"
        body = {"index": self.index, "group_size": self.size}
        timeout = aiohttp.ClientTimeout(total=max(self.interval, 1.0) * 2)
        said = ""
        # No DNS cache (aiohttp's keeps an answer 10 s): a recreated group's new leader has a new
        # address under the same name, and a worker must reach it, not its predecessor's, as
        # vLLM's workers resolve the head's name afresh when they start.
        connector = aiohttp.TCPConnector(use_dns_cache=False)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            while True:
                try:
                    async with session.post(url, json=body) as resp:
                        text = await resp.text()
                        ok = resp.status == 200
                        why = "" if ok else f"{url} answered {resp.status}: {text}"
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    ok, why = False, f"{url} did not answer: {exc}"
                if ok:
                    self.heartbeats += 1
                self._joined(ok)
                if why != said:
                    log.info("worker %d: %s", self.index, why or f"joined the leader at {url}")
                    said = why
                await asyncio.sleep(self.interval)

    def _joined(self, joined: bool) -> None:
        if joined == self.joined:
            return
        self.joined = joined
        if self.joined_file is None:
            return
        if joined:
            tmp = self.joined_file.with_name(self.joined_file.name + ".tmp")
            tmp.write_text(json.dumps({"index": self.index, "pid": os.getpid()}) + "\n")
            tmp.replace(self.joined_file)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.joined_file.unlink()
