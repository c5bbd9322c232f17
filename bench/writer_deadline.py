"""The writer's write deadline and breaker on a real GlusterFS volume (issue 33), in one run.

Starts a GlusterFS volume on loopback (``payloadrun_devcluster.glusterfs``; root, Debian's
``glusterfs-server`` and ``glusterfs-client``, the volume's default ``network.ping-timeout`` of
42 s) with one client, the fake vLLM (vLLM's wire format, Qwen3-30B-A3B routing: 384 B a token,
answers served from its cache, ``x-fake-cache``) and two writers on that client: one with the
deadline (``--write-deadline``, default) and one without (``--write-deadline 0``: today's path,
writes on the request pool). Then:

1. **Write times** that the default deadline is chosen from: ``PayloadStore.write`` (create,
   write, fsync, close) of 1, 4, 16 and 64 MiB files through the client, ``--reps`` each.
2. **Overhead** with a healthy volume: the writer's own work per by-handle answer (the mean of
   ``payloadrun_writer_response_work_seconds{mode="handle"}``, exact from its sum and count),
   deadline and breaker on against off, in alternating rounds. Goal: ratio <= 1.05.
3. **Hang to first inline answer**: the brick SIGSTOPped, one request at once: the time until
   its answer (inline, ``write_timeout``), against the deadline plus vLLM's own time for the
   same request (asked straight after). Goal: <= deadline + 100 ms (vLLM's time taken off).
   The brick is then continued, and the writer's late write is waited for (its file removed).
4. **What a long outage costs**: the bytes of one answer inline and by handle, for the
   payload sizes of step 2, and per batch of ``--batch`` answers.

    sudo python bench/writer_deadline.py          # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

import report
from payloadrun.codec import PositionedRows
from payloadrun.store import PayloadStore
from payloadrun.testing import processes
from payloadrun_devcluster.glusterfs import GlusterServer, teardown, unsupported_reason
from report import scrape, value

MIB = 1 << 20
ROW_BYTES = 48 * 8
MAX_TOKENS = 16
PATH = "/inference/v1/generate"
HEADERS = {"Content-Type": "application/json", "x-fake-cache": "1"}
WORK = "payloadrun_writer_response_work_seconds"


def request_body(size: int, payload_dir: str, tag: int = 0) -> bytes:
    rows = max(1, size // ROW_BYTES)
    prompt_len = rows - MAX_TOKENS + 1
    params = {"max_tokens": MAX_TOKENS, "extra_args": {"payload_dir": payload_dir}}
    return json.dumps(
        {"token_ids": [tag, *range(prompt_len - 1)], "sampling_params": params}
    ).encode()


def post(url: str, body: bytes, timeout: float = 300) -> tuple[float, dict[str, str], bytes]:
    started = time.perf_counter()
    req = urllib.request.Request(url + PATH, body, HEADERS, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
    return time.perf_counter() - started, headers, data


def write_times(root: Path, sizes_mib: list[int], reps: int) -> dict[int, list[float]]:
    store = PayloadStore(root)
    out: dict[int, list[float]] = {}
    for size in sizes_mib:
        rows = np.random.default_rng(size).integers(0, 128, (size * MIB // ROW_BYTES, 48, 8))
        rows = rows.astype(np.uint8)
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            (seg,) = store.write(f"{root}/v0", [PositionedRows("routed_experts", rows, 0)])
            times.append(time.perf_counter() - started)
            Path(seg.file).unlink()
        out[size] = times
    return out


def work_mean(before: dict, after: dict) -> tuple[float, float]:
    """(seconds summed, answers) of the by-handle work histogram between two scrapes."""
    total = value(after, WORK + "_sum", mode="handle") - value(before, WORK + "_sum", mode="handle")
    count = value(after, WORK + "_count", mode="handle") - value(
        before, WORK + "_count", mode="handle"
    )
    return total, count


def overhead(
    writers: dict[str, processes.PayloadrunProcess], run_root: Path, size: int, rounds: int, n: int
) -> dict[str, float]:
    """Mean writer work per by-handle answer, per writer, over alternating rounds."""
    sums = {name: [0.0, 0.0] for name in writers}
    body = request_body(size, f"{run_root}/v1")
    for proc in writers.values():  # warm: the fake's cache, the writers' pools
        for _ in range(2):
            post(proc.url, body)
    for r in range(rounds):
        order = list(writers.items()) if r % 2 == 0 else list(writers.items())[::-1]
        for name, proc in order:
            before = scrape(proc.metrics_url)
            for _ in range(n):
                _, headers, _ = post(proc.url, body)
                assert headers["x-payloadrun-mode"] == "handle", headers
            total, count = work_mean(before, scrape(proc.metrics_url))
            sums[name][0] += total
            sums[name][1] += count
            for f in (run_root / "v1").glob("*.bin"):
                f.unlink()
    return {name: s / c for name, (s, c) in sums.items()}


def hang_to_inline(volume, proc, fake, run_root: Path, size: int) -> tuple[float, float, str]:
    """(seconds from SIGSTOP to the answer, vLLM's own seconds for it, the fallback reason)."""
    body = request_body(size, f"{run_root}/v2", tag=7)
    post(fake.url, body)  # the fake's cache holds the answer: vLLM's time is its own
    pid = volume.pause_brick()
    try:
        started = time.perf_counter()
        _, headers, _ = post(proc.url, body)
        elapsed = time.perf_counter() - started
        vllm_seconds, _, _ = post(fake.url, body)
    finally:
        volume.resume_brick(pid)
    volume.clients_reconnected()
    return elapsed, vllm_seconds, headers.get("x-payloadrun-fallback", "")


def wait_released(proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while value(scrape(proc.metrics_url), "payloadrun_writer_write_threads_held") > 0:
        if time.monotonic() > deadline:
            raise SystemExit("the late write never returned")
        time.sleep(0.1)


def outage_cost(proc, fake, run_root: Path, sizes: list[int]) -> list[tuple[int, int, int]]:
    """(payload bytes, body bytes inline, body bytes by handle) for one answer of each size."""
    out = []
    for size in sizes:
        body = request_body(size, f"{run_root}/v3", tag=11)
        _, _, inline = post(fake.url, body)
        _, headers, handle = post(proc.url, body)
        assert headers["x-payloadrun-mode"] == "handle", headers
        out.append((size, len(inline), len(handle)))
    for f in (run_root / "v3").glob("*.bin"):
        f.unlink()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="writes per file size (step 1)")
    parser.add_argument("--size-mib", type=int, default=4, help="payload per answer (step 2)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds (step 2)")
    parser.add_argument("--requests", type=int, default=20, help="answers per round (step 2)")
    parser.add_argument("--batch", type=int, default=512, help="answers per batch (step 4)")
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason:
        print(f"GlusterFS cannot run here: {reason}", file=sys.stderr)
        return 2
    report.print_load("start")
    server = GlusterServer.ensure()
    with tempfile.TemporaryDirectory(prefix="payloadrun-bench-deadline-") as tmp:
        try:  # the volume and its mount go before the directory they are in
            base = Path(tmp)
            volume = server.create_volume(base / "server")  # default network.ping-timeout: 42 s
            mount = volume.mount(base / "writer")
            run_root = mount.path / "run"
            run_root.mkdir()
            return measure(args, volume, run_root)
        finally:
            teardown(server)


def measure(args, volume, run_root: Path) -> int:
    print(f"GlusterFS volume {volume.name}: default settings (network.ping-timeout 42 s)")
    times = write_times(run_root, [1, 4, 16, 64], args.reps)
    print("\n1. PayloadStore.write (create, write, fsync, close) on GlusterFS, seconds:")
    print(f"{'MiB':>5} {'min':>8} {'median':>8} {'max':>8}")
    for size, ts in times.items():
        print(f"{size:>5} {min(ts):8.3f} {statistics.median(ts):8.3f} {max(ts):8.3f}")
    worst = max(times[64])

    with (
        processes.fake_vllm(
            "--layers=48", "--top-k=8", "--experts=128", "--no-sampling-mask"
        ) as fake,
        processes.writer(fake.url, run_root, "--log-level=WARNING") as with_deadline,
        processes.writer(
            fake.url, run_root, "--write-deadline", "0", "--log-level=WARNING"
        ) as without,
    ):
        scraped = scrape(with_deadline.metrics_url)
        deadline = value(scraped, "payloadrun_writer_write_deadline_seconds")
        print(
            f"\nthe writer's default --write-deadline: {deadline:g} s = "
            f"{deadline / worst:.1f}x the slowest 64 MiB write above"
        )
        means = overhead(
            {"deadline": with_deadline, "no deadline": without},
            run_root,
            args.size_mib * MIB,
            args.rounds,
            args.requests,
        )
        print(
            f"\n2. writer work per by-handle answer of {args.size_mib} MiB "
            f"({args.rounds} rounds x {args.requests}): deadline and breaker "
            f"{means['deadline'] * 1e3:.2f} ms, without {means['no deadline'] * 1e3:.2f} ms"
        )
        ratio = means["deadline"] / means["no deadline"]

        elapsed, vllm_seconds, reason = hang_to_inline(
            volume, with_deadline, fake, run_root, args.size_mib * MIB
        )
        beyond = elapsed - vllm_seconds - deadline
        print(
            f"\n3. brick SIGSTOPped: first answer after {elapsed:.3f} s ({reason}); vLLM's own "
            f"{vllm_seconds * 1e3:.1f} ms; beyond the deadline: {beyond * 1e3:.0f} ms"
        )
        wait_released(with_deadline)
        late = scrape(with_deadline.metrics_url)
        print(
            "   after SIGCONT: late writes removed "
            f"{value(late, 'payloadrun_writer_late_writes_total', outcome='removed'):g}, failed "
            f"{value(late, 'payloadrun_writer_late_writes_total', outcome='failed'):g}"
        )
        # the breaker closes again on the first write back in time (after its cooldown)
        deadline_at = time.monotonic() + 60
        while (
            post(with_deadline.url, request_body(MIB, f"{run_root}/v3", 3))[1]["x-payloadrun-mode"]
            != "handle"
        ):
            if time.monotonic() > deadline_at:
                raise SystemExit("the writer never wrote by handle again")
            time.sleep(0.2)

        cost = outage_cost(with_deadline, fake, run_root, [1 * MIB, 4 * MIB, 16 * MIB, 32 * MIB])
    print(f"\n4. one answer inline and by handle; a batch of {args.batch} answers all inline:")
    print(f"{'payload':>9} {'inline B':>12} {'handle B':>9} {'ratio':>7} {'batch inline':>13}")
    for size, inline, handle in cost:
        print(
            f"{size // MIB:>6}MiB {inline:>12,} {handle:>9,} {inline / handle:>7.0f} "
            f"{inline * args.batch / 2**30:>10.1f}GiB"
        )
    print()
    first_inline = elapsed - vllm_seconds
    report.print_goals(
        [
            report.Goal.at_most("deadline+breaker work / today's (healthy)", ratio, 1.05),
            report.Goal.at_most(
                "hang to first inline answer - vLLM, s", first_inline, deadline + 0.1
            ),
        ],
        fmt="{:.3f}".format,
    )
    report.print_load("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
