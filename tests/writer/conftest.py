"""Real servers on 127.0.0.1 for the writer's tests: the fake vLLM, the writer, a real vLLM.

Each server runs its aiohttp app on its own event loop in a thread, so tests are plain functions
that talk HTTP through real sockets. Nothing is mocked: the writer writes through the real store
into a real directory (or a small tmpfs for the disk-full tests).

The real vLLM (``real_vllm``) is ``PAYLOADRUN_VLLM_URL`` when that is set (any vLLM, a GPU one
included); else the CPU build and tiny model that ``hack/vllm.sh`` prepared (``make test`` runs
it), started once, when the first test asks, and stopped at the end of the session. A failed test
that used it shows the end of vLLM's log.
"""

from __future__ import annotations

import asyncio
import http.client as httpclient
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from payloadrun.serving import app_runner
from payloadrun.testing.fakevllm import FAKE_KEY, FakeConfig
from payloadrun.testing.fakevllm import build_app as build_fake
from payloadrun.testing.processes import StartError, VLLMServer, fake_vllm, free_port
from payloadrun.writer.config import WriterConfig
from payloadrun.writer.server import WRITER_KEY
from payloadrun.writer.server import build_app as build_writer
from payloadrun_devkit import required

CREATED = 1_764_460_800  # fixed, so direct and proxied answers are byte-comparable
REPO = Path(__file__).resolve().parents[2]
VLLM_URL_ENV = "PAYLOADRUN_VLLM_URL"


class ServerThread:
    """An aiohttp app served on 127.0.0.1 (a free port) from its own loop in a thread."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        runner = app_runner(self.app)  # with the options the app asks for, as in production
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    method: str,
    url: str,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Reply:
    """One request over a fresh connection; the raw body and headers of the answer."""
    parts = urlsplit(url)
    conn = httpclient.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    hdrs.update(headers or {})
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), data, hdrs)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


@pytest.fixture
def fake() -> Iterator[ServerThread]:
    server = ServerThread(build_fake(FakeConfig(created=CREATED))).start()
    yield server
    server.stop()


def fake_config(server: ServerThread) -> FakeConfig:
    return server.app[FAKE_KEY].config


def fake_posts(server: ServerThread) -> int:
    """How many generation requests the fake received."""
    stats = fake_config(server).stats
    return sum(v for k, v in stats.items() if k not in ("/health", "aborted"))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "payloads"
    path.mkdir()
    return path


@pytest.fixture
def start_writer() -> Iterator:
    """``start_writer(upstream, root, **config)`` -> a running writer; all stopped at the end."""
    servers: list[ServerThread] = []

    def start(upstream: str, payload_root: Path | str | None, **kwargs: Any) -> ServerThread:
        config = WriterConfig(
            upstream=upstream,
            payload_root=None if payload_root is None else str(payload_root),
            **kwargs,
        )
        server = ServerThread(build_writer(config)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def writer(fake: ServerThread, root: Path, start_writer) -> ServerThread:
    return start_writer(fake.url, root)


def metric(server: ServerThread, name: str, **labels: str) -> float:
    """A sample of the writer's metrics once no request is being served.

    The writer counts a request after its last byte went out (it counts whether the client took
    it), so a client holding the whole answer may look a moment before the count moves.
    """
    registry = server.app[WRITER_KEY].metrics.registry
    deadline = time.monotonic() + 5
    while registry.get_sample_value("payloadrun_writer_requests_in_flight") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.005)
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def wait_for_metric(server: ServerThread, name: str, value: float, timeout: float = 20.0) -> None:
    """Wait until the writer's metric ``name`` (no labels) is ``value``: a fact, not a sleep."""
    registry = server.app[WRITER_KEY].metrics.registry
    deadline = time.monotonic() + timeout
    while registry.get_sample_value(name) != value:
        assert time.monotonic() < deadline, (
            f"{name} is {registry.get_sample_value(name)}, not {value}, after {timeout} s"
        )
        time.sleep(0.005)


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0


def umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], check=False, capture_output=True)


@dataclass
class RealVLLM:
    """A running vLLM: ``url``; ``server`` when this session started it (else an external one)."""

    url: str
    server: VLLMServer | None = None

    @cached_property
    def model(self) -> str:
        return http("GET", self.url + "/v1/models").json()["data"][0]["id"]

    def log(self) -> str:
        return self.server.log() if self.server else f"(an external vLLM: {self.url})"


def prepared_vllm() -> Path:
    """The directory hack/vllm.sh prepared (``venv/``, ``model/``), found without preparing
    anything (so no network); else skip, or fail when everything must run."""
    result = subprocess.run(
        ["bash", str(REPO / "hack" / "vllm.sh"), "--installed"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        required.skip_or_fail(
            f"no real vLLM: {result.stderr.strip()} (or set {VLLM_URL_ENV} to a running server)"
        )
    return Path(result.stdout.strip())


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVLLM]:
    """A real vLLM for the session: ``PAYLOADRUN_VLLM_URL``, or the prepared CPU one, started
    (about a minute) only when a test first asks for it."""
    external = os.environ.get(VLLM_URL_ENV, "").strip()
    if external:
        yield RealVLLM(external.rstrip("/"))
        return
    env_dir = prepared_vllm()
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VLLMServer(env_dir, log_path=log_path)
    try:
        server.start()
    except StartError as exc:  # prepared, yet it does not serve: always a failure
        pytest.fail(f"vLLM from {env_dir} did not start (log {log_path}): {exc}", pytrace=False)
    try:
        yield RealVLLM(server.url, server)
    finally:
        server.stop(timeout=30)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test that used the real vLLM shows the end of its log."""
    outcome = yield
    report = outcome.get_result()
    vllm = getattr(item, "funcargs", {}).get("real_vllm")
    if report.failed and isinstance(vllm, RealVLLM):
        report.sections.append(("real vLLM log (its end)", vllm.log()))


def fake_process(*args: str):
    """The fake vLLM as a separate process (its CPU work then does not share our GIL)."""
    return fake_vllm(*args).start()


__all__ = ["fake_process", "free_port"]
