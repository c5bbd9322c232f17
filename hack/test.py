"""``make test``'s pytest: the suite as four pytest processes at once, every test in exactly one
of the first three.

- ``node``: the tests that need the machine's one node (the session's cluster with its node, or
  nodes of their own) or glusterd (which serves the node's volume too). They run in the order
  they always did (the node-lifecycle tests first, then the session's cluster, then the
  GlusterFS tests) and spend most of their time waiting on pods. It collects only their folders
  (``NODE_PATHS``). The GlusterFS tests (about two minutes) could run in the control-plane part
  instead, beside the node's (its users take turns at glusterd: ``glusterfs.machine_lock``); on
  2026-12-06 one of them failed there once, in a cold run, unexplained
  (``test_the_reader_retries_through_the_fault_...[stopped]`` read a stopped brick's file
  without an error), so they stay at the node part's end, where they never failed.
- ``control-plane``: the other integration tests, which need no node: those that use the
  session's control plane (``kube_cluster`` without ``node_cluster``) get one of their own on
  loopback (``PAYLOADRUN_NO_NODE=1``), beside the node's, and fail, not skip, if one needed pods;
  the image tests (their own containerd, the images' contents).
- ``unit``: everything else (``make unit``'s tests): CPU-bound, and nothing in it touches a
  cluster or glusterd, so it fills the cores the other two leave idle.
- ``oldest-control-plane``: the control-plane tests of what the project puts into a cluster
  (:data:`OLDEST_PATHS`: the CRD and its rules, the chart and the manifests, the operator's
  reconcile, watches and group runs), again, against the oldest Kubernetes the
  project claims (``KUBERNETES_OLDEST_VERSION`` in cluster/versions.env: its kube-apiserver and
  kube-controller-manager, ``PAYLOADRUN_KUBERNETES_VERSION``), with no node (a kubelet must not
  be newer than its API server). The only tests that run twice. The part builds that control
  plane first (``bash cluster/build.sh --oldest``, :data:`OLDEST_BUILD`; a no-op once cached):
  cold, its go build is about 340 CPU-seconds, which ``make prepare`` (both cores busy with the
  other Go builds and the images) would add to the cold run's wall time in full, while here it
  fills what the node's part leaves idle and this part still ends before the node's.

Each part runs in a cpu cgroup of its own (``/sys/fs/cgroup/cpu`` or cgroup v2's root, when this
process may make one: root), which holds every process the part starts, whatever session it
starts (niceness alone was lost to the kernel's autogroups, one scheduling group per session).
The group's weight is what the part gets of the cores when all of them want them: the node's
part twice a control plane's (it is the suite's critical path: the others end minutes before
it, and in its first minutes, while all four run, it had under a third of the cores and ran the
demo at half its speed), each control plane's part the same (they wait on real API servers,
leases and deadlines: each still has a quarter of the cores when all four run), the unit part a
third of a control plane's (CPU-bound, no deadline but pytest's 600 s a test), so the unit
tests take what the others leave and none of them is starved.

Only the unit and control-plane parts had groups before (at the weight of niceness 10, 110 to
the node's 1024), and the node's part ran in the root group, where each of its processes weighs
as much as a whole group: on a machine slow enough that the node's part was busy, the other two
got a few percent of the cores. On 2026-12-05 CI's run took 38 min and failed: the control
plane's API server answered nothing for 60 s, the operator lost its Lease, one unit test went
from 6 s alone to over 600 s and one from 5.7 to 61.9 s, while the node's tests took twice their
time. When a part ends, its CPU time is printed (``cpu``: its processes' user and system
seconds, from the cgroup's accounting) beside its wall time, so the next slow run says which
part used the cores.

The first three expressions partition the suite (each is the others' complement), so every
collected test runs in one of them and only one, and none is skipped for the split (the fourth
runs some control-plane modules a second time, on another API server). A test cannot land in the
wrong part by a missing marker: ``tests/conftest.py`` marks each test by the fixtures it uses
(``control_plane``, ``node``, ``integration``, ``sharedfs``). Each part writes its own log (named
at the start; ``tail -f`` it to follow); when a part ends its summary is printed (durations,
failures in full, the short summary), and the exit status is non-zero when any part failed.

    python hack/test.py [PYTEST_ARGS...]     # every part gets PYTEST_ARGS (--durations=30, -x...)
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from payloadrun_devcluster.binaries import VERSION_ENV, read_versions

REPO = Path(__file__).resolve().parents[1]
MACHINE = "integration or sharedfs"
NO_NODE = "integration and not node and not sharedfs"
# The node's part collects only the folders its tests live in (pytest's testpaths, which
# arguments naming tests replace): collecting the whole suite took it about a minute at the
# start, when all three parts collect at once on two cores, a minute on the critical path. The
# unit part, which collects everything, fails when a test the node's part would run lies outside
# them (tests/conftest.py reads PAYLOADRUN_NODE_PATHS), so none is left to no part.
NODE_PATHS = ("tests/integration", "tests/sharedfs")
# What runs again on the oldest Kubernetes: the control-plane modules of the operator, the CRD,
# the chart and the manifests. Not the queues' (Kueue v0.19.2's own CRDs need Kubernetes 1.31's
# selectableFields: the API server refuses them, before the operator is involved), nor the
# election's and the client's (coordination.k8s.io/v1 Leases and the HTTP client are the same on
# every claimed version, and the election's tests are the suite's most timing-bound: a second run
# of them cost the node's part CPU for nothing), nor those that are the local machine's (images,
# dashboards, docs, kind's volume).
OLDEST_PATHS = tuple(
    f"tests/integration/test_{name}.py"
    for name in (
        "controlplane", "operator", "templates_api", "render_api", "explain", "chart_install",
        "release_manifests", "watching", "one_pass", "stopping", "groups_followed",
        "groups_refused", "lws_group_env",
    )
)  # fmt: skip
OLDEST_VERSION = read_versions()["KUBERNETES_OLDEST_VERSION"]
# what the oldest part runs before its pytest (its progress goes to the part's log)
OLDEST_BUILD = ("bash", "cluster/build.sh", "--oldest")
# name: (marker expression, environment, niceness, pytest options, setup command). The niceness
# is the weight of the part's cpu cgroup (nice -3: 2000, nice 0: 1024, nice 5: 336): the node's
# part, the critical path, twice a control plane's; the CPU-bound unit part a third of a control
# plane's. The setup command runs first, in the part's group; the part fails when it fails.
PARTS = {
    "node": (
        f"({MACHINE}) and not ({NO_NODE})",
        {},
        -3,
        ["-o", f"testpaths={' '.join(NODE_PATHS)}"],
        (),
    ),
    "control-plane": (NO_NODE, {"PAYLOADRUN_NO_NODE": "1"}, 0, [], ()),
    "unit": (
        f"not ({MACHINE})",
        {"PAYLOADRUN_NODE_PATHS": os.pathsep.join(NODE_PATHS)},
        5,
        [],
        (),
    ),
    "oldest-control-plane": (
        NO_NODE,
        {"PAYLOADRUN_NO_NODE": "1", VERSION_ENV: OLDEST_VERSION},
        0,
        ["-o", f"testpaths={' '.join(OLDEST_PATHS)}"],
        OLDEST_BUILD,
    ),
}
# pytest's sections after the progress dots: what a part prints when it ends
SUMMARY_START = re.compile(
    r"^=+ (FAILURES|ERRORS|warnings summary|slowest .*durations|short test summary info"
    r"|.* in \d+(\.\d+)?s( \([\d:]+\))?) =+$",  # the last line: "1 passed in 2.00s"
    re.M,
)
PROGRESS = re.compile(r"\[\s*(\d+)%\]")
HEARTBEAT_S = 60.0
NO_TESTS = 5  # pytest's exit status when a part selected nothing (PYTEST_ARGS name others')
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")  # the cpu controller's hierarchy (cgroup v1)
CGROUP_V2 = Path("/sys/fs/cgroup")  # the unified hierarchy (cgroup v2)
CGROUP_V1_CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting, when apart
CGROUP_PREFIX = "payloadrun-test-"  # a part's cpu cgroup: <prefix><part>-<this process's pid>


def cpu_shares(niceness: int) -> int:
    """cgroup v1's ``cpu.shares`` of a group weighed as one task of ``niceness``: a nice-0
    task's weight, 1024, divided by 1.25 per step (nice 10: 110, as in the kernel's table)."""
    return max(2, round(1024 / 1.25**niceness))


def cpu_cgroup_parent(v1: Path = CGROUP_V1_CPU, v2: Path = CGROUP_V2) -> Path | None:
    """Where a part's cpu cgroup can be made: cgroup v1's cpu hierarchy, or cgroup v2's root
    when its children get the cpu controller; None when neither is there or this process may not
    write to it (not root)."""
    if (v1 / "cpu.shares").is_file() and os.access(v1, os.W_OK):
        return v1
    controllers = v2 / "cgroup.subtree_control"
    if controllers.is_file() and "cpu" in controllers.read_text().split():
        return v2 if os.access(v2, os.W_OK) else None
    return None


class CpuGroup:
    """A cpu cgroup weighed as one task of ``niceness``; the processes a part starts in it
    stay in it, whatever session they start. On cgroup v1 a group of the same name in the
    cpuacct hierarchy (when it is mounted apart) counts their CPU time."""

    def __init__(
        self, parent: Path, name: str, niceness: int, cpuacct: Path = CGROUP_V1_CPUACCT
    ) -> None:
        self.path = parent / name
        self.path.mkdir(exist_ok=True)
        self.accounting: Path | None = None
        if (self.path / "cpu.shares").exists():  # v1
            (self.path / "cpu.shares").write_text(str(cpu_shares(niceness)))
            if (self.path / "cpuacct.usage").exists():  # cpu and cpuacct mounted together
                self.accounting = self.path
            elif (cpuacct / "cpuacct.usage").exists() and os.access(cpuacct, os.W_OK):
                self.accounting = cpuacct / name
                self.accounting.mkdir(exist_ok=True)
        else:  # v2: cpu.stat is in every group
            (self.path / "cpu.weight.nice").write_text(str(niceness))

    def groups(self) -> tuple[Path, ...]:
        """The group's directories: the cpu hierarchy's, and the cpuacct one's if apart."""
        if self.accounting in (None, self.path):
            return (self.path,)
        return (self.path, self.accounting)

    def enter(self) -> None:
        """Move the calling process into the group (a ``preexec_fn``: before the part's
        command runs, so each process it starts is born in it). A group that refuses it (cgroup
        v2's rule against processes beside child groups, say) leaves the part at niceness only:
        slower, never failing."""
        for group in self.groups():
            with contextlib.suppress(OSError):
                (group / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_seconds(self) -> float | None:
        """The CPU time (user and system) of every process that ran in the group, or None
        when nothing counts it."""
        with contextlib.suppress(OSError, ValueError):
            if self.accounting is not None:
                return int((self.accounting / "cpuacct.usage").read_text()) / 1e9
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) / 1e6
        return None

    def remove(self) -> None:
        """Remove the group once its processes are gone (a process a part left running keeps
        it, and stays in it)."""
        for group in self.groups():
            with contextlib.suppress(OSError):
                group.rmdir()


@dataclass
class Part:
    name: str
    marker: str
    env: dict[str, str]
    niceness: int
    options: list[str]
    log: Path
    setup: tuple[str, ...] = ()
    process: subprocess.Popen | None = None
    started: float = field(default_factory=time.monotonic)
    took: float | None = None
    code: int | None = None
    group: CpuGroup | None = None

    def command(self, pytest_args: list[str]) -> list[str]:
        pytest = [
            sys.executable, "-m", "pytest", "-m", self.marker,
            # each part its own cache (last failures), so none overwrites another's
            "-o", f"cache_dir=.pytest_cache/{self.name}",
            *self.options,
            *pytest_args,
        ]  # fmt: skip
        niced = ["nice", "-n", str(self.niceness)]
        if not self.setup:
            return [*niced, *pytest]
        # the setup's stdout (a build prints its directory) is not the log's; then pytest
        script = f'{shlex.join(self.setup)} >/dev/null && exec "$@"'
        return [*niced, "bash", "-c", script, self.name, *pytest]

    def progress(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        found = PROGRESS.findall(text)
        if found:
            return f"{found[-1]}%"
        if self.setup and text and "test session starts" not in text:  # pytest's first line
            return f"setting up ({shlex.join(self.setup)})"
        return "collecting"


def summary(text: str) -> str:
    """Everything a pytest run printed after its progress: failures in full, durations, the
    short summary and the final line; the whole output when it has none of them (a crash)."""
    match = SUMMARY_START.search(text)
    return text[match.start() :] if match else text


def stamp(started: float) -> str:
    took = int(time.monotonic() - started)
    return f"[{took // 60:02d}:{took % 60:02d}]"


def remove_stale_groups(parent: Path) -> None:
    """An earlier run's groups (it was killed), each once empty: a process it holds keeps it."""
    for hierarchy in (parent, CGROUP_V1_CPUACCT):
        for stale in hierarchy.glob(f"{CGROUP_PREFIX}*"):
            with contextlib.suppress(OSError):
                stale.rmdir()


def group_of(parent: Path, part: Part) -> CpuGroup | None:
    """The part's cpu cgroup, or None (said) when the cgroup file system refuses one."""
    try:
        return CpuGroup(parent, f"{CGROUP_PREFIX}{part.name}-{os.getpid()}", part.niceness)
    except OSError as error:  # a read-only cgroup file system: niceness only
        print(f"{part.name}: no cpu cgroup ({error}); niceness only", flush=True)
        return None


def main(argv: list[str]) -> int:
    logs = Path(tempfile.mkdtemp(prefix="payloadrun-test-"))
    started = time.monotonic()
    parts = [
        Part(name, marker, env, niceness, options, logs / f"{name}.log", setup)
        for name, (marker, env, niceness, options, setup) in PARTS.items()
    ]
    parent = cpu_cgroup_parent()
    if parent is not None:
        remove_stale_groups(parent)
    for part in parts:
        if parent is not None:
            part.group = group_of(parent, part)
        with part.log.open("w") as out:
            part.process = subprocess.Popen(
                part.command(argv),
                cwd=REPO,
                env={**os.environ, **part.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=part.group.enter if part.group else None,  # noqa: PLW1509 (one thread)
            )
        env = "".join(f"{k}={v} " for k, v in part.env.items())
        options = "".join(f" {option}" for option in part.options)
        where = f", cpu cgroup {part.group.path}" if part.group else ""
        setup = f"{shlex.join(part.setup)} && " if part.setup else ""
        print(
            f"{part.name}: {env}nice -n {part.niceness} {setup}pytest -m {part.marker!r}{options}, "
            f"log {part.log}{where}",
            flush=True,
        )

    def interrupt(signum: int, _frame: object) -> None:
        # SIGTERM (CI cancelling): each part gets SIGINT, so pytest tears its fixtures down (the
        # cluster stops, the host is cleaned) before it exits
        for part in parts:
            if part.process and part.process.poll() is None:
                part.process.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, interrupt)
    # the terminal's Ctrl-C reaches every part (one process group): this waits for them
    signal.signal(signal.SIGINT, lambda *_: None)
    failed = []
    running = list(parts)
    next_beat = time.monotonic() + HEARTBEAT_S
    while running:
        time.sleep(1)
        for part in list(running):
            assert part.process is not None
            code = part.process.poll()
            if code is None:
                continue
            running.remove(part)
            part.took = time.monotonic() - part.started
            cpu = ""
            if part.group:
                seconds = part.group.cpu_seconds()
                cpu = f" (cpu {seconds:.0f} s)" if seconds is not None else ""
                part.group.remove()
            print(
                f"\n{stamp(started)} ===== {part.name} (pytest -m {part.marker!r}) ended: "
                f"exit {code} in {part.took:.0f} s{cpu}; log {part.log}",
                flush=True,
            )
            print(summary(part.log.read_text(errors="replace")), end="", flush=True)
            part.code = code
            if code not in (0, NO_TESTS):
                failed.append(part.name)
        if running and time.monotonic() >= next_beat:
            next_beat += HEARTBEAT_S
            beat = ", ".join(f"{h.name} {h.progress()}" for h in running)
            print(f"{stamp(started)} running: {beat}", flush=True)
    if all(h.code == NO_TESTS for h in parts):
        failed.append("no test selected")
    took = {h.name: f"{h.took:.0f} s" for h in parts}
    verdict = f"FAILED: {', '.join(failed)}" if failed else "all passed"
    print(f"\n{stamp(started)} {verdict} ({took}); logs in {logs}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
