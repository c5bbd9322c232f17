"""The operator's heap trim gives freed pages back to the system (a real process, real RSS); what
the operator built to start is frozen out of the garbage collector's passes."""

import subprocess
import sys

from payloadrun_operator.platform.heap import malloc_trim

# 64 MiB through malloc (a bytearray's buffer over 512 bytes), then every block freed but one in
# 64: the free pages lie between live chunks, where glibc's own trimming never reaches.
FRAGMENTED = """
from pathlib import Path
from payloadrun_operator.platform.heap import malloc_trim

def rss_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

blocks = [bytearray(4096) for _ in range(16_384)]
kept = blocks[::64]
del blocks
before = rss_mib()
returned = malloc_trim()()
print(before, rss_mib(), returned)
"""


def test_the_trim_returns_the_pages_freed_between_live_chunks():
    assert malloc_trim() is not None, "this machine's libc is glibc: malloc_trim exists"
    out = subprocess.run(
        [sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True
    ).stdout
    before, after, returned = out.split()
    assert returned == "True"
    assert float(before) - float(after) > 48, out  # of the 63 MiB freed


def test_a_drained_burst_is_trimmed_once_and_not_every_run_after_it():
    from payloadrun_operator.platform.heap import DRAIN_TRIM_SECONDS, Drain

    now = [100.0]
    trims: list[float] = []
    drain = Drain(lambda: trims.append(now[0]) or True, clock=lambda: now[0])
    with drain.working(), drain.working():
        pass  # the second ends with the first still under way: no trim
    assert trims == [100.0]  # the last one ended: the burst's heap goes back
    now[0] += DRAIN_TRIM_SECONDS / 2
    with drain.working():
        pass
    assert trims == [100.0]  # runs one by one: not a trim each
    now[0] += DRAIN_TRIM_SECONDS
    with drain.working():
        pass
    assert trims == [100.0, now[0]] and drain.trims == 2


SETTLED = """
import gc
from payloadrun_operator.api.schema_check import run_schema
from payloadrun_operator.platform.heap import YOUNG_THRESHOLD, settle

settle()
schema = run_schema()
tracked = {id(o) for o in gc.get_objects()}
print(id(schema) in tracked, id(schema["properties"]["spec"]) in tracked)
print(gc.get_freeze_count() > 10_000, gc.get_threshold()[0] == YOUNG_THRESHOLD)
late = {}
late["self"] = late  # made after: the collector still sees it
print(any(o is late for o in gc.get_objects()))
"""


def test_what_starting_built_is_out_of_the_collectors_passes_and_what_follows_is_not():
    out = subprocess.run(
        [sys.executable, "-c", SETTLED], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "False False", out  # the schema a run is checked against: frozen
    assert out[1] == "True True", out
    assert out[2] == "True", out
