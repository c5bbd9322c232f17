"""``make test``'s pytest: the suite as two pytest processes at once, every test in exactly one.

- ``cluster``: ``-m "integration or sharedfs"``, the tests that hold the machine's one node,
  control plane or glusterd. They run in the order they always did (the node-lifecycle tests
  first, then the session's cluster), and spend most of their time waiting on pods and the API
  server.
- ``unit``: ``-m "not integration and not sharedfs"``, everything else: CPU-bound, and nothing
  in it touches the node or glusterd, so it fills the cores the cluster half leaves idle.

The two expressions are each other's complement, so each collected test runs in one half and only
one, and no test is skipped for the split. A test cannot land in the unit half by a missing
marker: ``tests/conftest.py`` marks every test that reaches the control plane or glusterd through
a fixture. Each half writes its own log (named at the start; ``tail -f`` it to follow); when a
half ends its summary is printed (durations, failures in full, the short summary), and the exit
status is non-zero when either half failed.

    python hack/test.py [PYTEST_ARGS...]     # both halves get PYTEST_ARGS (--durations=30, -x...)
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MACHINE = "integration or sharedfs"
HALVES = {"cluster": MACHINE, "unit": f"not ({MACHINE})"}
# pytest's sections after the progress dots: what a half prints when it ends
SUMMARY_START = re.compile(
    r"^=+ (FAILURES|ERRORS|warnings summary|slowest .*durations|short test summary info"
    r"|.* in \d+(\.\d+)?s( \([\d:]+\))?) =+$",  # the last line: "1 passed in 2.00s"
    re.M,
)
PROGRESS = re.compile(r"\[\s*(\d+)%\]")
HEARTBEAT_S = 60.0
NO_TESTS = 5  # pytest's exit status when a half selected nothing (PYTEST_ARGS name one half's)


@dataclass
class Half:
    name: str
    marker: str
    log: Path
    process: subprocess.Popen | None = None
    started: float = field(default_factory=time.monotonic)
    took: float | None = None
    code: int | None = None

    def command(self, pytest_args: list[str]) -> list[str]:
        return [
            sys.executable, "-m", "pytest", "-m", self.marker,
            # each half its own cache (last failures), so neither overwrites the other's
            "-o", f"cache_dir=.pytest_cache/{self.name}",
            *pytest_args,
        ]  # fmt: skip

    def progress(self) -> str:
        found = PROGRESS.findall(self.log.read_text(errors="replace")) if self.log.exists() else []
        return f"{found[-1]}%" if found else "collecting"


def summary(text: str) -> str:
    """Everything a pytest run printed after its progress: failures in full, durations, the
    short summary and the final line; the whole output when it has none of them (a crash)."""
    match = SUMMARY_START.search(text)
    return text[match.start() :] if match else text


def stamp(started: float) -> str:
    took = int(time.monotonic() - started)
    return f"[{took // 60:02d}:{took % 60:02d}]"


def main(argv: list[str]) -> int:
    logs = Path(tempfile.mkdtemp(prefix="payloadrun-test-"))
    started = time.monotonic()
    halves = [Half(name, marker, logs / f"{name}.log") for name, marker in HALVES.items()]
    for half in halves:
        with half.log.open("w") as out:
            half.process = subprocess.Popen(
                half.command(argv), cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )
        print(f"{half.name}: pytest -m {half.marker!r}, log {half.log}", flush=True)

    def interrupt(signum: int, _frame: object) -> None:
        # SIGTERM (CI cancelling): each half gets SIGINT, so pytest tears its fixtures down (the
        # cluster stops, the host is cleaned) before it exits
        for half in halves:
            if half.process and half.process.poll() is None:
                half.process.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, interrupt)
    # the terminal's Ctrl-C reaches both halves (one process group): this waits for them
    signal.signal(signal.SIGINT, lambda *_: None)
    failed = []
    running = list(halves)
    next_beat = time.monotonic() + HEARTBEAT_S
    while running:
        time.sleep(1)
        for half in list(running):
            assert half.process is not None
            code = half.process.poll()
            if code is None:
                continue
            running.remove(half)
            half.took = time.monotonic() - half.started
            print(
                f"\n{stamp(started)} ===== {half.name} (pytest -m {half.marker!r}) ended: "
                f"exit {code} in {half.took:.0f} s; log {half.log}",
                flush=True,
            )
            print(summary(half.log.read_text(errors="replace")), end="", flush=True)
            half.code = code
            if code not in (0, NO_TESTS):
                failed.append(half.name)
        if running and time.monotonic() >= next_beat:
            next_beat += HEARTBEAT_S
            beat = ", ".join(f"{h.name} {h.progress()}" for h in running)
            print(f"{stamp(started)} running: {beat}", flush=True)
    if all(h.code == NO_TESTS for h in halves):
        failed.append("no test selected")
    took = {h.name: f"{h.took:.0f} s" for h in halves}
    verdict = f"FAILED: {', '.join(failed)}" if failed else "both passed"
    print(f"\n{stamp(started)} {verdict} ({took}); logs in {logs}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
