"""Writer sidecar benchmark: the writer's own work per answer against the floor for the same bytes.

Starts the fake vLLM (vLLM 0.33.0's wire format, Qwen3-30B-A3B routing shape: 48 layers, top-8,
384 B per token) and the writer as separate processes on loopback. The fake serves every
request of a cell from one answer it prepared once (``x-fake-cache``), so what is measured is
the writer, not the fake generating answers on the same cores.

Per payload size and concurrency, in alternating rounds of ``concurrency`` requests:

- **writer work**: the writer's own histogram ``payloadrun_writer_response_work_seconds`` (from
  the last byte of vLLM's answer to the first byte sent to the client), read from its /metrics
  before and after each round; quantiles interpolated within its buckets (about 1.25x apart) as
  Prometheus' ``histogram_quantile`` does;
- **floor**: what no writer can avoid for the same bytes, timed here on ``concurrency`` threads:
  base64-decode the answer's ``routed_experts`` string (pybase64, as the writer) and write, fsync
  and close it into a new file on the same volume;
- bytes of the answer inline and by handle, the writer's CPU seconds (its
  ``process_cpu_seconds_total``) per GB of payload written;
- **halves**: the difference between each cell's medians over its odd and its even rounds: how
  far two runs of this many requests can be expected to disagree (shown, not a goal: the goal is
  that two consecutive runs agree within 10%, which takes two runs; 256 requests a cell do on a
  quiet machine from 8 MiB, see docs/writer.md).

Then the peak-memory case: a fresh writer with ``--in-flight-budget 1Gi`` and 32 answers of
32 MiB that the fake releases at the same instant (``x-fake-hold``): errors, the writer's peak
RSS (``VmHWM`` from /proc) and the most bytes it reserved at once.

Goals: answers >= 50x smaller by handle from 8 MiB; writer work <= 1.5x the floor (medians) at
8 and 32 MiB; in the peak case 0 errors and peak RSS within the budget. Bounded: a fixed number
of requests per cell, loopback only, payload files deleted after each round. Run: ``python
bench/writer.py`` (about 3 minutes; ``--quick``: a short run).
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
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pybase64

import report
from payloadrun.testing import processes
from report import scrape, value

MIB = 1 << 20
ROW_BYTES = 48 * 8  # Qwen3-30B-A3B: 48 MoE layers x top-8 uint8 ids
MAX_TOKENS = 16
PATH = "/inference/v1/generate"
WORK = "payloadrun_writer_response_work_seconds"
PEAK_BUDGET = "1Gi"
PEAK_BUDGET_BYTES = 1 << 30


def request_body(size: int, payload_dir: str | None, tag: int = 0) -> bytes:
    """A generate request whose routing is ``size`` bytes: ``size / 384`` forwarded tokens."""
    rows = max(1, size // ROW_BYTES)
    prompt_len = rows - MAX_TOKENS + 1
    params: dict = {"max_tokens": MAX_TOKENS}
    if payload_dir is not None:
        params["extra_args"] = {"payload_dir": payload_dir}
    return json.dumps(
        {"token_ids": [tag, *range(prompt_len - 1)], "sampling_params": params}
    ).encode()


# --- the writer's metrics -------------------------------------------------------------------------


def work_buckets(m: dict) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of the by-handle work histogram, in order."""
    out = [
        (float(dict(labels)["le"]), v)
        for (name, labels), v in m.items()
        if name == WORK + "_bucket" and dict(labels).get("mode") == "handle"
    ]
    return sorted(out)


@dataclass
class Histogram:
    """Bucket counts (not cumulative) over the histogram's upper bounds, summed over rounds."""

    bounds: list[float] = field(default_factory=list)
    counts: list[float] = field(default_factory=list)
    total: float = 0.0
    sum: float = 0.0

    def add(self, before: dict, after: dict) -> None:
        b, a = work_buckets(before), work_buckets(after)
        if not self.bounds:
            self.bounds = [le for le, _ in a]
            self.counts = [0.0] * len(a)
        prev = 0.0
        for i, ((_, cb), (_, ca)) in enumerate(zip(b, a, strict=True)):
            delta = ca - cb
            self.counts[i] += delta - prev
            prev = delta
        self.total += value(after, WORK + "_count", mode="handle") - value(
            before, WORK + "_count", mode="handle"
        )
        self.sum += value(after, WORK + "_sum", mode="handle") - value(
            before, WORK + "_sum", mode="handle"
        )

    def quantile(self, q: float) -> float:
        """As Prometheus' histogram_quantile: linear within the bucket the rank falls in."""
        rank = q * self.total
        seen = 0.0
        lower = 0.0
        for upper, count in zip(self.bounds, self.counts, strict=True):
            if count and seen + count >= rank:
                if upper == float("inf"):
                    return lower
                return lower + (upper - lower) * (rank - seen) / count
            seen += count
            lower = upper
        return lower


# --- the floor ---------------------------------------------------------------------------------


def floor_once(directory: Path, text: bytes) -> float:
    """Decode ``text`` (base64, validated) and write, fsync and close it into a new file."""
    path = directory / f"{uuid.uuid4().hex}.floor"
    t0 = time.perf_counter()
    data = memoryview(pybase64.b64decode(text, validate=True))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    took = time.perf_counter() - t0
    os.unlink(path)
    return took


def floor_round(pool: ThreadPoolExecutor, directory: Path, text: bytes, n: int) -> list[float]:
    return list(pool.map(lambda _: floor_once(directory, text), range(n)))


# --- requests ------------------------------------------------------------------------------------


async def post_all(url: str, body: bytes, n: int, headers: dict[str, str]) -> list[bytes]:
    """``n`` identical requests at once; their answers' bodies (raises on a non-200)."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> bytes:
            async with session.post(url, data=body, headers=headers) as resp:
                data = await resp.read()
                if resp.status != 200 or resp.headers.get("X-Payloadrun-Mode") == "inline":
                    raise RuntimeError(f"{url}: {resp.status} {dict(resp.headers)} {data[:300]!r}")
                return data

        return await asyncio.gather(*(one() for _ in range(n)))


HEADERS = {"Content-Type": "application/json", "x-fake-cache": "1"}


def clear(directory: Path) -> None:
    """Delete the files in ``directory`` but keep it: a run writes many answers into one
    ``v<k>``, and creating it again would add its fsyncs to the next answer's work."""
    if directory.exists():
        for path in directory.iterdir():
            path.unlink()


@dataclass
class Cell:
    size_mib: int
    concurrency: int
    work: Histogram = field(default_factory=Histogram)
    halves: tuple[Histogram, Histogram] = field(default_factory=lambda: (Histogram(), Histogram()))
    floor: list[float] = field(default_factory=list)
    floor_halves: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    inline_bytes: int = 0
    handle_bytes: int = 0
    cpu_seconds: float = 0.0
    payload_bytes: float = 0.0

    @property
    def ratio(self) -> float:
        return self.work.quantile(0.5) / statistics.median(self.floor)

    @property
    def spread(self) -> float:
        """The larger relative difference between the halves' medians (writer, floor)."""
        a, b = (h.quantile(0.5) for h in self.halves)
        fa, fb = (statistics.median(h) for h in self.floor_halves)
        return max(abs(a - b) / ((a + b) / 2), abs(fa - fb) / ((fa + fb) / 2))


def p90(xs: Sequence[float]) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[-1]


def run_cell(
    writer: processes.PayloadrunProcess,
    upstream: str,
    root: Path,
    size_mib: int,
    conc: int,
    count: int,
) -> Cell:
    size = size_mib * MIB
    cell = Cell(size_mib, conc)
    vdir = root / "v1"
    floor_dir = root / "floor"
    floor_dir.mkdir(exist_ok=True)
    body = request_body(size, str(vdir), tag=size_mib * 100 + conc)
    direct_body = request_body(size, None, tag=size_mib * 100 + conc)
    direct = asyncio.run(post_all(upstream + PATH, direct_body, 1, HEADERS))[0]
    cell.inline_bytes = len(direct)
    text = json.loads(direct)["choices"][0]["routed_experts"].encode()
    # warm: the fake prepares the answer, the writer's pool and connections start
    cell.handle_bytes = len(asyncio.run(post_all(writer.url + PATH, body, conc, HEADERS))[0])
    clear(vdir)
    rounds = max(2, -(-count // conc))
    with ThreadPoolExecutor(conc) as pool:
        floor_round(pool, floor_dir, text, conc)  # warm the threads
        for r in range(rounds):
            floor_first = r % 2 == 1
            if floor_first:
                took = floor_round(pool, floor_dir, text, conc)
            before = scrape(writer.metrics_url)
            asyncio.run(post_all(writer.url + PATH, body, conc, HEADERS))
            after = scrape(writer.metrics_url)
            if not floor_first:
                took = floor_round(pool, floor_dir, text, conc)
            clear(vdir)
            cell.work.add(before, after)
            cell.halves[r % 2].add(before, after)
            cell.floor.extend(took)
            cell.floor_halves[r % 2].extend(took)
            cell.cpu_seconds += value(after, "process_cpu_seconds_total") - value(
                before, "process_cpu_seconds_total"
            )
            cell.payload_bytes += value(
                after, "payloadrun_writer_payload_written_bytes_total", field="routed_experts"
            ) - value(
                before, "payloadrun_writer_payload_written_bytes_total", field="routed_experts"
            )
    return cell


# --- many large answers at once ------------------------------------------------------------------


def vm_hwm(pid: int) -> int:
    """The peak resident set of a process, in bytes (``VmHWM`` in /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


@dataclass
class Peak:
    count: int
    size_mib: int
    errors: int
    peak_rss: int
    start_rss: int
    reserved_peak: float
    waits: float
    seconds: float


def run_peak(upstream: str, root: Path, count: int, size_mib: int) -> Peak:
    vdir = root / "v2"
    body = request_body(size_mib * MIB, str(vdir), tag=7)
    headers = {**HEADERS, "x-fake-hold": str(count)}
    with processes.writer(
        upstream, root, "--log-level=WARNING", "--in-flight-budget", PEAK_BUDGET
    ) as writer:
        start_rss = vm_hwm(writer.pid)

        async def all_at_once() -> int:
            timeout = aiohttp.ClientTimeout(total=600)
            async with aiohttp.ClientSession(timeout=timeout) as session:

                async def one() -> bool:
                    async with session.post(writer.url + PATH, data=body, headers=headers) as r:
                        await r.read()
                        return r.status == 200 and r.headers.get("X-Payloadrun-Mode") == "handle"

                results = await asyncio.gather(*(one() for _ in range(count)))
                return sum(not ok for ok in results)

        t0 = time.perf_counter()
        errors = asyncio.run(all_at_once())
        took = time.perf_counter() - t0
        m = scrape(writer.metrics_url)
        peak = vm_hwm(writer.pid)
    shutil.rmtree(vdir, ignore_errors=True)
    return Peak(
        count,
        size_mib,
        errors,
        peak,
        start_rss,
        value(m, "payloadrun_writer_in_flight_peak_bytes"),
        value(m, "payloadrun_writer_budget_waits_total"),
        took,
    )


# --- main ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 8 MiB, 16 requests a cell")
    parser.add_argument("--sizes", default="1,8,32", help="payload sizes in MiB")
    parser.add_argument("--concurrency", default="1,8", help="concurrent requests")
    parser.add_argument("--requests", type=int, default=256, help="requests per cell")
    parser.add_argument("--peak-count", type=int, default=32, help="answers released together")
    parser.add_argument("--peak-size", type=int, default=32, help="their size in MiB")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--root", type=Path, help="where to make the payload root (default: the temp directory)"
    )
    args = parser.parse_args()
    sizes = [1, 8] if args.quick else [int(s) for s in args.sizes.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    count = 16 if args.quick else args.requests
    peak_count = 8 if args.quick else args.peak_count

    load_start = report.print_load("start")
    tmp = Path(tempfile.mkdtemp(prefix="payloadrun-bench-", dir=args.root)).resolve()
    root = tmp / "payloads"
    root.mkdir()
    procs = []
    cells: list[Cell] = []
    try:
        fake = processes.fake_vllm(
            "--layers=48", "--top-k=8", "--experts=128", "--no-sampling-mask"
        )
        procs.append(fake.start())
        writer = processes.writer(fake.url, root, "--log-level=WARNING")
        procs.append(writer.start())
        print(f"payload root {root}; {count} requests per cell, rounds alternate with the floor\n")
        head = (
            f"{'payload':>8} {'conc':>4} | {'inline B':>11} {'handle B':>9} {'ratio':>6} | "
            f"{'work p50':>8} {'p90':>7} {'floor p50':>9} {'p90':>7} {'p50/fl':>6} {'p90/fl':>6} "
            f"{'halves':>6} | {'CPU s/GB':>8}"
        )
        print(head)
        print("-" * len(head))
        for size_mib in sizes:
            for conc in concurrencies:
                cell = run_cell(writer, fake.url, root, size_mib, conc, count)
                cells.append(cell)
                w50, w90 = cell.work.quantile(0.5), cell.work.quantile(0.9)
                f50, f90 = statistics.median(cell.floor), p90(cell.floor)
                cpu = cell.cpu_seconds / (cell.payload_bytes / 1e9)
                print(
                    f"{size_mib:>4} MiB {conc:>4} | {cell.inline_bytes:>11,} "
                    f"{cell.handle_bytes:>9,} {cell.inline_bytes / cell.handle_bytes:>5.0f}x | "
                    f"{w50 * 1e3:>6.1f}ms {w90 * 1e3:>5.1f}ms {f50 * 1e3:>7.1f}ms "
                    f"{f90 * 1e3:>5.1f}ms {w50 / f50:>5.2f}x {w90 / f90:>5.2f}x "
                    f"{cell.spread:>6.1%} | {cpu:>8.2f}",
                    flush=True,
                )
        print(
            f"\npeak memory: {peak_count} answers of {args.peak_size} MiB released at once "
            f"through a writer with --in-flight-budget {PEAK_BUDGET} ...",
            flush=True,
        )
        peak = run_peak(fake.url, root, peak_count, args.peak_size)
        print(
            f"  {peak.errors} errors in {peak.seconds:.1f} s; writer peak RSS "
            f"{peak.peak_rss / MIB:.0f} MiB (at start {peak.start_rss / MIB:.0f} MiB); most "
            f"reserved at once {peak.reserved_peak / MIB:.0f} MiB; {peak.waits:.0f} answers "
            "waited for the budget\n"
        )
    finally:
        for proc in procs:
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    goals: list[report.Goal] = []
    for c in cells:
        name = f"{c.size_mib} MiB x{c.concurrency}"
        if c.size_mib >= 8:
            goals.append(
                report.Goal.at_least(
                    f"response bytes ratio, {name}", c.inline_bytes / c.handle_bytes, 50
                )
            )
            goals.append(report.Goal.at_most(f"writer work / floor (p50), {name}", c.ratio, 1.5))
    goals.append(report.Goal.at_most("peak case: errors", peak.errors, 0))
    goals.append(
        report.Goal.at_most(
            f"peak case: RSS MiB ({PEAK_BUDGET} budget)",
            peak.peak_rss / MIB,
            PEAK_BUDGET_BYTES / MIB,
        )
    )
    result = report.print_goals(goals)
    load_end = report.print_load("end")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "load_start": load_start,
                    "load_end": load_end,
                    "goals": result,
                    "cells": [
                        {
                            "size_mib": c.size_mib,
                            "concurrency": c.concurrency,
                            "work_p50_s": c.work.quantile(0.5),
                            "work_p90_s": c.work.quantile(0.9),
                            "work_mean_s": c.work.sum / c.work.total,
                            "floor_p50_s": statistics.median(c.floor),
                            "floor_p90_s": p90(c.floor),
                            "spread": c.spread,
                            "cpu_s_per_gb": c.cpu_seconds / (c.payload_bytes / 1e9),
                            "inline_bytes": c.inline_bytes,
                            "handle_bytes": c.handle_bytes,
                        }
                        for c in cells
                    ],
                    "peak": peak.__dict__,
                },
                indent=1,
            )
        )
    return 0 if all(g.met for g in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
