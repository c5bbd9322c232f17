"""A probe of the operator's heap, for ``bench/operator.py`` (docs/benchmarks.md, Memory).

    PYTHONPATH=bench/heapprobe HEAPPROBE_DIR=/tmp/heap python bench/operator.py --scale 1000

Python imports this module at the start of every process on that path; it acts only in the
operator's (``LocalOperator`` starts it with ``python -c``). Every 30 s it appends a line to
``$HEAPPROBE_DIR/heap.<pid>``: the resident set, the number of objects the garbage collector
tracks and, with ``HEAPPROBE_TRIM=1``, the resident set after glibc's ``malloc_trim(0)`` and
how long the trim took; then the collector's passes since the start, by generation (how many,
and the milliseconds they took, from ``gc.callbacks``), the objects frozen out of them and the
process's CPU seconds.
"""

import ctypes
import gc
import os
import sys
import threading
import time
from pathlib import Path

EVERY_SECONDS = float(os.environ.get("HEAPPROBE_EVERY", "30"))


class Collections:
    """The collector's passes by generation: how many, and their seconds."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._started

    def line(self) -> str:
        passes = ", ".join(
            f"gen{g} {n} in {s * 1e3:.0f} ms"
            for g, (n, s) in enumerate(zip(self.count, self.seconds, strict=True))
        )
        return (
            f"collections {passes}; frozen {gc.get_freeze_count()}; cpu {time.process_time():.2f} s"
        )


COLLECTIONS = Collections()


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def probe(out: Path, trim: bool) -> None:
    malloc_trim = ctypes.CDLL(None).malloc_trim if trim else None
    while True:
        time.sleep(EVERY_SECONDS)
        line = f"{time.strftime('%H:%M:%S')} rss {rss_mib():.1f} MiB"
        if malloc_trim is not None:
            t0 = time.perf_counter()
            malloc_trim(0)
            took = (time.perf_counter() - t0) * 1e3
            line += f", after malloc_trim {rss_mib():.1f} MiB ({took:.1f} ms)"
        with out.open("a") as f:
            f.write(f"{line}, gc objects {len(gc.get_objects())}; {COLLECTIONS.line()}\n")


if os.environ.get("HEAPPROBE_DIR") and sys.argv[:1] == ["-c"]:
    target = Path(os.environ["HEAPPROBE_DIR"]) / f"heap.{os.getpid()}"
    target.parent.mkdir(parents=True, exist_ok=True)
    trim = os.environ.get("HEAPPROBE_TRIM") == "1"
    gc.callbacks.append(COLLECTIONS)
    threading.Thread(target=probe, args=(target, trim), name="heapprobe", daemon=True).start()
