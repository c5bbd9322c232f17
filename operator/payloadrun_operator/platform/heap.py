"""The operator's heap: the garbage collector kept off what the process built to start
(:func:`settle`), and freed heap back to the system: glibc's ``malloc_trim(0)``, once a minute
and when a burst of reconciles has drained (:class:`Drain`).

glibc returns freed memory to the system only from the top of its heap; the pages of chunks freed
below a live one stay in the process's resident set. The trim gives those pages back
(``madvise``): after a burst at 1,000 runs (``bench/heapprobe``) 9 MiB with the reconciles
bounded, 27 MiB without, in under 4 ms, and under a millisecond when there is nothing to give.
(What pymalloc holds in partly used arenas it cannot give back.) With another C library (musl)
there is no ``malloc_trim`` and nothing is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import time
from collections.abc import Callable, Iterator

from payloadrun_operator.api.schema_check import run_schema

TRIM_SECONDS = 60.0
# CPython collects its youngest generation every 700 allocations (net of frees): about 900 passes
# over the benchmark's 201 runs, and 7 full ones, each over every object the process holds (the
# imports, the schema, the cache).
YOUNG_THRESHOLD = 10_000
DRAIN_TRIM_SECONDS = 10.0  # at most one trim at a drain this often (runs one by one: not each)


def settle() -> None:
    """Once started, before the first run: what the process built so far (its imports, the
    schema a run is checked against, built now rather than at the first run) is never garbage,
    so it is frozen out of every collection (``gc.freeze``), and the youngest generation is
    collected every YOUNG_THRESHOLD allocations: garbage in reference cycles waits that long to
    be freed, the rest goes at once as always. The collector's time in the operator over
    ``bench/operator.py --idle-seconds 5 --ready-runs 10`` (201 runs), by ``bench/heapprobe``:
    598 ms of its 3.91 s of CPU before, 169 ms of 3.38 s after."""
    run_schema()
    gc.collect()  # what starting left behind goes now, not into the frozen generation
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def malloc_trim() -> Callable[[], bool] | None:
    """``malloc_trim(0)`` of this process's C library (True: memory was returned), or None
    when it has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: bool(trim(0))


async def trim_forever(every: float = TRIM_SECONDS) -> None:
    trim = malloc_trim()
    if trim is None:
        return
    while True:
        await asyncio.sleep(every)
        trim()


class Drain:
    """Counts the work under way (kopf's handlers waiting for their pass, and the passes); when
    the last of it ends, the heap a burst freed is given back at once, not up to a minute later,
    at most once every :data:`DRAIN_TRIM_SECONDS`."""

    def __init__(
        self,
        trim: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trim = trim
        self._clock = clock
        self._busy = 0
        self._last = -DRAIN_TRIM_SECONDS
        self.trims = 0

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            if self._busy == 0 and self._trim is not None:
                now = self._clock()
                if now - self._last >= DRAIN_TRIM_SECONDS:
                    self._last = now
                    self.trims += 1
                    self._trim()
