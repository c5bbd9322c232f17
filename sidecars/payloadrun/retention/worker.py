"""The retention sidecar's deletion worker: a process of its own, at a lower CPU priority.

Deleting a step's files costs Python work per file (a loop iteration, a system call's wrapper, a
count). In the API's interpreter that work holds the interpreter lock the event loop needs, so
every API call made while a step's 15,000 files go waits for it: measured, a ``status`` p99 of
25 ms. Here the API's process only journals the event and sends the worker one message per chunk
of files (1,024 of one directory); the worker unlinks them on threads of its own, at most
:data:`UNLINKS_PER_DIRECTORY` at once in one directory, and answers with what it removed and
every failed attempt. The journal's guarantees do not change: an event is durable before its
answer, whatever the worker does, and a deletion the worker never finished is replayed.

The two sides speak JSON lines over the worker's stdin and stdout (stderr is the sidecar's)::

    -> {"id": 7, "op": "unlink", "dir": "v12", "names": ["a.bin", ...], "sizes": [4096, -1, ...],
        "ours": ["a.bin", ...]}
    <- {"id": 7, "ok": {"files": 2, "bytes": 8192, "failures": [[label, where, errno, ...]]}}
    -> {"id": 8, "op": "measure", "dir": "v13", "names": [...]}   <- {"id": 8, "ok": [4096, ...]}
    -> {"id": 9, "op": "tree", "dir": ".retention-trash"}         (the same answer as unlink)
    -> {"id": 10, "op": "scan"}                   <- {"id": 10, "ok": [files, bytes, dirs]}
    -> {"op": "stop"}                             (cut retries short; no answer)

An operation that raised answers ``{"id": n, "error": "..."}``. End of input stops the worker
after the operations running then. :class:`ProcessDeleter` is the sidecar's side: the same
methods as :class:`~payloadrun.retention.deleter.LocalDeleter`, each a round trip. A worker
that died (the OOM killer's SIGKILL, say) is started again at the next call, and every call ends:

- a call that finds its worker gone before the worker took it (its input pipe is broken: nothing
  reads it any more) goes to the new worker;
- a call the worker may have begun (sent, not answered, or answered with a line its death cut
  short: :attr:`ProcessDeleter.replies_cut_short`) is sent once more, to a new worker: every
  operation is idempotent, and an unlink sent again names its files in ``ours``, so that the
  ones the dead worker removed (gone now, their sizes known) are counted too;
- a call whose second worker dies as well fails with :class:`WorkerGoneError`, saying so; its
  files stay in the journal, and the deletion queue tries them again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import IO, Any

from payloadrun.reasons import DeleteError
from payloadrun.retention.deleter import Census, Failure, LocalDeleter, Outcome, Removed, Retry

log = logging.getLogger("payloadrun.retention")

# Below the API's process (nice 0): when both want the CPU, the API's calls go first.
WORKER_NICE = 10
# How long a worker may take to finish its running operations once asked to stop.
STOP_TIMEOUT_S = 10.0
# Chunks unlinked at once in one directory. Linux holds a directory's lock through each unlink in
# it (on NFS, through the server's answer too), so more threads in one directory only queue on
# that lock, and on a few cores spin on it: on 2 cores raw unlinks on 8 threads are 5-9% slower
# than on 2, and the sidecar went from 0.74-0.80 of raw's best to 0.82-0.87 with 2 lanes
# (bench/retention.py). The other threads serve other directories.
UNLINKS_PER_DIRECTORY = 2
# Workers one call may be offered to: a call that finds its worker gone before the worker took it
# goes to a new one, but a worker that dies this many times running before it can read a line is
# broken (its command fails at start, say), and the call fails instead of starting workers forever.
SEND_ATTEMPTS = 3


class WorkerGoneError(RuntimeError):
    """The deletion worker exited before answering (its files stay in the journal)."""


# ----------------------------------------------------------------------- the worker's side


def _answer(deleter: LocalDeleter, request: dict[str, Any]) -> Any:
    op = request["op"]
    if op == "unlink":
        names, sizes, ours = request["names"], request["sizes"], request.get("ours", ())
        return _outcome(deleter.unlink(request["dir"], names, sizes, ours))
    if op == "measure":
        return deleter.measure(request["dir"], request["names"])
    if op == "tree":
        return _outcome(deleter.remove_tree(request["dir"]))
    if op == "scan":
        return astuple(deleter.scan())
    raise ValueError(f"unknown operation {op!r}")


def _outcome(out: Outcome) -> dict[str, Any]:
    return {
        "files": out.removed.files,
        "bytes": out.removed.bytes,
        "failures": [astuple(f) for f in out.failures],
    }


class DirectoryLanes:
    """Tasks on a thread pool, at most ``per_directory`` at once for one directory.

    A directory's other tasks wait in order, without holding a thread, and the thread that
    finishes one of its tasks runs the next itself (no hand-over to another thread). Tasks must
    not raise.
    """

    def __init__(self, pool: ThreadPoolExecutor, per_directory: int) -> None:
        self._pool = pool
        self._per_directory = per_directory
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[Callable[[], None]]] = {}

    def submit(self, directory: str, task: Callable[[], None]) -> None:
        with self._lock:
            running = self._running.get(directory, 0)
            if running >= self._per_directory:
                self._waiting.setdefault(directory, deque()).append(task)
                return
            self._running[directory] = running + 1
        self._pool.submit(self._drain, directory, task)

    def _drain(self, directory: str, task: Callable[[], None]) -> None:
        while True:
            task()
            with self._lock:
                queued = self._waiting.get(directory)
                if queued:
                    task = queued.popleft()
                    if not queued:
                        del self._waiting[directory]
                    continue
                self._running[directory] -= 1
                if not self._running[directory]:
                    del self._running[directory]
                return


def serve(deleter: LocalDeleter, requests: IO[bytes], replies: IO[bytes], threads: int) -> None:
    """Answer ``requests`` (JSON lines) on ``threads`` threads until end of input; unlinks run
    at most :data:`UNLINKS_PER_DIRECTORY` at once in one directory."""
    lock = threading.Lock()

    def run(request: dict[str, Any]) -> None:
        try:
            reply = {"id": request["id"], "ok": _answer(deleter, request)}
        except Exception as exc:  # answered, so the sidecar's call fails instead of waiting
            reply = {"id": request.get("id"), "error": f"{type(exc).__name__}: {exc}"}
        line = json.dumps(reply, separators=(",", ":")).encode() + b"\n"
        with lock:
            replies.write(line)
            replies.flush()

    with ThreadPoolExecutor(threads, thread_name_prefix="retention-unlink") as pool:
        lanes = DirectoryLanes(pool, UNLINKS_PER_DIRECTORY)
        for line in requests:
            request = json.loads(line)
            if request["op"] == "stop":
                deleter.stop()
            elif request["op"] == "unlink":
                lanes.submit(request["dir"], lambda request=request: run(request))
            else:
                pool.submit(run, request)
        deleter.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m payloadrun.retention.worker",
        description="The retention sidecar's deletion worker (started by the sidecar itself).",
    )
    parser.add_argument("root", type=Path, help="the payload root")
    parser.add_argument("--threads", type=int, default=8, help="unlink threads")
    parser.add_argument("--attempts", type=int, default=Retry.attempts, help="tries per file")
    parser.add_argument("--backoff", type=float, default=Retry.backoff_s, help="first retry delay")
    parser.add_argument("--nice", type=int, default=WORKER_NICE, help="CPU priority increment")
    args = parser.parse_args(argv)
    # The sidecar stops the worker by closing its input, once the deletions it waits for are
    # answered; a signal meant for the sidecar's process group must not cut them off first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(args.nice)
    except OSError as exc:  # a priority is a preference; the deletions matter more
        print(f"payloadrun retention worker: cannot lower its priority: {exc}", file=sys.stderr)
    deleter = LocalDeleter(args.root, Retry(args.attempts, args.backoff))
    try:
        serve(deleter, sys.stdin.buffer, sys.stdout.buffer, args.threads)
    finally:
        deleter.close()
    return 0


# ------------------------------------------------------------------------ the sidecar's side


@dataclass
class _Worker:
    """One worker process and the calls it has not answered yet."""

    proc: subprocess.Popen[bytes]
    waiting: dict[int, Future[Any]] = field(default_factory=dict)
    # the calls of ``waiting`` whose line is written whole (a call waits from before its write,
    # so that a reply cannot come before its future is there)
    written: set[int] = field(default_factory=set)
    # one call's line at a time on its input (held while writing, never with the deleter's lock)
    sending: threading.Lock = field(default_factory=threading.Lock)
    # its input pipe broke: it can take no call, whatever ``poll`` says (``poll`` answers None
    # while the reply reader is inside ``wait``, even for a process that has exited)
    gone: bool = False

    def alive(self) -> bool:
        return not self.gone and self.proc.poll() is None


class ProcessDeleter:
    """:class:`LocalDeleter`'s methods, run by a worker process; thread-safe."""

    def __init__(
        self,
        root: Path,
        *,
        threads: int,
        retry: Retry,
        nice: int = WORKER_NICE,
        on_restart: Callable[[], None] = lambda: None,
    ) -> None:
        self._command = [
            sys.executable,
            "-m",
            __name__,
            str(root),
            f"--threads={threads}",
            f"--attempts={retry.attempts}",
            f"--backoff={retry.backoff_s}",
            f"--nice={nice}",
        ]
        self._on_restart = on_restart
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._next_id = 0
        self._closed = False
        self._stopping = False  # stop(): no call is sent again after its worker's death
        # replies a worker's death cut short (a partial last line): each call is sent again
        self.replies_cut_short = 0
        with self._lock:
            self._running()  # fail at start, not at the first deletion

    # ------------------------------------------------------------------------ the operations

    def unlink(
        self,
        dir_name: str,
        names: Sequence[str],
        sizes: Sequence[int],
        ours: Collection[str] = (),
    ) -> Outcome:
        """A chunk's unlink; sent again after a worker's death with every name in ``ours``."""
        names = list(names)
        got = self._call(
            "unlink",
            {"ours": names},
            dir=dir_name,
            names=names,
            sizes=list(sizes),
            ours=sorted(ours),
        )
        return _parse_outcome(got)

    def measure(self, dir_name: str, names: Sequence[str]) -> list[int]:
        return self._call("measure", {}, dir=dir_name, names=list(names))

    def remove_tree(self, dir_name: str) -> Outcome:
        return _parse_outcome(self._call("tree", {}, dir=dir_name))

    def scan(self) -> Census:
        return Census(*self._call("scan", {}))

    def stop(self) -> None:
        """Cut the worker's retries short (it still answers every call); after its death, send
        no call again and start no other worker: the sidecar is stopping, the journal replays
        the rest."""
        with self._lock:
            self._stopping = True
            worker = self._worker if self._worker is not None and self._worker.alive() else None
        if worker is not None:
            with worker.sending, contextlib.suppress(OSError):  # gone: nothing to cut short
                _send(worker.proc, {"op": "stop"})

    def close(self) -> None:
        """Stop the worker once the operations running now are answered."""
        with self._lock:
            self._closed = True
            worker, self._worker = self._worker, None
        if worker is None:
            return
        proc = worker.proc
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("the deletion worker did not stop in %.0f s; killing it", STOP_TIMEOUT_S)
            proc.kill()
            proc.wait()

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._worker.proc.pid if self._worker is not None else None

    @property
    def unanswered(self) -> int:
        """Calls sent to the current worker and not answered yet (a call is counted once its
        line is written whole to the worker's input: a worker killed before then never took
        it, and the call goes to another as its first try)."""
        with self._lock:
            if self._worker is None:
                return 0
            return len(self._worker.waiting.keys() & self._worker.written)

    # --------------------------------------------------------------------------- the protocol

    def _call(self, op: str, again: dict[str, Any], **fields: Any) -> Any:
        """One operation's answer; sent once more, with ``again`` over its fields, when the
        worker that took it died before its answer came whole."""
        answer = self._send_call(op, fields)  # raises when no worker could take it
        try:
            reply = answer.result()
        except WorkerGoneError as exc:
            if self._stopping:
                raise
            log.warning("the deletion worker died before answering %s (%s): sent again", op, exc)
            answer = self._send_call(op, {**fields, **again})
            try:
                reply = answer.result()
            except WorkerGoneError as again_exc:
                raise WorkerGoneError(
                    f"the deletion worker died before answering {op}, and so did the one it "
                    f"was sent to again ({again_exc}); its files stay in the journal"
                ) from again_exc
        if "error" in reply:
            raise RuntimeError(f"the deletion worker failed {op}: {reply['error']}")
        return reply["ok"]

    def _send_call(self, op: str, fields: dict[str, Any]) -> Future[Any]:
        """Write the call to a live worker; the future of its reply.

        The write holds the worker's own send lock, never the deleter's: a request larger than
        the pipe's buffer waits for the worker to read it, and the worker reads only while its
        replies are read, which the reply reader does under the deleter's lock."""
        for attempt in range(1, SEND_ATTEMPTS + 1):
            # a future of its own for each attempt: a worker's reply reader may have failed the
            # last one (its worker died while the call was written), and a future is done once
            answer: Future[Any] = Future()
            with self._lock:
                worker = self._running()
                self._next_id += 1
                call_id = self._next_id
                worker.waiting[call_id] = answer
            try:
                with worker.sending:
                    _send(worker.proc, {"id": call_id, "op": op, **fields})
                with self._lock:
                    if call_id in worker.waiting:  # not answered while its write returned
                        worker.written.add(call_id)
                return answer
            except OSError as exc:
                # Nothing reads the worker's input: it exited (or is exiting) and never took
                # this call, whose line it cannot have read whole. Another worker can.
                with self._lock:
                    worker.waiting.pop(call_id, None)
                    self._drop(worker)
                if attempt == SEND_ATTEMPTS:
                    raise WorkerGoneError(
                        f"the deletion worker is gone ({exc}), {SEND_ATTEMPTS} workers "
                        "running: each exited before it could take a call (see its errors "
                        "above, on the sidecar's stderr)"
                    ) from exc
        raise AssertionError("unreachable")

    def _running(self) -> _Worker:
        """The live worker, started (again) if needed (lock held)."""
        if self._closed:
            raise WorkerGoneError("the deletion worker is closed")
        if self._worker is not None and self._worker.alive():
            return self._worker
        if self._stopping:  # the sidecar is stopping: no new worker, the journal replays it
            raise WorkerGoneError("the deletion worker is gone and the sidecar is stopping")
        if self._worker is not None:
            code = self._worker.proc.returncode
            log.warning("the deletion worker is gone (exit code %s); starting a new one", code)
            self._on_restart()
        proc = subprocess.Popen(
            self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
        )
        self._worker = worker = _Worker(proc)
        threading.Thread(
            target=self._read_replies, args=(worker,), name="retention-worker-replies", daemon=True
        ).start()
        return worker

    @staticmethod
    def _drop(worker: _Worker) -> None:
        """Take no more calls to ``worker``, whose input broke (lock held); its reply reader
        still fails the calls it left unanswered once its output ends."""
        worker.gone = True
        with contextlib.suppress(OSError):  # exited already: nothing to stop
            worker.proc.kill()  # a process that closed its input cannot do any more work

    def _read_replies(self, worker: _Worker) -> None:
        """Hand each answer to its caller; when the worker's output ends, however it ends (a
        last line its death cut short included), fail every call it left unanswered."""
        assert worker.proc.stdout is not None
        try:
            for line in worker.proc.stdout:
                if not line.endswith(b"\n"):  # it died while writing this reply
                    with self._lock:
                        self.replies_cut_short += 1
                    log.warning(
                        "the deletion worker died while answering: its reply was cut short "
                        "after %d bytes",
                        len(line),
                    )
                    break
                try:
                    reply = json.loads(line)
                    call_id = reply["id"]
                except (ValueError, KeyError, TypeError) as exc:
                    log.error("the deletion worker's reply is not one: %s: %.200r", exc, line)
                    continue
                with self._lock:
                    answer = worker.waiting.pop(call_id, None)
                    worker.written.discard(call_id)
                if answer is not None:
                    _settle(answer, reply)
        finally:
            with contextlib.suppress(OSError):  # it may be alive and writing garbage: stop it
                worker.proc.kill()
            code = worker.proc.wait()
            with self._lock:
                worker.gone = True
                left, worker.waiting = worker.waiting, {}
                worker.written.clear()
            for answer in left.values():
                _settle(answer, WorkerGoneError(f"the deletion worker exited (code {code})"))


def _settle(answer: Future[Any], outcome: Any) -> None:
    """Give a call its reply (or, an exception, its failure) unless it has one: one future
    already settled must not keep the reader from the others' (they would wait forever)."""
    with contextlib.suppress(InvalidStateError):
        if isinstance(outcome, BaseException):
            answer.set_exception(outcome)
        else:
            answer.set_result(outcome)


def _send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    proc.stdin.flush()


def _parse_outcome(got: dict[str, Any]) -> Outcome:
    failures = [Failure(DeleteError(label), *rest) for label, *rest in got["failures"]]
    return Outcome(Removed(got["files"], got["bytes"]), failures)


if __name__ == "__main__":
    sys.exit(main())
