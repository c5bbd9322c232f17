"""``payloadrun`` commands as child processes: what ``payloadrun simulate`` starts.

:class:`ChildProcess` runs ``python -m payloadrun.cli <command> ...`` in its own session with its
own log file, and stops it with SIGTERM (then SIGKILL) when its block ends. :class:`SidecarProcess`
is the retention sidecar, started with ``--port 0 --metrics-port 0`` and a ``--ready-file``: it
binds whatever ports are free and writes their URLs there, so there is no race between picking a
port and binding it. The test kit (:mod:`payloadrun.testing.processes`) builds the fake vLLM and
the writer on the same base.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

# ``python -m`` this module is the ``payloadrun`` command.
COMMAND_MODULE = "payloadrun.cli"


class StartError(RuntimeError):
    """A child process did not come up; the message carries the end of its log."""


class ChildProcess:
    """``python -m MODULE ARGS`` in its own session, logging to a file; a context manager.

    ``MODULE`` is the ``payloadrun`` command's (:data:`COMMAND_MODULE`) unless a subclass names
    another (the test kit's fake vLLM runs as its own module).
    """

    what = "payloadrun"
    module = COMMAND_MODULE

    def __init__(
        self,
        args: Sequence[str],
        *,
        log_path: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        start_timeout: float = 30.0,
        wrap: Sequence[str] = (),
    ) -> None:
        self.args = list(args)
        self.env = env
        self.wrap = list(wrap)  # a command that execs the rest (``unshare ...``, ``nice``)
        self.start_timeout = start_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="payloadrun-child-")
        self.log_path = Path(log_path) if log_path else Path(self._tmp.name) / "child.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"the {self.what} process is not running")
        return self.proc.pid

    def spawn(self, args: Sequence[str]) -> subprocess.Popen[bytes]:
        cmd = [*self.wrap, sys.executable, "-m", self.module, *args]
        env = None if self.env is None else {**os.environ, **self.env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return self.proc

    def failed(self, why: str) -> StartError:
        return StartError(f"{self.what} {why}:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL (the crash a journal is for)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def start(self) -> ChildProcess:
        raise NotImplementedError

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()


class SidecarProcess(ChildProcess):
    """One retention sidecar child process on free loopback ports."""

    what = "retention sidecar"

    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        start_timeout: float = 30.0,
        wrap: Sequence[str] = (),
    ) -> None:
        super().__init__(args, log_path=log_path, start_timeout=start_timeout, wrap=wrap)
        self.root = Path(root)
        self.run_id = run_id
        self.url = ""
        self.metrics_url = ""

    def start(self) -> SidecarProcess:
        ready = Path(self._tmp.name) / "ready.json"
        ready.unlink(missing_ok=True)
        proc = self.spawn(
            [
                "retention",
                "--root",
                str(self.root),
                "--run-id",
                self.run_id,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                "0",
                "--ready-file",
                str(ready),
                *self.args,
            ]
        )
        deadline = time.monotonic() + self.start_timeout
        while not ready.exists():
            if proc.poll() is not None:
                raise self.failed(f"exited with {proc.returncode} at start")
            if time.monotonic() > deadline:
                self.kill()
                raise self.failed(f"not listening after {self.start_timeout} s")
            time.sleep(0.01)
        urls = json.loads(ready.read_text())
        self.url, self.metrics_url = urls["api"], urls["metrics"]
        return self
