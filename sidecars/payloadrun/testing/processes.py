"""``payloadrun`` commands as child processes on loopback: for tests, benchmarks and the demo.

:class:`PayloadrunProcess` runs ``python -m payloadrun.cli <command> ...`` in its own session with
its own log file and waits until an HTTP URL answers; :func:`fake_vllm` and :func:`writer` are the
two everyone starts. :class:`SidecarProcess` is the retention sidecar, started with
``--port 0 --metrics-port 0`` and a ``--ready-file``: it binds whatever ports are free and writes
their URLs there, so there is no race between picking a port and binding it. Every process is
stopped with SIGTERM (then SIGKILL) when its block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for commands that cannot bind port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(
    url: str, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until ``url`` answers (any status below 400); raise the last error after ``timeout``.

    With ``process``, stop waiting as soon as it has exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                resp.read()
            return
        except OSError:
            if process is not None and process.poll() is not None:
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class StartError(RuntimeError):
    """A child process did not come up; the message carries the end of its log."""


class ChildProcess:
    """A ``payloadrun`` command in its own session, logging to a file; a context manager."""

    what = "payloadrun"

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
        cmd = [*self.wrap, sys.executable, "-m", "payloadrun.cli", *args]
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


class PayloadrunProcess(ChildProcess):
    """A command that serves HTTP at ``url``; ready when ``url + health_path`` answers."""

    def __init__(self, args: Sequence[str], url: str, health_path: str, **kwargs) -> None:
        super().__init__(args, **kwargs)
        self.what = f"payloadrun {args[0]}"
        self.url = url
        self.health_url = url + health_path
        self.metrics_url: str | None = None

    def start(self) -> PayloadrunProcess:
        proc = self.spawn(self.args)
        try:
            wait_http(self.health_url, self.start_timeout, proc)
        except OSError:
            self.stop()
            code = proc.returncode
            raise self.failed(
                f"exited with {code} at start" if code else "did not answer in time"
            ) from None
        return self


class VLLMServer(PayloadrunProcess):
    """A real vLLM (``vllm serve``) on a free loopback port: the CPU build and the tiny model that
    ``hack/vllm.sh`` prepares in ``env_dir`` (``venv/``, ``model/``), or any ``vllm`` and model.

    Served as ``tiny-qwen3-moe`` with the tokens-in endpoint on (``--enable-scale-out``), in
    float32 without compilation (what the CPU build runs), offline, with a 1 GiB KV cache.
    Startup takes about 30 s to a minute on 2 cores; ``start_timeout`` allows for a busy machine.
    """

    what = "vLLM"
    model_name = "tiny-qwen3-moe"

    def __init__(
        self,
        env_dir: str | os.PathLike[str],
        *args: str,
        port: int | None = None,
        log_path: str | os.PathLike[str] | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        env_dir = Path(env_dir)
        self.vllm = env_dir / "venv" / "bin" / "vllm"
        self.model = env_dir / "model"
        port = port or free_port()
        # vLLM runs in its own environment: nothing of this one (PYTHONPATH, VIRTUAL_ENV) leaks in
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            VLLM_CPU_KVCACHE_SPACE="1",  # GiB; the default (4) is more than a test needs
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
        )
        super().__init__(
            [
                "serve",
                str(self.model),
                "--served-model-name",
                self.model_name,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--enforce-eager",
                "--dtype",
                "float32",
                "--enable-scale-out",
                *args,
            ],
            f"http://127.0.0.1:{port}",
            "/health",
            log_path=log_path,
            start_timeout=start_timeout,
        )
        self.what = "vLLM"
        self.vllm_env = env

    def spawn(self, args: Sequence[str]) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.vllm), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.vllm_env,
                start_new_session=True,
            )
        return self.proc


def fake_vllm(*args: str, port: int | None = None, **kwargs) -> PayloadrunProcess:
    """``payloadrun fake-vllm`` on a free loopback port (``args``: its flags)."""
    port = port or free_port()
    return PayloadrunProcess(
        ["fake-vllm", "--port", str(port), *args], f"http://127.0.0.1:{port}", "/health", **kwargs
    )


def writer(
    upstream: str,
    root: str | os.PathLike[str],
    *args: str,
    port: int | None = None,
    metrics_port: int | None = None,
    **kwargs,
) -> PayloadrunProcess:
    """``payloadrun writer`` in front of ``upstream``, on free loopback ports.

    ``metrics_url`` is set on the result (``None`` with ``metrics_port=0``).
    """
    port = port or free_port()
    metrics_port = free_port() if metrics_port is None else metrics_port
    process = PayloadrunProcess(
        [
            "writer",
            "--upstream",
            upstream,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--payload-root",
            os.fspath(root),
            "--metrics-port",
            str(metrics_port),
            *args,
        ],
        f"http://127.0.0.1:{port}",
        "/healthz",
        **kwargs,
    )
    process.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else None
    return process


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
