"""Processes of one machine that use its glusterd at once, as a node (whose volume it serves),
these tests and a benchmark may: each creates, changes and deletes volumes and stops glusterd
when it finds it idle, and none fails for the others (glusterd refuses a second transaction
while one runs, and a process that found it idle must not stop it under another's new volume):
``glusterfs.machine_lock``."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.sharedfs

USER = """
import sys
from pathlib import Path
from payloadrun_devcluster.glusterfs import GlusterServer, machine_lock

base, rounds = Path(sys.argv[1]), int(sys.argv[2])
server = GlusterServer.ensure()
for n in range(rounds):
    volume = server.create_volume(base / str(n))
    volume.set({"performance.stat-prefetch": "off"})
    assert volume.brick_pid() is not None
    server.delete_volume(volume.name)
    server.stop_if_idle()  # glusterd stops when no other process has a volume left on it
print(rounds)
"""
USERS = 3
ROUNDS = 4


def test_processes_create_and_delete_volumes_and_stop_an_idle_glusterd_at_once(gluster, tmp_path):
    users = [
        subprocess.Popen(
            [sys.executable, "-c", USER, str(tmp_path / f"user-{n}"), str(ROUNDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(USERS)
    ]
    said = [(user, *user.communicate(timeout=300)) for user in users]
    ended = [(user.returncode, out.strip()) for user, out, _ in said]
    assert ended == [(0, str(ROUNDS))] * USERS, [err[-2000:] for _, _, err in said]
    theirs = tuple(f"prtest-{user.pid}-" for user in users)
    names = gluster.volume_names() if gluster.running() else []
    assert [name for name in names if name.startswith(theirs)] == []
