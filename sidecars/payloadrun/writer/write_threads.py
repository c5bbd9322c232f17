"""The threads that touch the payload volume for requests, apart from the request pool.

A write on a hung mount blocks its thread in the kernel until the mount lets go (forever, on an
NFS ``hard`` mount whose server is gone); it cannot be cancelled. So volume calls run here, never
on the pool that parses bodies and sends inline answers, and:

- the threads are **daemon** threads: a process asked to stop does not wait for a write that
  will never return (``concurrent.futures`` joins its workers at exit);
- there are at most ``cap`` of them; a call waits for a free one (its deadline counts from the
  moment it was submitted, the wait included) and one that has not started by its deadline is
  cancelled, so it never starts;
- :class:`HeldThreads` counts the calls still running past their deadline, the threads a hang
  holds. The server sends requests inline (``write_threads_full``) while all ``cap`` are held.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any

log = logging.getLogger("payloadrun.writer")


class WriteThreads:
    """At most ``cap`` daemon threads, started as calls need them, that run submitted calls."""

    def __init__(self, cap: int, name: str = "payloadrun-writer-volume") -> None:
        self.cap = cap
        self._name = name
        self._queue: SimpleQueue[tuple[Future, Callable[[], Any]] | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._queue.put((future, lambda: fn(*args)))
        with self._lock:
            if self._idle <= 0 and self._threads < self.cap:
                self._threads += 1
                threading.Thread(
                    target=self._work, name=f"{self._name}-{self._threads}", daemon=True
                ).start()
            else:
                # an idle thread takes it, or it waits for one (then negative: calls queued)
                self._idle -= 1
        return future

    def shutdown(self) -> None:
        """Let idle threads end; a thread blocked in the kernel ends when it returns."""
        with self._lock:
            threads = self._threads
        for _ in range(threads):
            self._queue.put(None)

    def _work(self) -> None:
        while self._run_next():
            with self._lock:
                self._idle += 1

    def _run_next(self) -> bool:
        """Take one call off the queue and run it; False when told to end.

        The call (and through it its arguments: a by-handle answer's body and decoded arrays,
        tens of MB) is let go of before its future is resolved, and nothing of it is left in a
        local while the thread waits for the next one. The in-flight budget is given back once
        the answer is sent; a thread still holding the last answer it wrote while it idles would
        keep that memory beyond the budget, one answer per idle thread (``--write-threads``).
        """
        item = self._queue.get()
        if item is None:
            return False
        future, call = item
        del item
        if not future.set_running_or_notify_cancel():
            return True
        try:
            result = call()
        except BaseException as exc:
            del call
            future.set_exception(exc)
        else:
            del call
            future.set_result(result)
        return True


class HeldThreads:
    """The calls still running after their deadline passed: the threads a hang holds.

    ``on_change(held)`` is called with the new count each time it moves (from the loop when a
    call is given up on, from the call's own thread when it returns).
    """

    def __init__(self, on_change: Callable[[int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self._on_change = on_change

    @property
    def held(self) -> int:
        return self._held

    def hold(self, future: Future, when_returned: Callable[[Future], None]) -> None:
        """Count ``future`` as held until it finishes; then ``when_returned(future)`` runs (on
        the thread that ran it) before the count drops, so a removal it does is done first."""
        self._move(+1)

        def returned(done: Future) -> None:
            try:
                when_returned(done)
            except Exception:
                log.exception("handling a late volume call failed")
            finally:
                self._move(-1)

        future.add_done_callback(returned)

    def _move(self, delta: int) -> None:
        with self._lock:
            self._held += delta
            held = self._held
        if self._on_change is not None:
            self._on_change(held)
