"""Exactly one active operator: leader election on a ``coordination.k8s.io/v1`` Lease.

client-go's ``leaderelection`` (what controller-runtime's managers use), with its defaults:
a lease of 15 s, renewed every 2 s, given up 10 s after the last successful renewal. A candidate
takes the Lease when it is free (no holder), held by itself, or has not changed for a whole
lease duration as *this candidate observed it*: like client-go, expiry is measured on the
candidate's own monotonic clock from when it last saw the record change, so clocks that differ
between nodes cannot make two leaders.

Why not kopf's peering: a kopf peer with a lower priority pauses when it sees a higher one, but
nothing makes the paused peer sure the other has stopped (no fencing, no renewal deadline), two
peers of equal priority both run, and it needs a cluster-wide CRD of its own. Here a leader
whose renewals fail stops the whole process (:func:`watchdog`) ``renew_deadline`` (10 s) after
its last renewal, before any standby can take the Lease (15 s after it last changed), and a
standby runs no handler at all: it does not even start kopf. A leader that stops cleanly
releases the Lease (client-go's ``ReleaseOnCancel``), so a rolling update hands over within one
retry period.

The API calls are synchronous (``http.client``, one kept-alive connection) on threads of their
own, apart from kopf's event loop: a loop blocked by a long handler cannot delay a renewal into a
lost lease, and a loop that hangs stops the renewals (:class:`Heartbeat`), so a hung leader
gives its place up.

A renewal waits for its answer until the renew deadline, not one retry period (client-go bounds
its renewals by the deadline, and kube-controller-manager's Lease client times out at it): an
API server under load that answers in 3 s keeps its leader, where a 2 s timeout made every
renewal fail and the leader exit although each one would have been answered. A call still never
outlives the deadline, so a leader that cannot renew stops before a standby may take over.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from payloadrun_operator.api.kinds import LEASE

log = logging.getLogger("payloadrun.election")
LEASES = f"/apis/{LEASE.api_version}/namespaces/{{namespace}}/{LEASE.plural}"


@dataclass(frozen=True)
class Timing:
    """client-go's defaults (``LeaseDuration``, ``RenewDeadline``, ``RetryPeriod``)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"leader election needs retry period < renew deadline < lease duration, got "
                f"{self.retry_period} s, {self.renew_deadline} s and {self.lease_duration} s: "
                "a leader must give up before a standby may take over"
            )


def micro_time(moment: datetime) -> str:
    """metav1.MicroTime: RFC 3339 with microseconds, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def free_for(
    spec: dict[str, Any], identity: str, unchanged_for: float, lease_duration: float
) -> bool:
    """Whether ``identity`` may write the Lease: it holds it, nobody does, or the holder has not
    renewed for a whole lease duration (``unchanged_for``: seconds since this candidate saw the
    record change)."""
    holder = spec.get("holderIdentity") or ""
    if holder in ("", identity):
        return True
    duration = float(spec.get("leaseDurationSeconds") or lease_duration)
    return unchanged_for >= duration


def claimed_spec(
    spec: dict[str, Any], identity: str, now: datetime, lease_duration: float
) -> dict[str, Any]:
    """The Lease's spec with ``identity`` holding it, renewed at ``now``."""
    taking_over = (spec.get("holderIdentity") or "") != identity
    claimed = {
        **spec,
        "holderIdentity": identity,
        "leaseDurationSeconds": int(lease_duration),
        "renewTime": micro_time(now),
    }
    if taking_over:
        claimed["acquireTime"] = micro_time(now)
        # client-go counts every change of holder, a released Lease's included; not a creation
        claimed["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if spec else 0)
    return claimed


def released_spec(spec: dict[str, Any], now: datetime) -> dict[str, Any]:
    """client-go's release: no holder and a 1 s lease, so a standby takes it at its next try."""
    return {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time(now)}


class LeaseApi:
    """GET, POST and PUT of one Lease, with the operator's credentials (a kopf ConnectionInfo,
    asked for again on 401: exec credential plugins issue short-lived tokens), over one kept-alive
    connection: a renewal every retry period would otherwise cost the API server a TLS handshake
    each time."""

    def __init__(self, login: Callable[[], Any], namespace: str, name: str) -> None:
        self._login = login
        self.namespace = namespace
        self.name = name
        self._info: Any = None
        self._connection: http.client.HTTPConnection | None = None
        self._prefix = ""  # the server URL's path, if it has one (a proxy's)
        # one call at a time on the connection: the renewals' thread, and a release at exit
        self._lock = threading.Lock()

    def _connect(self) -> http.client.HTTPConnection:
        if self._info is None:
            self._info = self._login()
            if self._info is None:
                raise ApiUnreachable(
                    "no credentials: run in a pod with a service account, or set KUBECONFIG"
                )
        if self._connection is None:
            url = urllib.parse.urlsplit(self._info.server)
            self._prefix = url.path.rstrip("/")
            if url.scheme == "http":
                self._connection = http.client.HTTPConnection(url.hostname or "", url.port)
            else:
                self._connection = http.client.HTTPSConnection(
                    url.hostname or "",
                    url.port,
                    context=self._info.as_ssl_context(),
                )
        return self._connection

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _exchange(
        self, method: str, path: str, data: bytes | None, timeout: float
    ) -> tuple[int, bytes]:
        """One request and its whole answer (read, so the connection can carry the next), each
        wait on the socket at most ``timeout`` seconds. A kept-alive connection the server closed
        meanwhile is found when it is used: the request is sent once more on a new one: a PUT
        carries the Lease's resourceVersion and a POST its name, so one that had arrived after
        all is answered 409, read as "changed meanwhile"."""
        for last in (False, True):
            connection = self._connect()
            reused = connection.sock is not None
            connection.timeout = timeout  # a new connection's connect and reads
            if reused:
                connection.sock.settimeout(timeout)
            try:
                connection.request(
                    method,
                    self._prefix + path,
                    body=data,
                    headers={**self._info.as_http_headers(), "Content-Type": "application/json"},
                )
                response = connection.getresponse()
                return response.status, response.read()
            except (ConnectionResetError, BrokenPipeError, http.client.BadStatusLine) as exc:
                self._disconnect()
                if last or not reused:
                    raise ApiUnreachable(self._unreachable(exc)) from exc
            except (OSError, http.client.HTTPException) as exc:  # a timeout, a refused connection
                self._disconnect()
                raise ApiUnreachable(self._unreachable(exc)) from exc
        raise AssertionError("unreachable")

    def _unreachable(self, exc: BaseException) -> str:
        return (
            f"cannot reach the API server at {self._info.server}: {str(exc) or type(exc).__name__}"
        )

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float
    ) -> tuple[int, dict[str, Any]]:
        data = None if body is None else json.dumps(body).encode()
        # a release at exit does not wait out a renewal's whole deadline for its turn
        if not self._lock.acquire(timeout=timeout):
            raise ApiUnreachable("the Lease's connection is busy with another call")
        try:
            status, raw = self._exchange(method, path, data, timeout)
            if status == 401:  # log in again once: the token may have expired
                self._info = None
                self._disconnect()
                status, raw = self._exchange(method, path, data, timeout)
        finally:
            self._lock.release()
        try:
            payload = json.loads(raw or b"{}")
        except ValueError:
            if status < 400:
                raise
            payload = {}
        return status, payload if isinstance(payload, dict) else {}

    @property
    def _path(self) -> str:
        return LEASES.format(namespace=self.namespace) + f"/{self.name}"

    def get(self, timeout: float) -> dict[str, Any] | None:
        status, lease = self._call("GET", self._path, None, timeout)
        if status == 404:
            return None
        if status != 200:
            raise LeaseError(f"reading Lease {self.namespace}/{self.name}", status, lease)
        return lease

    def create(self, spec: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """The new Lease, or None when another candidate created it first."""
        body = {
            **LEASE.type_meta,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        status, lease = self._call("POST", LEASES.format(namespace=self.namespace), body, timeout)
        if status == 409:
            return None
        if status != 201:
            raise LeaseError(f"creating Lease {self.namespace}/{self.name}", status, lease)
        return lease

    def update(
        self, lease: dict[str, Any], spec: dict[str, Any], timeout: float
    ) -> dict[str, Any] | None:
        """The updated Lease, or None when it changed since ``lease`` was read (409)."""
        body = {**lease, "spec": spec}
        status, updated = self._call("PUT", self._path, body, timeout)
        if status == 409:
            return None
        if status != 200:
            raise LeaseError(f"updating Lease {self.namespace}/{self.name}", status, updated)
        return updated


class ApiUnreachable(OSError):
    """No answer from the API server, or no credentials to ask it with."""


class LeaseError(RuntimeError):
    def __init__(self, what: str, status: int, body: dict[str, Any]) -> None:
        hint = ""
        if status == 403:
            hint = " (the operator's Role must allow get, create and update on leases)"
        super().__init__(f"{what}: HTTP {status}: {body.get('message', body)}{hint}")
        self.status = status


class Heartbeat:
    """Beaten by the operator's event loop; renewals stop when it goes stale (a hung loop)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: float | None = None

    def beat(self) -> None:
        self._last = self._clock()

    def stale(self, limit: float) -> bool:
        return self._last is not None and self._clock() - self._last > limit

    async def beat_forever(self, every: float = 1.0) -> None:
        while True:
            self.beat()
            await asyncio.sleep(every)


class Elector:
    """One candidate. :meth:`acquire` blocks until it leads; :meth:`keep` renews until told to
    stop or until the lease is lost, which it reports through ``on_lost``."""

    def __init__(
        self,
        api: LeaseApi,
        identity: str,
        timing: Timing = Timing(),
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.identity = identity
        self.timing = timing
        self._clock = clock
        self._wall = wall
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._written: dict[str, Any] | None = None  # the Lease as this candidate last wrote it
        self._observed_at = 0.0
        self.renewed_at: float | None = None
        self.leading = False
        self.error: str | None = None  # why the last attempt failed to reach a decision

    def _observe(self, spec: dict[str, Any]) -> float:
        """Seconds since the record last changed, as this candidate saw it."""
        record = (spec.get("holderIdentity") or "", spec.get("renewTime") or "")
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        return now - self._observed_at

    def try_once(self, deadline: float | None = None) -> bool:
        """One attempt to take or renew the Lease; True if this candidate now holds it. Its
        calls wait for their answers until ``deadline`` (on this candidate's clock; by default a
        renew deadline from now) and no longer.

        A leader whose lease is still valid renews the Lease as it last wrote it, without
        reading it first (client-go's fast path): one request a retry period. If the Lease
        changed since (409), it reads it and decides as any candidate does.
        """
        if deadline is None:
            deadline = self._clock() + self.timing.renew_deadline
        if self._renewable():
            assert self._written is not None
            spec = self._written.get("spec") or {}
            renewed = self.api.update(
                self._written,
                claimed_spec(spec, self.identity, self._wall(), self.timing.lease_duration),
                self._left(deadline),
            )
            if renewed is not None:
                return self._held(renewed)
        lease = self.api.get(self._left(deadline))
        now = self._wall()
        if lease is None:
            created = self.api.create(
                claimed_spec({}, self.identity, now, self.timing.lease_duration),
                self._left(deadline),
            )
            return self._held(created)
        spec = lease.get("spec") or {}
        if not free_for(spec, self.identity, self._observe(spec), self.timing.lease_duration):
            self.leading = False
            return False
        updated = self.api.update(
            lease,
            claimed_spec(spec, self.identity, now, self.timing.lease_duration),
            self._left(deadline),
        )
        return self._held(updated)

    def _left(self, deadline: float) -> float:
        """Seconds a call may wait for its answer: until ``deadline``, which has not passed."""
        left = deadline - self._clock()
        if left <= 0:
            raise ApiUnreachable("no answer from the API server before the renew deadline")
        return left

    def _renewable(self) -> bool:
        """Leading, with the Lease written less than a lease duration ago."""
        return (
            self.leading
            and self._written is not None
            and self.renewed_at is not None
            and self._clock() - self.renewed_at < self.timing.lease_duration
        )

    def _held(self, lease: dict[str, Any] | None) -> bool:
        if lease is None:  # another candidate wrote first
            return False
        self._written = lease
        self._observe(lease.get("spec") or {})
        self.renewed_at = self._clock()
        self.leading = True
        return True

    def _attempt(self, deadline: float | None = None) -> bool:
        """:meth:`try_once`, with its failure logged once per distinct error (a standby that
        cannot reach the API server says so once, not every retry period)."""
        try:
            held = self.try_once(deadline)
        except (OSError, LeaseError, ValueError) as exc:
            if str(exc) != self.error:
                log.warning(
                    "leader election: %s; retrying every %g s", exc, self.timing.retry_period
                )
            self.error = str(exc)
            return False
        if self.error is not None:
            log.info("leader election: the Lease answers again")
            self.error = None
        return held

    def acquire(self, stop: threading.Event) -> bool:
        """Try every retry period until this candidate leads (True) or ``stop`` is set."""
        holder = None
        while not stop.is_set():
            if self._attempt():
                log.info(
                    "leading: holding Lease %s/%s as %s",
                    self.api.namespace,
                    self.api.name,
                    self.identity,
                )
                return True
            current = (self._observed or ("", ""))[0]
            if self.error is None and current != holder:
                holder = current
                log.info(
                    "standby: Lease %s/%s is held by %s; retrying every %g s",
                    self.api.namespace,
                    self.api.name,
                    holder or "nobody",
                    self.timing.retry_period,
                )
            stop.wait(self.timing.retry_period)
        return False

    def keep(
        self, stop: threading.Event, heartbeat: Heartbeat, on_lost: Callable[[str], None]
    ) -> None:
        """Renew every retry period until ``stop``; ``on_lost(why)`` when another candidate holds
        the Lease or ``renew_deadline`` passed since the last renewal. A renewal waits for its
        answer until that deadline, and not past it."""
        while not stop.wait(self.timing.retry_period):
            assert self.renewed_at is not None
            if heartbeat.stale(self.timing.renew_deadline / 2):
                why = "the operator's event loop has not run for a while"
            elif self._attempt(self.renewed_at + self.timing.renew_deadline):
                continue
            elif not self.leading:
                holder = self._observed[0] if self._observed else "another candidate"
                on_lost(f"Lease {self.api.namespace}/{self.api.name} is held by {holder}")
                return
            else:
                why = "the Lease could not be renewed"
            if self._clock() - self.renewed_at >= self.timing.renew_deadline:
                on_lost(f"{why} for {self.timing.renew_deadline:g} s")
                return

    def release(self) -> None:
        """Give the Lease up (a clean stop), if this candidate still holds it."""
        deadline = self._clock() + self.timing.retry_period  # a stop is not held up longer
        try:
            lease = self.api.get(self._left(deadline))
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            self.api.update(lease, released_spec(lease["spec"], self._wall()), self._left(deadline))
            log.info("released Lease %s/%s", self.api.namespace, self.api.name)
        except (OSError, LeaseError, ValueError) as exc:
            log.warning("could not release the Lease (a standby takes it once it expires): %s", exc)
        finally:
            self.leading = False
