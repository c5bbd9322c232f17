"""A real network filesystem on this machine: GlusterFS volumes on loopback, FUSE client mounts.

Users run payloads by handle on NFS, CephFS, Filestore, EFS or Lustre, where the writer and the
trainer are different clients of the filesystem, each with its own attribute and directory-entry
caches. GlusterFS (Debian's ``glusterfs-server`` and ``glusterfs-client``, nothing else) gives
the same shape here: each ``glusterfs`` mount is an independent FUSE client of the volume's brick
server, with its own caches, so "the inference node", "the orchestrator node" and "the trainer
node" are three mounts of one volume. nfs-ganesha would serve NFS too, but Debian packages no
userspace NFS client and this kernel has none; GlusterFS needs nothing beyond Debian.

- :class:`GlusterServer`: ``glusterd``, one per machine (its port 24007 is fixed), bound to
  127.0.0.1 with its state under ``/run/payloadrun-gluster``. Started by the first user that needs
  it, stopped by :meth:`GlusterServer.stop_if_idle` once no volume is left.
- :data:`machine_lock`: the processes that use it at once (a node, whose volume it serves, the
  GlusterFS tests, a benchmark, a test's users of their own) take turns: glusterd refuses a
  second transaction while one runs ("Another transaction is in progress"), and "is it idle?
  stop it" or "is it running? create a volume" must not interleave with another process's.
- :class:`Volume`: one brick on a local directory (or on a tmpfs of a given size, for a volume
  that fills up), with the fault controls the tests use: kill the brick process and start it
  again, stop it (SIGSTOP) and let it go on.
- :class:`Mount`: one FUSE client of a volume (or of one directory of it), with the client's
  default caches or the coherent settings (:data:`COHERENT_MOUNT_OPTIONS` with
  :data:`COHERENT_VOLUME_OPTIONS`).

Volumes are named after their owner: ``prnode`` is the local node's (its storage class), and
``prtest-<pid>-<n>`` a test or benchmark process's; the volumes of a process that is gone are
deleted by the next :meth:`GlusterServer.ensure`, so a crash leaves nothing that trips a new run.
Root and Linux only (FUSE mounts); standard library only, like the rest of this package.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .processes import process_start_time

RUN_DIR = Path("/run/payloadrun-gluster")
GLUSTERD_PORT = 24007
COMMANDS = ("glusterd", "gluster", "glusterfs")
PACKAGES_HINT = "run: bash cluster/node-packages.sh  (Debian: glusterfs-server, glusterfs-client)"
NODE_VOLUME = "prnode"
TEST_VOLUME_PREFIX = "prtest-"
# What makes a second client see another client's changes at once: no FUSE entry, attribute or
# negative-lookup caching in the kernel, and no md-cache (stat-prefetch) in the client.
COHERENT_MOUNT_OPTIONS = ("--attribute-timeout=0", "--entry-timeout=0", "--negative-timeout=0")
COHERENT_VOLUME_OPTIONS = {"performance.stat-prefetch": "off"}

_counter = itertools.count()


class MachineLock:
    """An exclusive lock of every process on this machine (``flock`` on ``path``), re-entrant
    within a process: what holds it may call what takes it again (a volume's creation runs
    ``gluster`` commands, each of which takes it too). The lock file is opened close-on-exec, so a
    glusterd started under it does not hold it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._in_process = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    def __enter__(self) -> None:
        self._in_process.acquire()
        if self._depth == 0:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                self._in_process.release()
                raise
            self._fd = fd
        self._depth += 1

    def __exit__(self, *_exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
        self._in_process.release()


# beside RUN_DIR, not in it: the lock outlives a cleanup of the server's state
machine_lock = MachineLock(RUN_DIR.with_name(RUN_DIR.name + ".lock"))


class GlusterError(RuntimeError):
    """GlusterFS cannot run here, or a command of it failed (with its output)."""


def unsupported_reason() -> str | None:
    """Why GlusterFS cannot run on this machine, or None when it can."""
    if not Path("/proc/filesystems").is_file():
        return "GlusterFS mounts need Linux"
    if os.geteuid() != 0:
        return "GlusterFS mounts need root (FUSE, a server on port 24007)"
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse on this machine"
    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if missing:
        return f"missing on this machine: {', '.join(missing)}; {PACKAGES_HINT}"
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except OSError as error:
        return f"the hostname {host!r} does not resolve ({error}): add '127.0.0.1 {host}' to " + (
            "/etc/hosts"
        )
    if address != "127.0.0.1":
        return (
            f"the hostname {host!r} resolves to {address}, not 127.0.0.1: GlusterFS names its "
            f"brick by the hostname and refuses 127.0.0.1 itself; add '127.0.0.1 {host}' to "
            "/etc/hosts"
        )
    return None


def glusterd_volfile(work_dir: Path) -> str:
    """glusterd's configuration: Debian's, on 127.0.0.1 only (its bricks then bind there too)."""
    return f"""volume management
    type mgmt/glusterd
    option working-directory {work_dir}
    option transport-type socket
    option transport.socket.listen-port {GLUSTERD_PORT}
    option transport.socket.bind-address 127.0.0.1
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option max-port 60999
end-volume
"""


def mount_command(
    volume: str,
    mountpoint: Path,
    *,
    log_file: Path,
    pid_file: Path,
    coherent: bool = False,
    subdir: str | None = None,
) -> list[str]:
    """The ``glusterfs`` command line of one FUSE client (pure; the node's volume driver too)."""
    args = [
        "glusterfs",
        "--volfile-server=127.0.0.1",
        f"--volfile-id={volume}",
        f"--log-file={log_file}",
        f"--pid-file={pid_file}",
    ]
    if subdir:
        args.append(f"--subdir-mount=/{subdir.strip('/')}")
    if coherent:
        args.extend(COHERENT_MOUNT_OPTIONS)
    return [*args, str(mountpoint)]


def as_client(mount: Path | str, at: Path | str) -> list[str]:
    """A command prefix that runs the rest as a process of another node: in a mount namespace
    of its own where ``at`` is the client ``mount`` (bind-mounted over it).

    Every pod of a run mounts the volume at the same path, each on its own node's client; this
    gives processes on one machine the same view (the segments name files by absolute path).
    ``unshare`` and ``sh`` exec the command, so its pid is the process's own.
    """
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private"]
    return [*unshare, "sh", "-c", script, "sh", str(mount), str(at)]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def gluster(*args: str, timeout: float = 120) -> str:
    """``gluster --mode=script ARGS``; its output, or :class:`GlusterError` with what it said.
    One at a time on the machine (:data:`machine_lock`)."""
    with machine_lock:
        result = _run("gluster", "--mode=script", *args, timeout=timeout)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip()
        raise GlusterError(f"gluster {' '.join(args)} failed ({result.returncode}): {said}")
    return result.stdout


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not: orphans here may be reaped late, or never)."""
    return process_start_time(pid) is not None


def _wait(what: str, condition, timeout: float, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise GlusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def fuse_mounts(source_prefix: str = "127.0.0.1:") -> list[tuple[str, str]]:
    """(source, mount point) of every GlusterFS FUSE mount on this machine from our server."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            fstype, source = after.split()[:2]
            if fstype == "fuse.glusterfs" and source.startswith(source_prefix):
                found.append((source, before.split()[4].replace("\\040", " ")))
    return found


def unmount(point: str | Path) -> None:
    """Unmount a FUSE mount (lazily if busy); its client process exits with it."""
    if _run("umount", str(point), timeout=30).returncode != 0:
        _run("umount", "-l", str(point), timeout=30)


def _processes(pattern: re.Pattern[str]) -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pattern.search(cmdline):
            yield int(entry.name), cmdline


@dataclass
class Mount:
    """One FUSE client of a volume at ``path``; :meth:`unmount` ends it."""

    volume: str
    path: Path
    pid: int
    coherent: bool
    subdir: str | None = None

    def unmount(self) -> None:
        """Unmount, and wait (up to 10 s) for the client process to exit."""
        if os.path.ismount(self.path):
            unmount(self.path)
        _wait(f"the client of {self.path} to exit", lambda: not process_alive(self.pid), 10)


@dataclass
class Volume:
    """A one-brick volume; ``brick`` is the server's directory of it (never written directly)."""

    name: str
    brick: Path
    tmpfs: Path | None = None
    mounts: list[Mount] = field(default_factory=list)

    # ------------------------------------------------------------------------------ clients

    def mount(self, path: Path, *, coherent: bool = False, subdir: str | None = None) -> Mount:
        """A new FUSE client of this volume at ``path``, ready when this returns."""
        mount = mount_client(self.name, path, coherent=coherent, subdir=subdir)
        self.mounts.append(mount)
        return mount

    # ------------------------------------------------------------------------------- faults

    def brick_pid(self) -> int | None:
        """The brick server's pid while it is online, else None."""
        status = ET.fromstring(gluster("volume", "status", self.name, "--xml", timeout=30))
        for node in status.iter("node"):
            if node.findtext("path") == str(self.brick) and node.findtext("status") == "1":
                pid = int(node.findtext("pid") or -1)
                return pid if pid > 0 else None
        return None

    def signal_brick(self, sig: int) -> int:
        """Send ``sig`` to the running brick server; its pid."""
        pid = self.brick_pid()
        if pid is None:
            raise GlusterError(f"the brick of {self.name} is not running")
        os.kill(pid, sig)
        return pid

    def kill_brick(self) -> int:
        """SIGKILL the brick server (every client's calls fail until it is back); its pid."""
        pid = self.signal_brick(signal.SIGKILL)
        _wait(f"brick {pid} of {self.name} to die", lambda: not process_alive(pid), 10)
        return pid

    def start_brick(self, timeout: float = 60) -> int:
        """Start a brick that died (``volume start --force``); its new pid, once it serves."""

        def online() -> bool:
            if self.brick_pid() is not None:
                return True
            # glusterd sees a brick as running until it has noticed the death: ask again
            with contextlib.suppress(GlusterError):
                gluster("volume", "start", self.name, "force", timeout=30)
            return self.brick_pid() is not None

        _wait(f"the brick of {self.name} to serve again", online, timeout, interval=0.2)
        pid = self.brick_pid()
        assert pid is not None
        return pid

    def pause_brick(self) -> int:
        """SIGSTOP the brick server: clients' calls hang until their ping timeout; its pid."""
        return self.signal_brick(signal.SIGSTOP)

    @staticmethod
    def resume_brick(pid: int) -> None:
        os.kill(pid, signal.SIGCONT)

    def set(self, options: dict[str, str]) -> None:
        for key, value in options.items():
            gluster("volume", "set", self.name, key, value)

    def clients_reconnected(self, timeout: float = 60) -> None:
        """Wait until every mount of this volume answers a ``statvfs`` again."""
        for mount in self.mounts:
            _wait(f"{mount.path} to answer again", lambda m=mount: _answers(m.path), timeout, 0.2)


def mount_client(
    volume: str, path: Path, *, coherent: bool = False, subdir: str | None = None
) -> Mount:
    """A new FUSE client of ``volume`` (or of its directory ``subdir``) at ``path``, ready when
    this returns; its log under ``/run/payloadrun-gluster/logs``."""
    path.mkdir(parents=True, exist_ok=True)
    logs = RUN_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tag = re.sub(r"[^A-Za-z0-9]+", "-", str(path)).strip("-")[-120:]
    pid_file = RUN_DIR / "clients" / f"{tag}.pid"
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"client-{tag}.log"
    command = mount_command(
        volume, path, log_file=log_file, pid_file=pid_file, coherent=coherent, subdir=subdir
    )
    result = _run(*command, timeout=60)
    if result.returncode != 0:
        raise GlusterError(
            f"mounting {volume} at {path} failed ({result.returncode}): "
            f"{(result.stderr or result.stdout).strip()}; see {log_file}"
        )
    _wait(f"{volume} mounted at {path}", lambda: _mounted(path), 30)
    return Mount(volume, path, int(pid_file.read_text().strip()), coherent, subdir)


def _answers(path: Path) -> bool:
    try:
        os.statvfs(path)
        os.listdir(path)
    except OSError:
        return False
    return True


def _mounted(path: Path) -> bool:
    return os.path.ismount(path) and _answers(path)


class GlusterServer:
    """The machine's ``glusterd``, and the volumes this process made on it."""

    def __init__(self) -> None:
        self.volumes: dict[str, Volume] = {}

    @classmethod
    def ensure(cls) -> GlusterServer:
        """The running glusterd of this machine, started if none runs (after leftovers go)."""
        reason = unsupported_reason()
        if reason:
            raise GlusterError(f"GlusterFS cannot run here: {reason}")
        server = cls()
        with machine_lock:
            server._start_if_stopped()
            server._delete_volumes_of_gone_processes()
        return server

    def _start_if_stopped(self) -> None:
        """Start glusterd when none runs (another process that found it idle may have stopped
        it since this one's :meth:`ensure`), after a crashed one's leftovers go. Under
        :data:`machine_lock`."""
        if not self.running():
            self._clean_leftovers()
            self._start()

    @staticmethod
    def pid() -> int | None:
        try:
            pid = int((RUN_DIR / "glusterd.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if process_alive(pid) else None

    def running(self) -> bool:
        return self.pid() is not None and _port_open(GLUSTERD_PORT)

    def _start(self) -> None:
        work = RUN_DIR / "glusterd"
        work.mkdir(parents=True, exist_ok=True)
        (RUN_DIR / "logs").mkdir(exist_ok=True)
        volfile = RUN_DIR / "glusterd.vol"
        volfile.write_text(glusterd_volfile(work))
        log = RUN_DIR / "logs" / "glusterd.log"
        result = _run(
            "glusterd", "-f", str(volfile), "-p", str(RUN_DIR / "glusterd.pid"), f"--log-file={log}"
        )
        if result.returncode != 0:
            raise GlusterError(f"glusterd did not start ({result.returncode}): {result.stderr}")
        try:
            _wait("glusterd to answer", self._answers, 30, interval=0.1)
        except GlusterError as error:
            raise GlusterError(f"{error}; its log: {log}") from None

    @staticmethod
    def _answers() -> bool:
        return _run("gluster", "--mode=script", "volume", "list", timeout=10).returncode == 0

    def volume_names(self) -> list[str]:
        out = gluster("volume", "list", timeout=30)
        return [line.strip() for line in out.splitlines() if line.strip() and " " not in line]

    def create_volume(
        self,
        brick_dir: Path,
        *,
        name: str | None = None,
        size_bytes: int | None = None,
        options: dict[str, str] | None = None,
    ) -> Volume:
        """A started one-brick volume on ``brick_dir`` (a tmpfs of ``size_bytes`` when given).

        ``name`` defaults to a test volume of this process (:data:`TEST_VOLUME_PREFIX`).
        """
        name = name or f"{TEST_VOLUME_PREFIX}{os.getpid()}-{next(_counter)}"
        with machine_lock:
            self._start_if_stopped()
            return self._create_volume(brick_dir, name, size_bytes, options)

    def _create_volume(
        self, brick_dir: Path, name: str, size_bytes: int | None, options: dict[str, str] | None
    ) -> Volume:
        brick_dir.mkdir(parents=True, exist_ok=True)
        tmpfs = None
        if size_bytes is not None:
            result = _run(
                "mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(brick_dir)
            )
            if result.returncode != 0:
                raise GlusterError(f"mounting a tmpfs at {brick_dir} failed: {result.stderr}")
            tmpfs = brick_dir
        brick = brick_dir / "brick"
        brick.mkdir(exist_ok=True)
        host = socket.gethostname()
        # force: the brick is on the root filesystem, which GlusterFS warns against
        gluster("volume", "create", name, f"{host}:{brick}", "force")
        volume = Volume(name, brick, tmpfs)
        self.volumes[name] = volume
        try:
            if options:
                volume.set(options)
            gluster("volume", "start", name)
            _wait(f"the brick of {name}", lambda: volume.brick_pid() is not None, 30, 0.1)
        except BaseException:
            self.delete_volume(name)
            raise
        return volume

    def delete_volume(self, name: str) -> None:
        """Unmount its clients, stop and delete the volume, and remove its brick's data."""
        with machine_lock:
            self._delete_volume(name)

    def _delete_volume(self, name: str) -> None:
        volume = self.volumes.pop(name, None)
        for source, point in fuse_mounts(f"127.0.0.1:{name}"):
            if source == f"127.0.0.1:{name}" or source.startswith(f"127.0.0.1:{name}/"):
                unmount(point)
        if volume is not None:
            for mount in volume.mounts:
                with contextlib.suppress(GlusterError):
                    mount.unmount()
        if name in self.volume_names():
            bricks = _brick_paths(name)
            gluster("volume", "stop", name, "force")
            gluster("volume", "delete", name)
            for brick in bricks:  # the data; a tmpfs goes with its unmount below
                shutil.rmtree(brick, ignore_errors=True)
        if volume is not None and volume.tmpfs is not None:
            unmount(volume.tmpfs)

    def delete_own_volumes(self) -> None:
        for name in list(self.volumes):
            self.delete_volume(name)

    def stop_if_idle(self) -> bool:
        """Stop glusterd when no volume is left on it; True when it is stopped (or was)."""
        with machine_lock:
            if not self.running():
                return True
            if self.volume_names():
                return False
            self._stop()
            return True

    def _stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(GlusterError):
                _wait("glusterd to exit", lambda: not process_alive(pid), 10)
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(RUN_DIR / "glusterd", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (RUN_DIR / "glusterd.pid").unlink()

    def _delete_volumes_of_gone_processes(self) -> None:
        for name in self.volume_names():
            match = re.fullmatch(rf"{TEST_VOLUME_PREFIX}(\d+)-\d+", name)
            if match and not process_alive(int(match.group(1))):
                self.delete_volume(name)

    def _clean_leftovers(self) -> None:
        """A crashed glusterd's clients, bricks and state: nothing of it is reused."""
        for _, point in fuse_mounts():
            unmount(point)
        ours = re.compile(rf"glusterfsd .*--volfile-id ({NODE_VOLUME}|{TEST_VOLUME_PREFIX})")
        ours_too = re.compile(rf"(glusterd|glusterfs) .*{RUN_DIR}")
        for pid, _ in [*_processes(ours), *_processes(ours_too)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(RUN_DIR / "glusterd", ignore_errors=True)


def teardown(server: GlusterServer | None = None) -> None:
    """Delete this process's volumes and stop glusterd when nothing else uses it."""
    server = server or GlusterServer()
    if not server.running():
        return
    server.delete_own_volumes()
    server.stop_if_idle()


def _brick_paths(name: str) -> list[Path]:
    info = ET.fromstring(gluster("volume", "info", name, "--xml", timeout=30))
    return [Path(b.text.split(":", 1)[1]) for b in info.iter("brick") if b.text and ":" in b.text]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0
