"""The data-plane and retention benchmarks on a real network filesystem, against raw system calls
on the same mounts in the same run.

Starts a GlusterFS volume on loopback (``payloadrun_devcluster.glusterfs``; root, Debian's
``glusterfs-server`` and ``glusterfs-client``) with three clients at their default settings: the
writer's, the trainer's and the orchestrator's. Then:

1. ``bench/dataplane.py --quick --dir <writer's client>``: ``PayloadStore.write`` against a raw
   ``open/write/fsync/close``, and the reader against raw reads, all through one client.
2. Reads across clients: files written through the writer's client, read through the trainer's
   (which has never seen them: no page cache, every open a round trip) by ``PayloadReader``
   (16 threads) against a raw ``open/preadv/close`` of the same bytes on a pool of as many
   threads. Each side reads its own fresh files, and the order alternates. Goal: ratio >= 0.8.
3. ``bench/retention.py --quick --dir <orchestrator's client>``: the simulator's loop with its
   files on the volume (directory size under delete-on-consume and the version sweep), the
   sidecar's unlink rate against raw ``unlink`` at its best thread count, ``policy_updated``
   p99 while it deletes, ``/metrics`` latency.

    sudo python bench/sharedfs.py            # about 10 minutes on 2 cores
    sudo python bench/sharedfs.py --files 500 --skip-retention   # the cross-client reads only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from payloadrun.codec import PositionedRows
from payloadrun.reader import PayloadReader
from payloadrun.segments import Segment
from payloadrun.store import PayloadStore
from payloadrun_devcluster.glusterfs import (
    GlusterServer,
    teardown,
    unsupported_reason,
)
from report import Goal, print_goals, print_load

HERE = Path(__file__).resolve().parent

MASK_ROWS = (1024, 50)  # 200 KiB of int32 per file, as in bench/dataplane.py's batch
MICRO_BATCH = 100
# every create, fsync and unlink is a round trip here (about 100 creates/s on one thread): the
# retention benchmark's quick load, smaller still
RETENTION_LOAD = ["--unlink-files", "2000", "--latency-files", "4000", "--metrics-files", "5000"]


def write_files(store: PayloadStore, version: str, count: int) -> list[Segment]:
    """``count`` payload files of 200 KiB through the store; one segment each."""
    rows = np.arange(np.prod(MASK_ROWS), dtype=np.int32).reshape(MASK_ROWS)
    segments = []
    for i in range(count):
        (seg,) = store.write(version, [PositionedRows("sampling_mask", rows + i, 0)])
        segments.append(seg)
    return segments


def on_mount(segments: list[Segment], writer_root: Path, reader_root: Path) -> list[Segment]:
    """The same segments as the trainer's client names them (every pod mounts at one path; on
    one machine the two clients have two paths)."""
    out = []
    for seg in segments:
        rel = Path(seg.file).relative_to(writer_root)
        out.append(
            Segment(
                seg.field, str(reader_root / rel), seg.offset, 0, seg.rows, seg.dtype, seg.shape
            )
        )
    return out


def read_with_reader(reader: PayloadReader, segments: list[Segment]) -> float:
    rows = segments[0].rows
    out = np.empty((MICRO_BATCH * rows, *segments[0].shape), dtype=np.int32)
    start = time.perf_counter()
    for i in range(0, len(segments), MICRO_BATCH):
        batch = [
            Segment(s.field, s.file, s.offset, j * rows, s.rows, s.dtype, s.shape)
            for j, s in enumerate(segments[i : i + MICRO_BATCH])
        ]
        reader.read(batch, "sampling_mask", 0, len(batch) * rows, out=out[: len(batch) * rows])
    return time.perf_counter() - start


def read_raw(pool: ThreadPoolExecutor, segments: list[Segment]) -> float:
    import os

    nbytes = segments[0].nbytes
    bufs = [bytearray(nbytes) for _ in range(MICRO_BATCH)]

    def one(job: tuple[Segment, bytearray]) -> None:
        seg, buf = job
        fd = os.open(seg.file, os.O_RDONLY)
        try:
            got = os.preadv(fd, [buf], seg.offset)
            assert got == nbytes, (seg.file, got)
        finally:
            os.close(fd)

    start = time.perf_counter()
    for i in range(0, len(segments), MICRO_BATCH):
        batch = segments[i : i + MICRO_BATCH]
        list(pool.map(one, zip(batch, bufs, strict=False)))
    return time.perf_counter() - start


def cross_client_reads(server: GlusterServer, base: Path, files: int, rounds: int) -> Goal:
    volume = server.create_volume(base / "server")
    writer_mount = volume.mount(base / "writer")
    trainer_mount = volume.mount(base / "trainer")
    store = PayloadStore(writer_mount.path)
    mib = files * np.prod(MASK_ROWS) * 4 / (1 << 20)
    print(f"2. reads across clients: {files} files of 200 KiB ({mib:.0f} MiB) per side x {rounds}")
    ratios = []
    with (
        PayloadReader(trainer_mount.path, max_workers=16) as reader,
        ThreadPoolExecutor(16) as pool,
    ):
        for r in range(rounds):
            ours = on_mount(
                write_files(store, f"v{2 * r}", files), writer_mount.path, trainer_mount.path
            )
            raws = on_mount(
                write_files(store, f"v{2 * r + 1}", files), writer_mount.path, trainer_mount.path
            )
            if r % 2:
                raw_s = read_raw(pool, raws)
                ours_s = read_with_reader(reader, ours)
            else:
                ours_s = read_with_reader(reader, ours)
                raw_s = read_raw(pool, raws)
            ratio = raw_s / ours_s
            ratios.append(ratio)
            print(
                f"   round {r + 1}: reader {mib / ours_s:.0f} MiB/s, raw {mib / raw_s:.0f} MiB/s,"
                f" ratio {ratio:.2f}",
                flush=True,
            )
    server.delete_volume(volume.name)
    median = float(np.median(ratios))
    return Goal.at_least("reader vs raw concurrent preadv, from another client", median, 0.8)


def run_bench(script: str, args: list[str]) -> int:
    """Another benchmark script, its output shown as it comes."""
    print(f"$ python bench/{script} {' '.join(args)}", flush=True)
    return subprocess.run([sys.executable, str(HERE / script), *args], check=False).returncode


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--files", type=int, default=2_000, help="files per side and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--skip-dataplane", action="store_true")
    parser.add_argument("--skip-retention", action="store_true")
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason:
        print(f"GlusterFS cannot run here: {reason}", file=sys.stderr)
        return 2
    print_load("start")
    server = GlusterServer.ensure()
    codes = []
    with tempfile.TemporaryDirectory(prefix="payloadrun-sharedfs-bench-") as tmp:
        try:  # the volume and its mounts go before the directory they are in
            base = Path(tmp)
            volume = server.create_volume(base / "server")
            writer_mount = volume.mount(base / "writer")
            orchestrator_mount = volume.mount(base / "orchestrator")
            print(f"GlusterFS volume {volume.name}: default client settings, brick {volume.brick}")
            if not args.skip_dataplane:
                print("1. the store and the reader on one client", flush=True)
                dataplane = ["--quick", "--dir", str(writer_mount.path)]
                codes.append(run_bench("dataplane.py", dataplane))
            goal = cross_client_reads(server, base / "reads", args.files, args.rounds)
            if not args.skip_retention:
                print("3. retention on the orchestrator's client", flush=True)
                retention = ["--quick", "--dir", str(orchestrator_mount.path), *RETENTION_LOAD]
                codes.append(run_bench("retention.py", retention))
            print_goals([goal])
        finally:
            teardown(server)
            print_load("end")
    return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main())
