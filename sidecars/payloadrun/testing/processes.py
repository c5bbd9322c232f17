"""Commands as child processes on loopback: for tests, benchmarks and the demo.

:class:`PayloadrunProcess` is a :class:`~payloadrun.children.ChildProcess` that serves HTTP and
is ready when a URL answers; :func:`fake_vllm` (one API server or several on consecutive ports,
:func:`free_ports`) and :func:`writer` are the two everyone starts, :class:`FakeWorker` a fake
vLLM group's worker that serves no HTTP, :class:`VLLMServer` a real vLLM. The retention
sidecar, :class:`SidecarProcess`, lives in the product (``payloadrun simulate`` starts one) and
is re-exported here. Every process is stopped with SIGTERM (then SIGKILL) when its block ends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from payloadrun.children import COMMAND_MODULE, ChildProcess, SidecarProcess, StartError

__all__ = [
    "FAKE_VLLM_MODULE",
    "ChildProcess",
    "FakeWorker",
    "PayloadrunProcess",
    "SidecarProcess",
    "StartError",
    "VLLMServer",
    "fake_vllm",
    "free_port",
    "free_ports",
    "wait_http",
    "writer",
]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for commands that cannot bind port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1 right now (the fake vLLM's
    ``--api-servers``, as vLLM's API servers of one pod take consecutive ports)."""
    for _ in range(50):
        base = free_port()
        if base + count > 65536:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise OSError(f"found no {count} consecutive free ports on 127.0.0.1 in 50 tries")


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


class PayloadrunProcess(ChildProcess):
    """A command that serves HTTP at ``url``; ready when ``url + health_path`` answers.

    ``module`` is what ``python -m`` runs: the ``payloadrun`` command unless told otherwise.
    """

    def __init__(
        self,
        args: Sequence[str],
        url: str,
        health_path: str,
        *,
        module: str = COMMAND_MODULE,
        **kwargs,
    ) -> None:
        super().__init__(args, **kwargs)
        self.module = module
        self.what = f"payloadrun {args[0]}" if module == COMMAND_MODULE else module
        self.url = url
        self.urls = [url]  # every API server of a fake vLLM with --api-servers
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


# ``python -m`` this module is the fake vLLM (the end-to-end pods' inference container).
FAKE_VLLM_MODULE = "payloadrun.testing.fakevllm"


def fake_vllm(
    *args: str,
    port: int | None = None,
    api_servers: int = 1,
    ready_path: str = "/health",
    **kwargs,
) -> PayloadrunProcess:
    """The fake vLLM on a free loopback port (``args``: its flags); with ``api_servers``, that
    many API servers on consecutive free ports, listed in ``urls`` (``url`` is the first).

    Started when ``ready_path`` answers on the last of them (they bind in order); a group's
    leader answers ``/health`` only once its workers joined, so start one with
    ``ready_path=GROUP_PATH`` (:mod:`~payloadrun.testing.fakegroup`).
    """
    port = port or (free_ports(api_servers) if api_servers > 1 else free_port())
    servers = ["--api-servers", str(api_servers)] if api_servers > 1 else []
    urls = [f"http://127.0.0.1:{port + n}" for n in range(api_servers)]
    process = PayloadrunProcess(
        ["--port", str(port), *servers, *args],
        urls[0],
        ready_path,
        module=FAKE_VLLM_MODULE,
        **kwargs,
    )
    process.health_url = urls[-1] + ready_path
    process.urls = urls
    return process


class FakeWorker(ChildProcess):
    """A fake vLLM worker that serves no HTTP (``--no-http``: only its leader serves): it joins
    its leader at ``leader`` (``HOST:PORT``) as worker ``index`` of ``group_size``. Started once
    spawned: its leader's ``GET /fake/group`` (or ``joined_file``) says when it has joined."""

    what = "fake vLLM worker"
    module = FAKE_VLLM_MODULE

    def __init__(self, leader: str, index: int, group_size: int, *args: str, **kwargs) -> None:
        super().__init__(
            [
                "--no-http",
                "--leader-address",
                leader,
                "--worker-index",
                str(index),
                "--group-size",
                str(group_size),
                *args,
            ],
            **kwargs,
        )

    def start(self) -> FakeWorker:
        self.spawn(self.args)
        return self


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
