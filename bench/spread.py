"""How evenly requests spread over a pod's vLLM API servers: one writer per pod vs a port each.

Issue 36: a multi-node replica runs several vLLM API servers per pod, one per data-parallel rank
on consecutive ports. kube-proxy balances per connection, and prime-rl's orchestrator (httpx or
aiohttp) keeps a keep-alive pool, so a Service port per API server would pin each connection to
the server it met at connect. The writer instead fronts every local API server and chooses per
request (fewest in flight, ties round robin).

One fake vLLM process serves 4 API servers (``--api-servers 4``); generations take a seeded
random time (``x-fake-delay``, exponential around ``--delay-ms``, the same sequence in every
round) so that requests overlap as generations do. A client with a keep-alive pool of
``--connections`` K sends ``--requests`` N requests, K at a time, in two ways, alternating:

- **pinned** (the baseline): straight at the API servers, each of the K connections to one
  server chosen at random when it connects (a new seed each round): what per-connection
  balancing gives;
- **writer**: through one ``payloadrun writer`` process with ``--upstream`` listing the 4.

Per round: requests per API server (from the ``x-fake-server`` header each answer carries, checked
against the servers' own ``/fake/stats``), max/min and the coefficient of variation (population
standard deviation / mean), and the max/min of the generation seconds each server served (the
work: fewest-in-flight balances busy time, so requests of unequal length leave the counts a few
percent apart where the work is even). Goals, through the writer in every round: requests CV <=
0.05 and work max/min <= 1.10; and the mean CV pinned / writer >= 5.

``--compare-writer DIR`` adds the single-upstream hot path: a writer from another checkout
(``DIR/sidecars`` on its PYTHONPATH: the code before this change, from ``git archive``) and this
one, each in front of one API server, in alternating rounds of N requests at K at a time with no
generation delay; new / old of the medians over rounds of the writer's CPU seconds per request
(its ``process_cpu_seconds_total``: the steadiest figure on a shared machine), of each round's
p50 latency (goal <= 1.05 for both) and of throughput (goal >= 0.95).

Bounded: a fixed number of requests, loopback only. Run under the machine lock:
``flock /tmp/payloadrun-machine.lock python bench/spread.py --compare-writer DIR`` (about two
minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp

import report
from payloadrun.testing import processes
from payloadrun.testing.fakevllm import SERVER_HEADER

PATH = "/v1/completions"
BODY = json.dumps({"prompt": "spread", "max_tokens": 4}).encode()
API_SERVERS = 4


def max_min(values: list[float]) -> float:
    return max(values) / min(values) if min(values) > 0 else float("inf")


def cv(values: list[float]) -> float:
    """Coefficient of variation: population standard deviation / mean."""
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean else 0.0


@dataclass(frozen=True)
class Round:
    mode: str
    counts: list[int]  # requests per API server, in port order
    work: list[float]  # seconds of generation per API server (the x-fake-delay it served)
    seconds: float
    p50_ms: float

    @property
    def max_min(self) -> float:
        return max_min(self.counts)

    @property
    def cv(self) -> float:
        return cv(self.counts)

    @property
    def work_max_min(self) -> float:
        return max_min(self.work)


def delays(count: int, mean_ms: float, seed: int = 36) -> list[float]:
    """Seeded generation times (seconds): exponential around ``mean_ms``, at most 5x it."""
    rng = random.Random(seed)
    return [min(rng.expovariate(1.0 / mean_ms), 5 * mean_ms) / 1000 for _ in range(count)]


async def drive(
    urls: list[str], times: list[float], connections: int
) -> tuple[Counter, Counter, list[float]]:
    """Every request of ``times`` over ``connections`` keep-alive connections, one worker each:
    ``urls[w]`` for worker ``w`` (its own pool of one: a pinned connection) or, with one URL,
    one shared pool of ``connections``. Requests and generation seconds per ``x-fake-server``
    (the port that answered), and latencies."""
    queue = list(enumerate(times))
    queue.reverse()
    served: Counter = Counter()
    work: Counter = Counter()
    latencies: list[float] = []
    shared = len(urls) == 1
    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections if shared else 1))
        for _ in range(1 if shared else connections)
    ]

    async def worker(w: int) -> None:
        session = sessions[0 if shared else w]
        url = (urls[0] if shared else urls[w]) + PATH
        while queue:
            _, delay = queue.pop()
            headers = {"Content-Type": "application/json"}
            if delay:
                headers["x-fake-delay"] = f"{delay:.5f}"
            started = time.perf_counter()
            async with session.post(url, data=BODY, headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url} answered {resp.status}")
                served[resp.headers[SERVER_HEADER]] += 1
                work[resp.headers[SERVER_HEADER]] += delay
            latencies.append(time.perf_counter() - started)

    try:
        await asyncio.gather(*(worker(w) for w in range(connections)))
    finally:
        for session in sessions:
            await session.close()
    return served, work, latencies


def stats_of(urls: list[str]) -> list[int]:
    """Requests each API server counted on its own (``/fake/stats``)."""
    out = []
    for url in urls:
        with urllib.request.urlopen(url + "/fake/stats", timeout=10) as resp:
            out.append(int(json.loads(resp.read()).get(PATH, 0)))
    return out


def one_round(mode: str, targets: list[str], servers: list[str], times, k: int) -> Round:
    before = stats_of(servers)
    started = time.perf_counter()
    served, work, latencies = asyncio.run(drive(targets, times, k))
    seconds = time.perf_counter() - started
    after = stats_of(servers)
    ports = [url.rsplit(":", 1)[1] for url in servers]
    counts = [served[port] for port in ports]
    seen = [a - b for a, b in zip(after, before, strict=True)]
    if counts != seen:
        raise RuntimeError(f"headers counted {counts}, the servers' stats {seen}")
    p50_ms = statistics.median(latencies) * 1000
    return Round(mode, counts, [work[p] for p in ports], seconds, p50_ms)


def print_rounds(rounds: list[Round], servers: list[str]) -> None:
    ports = [u.rsplit(":", 1)[1] for u in servers]
    head = f"{'round':<12}" + "".join(f"{':' + p:>8}" for p in ports)
    head += f"{'max/min':>9}{'CV':>7}{'work max/min':>14}{'req/s':>8}{'p50 ms':>8}"
    print(head)
    print("-" * len(head))
    for i, r in enumerate(rounds):
        cells = "".join(f"{c:>8}" for c in r.counts)
        rate = sum(r.counts) / r.seconds
        print(
            f"{r.mode + ' ' + str(i // 2 + 1):<12}{cells}{r.max_min:>9.2f}{r.cv:>7.3f}"
            f"{r.work_max_min:>14.2f}{rate:>8.0f}{r.p50_ms:>8.1f}"
        )


def spread(args: argparse.Namespace, tmp: Path) -> list[report.Goal]:
    times = delays(args.requests, args.delay_ms)
    with processes.fake_vllm(api_servers=API_SERVERS) as fake:
        servers = fake.urls
        with processes.writer(",".join(servers), tmp / "payloads") as writer:
            print(
                f"{args.requests} requests a round, {args.connections} keep-alive connections, "
                f"generations {args.delay_ms:g} ms on average (exponential, seeded); "
                f"{API_SERVERS} API servers on ports {servers[0].rsplit(':', 1)[1]}+\n"
            )
            rounds = []
            for i in range(args.rounds):
                rng = random.Random(1000 + i)
                pinned = [rng.choice(servers) for _ in range(args.connections)]
                rounds.append(one_round("pinned", pinned, servers, times, args.connections))
                rounds.append(one_round("writer", [writer.url], servers, times, args.connections))
            print_rounds(rounds, servers)
    pinned_r = [r for r in rounds if r.mode == "pinned"]
    writer_r = [r for r in rounds if r.mode == "writer"]
    pinned_cv = statistics.fmean(r.cv for r in pinned_r)
    writer_cv = statistics.fmean(r.cv for r in writer_r)
    cv_ratio = pinned_cv / writer_cv if writer_cv else float("inf")

    def summary(rs: list[Round]) -> str:
        return (
            f"max/min {statistics.fmean(r.max_min for r in rs):.2f} (worst "
            f"{max(r.max_min for r in rs):.2f}), CV {statistics.fmean(r.cv for r in rs):.3f}, "
            f"work max/min {statistics.fmean(r.work_max_min for r in rs):.2f}"
        )

    print(
        f"\nmean over {args.rounds} rounds: pinned {summary(pinned_r)}; writer "
        f"{summary(writer_r)}; CV pinned / writer {cv_ratio:.1f}x\n"
    )
    return [
        report.Goal.at_most("writer requests CV, worst round", max(r.cv for r in writer_r), 0.05),
        report.Goal.at_most(
            "writer work max/min, worst round", max(r.work_max_min for r in writer_r), 1.10
        ),
        report.Goal.at_least("requests CV, pinned / writer (mean)", cv_ratio, 5.0),
    ]


def hot_path(args: argparse.Namespace, tmp: Path) -> list[report.Goal]:
    """This writer against another checkout's, each in front of one API server."""
    old_path = Path(args.compare_writer).resolve() / "sidecars"
    if not (old_path / "payloadrun" / "writer").is_dir():
        sys.exit(f"--compare-writer {args.compare_writer}: no sidecars/payloadrun/writer there")
    env = {"PYTHONPATH": os.pathsep.join([str(old_path), os.environ.get("PYTHONPATH", "")])}
    times = [0.0] * args.requests
    with (
        processes.fake_vllm() as fake,
        processes.writer(fake.url, tmp / "new") as new,
        processes.writer(fake.url, tmp / "old", env=env) as old,
    ):
        rounds: dict[str, list[Round]] = {"old": [], "new": []}
        cpu: dict[str, list[float]] = {"old": [], "new": []}  # writer CPU µs per request
        for _ in range(args.rounds):
            for name, w in (("old", old), ("new", new)):
                before = report.value(report.scrape(w.metrics_url), "process_cpu_seconds_total")
                rounds[name].append(one_round(name, [w.url], [fake.url], times, args.connections))
                after = report.value(report.scrape(w.metrics_url), "process_cpu_seconds_total")
                cpu[name].append((after - before) / args.requests * 1e6)
    p50 = {name: statistics.median(r.p50_ms for r in rs) for name, rs in rounds.items()}
    rate = {
        name: statistics.median(sum(r.counts) / r.seconds for r in rs)
        for name, rs in rounds.items()
    }
    us = {name: statistics.median(values) for name, values in cpu.items()}
    print(
        f"single upstream, {args.requests} requests at {args.connections} at a time, no "
        f"generation delay, {args.rounds} alternating rounds each (medians of rounds):\n"
        f"  old writer ({args.compare_writer}): p50 {p50['old']:.2f} ms, {rate['old']:.0f} "
        f"req/s, {us['old']:.0f} µs of writer CPU per request\n"
        f"  this writer: p50 {p50['new']:.2f} ms, {rate['new']:.0f} req/s, {us['new']:.0f} µs "
        "of writer CPU per request\n"
        f"  new / old: p50 {p50['new'] / p50['old']:.3f}, throughput "
        f"{rate['new'] / rate['old']:.3f}, CPU per request {us['new'] / us['old']:.3f}\n"
    )
    return [
        report.Goal.at_most("single upstream CPU/request, new / old", us["new"] / us["old"], 1.05),
        report.Goal.at_most("single upstream p50, new / old", p50["new"] / p50["old"], 1.05),
        report.Goal.at_least("single upstream req/s, new / old", rate["new"] / rate["old"], 0.95),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests a round")
    parser.add_argument("--connections", type=int, default=8, help="the client's keep-alive pool")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each kind")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="mean generation time")
    parser.add_argument(
        "--compare-writer",
        metavar="DIR",
        help="a checkout of the writer before this change: also compare the single-upstream hot "
        "path, old against new",
    )
    args = parser.parse_args()
    if not 0 < args.requests <= 20_000 or not 0 < args.connections <= 64:
        sys.exit("--requests must be 1 to 20000 and --connections 1 to 64 (a bounded benchmark)")
    report.print_load("start")
    with tempfile.TemporaryDirectory(prefix="payloadrun-spread-") as tmp:
        goals = spread(args, Path(tmp))
        if args.compare_writer:
            goals += hot_path(args, Path(tmp))
    report.print_goals(goals, "{:.3f}".format)
    report.print_load("end")
    return 0 if all(g.met for g in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
