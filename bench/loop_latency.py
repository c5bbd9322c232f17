"""The writer's event loop while it handles a 60 MB answer: how long ``/healthz`` waits.

Parsing, decoding and writing a big answer run on worker threads, and the base64 is decoded in
slices, so that the loop that serves every other request is never held for long. This measures
it, as ratios against figures of the same run (a wall-clock limit in a test would only measure
how busy the machine is): ``/healthz`` polled every 5 ms on one connection, first with the writer
idle (the baseline), then while it handles ``--requests`` answers of 60 MB (120,000 tokens of
Qwen3-30B-A3B routing: 48 layers x top-8) one after the other.

- **worst poll / request**: the longest ``/healthz`` wait during a request over that request's
  duration (the share of it the loop was unavailable at a stretch; doing the work on the loop
  holds it for most of the request, about 0.8 of it measured);
- **median poll / idle median**: how much slower a typical poll is while a request is handled.

Goals: worst poll <= 0.25 of the request; median poll <= 10x idle. Bounded: a fixed number of
requests and polls, loopback only. Run: ``python bench/loop_latency.py`` (about 20 s).
"""

from __future__ import annotations

import argparse
import http.client as httpclient
import json
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import report
from payloadrun.testing import processes

PATH = "/inference/v1/generate"
TOKENS = 120_000
IDLE_POLLS = 400


def poll(port: int, stop: threading.Event, latencies: list[float], limit: int | None = None):
    """``GET /healthz`` every 5 ms until ``stop`` (or ``limit`` polls); each wait recorded."""
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.is_set() and (limit is None or len(latencies) < limit):
        start = time.perf_counter()
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        latencies.append(time.perf_counter() - start)
        time.sleep(0.005)
    conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5, help="60 MB answers, one at a time")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    load_start = report.print_load("start")
    tmp = Path(tempfile.mkdtemp(prefix="payloadrun-bench-loop-")).resolve()
    root = tmp / "payloads"
    root.mkdir()
    procs = []
    try:
        fake = processes.fake_vllm("--layers=48", "--top-k=8", "--no-sampling-mask")
        procs.append(fake.start())
        writer = processes.writer(fake.url, root, "--log-level=WARNING")
        procs.append(writer.start())
        port = int(writer.url.rsplit(":", 1)[1])
        idle: list[float] = []
        poll(port, threading.Event(), idle, IDLE_POLLS)
        body = json.dumps(
            {
                "token_ids": list(range(TOKENS)),
                "sampling_params": {"max_tokens": 16, "extra_args": {"payload_dir": f"{root}/v1"}},
            }
        ).encode()
        worst_share, medians = [], []
        for _ in range(args.requests):
            stop, during = threading.Event(), []
            poller = threading.Thread(target=poll, args=(port, stop, during))
            poller.start()
            started = time.perf_counter()
            req = urllib.request.Request(
                writer.url + PATH, body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=120) as resp:
                assert resp.headers["x-payloadrun-mode"] == "handle", dict(resp.headers)
                resp.read()
            took = time.perf_counter() - started
            stop.set()
            poller.join()
            worst_share.append(max(during) / took)
            medians.append(statistics.median(during))
            shutil.rmtree(root / "v1", ignore_errors=True)
            print(
                f"request {took:.2f} s: {len(during)} polls, worst {max(during) * 1e3:.1f} ms, "
                f"median {statistics.median(during) * 1e3:.2f} ms"
            )
        idle_median = statistics.median(idle)
        print(f"idle: {len(idle)} polls, median {idle_median * 1e3:.2f} ms\n")
        goals = [
            report.Goal.at_most("worst poll / request", max(worst_share), 0.25),
            report.Goal.at_most(
                "median poll / idle median", statistics.median(medians) / idle_median, 10
            ),
        ]
        results = report.print_goals(goals)
        load_end = report.print_load("end")
        if args.json:
            args.json.write_text(
                json.dumps({"goals": results, "load": [load_start, load_end]}, indent=2)
            )
        return 0 if all(g.met for g in goals) else 1
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
