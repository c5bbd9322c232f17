"""Prefix-cache hits of multi-turn rollouts through one writer in front of two real vLLM engines.

Each turn of a multi-turn rollout re-sends the conversation so far; only the engine that served
the previous turn holds that prefix in its cache. The writer fronts its pod's API servers and
picks per request: the least busy, or, for a request naming its session (``X-Session-ID``, the
header verifiers sends and prime-rl's router hashes), the session's own engine.

Two real vLLM engines (the CPU build and tiny Qwen3-MoE of ``hack/vllm.sh``, with
``--enable-prefix-caching``) behind one ``payloadrun writer``; ``--sessions`` S rollouts of
``--turns`` T turns run at once (each turn: the previous prompt, the answer, ``--new-tokens``
more, after a random delay of mean ``--tool-seconds``, as a tool call takes), twice on the same
engines with fresh prompts: without the header (the baseline: fewest in flight) and with it. Per
run: the prefix-cache hit rate (``vllm:prefix_cache_hits_total`` over
``vllm:prefix_cache_queries_total``, summed over both engines, counted from the second turn on:
a first turn's prompt is new and hits nothing), and the share of what the previous turns left in
their engine's cache that was hit (whole blocks of 32 tokens, the smallest vLLM's CPU attention
takes, of each previous turn's prompt and completion). Goal: with the header, every turn reuses
all of it (>= 0.99); the hit rates with and without, and their ratio, are figures.

Bounded: S x T x 2 requests, loopback only; about two minutes on two cores (most of it the two
engines' start). Run under the machine lock: ``flock /tmp/payloadrun-machine.lock python
bench/session_affinity.py``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import report
from payloadrun.testing import processes
from payloadrun.writer.upstreams import SESSION_HEADER

REPO = Path(__file__).resolve().parents[1]
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
VOCAB = 512  # the tiny model's
BLOCK = 32  # tokens a cache block holds: the smallest vLLM's CPU attention takes (GPUs: 16)


def vllm_dir() -> str:
    out = subprocess.run(["bash", str(REPO / "hack" / "vllm.sh"), "--installed"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if out.returncode:
        sys.exit(f"session_affinity: {out.stderr.strip()} (bash hack/vllm.sh, or make vllm)")
    return out.stdout.strip()


def counters(urls: list[str]) -> tuple[float, float]:
    """Prefix-cache hits and queries (tokens), summed over the engines."""
    scraped = [report.scrape(url + "/metrics") for url in urls]
    return (
        sum(v for m in scraped for (name, _), v in m.items() if name == HITS),
        sum(v for m in scraped for (name, _), v in m.items() if name == QUERIES),
    )


def post(url: str, body: dict, headers: dict[str, str]) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())


def rollouts(args, front: str, engines: list[str], with_session: bool, seed: int) -> dict:
    """S rollouts of T turns at once, each turn after its environment's random delay (a tool
    call's latency): the prefix-cache hit rate of every turn but the first (a first turn's
    prompt is new random tokens: it hits nothing, so its tokens are taken out of the queries)."""
    before = counters(engines)
    errors: list[BaseException] = []

    def rollout(s: int) -> None:
        rng = random.Random(seed * 1000 + s)
        headers = {SESSION_HEADER: f"rollout-{seed}-{s}"} if with_session else {}
        prompt = [rng.randrange(10, VOCAB) for _ in range(args.prompt_tokens)]
        params = {"max_tokens": args.completion_tokens, "temperature": 1.0, "ignore_eos": True}
        try:
            for _ in range(args.turns):
                time.sleep(rng.expovariate(1 / args.tool_seconds))
                body = {"model": "tiny-qwen3-moe", "token_ids": prompt, "sampling_params": params}
                answer = post(front + "/inference/v1/generate", body, headers)
                completion = answer["choices"][0]["token_ids"]
                new = [rng.randrange(10, VOCAB) for _ in range(args.new_tokens)]
                prompt = prompt + completion + new
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rollout, args=(s,)) for s in range(args.sessions)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    after = counters(engines)
    hits = after[0] - before[0]
    queries = after[1] - before[1] - args.sessions * args.prompt_tokens
    return {
        "hit_rate": hits / queries if queries else 0.0,
        "reused": hits / reusable(args) if reusable(args) else 0.0,
        "hits": hits,
        "queries": queries,
    }


def reusable(args) -> int:
    """The prompt tokens a turn's own engine can serve from cache, summed over every rollout's
    turns but the first: the whole blocks of what the previous turn computed (its prompt and its
    completion but the last token, which is never forwarded)."""
    total, prompt = 0, args.prompt_tokens
    for _ in range(1, args.turns):
        total += (prompt + args.completion_tokens - 1) // BLOCK * BLOCK
        prompt += args.completion_tokens + args.new_tokens
    return total * args.sessions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=8, help="rollouts at once")
    p.add_argument("--turns", type=int, default=4, help="turns per rollout")
    p.add_argument("--prompt-tokens", type=int, default=256, help="the first turn's prompt")
    p.add_argument("--completion-tokens", type=int, default=16, help="tokens each turn samples")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens each later turn adds")
    p.add_argument(
        "--tool-seconds", type=float, default=0.2, help="mean delay before each turn (a tool)"
    )
    args = p.parse_args(argv)
    last = args.prompt_tokens + (args.turns - 1) * (args.completion_tokens + args.new_tokens)
    if last + args.completion_tokens > 1024:
        p.error(f"the last turn would hold {last} prompt tokens: the tiny model takes 1,024")
    report.print_load("start")
    directory = vllm_dir()
    with tempfile.TemporaryDirectory(prefix="payloadrun-affinity-") as tmp:
        logs = [Path(tmp) / f"vllm{i}.log" for i in range(2)]
        started = time.monotonic()
        engines = [
            processes.VLLMServer(
                directory, "--enable-prefix-caching", "--block-size", str(BLOCK), log_path=log
            ).start()
            for log in logs
        ]
        try:
            print(f"two vLLM engines up in {time.monotonic() - started:.0f} s", flush=True)
            urls = [e.url for e in engines]
            with processes.writer(",".join(urls), Path(tmp) / "payloads") as front:
                runs = {}
                for name, with_session, seed in (("without", False, 1), ("with", True, 2)):
                    runs[name] = rollouts(args, front.url, urls, with_session, seed)
                    run = runs[name]
                    print(f"{name} X-Session-ID: hit rate {run['hit_rate']:.3f} "
                          f"({run['hits']:.0f} of {run['queries']:.0f} prompt tokens from the "
                          f"second turn on), {run['reused']:.3f} of the {reusable(args)} the "
                          "previous turns left in cache", flush=True)  # fmt: skip
        finally:
            for e in engines:
                e.stop()
    ratio = runs["with"]["hit_rate"] / max(runs["without"]["hit_rate"], 1e-9)
    computed = (runs["without"]["queries"] - runs["without"]["hits"]) / (
        runs["with"]["queries"] - runs["with"]["hits"]
    )
    goals = [
        report.Goal.at_least(
            "cached prefix reused, with X-Session-ID", runs["with"]["reused"], 0.99
        ),
        report.Goal.figure("cached prefix reused, without", runs["without"]["reused"]),
        report.Goal.figure("hit rate with / without X-Session-ID", ratio),
        report.Goal.figure("prompt tokens computed, without / with", computed),
    ]
    report.print_goals(goals, "{:.3f}".format)
    report.print_load("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
