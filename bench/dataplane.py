"""Data-plane benchmark: the store and the reader against raw I/O of the same bytes, same run.

Writes: ``PayloadStore.write`` (path checks, O_EXCL create, write, fsync, close) against a raw
``open/write/fsync/close`` of the same bytes in the same directory, interleaved so both see the
same disk state. Reads: ``PayloadReader.read`` (path checks, concurrent preadv into one array)
against a raw single-threaded ``open/os.preadv/close`` into a preallocated buffer, page cache warm.

Cases: one request of 1, 16 and 64 MiB (routing rows [n, 48, 8] uint8), and one batch of 36,000
files of 200 KiB (mask rows [1024, 50] int32), read back in micro-batches of 1,000 files.
The goal is a ratio of at least 0.8 of raw for both; ratios above 1 mean faster than raw.

Small reads, each call timed alone, reader and raw alternating call by call
(which goes first alternates too), the median of many calls:

- one 1 MiB segment (2,730 routing rows) read into a reused buffer, against ``open``,
  ``os.preadv``, ``close`` of the same file into the same buffer (what the reader must do too);
  goal: at least 0.8 of raw;
- a micro-batch of 1,000 files of 4 KiB and of 64 KiB (mask rows [16 or 256, 64] int32), one
  segment each, read into a reused buffer, against a raw loop of ``open/preadv/close`` over the
  same files; goal: no more time per segment than the loop (ratio at least 1). The same call on a
  reader of one thread is shown beside it, for comparison, without a goal.

    python bench/dataplane.py            # the full run (about 2 minutes, 15 GB of disk)
    python bench/dataplane.py --quick    # 3,600 small files and fewer repeats
    python bench/dataplane.py --small-only [--quick]   # only the small reads (seconds)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from payloadrun.codec import PositionedRows
from payloadrun.reader import PayloadReader
from payloadrun.segments import Segment
from payloadrun.store import PayloadStore
from report import Goal, print_goals, print_load

MIB = 1 << 20
ROUTING_ROW = (48, 8)  # Qwen3-30B-A3B: 48 MoE layers, top-8, uint8: 384 B per token
MASK_ROW = (50,)  # 50 int32 ids: 200 B per token; 1024 tokens make 200 KiB


def raw_write(directory: Path, data: memoryview) -> None:
    fd = os.open(directory / f"{uuid.uuid4().hex}.raw", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path: str, buf: memoryview) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        got = 0
        while got < len(buf):
            n = os.preadv(fd, [buf[got:]], got)
            if n == 0:
                raise OSError(f"{path} is short")
            got += n
    finally:
        os.close(fd)


def time_reads(
    reader: PayloadReader, chunks: list[list[Segment]], field: str, file_shape: tuple[int, ...]
) -> dict:
    """Seconds to read every chunk four ways, each chunk's variants back to back.

    ``raw_new``/``reader_new``: into a new array per chunk (as a trainer that allocates);
    ``raw_buf``/``reader_buf``: into one buffer reused across chunks (no page faults).
    """
    per_file = int(np.prod(file_shape)) * np.dtype(chunks[0][0].dtype).itemsize
    rows_per_file = file_shape[0]
    widest = max(len(c) for c in chunks)
    buf = np.empty((widest * rows_per_file, *file_shape[1:]), chunks[0][0].dtype)
    totals = dict.fromkeys(("raw_new", "reader_new", "raw_buf", "reader_buf"), 0.0)
    out = None
    for chunk in chunks:
        lo, hi = chunk[0].pos, chunk[-1].end

        def raw(target: np.ndarray, chunk: list[Segment] = chunk) -> None:
            view = memoryview(target).cast("B")
            for j, seg in enumerate(chunk):
                raw_read(seg.file, view[j * per_file : (j + 1) * per_file])

        t0 = time.perf_counter()
        raw(np.empty((len(chunk) * rows_per_file, *file_shape[1:]), buf.dtype))
        t1 = time.perf_counter()
        out = reader.read(chunk, field, lo, hi)
        t2 = time.perf_counter()
        raw(buf)
        t3 = time.perf_counter()
        reader.read(chunk, field, lo, hi, out=buf[: hi - lo])
        t4 = time.perf_counter()
        for key, seconds in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            totals[key] += seconds
    return {**totals, "last": out}


def routing_request(size: int, rng: np.random.Generator) -> np.ndarray:
    rows = size // (ROUTING_ROW[0] * ROUTING_ROW[1])
    return rng.integers(0, 128, (rows, *ROUTING_ROW), dtype=np.uint8)


def bench_large(root: Path, size_mib: int, repeats: int, reader: PayloadReader) -> dict:
    store = PayloadStore(root)
    rng = np.random.default_rng(size_mib)
    rows = routing_request(size_mib * MIB, rng)
    raw_dir = root / "raw"
    raw_dir.mkdir(exist_ok=True)
    store_t, raw_t, segments = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        raw_write(raw_dir, memoryview(rows).cast("B"))
        raw_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        segments.append(store.write("v1", [PositionedRows("routed_experts", rows, 0)])[0])
        store_t.append(time.perf_counter() - t0)

    for seg in segments:  # a first pass warms the page cache, as the goal states
        raw_read(seg.file, memoryview(np.empty(rows.nbytes, np.uint8)))
    reads = time_reads(reader, [[seg] for seg in segments], "routed_experts", rows.shape)
    assert np.array_equal(reads.pop("last"), rows)
    shutil.rmtree(root / "v1")
    shutil.rmtree(raw_dir)
    nbytes = rows.nbytes
    return {
        "case": f"1 request of {size_mib} MiB",
        "raw_write": nbytes / statistics.median(raw_t),
        "store_write": nbytes / statistics.median(store_t),
        **{k: nbytes * len(segments) / v for k, v in reads.items()},
    }


def bench_small_files(root: Path, files: int, per_call: int, reader: PayloadReader) -> dict:
    store = PayloadStore(root)
    rows_per_file = 1024
    rows = np.random.default_rng(7).integers(0, 150_000, (rows_per_file, *MASK_ROW), dtype=np.int32)
    raw_dir = root / "raw"
    raw_dir.mkdir(exist_ok=True)
    data = memoryview(rows).cast("B")
    segments = []
    raw_s = store_s = 0.0
    block = 500
    for start in range(0, files, block):  # interleave blocks so both see the same disk state
        n = min(block, files - start)
        t0 = time.perf_counter()
        for _ in range(n):
            raw_write(raw_dir, data)
        raw_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(start, start + n):
            part = PositionedRows("sampling_mask", rows, i * rows_per_file)
            segments.append(store.write("v2", [part])[0])
        store_s += time.perf_counter() - t0
        print(f"  small files: {start + n}/{files} written", end="\r", flush=True)
    print()
    shutil.rmtree(raw_dir)

    for seg in segments:
        raw_read(seg.file, memoryview(np.empty(rows.nbytes, np.uint8)))
    chunks = [segments[i : i + per_call] for i in range(0, files, per_call)]
    reads = time_reads(reader, chunks, "sampling_mask", rows.shape)
    assert np.array_equal(reads.pop("last")[-rows_per_file:], rows)
    shutil.rmtree(root / "v2")
    total = files * rows.nbytes
    return {
        "case": f"{files:,} files of 200 KiB",
        "raw_write": total / raw_s,
        "store_write": total / store_s,
        **{k: total / v for k, v in reads.items()},
    }


def interleaved_ns(first: Callable[[], object], second: Callable[[], object], calls: int) -> tuple:
    """Median nanoseconds per call of ``first`` and ``second``, timed call by call, alternating
    which goes first so that neither always runs on the caches the other left."""
    times: tuple[list[int], list[int]] = ([], [])
    clock = time.perf_counter_ns
    for i in range(calls):
        order = ((0, first), (1, second)) if i % 2 == 0 else ((1, second), (0, first))
        for k, fn in order:
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def bench_one_segment(root: Path, reader: PayloadReader, calls: int) -> dict:
    """One 1 MiB segment into a reused buffer, against open/preadv/close of the same file."""
    rows = routing_request(MIB, np.random.default_rng(11))
    seg = PayloadStore(root).write("v3", [PositionedRows("routed_experts", rows, 0)])[0]
    buf = np.empty_like(rows)
    view = memoryview(buf).cast("B")
    raw_read(seg.file, view)  # page cache warm
    for _ in range(min(calls, 200)):  # and the interpreter
        reader.read([seg], "routed_experts", 0, seg.rows, out=buf)

    def raw() -> None:
        raw_read(seg.file, view)

    def payloadrun() -> None:
        reader.read([seg], "routed_experts", 0, seg.rows, out=buf)

    raw_ns, reader_ns = interleaved_ns(raw, payloadrun, calls)
    assert np.array_equal(buf, rows)
    shutil.rmtree(root / "v3")
    return {"case": f"1 segment of {rows.nbytes / MIB:.2f} MiB", "raw": raw_ns, "reader": reader_ns}


def bench_micro_batch(
    root: Path, readers: dict[str, PayloadReader], files: int, kib: int, calls: int
) -> list[dict]:
    """A micro-batch of ``files`` one-segment files of ``kib`` KiB, per segment, against a raw
    loop of open/preadv/close over the same files into the same buffer."""
    rows_per_file = kib * 1024 // (64 * 4)
    rows = np.random.default_rng(kib).integers(0, 150_000, (rows_per_file, 64), dtype=np.int32)
    store = PayloadStore(root)
    segs = [
        store.write(f"v{kib}", [PositionedRows("sampling_mask", rows, i * rows_per_file)])[0]
        for i in range(files)
    ]
    hi = files * rows_per_file
    buf = np.empty((hi, 64), np.int32)
    view = memoryview(buf).cast("B")
    per = rows.nbytes

    def raw() -> None:
        for j, seg in enumerate(segs):
            raw_read(seg.file, view[j * per : (j + 1) * per])

    raw()  # page cache warm
    results = []
    for name, reader in readers.items():
        reader.read(segs, "sampling_mask", 0, hi, out=buf)

        def payloadrun(reader: PayloadReader = reader) -> None:
            reader.read(segs, "sampling_mask", 0, hi, out=buf)

        raw_ns, reader_ns = interleaved_ns(raw, payloadrun, calls)
        assert np.array_equal(buf[-rows_per_file:], rows)
        results.append(
            {
                "case": f"{files:,} x {kib} KiB, {name}",
                "raw": raw_ns / files,
                "reader": reader_ns / files,
            }
        )
    shutil.rmtree(root / f"v{kib}")
    return results


def print_small_table(results: list[dict]) -> None:
    head = f"{'small reads (reused buffer)':<34} {'raw us':>9} {'reader us':>10} {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['case']:<34} {r['raw'] / 1e3:>9.2f} {r['reader'] / 1e3:>10.2f} "
            f"{r['raw'] / r['reader']:>6.2f}"
        )
    print("us per call for the 1 MiB segment, per segment for the micro-batches; ratio = raw /")
    print("payloadrun time, so above 1 means faster than raw")


def print_table(results: list[dict]) -> None:
    head = (
        f"{'case':<24} {'raw write':>10} {'store':>10} {'ratio':>5} | {'raw pread':>10} "
        f"{'reader':>10} {'ratio':>5} | {'into a reused buffer: raw':>26} {'reader':>10} "
        f"{'ratio':>5}"
    )
    print(head)
    print("-" * len(head))

    def gbs(x: float) -> str:
        return f"{x / 1e9:6.2f} GB/s"

    for r in results:
        print(
            f"{r['case']:<24} {gbs(r['raw_write']):>10} {gbs(r['store_write']):>10} "
            f"{r['store_write'] / r['raw_write']:>5.2f} | {gbs(r['raw_new']):>10} "
            f"{gbs(r['reader_new']):>10} {r['reader_new'] / r['raw_new']:>5.2f} | "
            f"{gbs(r['raw_buf']):>26} {gbs(r['reader_buf']):>10} "
            f"{r['reader_buf'] / r['raw_buf']:>5.2f}"
        )
    print("ratio = payloadrun / raw on the same bytes, same run (goal: >= 0.80); reads are warm,")
    print("into a new array per request or micro-batch of 1,000 files, then into a reused buffer")


def small_goals(small: list[dict], workers: int) -> list[Goal]:
    goals = []
    for r in small:
        if r["case"].endswith("1 thread"):
            continue  # shown for comparison: the goal is the default reader's
        floor = 0.8 if r["case"].startswith("1 segment") else 1.0
        goals.append(Goal.at_least(f"{r['case']}: raw / reader", r["raw"] / r["reader"], floor))
    return goals


def large_goals(results: list[dict]) -> list[Goal]:
    goals = []
    for r in results:
        for key, what in (("new", "new array"), ("buf", "reused buffer")):
            ratio = r[f"reader_{key}"] / r[f"raw_{key}"]
            goals.append(Goal.at_least(f"{r['case']}, {what}: reader / raw", ratio, 0.8))
    return goals


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3,600 small files, fewer repeats")
    parser.add_argument("--files", type=int, help="number of 200 KiB files (default 36,000)")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary directory)")
    parser.add_argument("--workers", type=int, default=16, help="reader threads")
    parser.add_argument(
        "--small-only",
        action="store_true",
        help="only the small reads, per call against raw I/O: one 1 MiB segment, and micro-"
        "batches of 1,000 files of 4 and 64 KiB (a few seconds)",
    )
    args = parser.parse_args()
    files = args.files or (3_600 if args.quick else 36_000)
    repeats = {1: 64, 16: 12, 64: 5} if not args.quick else {1: 16, 16: 4, 64: 2}
    one_calls, batch_calls = (1_000, 20) if args.quick else (4_000, 60)

    print_load("start")
    base = args.dir or Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix="payloadrun-bench-", dir=base) as tmp:
        root = Path(tmp)
        print(f"payload root {root}, {os.cpu_count()} CPUs, reader threads {args.workers}")
        results, small = [], []
        with (
            PayloadReader(root, max_workers=args.workers) as reader,
            PayloadReader(root, max_workers=1) as one_thread,
        ):
            print(f"  1 MiB segment x {one_calls} calls ...", flush=True)
            small.append(bench_one_segment(root, reader, one_calls))
            readers = {f"{args.workers} threads": reader, "1 thread": one_thread}
            for kib in (4, 64):
                print(f"  1,000 x {kib} KiB x {batch_calls} calls ...", flush=True)
                small.extend(bench_micro_batch(root, readers, 1_000, kib, batch_calls))
            if not args.small_only:
                for size, n in repeats.items():
                    print(f"  {size} MiB x {n} ...", flush=True)
                    results.append(bench_large(root, size, n, reader))
                results.append(bench_small_files(root, files, 1_000, reader))
        print()
        if results:
            print_table(results)
            print()
        print_small_table(small)
        print()
    print_goals(small_goals(small, args.workers) + large_goals(results))
    print_load("end")


if __name__ == "__main__":
    main()
