"""Data-plane benchmark: the store and the reader against raw I/O of the same bytes, same run.

Writes: ``PayloadStore.write`` (path checks, O_EXCL create, write, fsync, close) against a raw
``open/write/fsync/close`` of the same bytes in the same directory, interleaved so both see the
same disk state. Reads: ``PayloadReader.read`` (path checks, concurrent preadv into one array)
against a raw single-threaded ``open/os.preadv/close`` into a preallocated buffer, page cache warm.

Cases: one request of 1, 16 and 64 MiB (routing rows [n, 48, 8] uint8), and one batch of 36,000
files of 200 KiB (mask rows [1024, 50] int32), read back in micro-batches of 1,000 files.
The goal is a ratio of at least 0.8 of raw for both; ratios above 1 mean faster than raw.

    python bench/dataplane.py            # the full run (about 2 minutes, 15 GB of disk)
    python bench/dataplane.py --quick    # 3,600 small files and fewer repeats
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from payloadrun.codec import PositionedRows
from payloadrun.reader import PayloadReader
from payloadrun.segments import Segment
from payloadrun.store import PayloadStore

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3,600 small files, fewer repeats")
    parser.add_argument("--files", type=int, help="number of 200 KiB files (default 36,000)")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary directory)")
    parser.add_argument("--workers", type=int, default=16, help="reader threads")
    args = parser.parse_args()
    files = args.files or (3_600 if args.quick else 36_000)
    repeats = {1: 64, 16: 12, 64: 5} if not args.quick else {1: 16, 16: 4, 64: 2}

    base = args.dir or Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix="payloadrun-bench-", dir=base) as tmp:
        root = Path(tmp)
        print(f"payload root {root}, {os.cpu_count()} CPUs, reader threads {args.workers}")
        results = []
        with PayloadReader(root, max_workers=args.workers) as reader:
            for size, n in repeats.items():
                print(f"  {size} MiB x {n} ...", flush=True)
                results.append(bench_large(root, size, n, reader))
            results.append(bench_small_files(root, files, 1_000, reader))
        print()
        print_table(results)


if __name__ == "__main__":
    main()
