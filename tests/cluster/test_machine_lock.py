"""``glusterfs.MachineLock``: the lock glusterd's users on one machine take turns by (a node,
the GlusterFS tests, a benchmark), tried from other processes."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from payloadrun_devcluster.glusterfs import MachineLock

# exit 0 when the lock at argv[1] is free (taken and let go at once), 1 when another holds it
TRY_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(1)
sys.exit(0)
"""


def free(path: Path) -> bool:
    return subprocess.run([sys.executable, "-c", TRY_LOCK, str(path)], check=False).returncode == 0


def test_another_process_waits_while_any_depth_of_it_is_held(tmp_path):
    lock = MachineLock(tmp_path / "run" / "gluster.lock")
    with lock:
        with lock:  # re-entrant: what holds it calls what takes it again
            assert not free(lock.path)
        assert not free(lock.path)  # the outer hold still holds it
    assert free(lock.path)


def test_a_process_started_under_it_does_not_keep_it(tmp_path):
    # glusterd is started under the lock and outlives the hold: it must not inherit it
    lock = MachineLock(tmp_path / "gluster.lock")
    with lock:
        daemon = subprocess.Popen(["sleep", "30"])
    try:
        assert free(lock.path)
    finally:
        daemon.kill()
        daemon.wait()


def test_threads_of_one_process_take_turns(tmp_path):
    lock = MachineLock(tmp_path / "gluster.lock")
    inside = threading.Event()
    let_go = threading.Event()
    entered = []

    def holder() -> None:
        with lock:
            inside.set()
            let_go.wait(10)

    def second() -> None:
        with lock:
            entered.append(let_go.is_set())

    first = threading.Thread(target=holder)
    first.start()
    assert inside.wait(10)
    other = threading.Thread(target=second)
    other.start()
    other.join(0.2)
    assert other.is_alive() and entered == []  # waiting behind the first thread's hold
    let_go.set()
    first.join(10), other.join(10)
    assert entered == [True]
    assert free(lock.path)
