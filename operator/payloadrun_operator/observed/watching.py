"""The children's watches, as client-go's reflector keeps an informer's: a list, then a watch from
the list's resourceVersion, continued from the last version seen whenever the API server ends it,
and a list again when that version is too old (410 Gone).

The runs are kopf's (its handlers reconcile them); their children are followed here, not through
kopf's ``on.event`` handlers, as controller-runtime's ``Owns()`` follows them with a bare
informer beside the reconcile's machinery: kopf gives each object it watches a worker, a memory,
three loggers, a throttle and a handler call per event, for four children a run that only feed a
cache (a memory each for the four thousand children of 1,000 runs; bench/operator.py, with the
client's orjson and protobuf answers: the operator's CPU a run in a burst of 50 from 20-24 ms
to 13-15, its RSS after 101 runs from 100 to 84 MB). Each watch asks for the operator's
children only (the managed-by label), and an event goes to
:meth:`following.Follower.observe_child`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp

from payloadrun_operator.api.kinds import Kind
from payloadrun_operator.api.names import MANAGED_SELECTOR
from payloadrun_operator.platform.kube import KubeApiError, KubeClient

log = logging.getLogger("payloadrun.watching")
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0)  # between failed attempts, the last one repeated
GONE = 410  # the version a watch asked for is no longer in the API server's window


def backoff(failures: int) -> float:
    """The wait after ``failures`` failed attempts in a row (1 or more): :data:`BACKOFF_SECONDS`."""
    return BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1]


class Step(StrEnum):
    """What a watch event asks of the reflector."""

    DELIVER = "deliver"  # an object's change: to the cache, then on from its version
    ADVANCE = "advance"  # a bookmark: nothing changed up to its version
    RELIST = "relist"  # 410 Gone: the version is too old to watch from
    RECONNECT = "reconnect"  # another error the server ended the watch with: again, later


def step_of(event: Mapping[str, Any]) -> Step:
    """The reflector's step for one event of a watch stream."""
    kind = event.get("type")
    if kind == "BOOKMARK":
        return Step.ADVANCE
    if kind == "ERROR":
        status = event.get("object") or {}
        return Step.RELIST if status.get("code") == GONE else Step.RECONNECT
    return Step.DELIVER


def version_of(event: Mapping[str, Any]) -> str:
    obj = event.get("object") or {}
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclass(frozen=True)
class WatchSettings:
    """From the operator's settings (``PAYLOADRUN_WATCH_*``)."""

    server_timeout: int  # the API server ends each watch after this long
    inactivity_timeout: float  # nothing at all (bookmarks included) this long: reconnect


Listed = Callable[[Kind, str | None, list[dict[str, Any]]], None]
Observed = Callable[[Kind, Mapping[str, Any]], None]


class Reflector:
    """One kind's children in one scope (a namespace, or None: every namespace), listed and
    watched for as long as :meth:`run` runs."""

    def __init__(
        self,
        client: KubeClient,
        kind: Kind,
        scope: str | None,
        settings: WatchSettings,
        *,
        listed: Listed,
        observed: Observed,
    ) -> None:
        self.client, self.kind, self.scope, self.settings = client, kind, scope, settings
        self._listed, self._observed = listed, observed
        self.version = ""  # the last version seen; "" until listed
        self.lists = 0  # lists made (the first, then one per 410 Gone)

    @property
    def where(self) -> str:
        return f"{self.kind.kind} in {self.scope or 'every namespace'}"

    async def list(self) -> None:
        """List the kind's children into the cache; the watch goes on from the list's version."""
        items, self.version = await self.client.list_collection(
            self.kind.api_version, self.kind.kind, self.scope, MANAGED_SELECTOR
        )
        self.lists += 1
        self._listed(self.kind, self.scope, items)

    async def run(self) -> None:
        """Watch from :attr:`version` (:meth:`list` first when there is none) until cancelled."""
        failures = 0
        while True:
            try:
                if not self.version:
                    await self.list()
                ended = await self._watch()
                failures = failures + 1 if ended is Step.RECONNECT else 0
            except KubeApiError as exc:
                if exc.status == GONE:
                    log.info("%s: %s; listing again", self.where, exc)
                    self.version = ""
                    continue
                failures += 1
                log.warning("%s: the watch was refused (retrying): %s", self.where, exc)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                failures += 1
                log.warning("%s: the watch failed (retrying): %r", self.where, exc)
            if failures:
                await asyncio.sleep(backoff(failures))

    async def _watch(self) -> Step | None:
        """One watch, until the server ends it: after its timeout (None), asking for a list
        (:attr:`Step.RELIST`) or with another error (:attr:`Step.RECONNECT`)."""
        async for event in self.client.watch(
            self.kind.api_version,
            self.kind.kind,
            self.scope,
            resource_version=self.version,
            label_selector=MANAGED_SELECTOR,
            timeout_seconds=self.settings.server_timeout,
            inactivity_seconds=self.settings.inactivity_timeout,
        ):
            step = step_of(event)
            if step is Step.RELIST:
                log.info("%s: the watch's version is too old; listing again", self.where)
                self.version = ""
                return step
            if step is Step.RECONNECT:
                log.warning("%s: the watch ended with %s", self.where, event.get("object"))
                return step
            if step is Step.DELIVER:
                self._observed(self.kind, event)
            self.version = version_of(event) or self.version
        return None
