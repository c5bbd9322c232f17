"""Writer sidecar benchmark: through the writer versus straight to the upstream, same run.

Starts the fake vLLM (vLLM 0.33.0's wire format, Qwen3-30B-A3B routing shape: 48 layers, top-8,
384 B per token) and the writer as separate processes on loopback, then for each payload size and
concurrency sends the same requests straight to the upstream (inline) and through the writer (by
handle), and writes the same number of bytes with a plain write+fsync for reference. Prints:

- bytes in the response, inline and by handle, and their ratio (goal: >= 50x from 8 MiB up);
- latency per request (median) both ways, the added latency, a raw write+fsync of the same bytes
  at the same concurrency, and their ratio (goal: added <= 1.5x raw);
- requests per second both ways.

Bounded: a fixed number of requests per cell (fewer with ``--quick``), loopback only, payload files
deleted after each cell. Run: ``python bench/writer.py`` (or ``--quick``). On a shared machine,
``--interleave`` alternates rounds of ``concurrency`` requests direct and through the writer, so
that load from elsewhere drifting during a cell falls on both sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from payloadrun.testing import processes

MIB = 1 << 20
ROW_BYTES = 48 * 8  # Qwen3-30B-A3B: 48 MoE layers x top-8 uint8 ids
MAX_TOKENS = 16


def request_body(size: int, i: int, payload_dir: str | None) -> bytes:
    """A generate request whose routing is ``size`` bytes: ``size / 384`` forwarded tokens."""
    rows = max(1, size // ROW_BYTES)
    prompt_len = rows - MAX_TOKENS + 1
    params: dict = {"max_tokens": MAX_TOKENS}
    if payload_dir is not None:
        params["extra_args"] = {"payload_dir": payload_dir}
    return json.dumps(
        {"token_ids": [i, *range(prompt_len - 1)], "sampling_params": params}
    ).encode()


@dataclass
class Run:
    latencies: list[float]
    sizes: list[int]
    wall: float

    @property
    def median(self) -> float:
        return statistics.median(self.latencies)

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.wall


async def run_requests(url: str, bodies: list[bytes], concurrency: int) -> Run:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    sizes: list[int] = []
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(body: bytes) -> None:
            async with sem:
                t0 = time.perf_counter()
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    data = await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{url}: {resp.status} {data[:300]!r}")
                latencies.append(time.perf_counter() - t0)
                sizes.append(len(data))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return Run(latencies, sizes, time.perf_counter() - t0)


def run_interleaved(
    direct_url: str,
    via_url: str,
    direct_bodies: list[bytes],
    via_bodies: list[bytes],
    concurrency: int,
) -> tuple[Run, Run]:
    """Rounds of ``concurrency`` requests, direct then through the writer, until all are sent."""
    sides = (Run([], [], 0.0), Run([], [], 0.0))
    for start in range(0, len(direct_bodies), concurrency):
        for side, url, bodies in zip(
            sides, (direct_url, via_url), (direct_bodies, via_bodies), strict=True
        ):
            done = asyncio.run(run_requests(url, bodies[start : start + concurrency], concurrency))
            side.latencies.extend(done.latencies)
            side.sizes.extend(done.sizes)
            side.wall += done.wall
    return sides


def raw_write(directory: Path, data: bytes) -> float:
    """One write+fsync+close of ``data`` into a new file, as the store does it."""
    path = directory / f"{uuid.uuid4().hex}.raw"
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    took = time.perf_counter() - t0
    os.unlink(path)
    return took


def raw_writes(directory: Path, size: int, count: int, concurrency: int) -> float:
    data = os.urandom(size)
    lock = threading.Lock()
    times: list[float] = []

    def one(_: int) -> None:
        t = raw_write(directory, data)
        with lock:
            times.append(t)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(count)))
    return statistics.median(times)


def clear(root: Path) -> None:
    for child in root.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 8 MiB, 4 requests a cell")
    parser.add_argument("--sizes", default="1,8,32", help="payload sizes in MiB")
    parser.add_argument("--concurrency", default="1,8", help="concurrent requests")
    parser.add_argument("--requests", type=int, default=16, help="requests per cell and side")
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="alternate rounds of direct and writer requests (fairer on a loaded machine)",
    )
    parser.add_argument(
        "--root", type=Path, help="where to make the payload root (default: the temp directory)"
    )
    args = parser.parse_args()
    sizes = [1, 8] if args.quick else [int(s) for s in args.sizes.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    count = 4 if args.quick else args.requests

    tmp = Path(tempfile.mkdtemp(prefix="payloadrun-bench-", dir=args.root)).resolve()
    root = tmp / "payloads"
    root.mkdir()
    procs = []
    try:
        fake = processes.fake_vllm(
            "--layers=48", "--top-k=8", "--experts=128", "--no-sampling-mask"
        )
        procs.append(fake.start())
        upstream = fake.url
        server = processes.writer(upstream, root, "--log-level=WARNING", metrics_port=0)
        procs.append(server.start())
        writer = server.url
        order = "interleaved rounds" if args.interleave else "direct first"
        print(f"payload root {root}; {count} requests per cell and side, {order}\n")
        head = (
            f"{'payload':>8} {'conc':>4} | {'inline B':>11} {'handle B':>9} {'ratio':>6} | "
            f"{'direct ms':>9} {'writer ms':>9} {'added ms':>8} {'raw w+f ms':>10} "
            f"{'added/raw':>9} | {'rps dir':>7} {'rps wr':>7}"
        )
        print(head)
        print("-" * len(head))
        results = []
        for size_mib in sizes:
            size = size_mib * MIB
            for conc in concurrencies:
                path = "/inference/v1/generate"
                warm = [request_body(size, 10_000 + i, f"{root}/v0") for i in range(2)]
                asyncio.run(run_requests(writer + path, warm, 2))
                clear(root)
                direct_bodies = [request_body(size, i, None) for i in range(count)]
                via_bodies = [request_body(size, i, f"{root}/v1") for i in range(count)]
                if args.interleave:
                    direct, via = run_interleaved(
                        upstream + path, writer + path, direct_bodies, via_bodies, conc
                    )
                else:
                    direct = asyncio.run(run_requests(upstream + path, direct_bodies, conc))
                    via = asyncio.run(run_requests(writer + path, via_bodies, conc))
                clear(root)
                raw = raw_writes(root, size, count, conc)
                ratio = statistics.median(direct.sizes) / statistics.median(via.sizes)
                added = via.median - direct.median
                row = {
                    "size_mib": size_mib,
                    "concurrency": conc,
                    "inline_bytes": statistics.median(direct.sizes),
                    "handle_bytes": statistics.median(via.sizes),
                    "bytes_ratio": ratio,
                    "direct_s": direct.median,
                    "writer_s": via.median,
                    "added_s": added,
                    "raw_write_fsync_s": raw,
                    "added_over_raw": added / raw,
                    "rps_direct": direct.rps,
                    "rps_writer": via.rps,
                }
                results.append(row)
                print(
                    f"{size_mib:>5} MiB {conc:>4} | {row['inline_bytes']:>11,.0f} "
                    f"{row['handle_bytes']:>9,.0f} {ratio:>5.0f}x | {direct.median * 1e3:>9.1f} "
                    f"{via.median * 1e3:>9.1f} {added * 1e3:>8.1f} {raw * 1e3:>10.1f} "
                    f"{added / raw:>8.2f}x | {direct.rps:>7.2f} {via.rps:>7.2f}",
                    flush=True,
                )
        print()
        for row in results:
            goal_bytes = row["size_mib"] < 8 or row["bytes_ratio"] >= 50
            goal_lat = row["added_over_raw"] <= 1.5
            cell = f"{row['size_mib']:>2} MiB x{row['concurrency']}"
            print(
                f"{cell}: response {row['bytes_ratio']:.0f}x smaller "
                f"({'meets' if goal_bytes else 'misses'} >=50x from 8 MiB); added latency "
                f"{row['added_over_raw']:.2f}x a raw write+fsync "
                f"({'meets' if goal_lat else 'misses'} <=1.5x)"
            )
    finally:
        for proc in procs:
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
