"""Retention benchmark: delete-on-consume against the version sweep, and the sidecar's overheads.

1. Directory size: the same simulated RL workload (``payloadrun simulate``'s default: batch 512
   multi-turn rollouts in groups of 16, 1-8 turns each with forks and bridged turns, one file a
   turn, ``max_off_policy_steps`` 8, 24 steps) under delete-on-consume (the retention sidecar) and
   under the version sweep of public prime-rl (``rmtree`` of ``v<k>`` for
   ``k < min_fresh_version(step + 1, m)``). Goal: a peak of at most 3 batches, below the sweep's
   (their ratio is printed; the sweep keeps about ``m + 3`` batches). Writes
   ``bench/out/retention_directory.png`` (size per step).
2. Unlink rate: the sidecar at its default settings deleting a consumed step of N files (its own
   measure, from ``policy_updated`` to the last unlink) against a raw ``os.unlink`` of as many
   files on a thread pool, at the raw pool's best thread count of 1, 2, 4 and 8. Goal: ratio at
   least 0.8. The step's batch was recorded, and measured by the sidecar, before its policy
   update, as in a run, where a whole training step lies between the two.
3. ``policy_updated`` latency (client round trip) while 15,000 files are being deleted, and
   ``status`` (no journal write) beside it. Goals: p99 at most 10 ms and 5 ms.
4. ``/metrics`` latency with 100,000 files under the root. Goal: at most 20 ms.

    python bench/retention.py            # the full run (a few minutes)
    python bench/retention.py --quick    # batch 128, fewer files
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from payloadrun.retention.client import RetentionClient
from payloadrun.simulate import DELETE_ON_CONSUME, VERSION_SWEEP, Summary, Workload, run_policy
from payloadrun.testing.processes import SidecarProcess
from report import Goal, print_goals, print_load

OUT = Path(__file__).resolve().parent / "out"
RAW_THREADS = (1, 2, 4, 8)


def make_files(directory: Path, n: int, size: int = 4096) -> list[str]:
    """``n`` new files of ``size`` bytes (on 8 threads: on a network file system every create is
    a round trip; the creation is not what is measured)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = b"x" * size
    paths = [str(directory / f"{uuid.uuid4().hex}.bin") for _ in range(n)]

    def create(path: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, paths))
    return paths


def wait_idle(client: RetentionClient, poll: float = 0.002) -> None:
    while True:
        st = client.status()
        if st["queue_files"] == 0 and st["outstanding_jobs"] == 0 and st["sizing_files"] == 0:
            return
        time.sleep(poll)


def record_measured(client: RetentionClient, step: int, files: list[str]) -> None:
    """Record a batch and wait until the sidecar has measured its files (see the module)."""
    client.record_batch(step, files)
    wait_idle(client, poll=0.01)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# ------------------------------------------------------------------------------ 1. directory


def directory_case(workload: Workload, tmp: Path) -> tuple[Summary, Summary]:
    doc = run_policy(workload, DELETE_ON_CONSUME, tmp / "doc")
    sweep = run_policy(workload, VERSION_SWEEP, tmp / "sweep")
    return doc, sweep


def plot(doc: Summary, sweep: Summary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = doc.workload
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for s, colour in ((sweep, "tab:red"), (doc, "tab:blue")):
        steps = [r.step for r in s.steps]
        ax.plot(steps, [r.high_bytes / 1e6 for r in s.steps], color=colour, label=s.policy)
        ax.plot(steps, [r.after_bytes / 1e6 for r in s.steps], color=colour, ls=":", lw=1)
    ax.axhline(3 * doc.batch_bytes / 1e6, color="grey", ls="--", lw=1, label="3 batches")
    ax.set_xlabel("step")
    ax.set_ylabel("payload directory (MB): before / after the policy update")
    ax.set_title(
        f"batch {w.batch_size} rollouts of 1-{w.rollout.max_turns} turns, max_off_policy_steps "
        f"{w.max_off_policy_steps}, {doc.batch_bytes / w.batch_size / 1024:.1f} KiB per rollout"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- 2. unlink rate


def delete_seconds(metrics_url: str) -> float:
    """The sidecar's own sum of ``policy_updated``-to-last-unlink durations."""
    with urllib.request.urlopen(metrics_url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("payloadrun_retention_policy_update_delete_seconds_sum"):
                return float(line.split()[-1])
    raise RuntimeError("policy_update_delete_seconds missing from /metrics")


def raw_unlink_rate(files: list[str], threads: int) -> float:
    chunks = [files[i : i + 256] for i in range(0, len(files), 256)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda c: [os.unlink(f) for f in c], chunks))
    return len(files) / (time.perf_counter() - t0)


def unlink_rate_case(sidecar: SidecarProcess, client: RetentionClient, n: int, rounds: int) -> dict:
    """Sidecar time is its own measurement (no polling in it); raw is timed around the pool.

    Each round deletes one step through the sidecar, then the same number of files raw at each
    thread count; the medians over the rounds are compared, raw at its best thread count.
    """
    sidecar_rates: list[float] = []
    raw_rates: dict[int, list[float]] = {t: [] for t in RAW_THREADS}
    root = sidecar.root
    step = 1000
    for _ in range(rounds):
        step += 1
        files = make_files(root / f"v{step}", n)
        record_measured(client, step, files)
        before = delete_seconds(sidecar.metrics_url)
        client.policy_updated(step)
        wait_idle(client, poll=0.05)
        sidecar_rates.append(n / (delete_seconds(sidecar.metrics_url) - before))
        assert not any(os.path.exists(f) for f in files[:50])
        for threads in RAW_THREADS:
            raw_rates[threads].append(raw_unlink_rate(make_files(root / f"v{step}", n), threads))
    s = statistics.median(sidecar_rates)
    by_threads = {t: statistics.median(r) for t, r in raw_rates.items()}
    best = max(by_threads, key=by_threads.__getitem__)
    r = by_threads[best]
    return {
        "files": n,
        "sidecar_files_per_s": s,
        "raw_files_per_s": r,
        "raw_best_threads": best,
        "raw_files_per_s_by_threads": by_threads,
        "ratio": s / r,
    }


# ------------------------------------------------------------------------- 3. call latency


RAW_UNLINK_PROCESS = """
import os, sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
d = sys.argv[1]
files = [os.path.join(d, f) for f in os.listdir(d)]
chunks = [files[i : i + 256] for i in range(0, len(files), 256)]
with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda c: [os.unlink(f) for f in c], chunks))
"""


def timed_during_raw_unlink(directory: Path, n: int, call: Callable[[], object]) -> list[float]:
    """Round trips of ``call`` (every millisecond) while another process, not the sidecar,
    unlinks ``n`` new files of ``directory`` raw on 8 threads: what the machine charges a call
    while a step's files go, whoever deletes them."""
    make_files(directory, n)
    proc = subprocess.Popen([sys.executable, "-c", RAW_UNLINK_PROCESS, str(directory)])
    latencies = []
    while proc.poll() is None:
        t0 = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.001)
    directory.rmdir()
    return latencies


def floor_case(root: Path, n: int, rounds: int, call: Callable[[], object]) -> dict:
    latencies: list[float] = []
    for r in range(rounds):
        latencies += timed_during_raw_unlink(root / f"v{90_000 + r}", n, call)
    return {
        "files": n,
        "calls": len(latencies),
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "max_ms": max(latencies) * 1e3,
    }


def journal_floor_case(tmp: Path, n: int, rounds: int) -> dict:
    """The floor under ``policy_updated``: a journal-sized append + ``fdatasync`` during a raw
    unlink. On ext4 an ``fdatasync`` commits the file system's journal, unlinks included: this
    is what the file system alone charges an acknowledged event while a step's files go."""
    fd = os.open(tmp / "floor-journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append() -> None:
        os.write(fd, b'{"op":"policy","step":1}\n')
        os.fdatasync(fd)

    try:
        (tmp / "floor").mkdir(exist_ok=True)
        return floor_case(tmp / "floor", n, rounds, append)
    finally:
        os.close(fd)


def policy_latency_case(root: Path, client: RetentionClient, n: int, rounds: int) -> dict:
    """``policy_updated`` round trips while a step of ``n`` files is being unlinked.

    ``status`` round trips (no journal write) are timed alongside as a control: the difference is
    the journal's ``fdatasync``, which shares the file system's journal with the unlinks.
    """
    step = 5000
    calls: list[float] = []
    control: list[float] = []
    for _ in range(rounds):
        files = make_files(root / f"v{step}", n)
        record_measured(client, step, files)
        client.policy_updated(step)
        while True:
            step += 1
            t0 = time.perf_counter()
            client.policy_updated(step)
            t1 = time.perf_counter()
            busy = client.status()["queue_files"] > 0
            t2 = time.perf_counter()
            calls.append(t1 - t0)
            control.append(t2 - t1)
            if not busy:
                break
            time.sleep(0.001)
        wait_idle(client)
        step += 1
    return {
        "files": n,
        "rounds": rounds,
        "calls": len(calls),
        "p50_ms": percentile(calls, 50) * 1e3,
        "p99_ms": percentile(calls, 99) * 1e3,
        "max_ms": max(calls) * 1e3,
        "status_p50_ms": percentile(control, 50) * 1e3,
        "status_p99_ms": percentile(control, 99) * 1e3,
    }


# ------------------------------------------------------------------------ 4. metrics latency


def metrics_latency_case(tmp: Path, n: int, scrapes: int) -> dict:
    root = tmp / "metrics-root"
    per_dir = 10_000
    for k in range(0, n, per_dir):
        make_files(root / f"v{k // per_dir}", min(per_dir, n - k), size=0)
    args = ("--resume", "--max-off-policy-steps", "32")
    with SidecarProcess(root, "bench-metrics", args=args) as sidecar:
        with RetentionClient(sidecar.url) as client:
            while client.status()["directory"]["scans"] < 1:
                time.sleep(0.05)
            seen = client.status()["directory"]["files"]
        latencies = []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            with urllib.request.urlopen(sidecar.metrics_url, timeout=5) as resp:
                resp.read()
            latencies.append(time.perf_counter() - t0)
    return {
        "files": n,
        "files_reported": seen,
        "scrapes": scrapes,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
    }


# ----------------------------------------------------------------------------------- report


def print_report(
    doc: Summary, sweep: Summary, unlink: dict, call: dict, floor: dict, metrics: dict
) -> dict:
    w = doc.workload
    ratio = sweep.peak_bytes / doc.peak_bytes
    print()
    print(
        f"directory size: batch {w.batch_size} rollouts, max_off_policy_steps "
        f"{w.max_off_policy_steps}, {w.steps} steps, rollouts of 1-{w.rollout.max_turns} turns "
        f"({doc.batch_bytes / w.batch_size:,.0f} B on average), seed {w.seed}"
    )
    head = f"{'policy':<20}{'peak MB':>10}{'peak files':>12}{'peak batches':>14}{'final MB':>10}"
    print(head)
    print("-" * len(head))
    for s in (sweep, doc):
        print(
            f"{s.policy:<20}{s.peak_bytes / 1e6:>10.1f}{s.peak_files:>12}"
            f"{s.peak_batches:>14.2f}{s.final_bytes / 1e6:>10.1f}"
        )
    print()
    goals = print_goals(
        [
            Goal.at_most("peak, delete-on-consume (batches)", doc.peak_batches, 3),
            Goal("peak, version sweep / delete-on-consume", ratio, "> 1", ratio > 1),
            Goal.at_least("unlink rate, sidecar / best raw", unlink["ratio"], 0.8),
            Goal.at_most("policy_updated p99 while deleting (ms)", call["p99_ms"], 10),
            Goal.at_most("status p99 while deleting (ms)", call["status_p99_ms"], 5),
            Goal.at_most("/metrics p99 (ms)", metrics["p99_ms"], 20),
        ]
    )
    print()
    raw = ", ".join(f"{t}: {r:,.0f}" for t, r in unlink["raw_files_per_s_by_threads"].items())
    print(
        f"unlink: {unlink['files']} files, sidecar {unlink['sidecar_files_per_s']:,.0f} files/s, "
        f"raw {unlink['raw_files_per_s']:,.0f} files/s at {unlink['raw_best_threads']} threads "
        f"(medians; raw by threads {raw})"
    )
    print(
        f"policy_updated during {call['rounds']} deletions of {call['files']} files: "
        f"{call['calls']} calls, "
        f"p50 {call['p50_ms']:.2f} ms, p99 {call['p99_ms']:.2f} ms, max {call['max_ms']:.2f} ms; "
        f"status (no journal write) p50 {call['status_p50_ms']:.2f} ms, "
        f"p99 {call['status_p99_ms']:.2f} ms"
    )
    sf = call["status_floor"]
    print(
        f"floor: status during a raw unlink of {sf['files']} files by another process (not the "
        f"sidecar), {sf['calls']} calls: p50 {sf['p50_ms']:.2f} ms, p99 {sf['p99_ms']:.2f} ms"
    )
    print(
        f"floor: {floor['calls']} journal appends + fdatasync while {floor['files']} files are "
        f"unlinked raw by another process, no sidecar: p50 {floor['p50_ms']:.2f} ms, "
        f"p99 {floor['p99_ms']:.2f} ms, max {floor['max_ms']:.2f} ms "
        f"(policy_updated p99 / floor p99: {call['p99_ms'] / floor['p99_ms']:.2f})"
    )
    print(
        f"/metrics with {metrics['files']} files under the root ({metrics['files_reported']} "
        f"reported): {metrics['scrapes']} scrapes, p50 {metrics['p50_ms']:.2f} ms, "
        f"p99 {metrics['p99_ms']:.2f} ms"
    )
    return goals


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="batch 128, fewer files and calls")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--sidecar-workers",
        type=int,
        help="the sidecar's deletion threads (default: the sidecar's own default)",
    )
    parser.add_argument("--unlink-files", type=int, help="files per unlink round (5,000 / 15,000)")
    parser.add_argument("--latency-files", type=int, help="files being deleted in case 3 (15,000)")
    parser.add_argument("--metrics-files", type=int, help="files under the root in case 4")
    args = parser.parse_args()
    workload = Workload(batch_size=128 if args.quick else 512, seed=args.seed)
    unlink_files, rounds = (5_000, 3) if args.quick else (15_000, 7)
    unlink_files = args.unlink_files or unlink_files
    latency_files = args.latency_files or 15_000
    metrics_files = args.metrics_files or (20_000 if args.quick else 100_000)
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="payloadrun-bench-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        print(f"work directory {tmp}", flush=True)
        load_start = print_load("start")
        print("1. directory size under both policies ...", flush=True)
        doc, sweep = directory_case(workload, tmp)
        png = OUT / "retention_directory.png"
        plot(doc, sweep, png)
        root = tmp / "calls"
        root.mkdir()
        sidecar_args = ("--workers", str(args.sidecar_workers)) if args.sidecar_workers else ()
        with (
            SidecarProcess(root, "bench-calls", args=sidecar_args) as sidecar,
            RetentionClient(sidecar.url) as client,
        ):
            print(f"2. unlink rate, {unlink_files} files x {rounds} ...", flush=True)
            unlink = unlink_rate_case(sidecar, client, unlink_files, rounds)
            print(f"3. policy_updated latency while deleting {latency_files} files ...", flush=True)
            call = policy_latency_case(root, client, latency_files, 2 if args.quick else 5)
            print("   the floor: status while another process unlinks raw ...", flush=True)
            call["status_floor"] = floor_case(
                root, latency_files, 2 if args.quick else 5, client.status
            )
        print("   the file system's floor: appends + fdatasync while a raw unlink runs ...")
        floor = journal_floor_case(tmp, latency_files, 2 if args.quick else 5)
        print(f"4. /metrics latency with {metrics_files} files ...", flush=True)
        metrics = metrics_latency_case(tmp, metrics_files, 200)
    goals = print_report(doc, sweep, unlink, call, floor, metrics)
    load_end = print_load("end")
    print(f"\nplot: {png}")
    results = {
        "workload": doc.to_json()["workload"],
        "delete_on_consume": {k: v for k, v in doc.to_json().items() if k != "steps"},
        "version_sweep": {k: v for k, v in sweep.to_json().items() if k != "steps"},
        "per_step": {
            "step": [r.step for r in doc.steps],
            "delete_on_consume_bytes": [r.high_bytes for r in doc.steps],
            "version_sweep_bytes": [r.high_bytes for r in sweep.steps],
        },
        "unlink": unlink,
        "policy_updated": call,
        "journal_floor": floor,
        "metrics": metrics,
        "goals": goals,
        "machine": {"start": load_start, "end": load_end},
    }
    (OUT / "retention.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
