"""hack/test.py (make test): each part runs in a cpu cgroup that holds every process it starts,
a new session's too (where a niceness alone was lost to the autogroups), and counts their CPU
time."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_suite_runner():
    spec = importlib.util.spec_from_file_location("suite_runner", REPO / "hack" / "test.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


runner = load_suite_runner()


def test_a_groups_weight_is_a_tasks_of_that_niceness():
    # the kernel's sched_prio_to_weight: nice 0 1024, nice 10 110, nice 19 15
    assert [runner.cpu_shares(n) for n in (0, 10, 19)] == [1024, 110, 15]
    assert runner.cpu_shares(40) == 2  # cgroup v1's least


def test_the_cgroup_parent_is_v1s_cpu_hierarchy_else_v2s_root_with_the_cpu_controller(tmp_path):
    v1, v2 = tmp_path / "cpu", tmp_path / "unified"
    v1.mkdir(), v2.mkdir()
    assert runner.cpu_cgroup_parent(v1, v2) is None
    (v2 / "cgroup.subtree_control").write_text("memory pids\n")
    assert runner.cpu_cgroup_parent(v1, v2) is None  # children get no cpu controller
    (v2 / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert runner.cpu_cgroup_parent(v1, v2) == v2
    (v1 / "cpu.shares").write_text("1024\n")
    assert runner.cpu_cgroup_parent(v1, v2) == v1


def cpu_cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or controllers == "":
            return path
    raise AssertionError(f"no cpu cgroup for {pid}")


def test_a_new_session_started_in_a_parts_group_stays_in_it():
    parent = runner.cpu_cgroup_parent()
    if parent is None:
        pytest.skip("no cpu cgroup can be made here (not root, or no cpu controller)")
    group = runner.CpuGroup(parent, f"{runner.CGROUP_PREFIX}probe-{os.getpid()}", niceness=10)
    try:
        if (group.path / "cpu.shares").exists():
            assert (group.path / "cpu.shares").read_text().strip() == "110"
        # the part's command, and a process it starts in a session of its own (as the control
        # planes and the sidecar processes the tests start do)
        script = "setsid sh -c 'cat /proc/self/cgroup'"
        result = subprocess.run(
            ["sh", "-c", script], preexec_fn=group.enter, capture_output=True, text=True, check=True
        )
        lines = [line.split(":", 2) for line in result.stdout.splitlines()]
        cpu = [path for _, controllers, path in lines if "cpu" in controllers.split(",")]
        cpu = cpu or [path for _, controllers, path in lines if controllers == ""]
        assert cpu == [f"/{group.path.name}"], result.stdout
        assert cpu_cgroup_of(os.getpid()) != f"/{group.path.name}"  # this process stays out
        # a process of the group that used 0.3 s of CPU: the group counts at least that
        burn = "import time\nwhile time.process_time() < 0.3:\n    pass\n"
        before = group.cpu_seconds()
        subprocess.run([sys.executable, "-c", burn], preexec_fn=group.enter, check=True)
        after = group.cpu_seconds()
        if before is None:
            pytest.skip("no CPU accounting for cpu cgroups here")
        assert after - before >= 0.3
    finally:
        group.remove()
    assert not group.path.exists()
    assert group.accounting is None or not group.accounting.exists()


def test_no_two_test_modules_share_a_name():
    # pytest imports test modules by their basename (rootdir-relative "prepend" mode): a second
    # module of the same name stops the whole part at collection ("import file mismatch")
    modules = [p for p in (REPO / "tests").rglob("test_*.py") if "__pycache__" not in p.parts]
    by_name: dict[str, list[str]] = {}
    for path in modules:
        by_name.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {n: p for n, p in by_name.items() if len(p) > 1} == {}


def run_part(tmp_path: Path, setup: tuple[str, ...]) -> tuple[int, str]:
    """A part whose pytest only prints its version, run as hack/test.py runs it; its exit
    status and its log."""
    log = tmp_path / "part.log"
    part = runner.Part("probe", "not integration", {}, 0, [], log, setup)
    with log.open("w") as out:
        code = subprocess.run(
            part.command(["--version"]), cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode
    return code, log.read_text()


def test_a_parts_setup_runs_before_its_pytest_and_a_failed_setup_fails_the_part(tmp_path):
    # as cluster/build.sh --oldest: progress on stderr, the built directory on stdout
    ready = "echo /built/directory; echo 'build.sh: compiling' >&2"
    code, log = run_part(tmp_path, ("sh", "-c", ready))
    assert code == 0, log
    assert log.index("build.sh: compiling") < log.index("pytest ")  # setup, then pytest
    assert "/built/directory" not in log  # the setup's stdout is not the log's
    code, log = run_part(tmp_path, ("sh", "-c", "echo 'build.sh: ERROR: no Go' >&2; exit 3"))
    assert code == 3 and "no Go" in log and "pytest " not in log, log


def test_the_oldest_part_builds_the_oldest_kubernetes_first():
    # cluster/build.sh --oldest: the control plane the part's tests run on, not make prepare's
    oldest = runner.PARTS["oldest-control-plane"]
    assert oldest[-1] == ("bash", "cluster/build.sh", "--oldest")
    assert oldest[1][runner.VERSION_ENV] == runner.OLDEST_VERSION
    others = [setup for name, (*_, setup) in runner.PARTS.items() if name != "oldest-control-plane"]
    assert others == [(), (), ()]
