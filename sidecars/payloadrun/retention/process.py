"""Start a retention sidecar as a child process on free loopback ports (simulator, bench, tests).

The child is ``python -m payloadrun.cli retention`` with ``--port 0 --metrics-port 0`` and a
``--ready-file``: it binds whatever ports are free and writes their URLs there, so there is no
race between picking a port and binding it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


class SidecarStartError(RuntimeError):
    """The retention sidecar did not come up; the message carries its log."""


class SidecarProcess:
    """One retention sidecar child process; a context manager that stops it on exit."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        self.root = Path(root)
        self.run_id = run_id
        self.args = list(args)
        self.start_timeout = start_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="payloadrun-retention-")
        self.log_path = Path(log_path) if log_path else Path(self._tmp.name) / "sidecar.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.metrics_url = ""

    def start(self) -> SidecarProcess:
        ready = Path(self._tmp.name) / "ready.json"
        ready.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "payloadrun.cli",
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
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while not ready.exists():
            if self.proc.poll() is not None:
                raise SidecarStartError(
                    f"retention sidecar exited with {self.proc.returncode} at start:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise SidecarStartError(
                    f"retention sidecar not listening after {self.start_timeout} s:\n{self.log()}"
                )
            time.sleep(0.01)
        urls = json.loads(ready.read_text())
        self.url, self.metrics_url = urls["api"], urls["metrics"]
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL: the crash the journal is for."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def __enter__(self) -> SidecarProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()
