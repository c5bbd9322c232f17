"""Start and stop control-plane processes so that none is ever left behind.

Each component runs in its own session (so its own process group); stopping it signals the
whole group, SIGTERM first and SIGKILL after a grace period. Attached processes (the pytest
fixture, a ``with LocalCluster()`` block) also get ``PR_SET_PDEATHSIG``: if the Python process
dies without running its cleanup (SIGKILL, a crash), the kernel sends SIGKILL to the children.
Detached processes (``python -m payloadrun_devcluster up``) outlive the command; their pid and
start time are recorded so ``down`` never signals a recycled pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int):
    """A ``preexec_fn`` that asks the kernel to SIGKILL the child when its parent dies.

    SIGKILL, not SIGTERM: when the parent is gone every component gets the signal at once,
    and kube-apiserver's graceful shutdown then waits forever for the etcd that died with it.
    """

    # loaded here, in the parent: the child only calls prctl, no dlopen between fork and exec
    # (where a lock another thread of the parent held at the fork is never released)
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def stat_fields(pid: int | str) -> list[str] | None:
    """``/proc/<pid>/stat`` from its third field (the state) on, or None if ``pid`` is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces or parentheses: split after its last ')'.
    return stat[stat.rindex(")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of the whole line


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. A zombie does not: it has exited, and only
    waits for its parent to reap it, which for a detached cluster's processes is PID 1, on its
    own schedule (every 2 s on the CI machines, so ``down`` waited 2 s per component)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(group == pgid and state not in "ZX" for state, group in process_groups())


def process_groups() -> Iterator[tuple[str, int]]:
    """(state, process group) of every process on the machine, from /proc."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := stat_fields(entry.name)) is not None:
            yield fields[0], int(fields[2])


@dataclass
class ManagedProcess:
    """One component process: its group, log file, and (when we started it) its Popen."""

    name: str
    pid: int
    start_time: int | None
    log_path: Path
    popen: subprocess.Popen | None = None

    @classmethod
    def spawn(
        cls,
        name: str,
        args: list[str],
        log_path: Path,
        *,
        cwd: Path,
        die_with_parent: bool,
        env: dict[str, str] | None = None,
    ) -> ManagedProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(
                f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(args)}\n".encode()
            )
            log.flush()
            popen = subprocess.Popen(
                args,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                # prctl must run in the child (its work is one call: see _die_with_parent)
                preexec_fn=_die_with_parent(os.getpid()) if die_with_parent else None,  # noqa: PLW1509
                close_fds=True,
            )
        return cls(
            name=name,
            pid=popen.pid,
            start_time=process_start_time(popen.pid),
            log_path=log_path,
            popen=popen,
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "pid": self.pid,
            "start_time": self.start_time,
            "log": str(self.log_path),
        }

    @classmethod
    def from_json(cls, data: dict) -> ManagedProcess:
        return cls(
            name=data["name"],
            pid=int(data["pid"]),
            start_time=data.get("start_time"),
            log_path=Path(data["log"]),
        )

    def is_ours(self) -> bool:
        """True while the recorded pid is still the process we started (not a recycled pid)."""
        if self.popen is not None:
            return self.popen.poll() is None
        current = process_start_time(self.pid)
        return current is not None and (self.start_time is None or current == self.start_time)

    def running(self) -> bool:
        return self.is_ours()

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def _group_alive(self) -> bool:
        if self.popen is not None:
            self.popen.poll()  # reap the leader so a zombie does not look alive
        return group_alive(self.pid)

    def signal_group(self, sig: int) -> None:
        if self.popen is None and not self.is_ours():
            return  # gone, or the pid now belongs to someone else: never signal it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._group_alive():
                return True
            time.sleep(0.05)
        return not self._group_alive()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the group, then SIGKILL whatever is left after ``grace`` seconds."""
        if self.terminate():
            self.wait_or_kill(grace)

    def terminate(self) -> bool:
        """SIGTERM the group; False when nothing of ours was left to stop."""
        if self.popen is None and not self.is_ours():
            return False  # already gone (or the pid was recycled): nothing of ours to stop
        if not self._group_alive():
            return False
        self.signal_group(signal.SIGTERM)
        return True

    def wait_or_kill(self, grace: float) -> None:
        """After :meth:`terminate`: wait ``grace`` seconds for the group to end, then SIGKILL it."""
        if self.wait_gone(grace):
            return
        self.signal_group(signal.SIGKILL)
        if not self.wait_gone(5.0):
            raise RuntimeError(f"{self.name} (process group {self.pid}) survived SIGKILL")

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return f"(no log at {self.log_path})"
        return "\n".join(text.splitlines()[-lines:])


class InBackground:
    """``work(cancelled)`` in a thread of its own: :meth:`join` waits for it and raises what it
    raised; :meth:`cancel` asks it to stop early (it checks ``cancelled`` where it waits) and waits.

    What runs there starts no process that must die with this one (``PR_SET_PDEATHSIG`` is tied
    to the thread that forks): those are spawned by the caller's thread.
    """

    def __init__(self, name: str, work: Callable[[threading.Event], None]) -> None:
        self.name = name
        self.cancelled = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(work,), name=name, daemon=True)

    def _run(self, work: Callable[[threading.Event], None]) -> None:
        try:
            work(self.cancelled)
        except BaseException as error:  # raised again by join(), in the caller's thread
            self.error = error

    def start(self) -> InBackground:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error

    def cancel(self, timeout: float = 120.0) -> None:
        self.cancelled.set()
        self.thread.join(timeout)
