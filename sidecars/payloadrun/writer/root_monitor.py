"""The payload root's health, watched in the background and never on a request's path.

Why not in ``/readyz``: a native sidecar's readiness counts toward its pod's, so a readiness that
follows the volume takes every inference pod out of its Service exactly when the inline fallback
would have answered (issue 33). The writer is ready when it can serve; the volume's health is
information: a metric, one log line per change, an alert, and a field in ``/readyz``'s body.

Why a thread of its own with a deadline: a probe on a hung mount (NFS ``hard``, GlusterFS within
``network.ping-timeout``) blocks in a system call that nothing can cancel. The monitor starts each
probe on a daemon thread and waits for it at most ``deadline`` seconds; a probe that has not
returned by then makes the root "not writable (hung)", and no second probe starts until it
returns, so a hang holds one thread, whatever its length.

:func:`next_health` and :func:`change_line` are the pure part (what the state becomes, what the
log says); :class:`RootMonitor` is the I/O around them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("payloadrun.writer")

# The outcome of one probe: None when a file could be created and deleted, else what failed.
Probe = Callable[[], str | None]


@dataclass(frozen=True, slots=True)
class RootHealth:
    """What the monitor knows about the payload root.

    ``writable`` is None before the first probe has answered or timed out; ``problem`` says
    what failed (None when writable); ``last_ok`` is the wall-clock time of the last good probe
    (None when there was none).
    """

    writable: bool | None = None
    problem: str | None = None
    last_ok: float | None = None

    def describe(self) -> str:
        """``/readyz``'s ``payload_root`` field: "ok", or what failed, or not probed yet."""
        if self.writable is None:
            return "not probed yet"
        return "ok" if self.writable else f"not writable: {self.problem}"


def next_health(previous: RootHealth, problem: str | None, now: float) -> RootHealth:
    """The health after one probe (``problem``: None for a good probe) finished at ``now``."""
    if problem is None:
        return RootHealth(True, None, now)
    return RootHealth(False, problem, previous.last_ok)


def change_line(previous: RootHealth, current: RootHealth) -> str | None:
    """The one log line for a change of writability, None when it did not change.

    A different problem while still not writable is not a change (no line per probe during an
    outage); the first probe's result is logged only when the root is not writable.
    """
    if previous.writable == current.writable:
        return None
    if current.writable:
        return "payload root is writable again" if previous.writable is False else None
    return f"payload root is not writable, payloads go inline until it is: {current.problem}"


def hung_problem(elapsed: float, deadline: float) -> str:
    return (
        f"a probe file could not be created and deleted within {deadline:g} s (still blocked "
        f"after {elapsed:.1f} s): the mount hangs; check the volume's server"
    )


class RootMonitor:
    """Probes the payload root every ``interval`` seconds on its own threads.

    ``on_probe(health)`` is called on the monitor's thread after every probe (answered or timed
    out), with the health it left: the metrics follow it.
    """

    def __init__(
        self,
        probe: Probe,
        *,
        interval: float,
        deadline: float,
        on_probe: Callable[[RootHealth], None] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._probe = probe
        self.interval = interval
        self.deadline = deadline
        self._on_probe = on_probe
        self._wall = wall
        self.health = RootHealth()
        self._stop = threading.Event()
        self._probed = threading.Event()  # set once the first probe answered or timed out
        self._outstanding: tuple[threading.Event, list[str | None], float] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name="payloadrun-writer-root-monitor", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop probing; a probe still blocked in the kernel is left to its daemon thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.deadline + 1.0)

    def wait_first(self, timeout: float) -> bool:
        """Block until the first probe has answered or timed out (True), at most ``timeout`` s."""
        return self._probed.wait(timeout)

    def wait_outstanding(self, timeout: float) -> bool:
        """Block until a probe still blocked past its deadline has returned (True at once when
        none is outstanding), at most ``timeout`` s."""
        outstanding = self._outstanding
        return outstanding is None or outstanding[0].wait(timeout)

    def _loop(self) -> None:
        while True:
            self.check_once()
            if self._stop.wait(self.interval):
                return

    def check_once(self) -> RootHealth:
        """Start a probe unless one is still blocked, wait for it up to its deadline, record it."""
        if self._outstanding is None:
            done, slot = threading.Event(), [None]
            self._outstanding = (done, slot, time.monotonic())
            threading.Thread(
                target=_run_probe,
                args=(self._probe, slot, done),
                name="payloadrun-writer-root-probe",
                daemon=True,
            ).start()
        done, slot, started = self._outstanding
        left = started + self.deadline - time.monotonic()
        if done.wait(max(0.0, left)):
            self._outstanding = None
            problem = slot[0]
        else:
            problem = hung_problem(time.monotonic() - started, self.deadline)
        return self._record(problem)

    def _record(self, problem: str | None) -> RootHealth:
        previous = self.health
        self.health = current = next_health(previous, problem, self._wall())
        self._probed.set()
        line = change_line(previous, current)
        if line is not None:
            (log.info if current.writable else log.warning)("%s", line)
        if self._on_probe is not None:
            self._on_probe(current)
        return current


def _run_probe(probe: Probe, slot: list[str | None], done: threading.Event) -> None:
    try:
        slot[0] = probe()
    except Exception as exc:  # a probe that raises is a root that cannot take a file
        slot[0] = f"the probe failed: {type(exc).__name__}: {exc}"
    finally:
        done.set()
