"""Three clients of one volume, requests through the writer and straight to the fake vLLM, and
the checks that they agree."""

from __future__ import annotations

import http.client
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from payloadrun.codec import decode_npy_base64
from payloadrun.reader import PayloadReader
from payloadrun.segments import ROUTED_EXPERTS, SAMPLING_MASK, Segment, segments_from_json
from payloadrun_devcluster.glusterfs import GlusterServer, Mount, Volume, as_client

GEN = "/inference/v1/generate"


@dataclass
class Nodes:
    """One volume seen by three clients; ``root`` is where each process sees its own."""

    volume: Volume
    root: Path
    inference: Mount
    orchestrator: Mount
    trainer: Mount

    @property
    def brick(self) -> Path:
        return self.volume.brick

    def on_inference(self) -> list[str]:
        """The command prefix that runs a process on the inference node."""
        return as_client(self.inference.path, self.root)

    def on_orchestrator(self) -> list[str]:
        return as_client(self.orchestrator.path, self.root)

    def on_brick(self, path: Path | str) -> Path:
        """``path`` under ``root``, as the server stores it."""
        return self.brick / Path(path).relative_to(self.root)


def make_nodes(
    server: GlusterServer,
    base: Path,
    options: dict[str, str] | None = None,
    *,
    coherent: bool = False,
    size_bytes: int | None = None,
) -> Nodes:
    """A new volume under ``base`` and its three clients (default caches, or coherent); its
    brick on a tmpfs of ``size_bytes`` when given (a volume that fills up)."""
    volume = server.create_volume(base / "server", options=options, size_bytes=size_bytes)
    inference = volume.mount(base / "inference", coherent=coherent)
    orchestrator = volume.mount(base / "orchestrator", coherent=coherent)
    trainer = volume.mount(base / "trainer", coherent=coherent)  # this process's: the root
    return Nodes(volume, trainer.path, inference, orchestrator, trainer)


def generate_request(
    payload_dir: str, *, prompt_len: int, n: int = 1, prompt_start: int = 0, max_tokens: int = 12
) -> dict[str, Any]:
    """A ``/inference/v1/generate`` request asking for its payload in ``payload_dir``."""
    params = {
        "n": n,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_k": 20,
        "routed_experts_prompt_start": prompt_start,
        "extra_args": {"payload_dir": payload_dir},
    }
    # a distinct prompt per request: the fake seeds its arrays from the body
    first = uuid.uuid4().int % 50_000
    return {"token_ids": list(range(first, first + prompt_len)), "sampling_params": params}


def post(
    url: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 120
) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(
            "POST", parts.path, body, {"Content-Type": "application/json", **(headers or {})}
        )
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("GET", parts.path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def payload_segments(response: dict[str, Any]) -> list[list[Segment]]:
    return [segments_from_json(choice["payload"]) for choice in response["choices"]]


def check_by_handle_equals_inline(
    reader: PayloadReader, via: dict[str, Any], direct: dict[str, Any], prompt_len: int
) -> set[str]:
    """Every choice's arrays, read back from the files, equal the inline ones bit for bit.

    Returns the payload files the answer names.
    """
    files: set[str] = set()
    assert len(via["choices"]) == len(direct["choices"])
    for got, want in zip(via["choices"], direct["choices"], strict=True):
        assert got["routed_experts"] is None and got.get("sampling_mask") is None
        segments = segments_from_json(got["payload"])
        files.update(s.file for s in segments)
        by_field = {s.field: s for s in segments}
        inline = decode_npy_base64(want["routed_experts"])
        seg = by_field[ROUTED_EXPERTS]
        back = reader.read(segments, ROUTED_EXPERTS, seg.pos, seg.end)
        assert back.dtype == inline.dtype and back.shape == inline.shape
        assert back.tobytes() == inline.tobytes()
        mask = by_field[SAMPLING_MASK]
        rows = reader.read(segments, SAMPLING_MASK, prompt_len, prompt_len + mask.rows)
        assert [[int(t) for t in row if t != -1] for row in rows] == want["sampling_mask"]
        assert got["token_ids"] == want["token_ids"]
    return files


def metric(url: str, name: str, **labels: str) -> float:
    """The value of one sample on a Prometheus text page (0 when it is not there)."""
    _, text = get(url)
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def wait_for(what: str, condition: Callable[[], Any], timeout: float, interval: float = 0.05):
    """Poll ``condition`` until it returns something true, and return that; fail on timeout."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(interval)
    return value


def files_on(brick: Path) -> set[Path]:
    """The payload files the server holds under ``brick`` (its own metadata left out)."""
    return {
        p.relative_to(brick)
        for p in brick.rglob("*.bin")
        if ".glusterfs" not in p.relative_to(brick).parts
    }


def bytes_on(brick: Path, under: str) -> int:
    return sum(
        p.stat().st_size
        for p in (brick / under).rglob("*.bin")
        if ".glusterfs" not in p.relative_to(brick).parts
    )


def read_json(body: bytes) -> dict[str, Any]:
    return json.loads(body)
