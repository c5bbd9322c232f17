"""A probe of the operator's heap, for ``bench/operator.py`` (docs/benchmarks.md, Memory).

    PYTHONPATH=bench/heapprobe HEAPPROBE_DIR=/tmp/heap python bench/operator.py --scale 1000

Python imports this module at the start of every process on that path; it acts only in the
operator's (``LocalOperator`` starts it with ``python -c``). Every 30 s it appends a line to
``$HEAPPROBE_DIR/heap.<pid>``: the resident set, the number of objects the garbage collector
tracks and, with ``HEAPPROBE_TRIM=1``, the resident set after glibc's ``malloc_trim(0)`` and
how long the trim took.
"""

import ctypes
import gc
import os
import sys
import threading
import time
from pathlib import Path

EVERY_SECONDS = 30.0


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
            f.write(f"{line}, gc objects {len(gc.get_objects())}\n")


if os.environ.get("HEAPPROBE_DIR") and sys.argv[:1] == ["-c"]:
    target = Path(os.environ["HEAPPROBE_DIR"]) / f"heap.{os.getpid()}"
    target.parent.mkdir(parents=True, exist_ok=True)
    trim = os.environ.get("HEAPPROBE_TRIM") == "1"
    threading.Thread(target=probe, args=(target, trim), name="heapprobe", daemon=True).start()
