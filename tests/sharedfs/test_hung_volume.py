"""A brick that stops answering: retention and the trainer's reader answer within their deadlines.

The volume keeps GlusterFS's default ``network.ping-timeout`` (42 s), so a SIGSTOPped brick hangs
every client call for longer than this test runs: nothing here is answered by the client giving
up on the brick. The retention sidecar runs on the orchestrator's client with its journal on the
volume, the trainer's reader on its own client; the files are written on the orchestrator's
client, so the trainer's client has nothing of them cached and its read must ask the brick.

While the brick is stopped: a ``policy_updated`` is answered 503 ``volume_hung`` after the
sidecar's deadline, the fenced journal refuses the next call at once, ``/metrics`` and the
probes answer, and a read of an existing file raises :class:`ReadDeadlineError` naming it. Each
answer is checked to have come while the brick was still stopped (a fact read from
``/proc/<pid>/stat``), never against the clock. After SIGCONT the late append lands, the journal
is read back, exactly the consumed batch's files are deleted (checked on the server's brick),
and a restart from the journal rebuilds the same state.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sharedfs_helpers import Nodes, files_on, get, make_nodes, metric, wait_for

from payloadrun.reader import PayloadReader, ReadDeadlineError
from payloadrun.retention.client import RetentionClient, RetentionVolumeHungError
from payloadrun.segments import ROUTED_EXPERTS, segments_from_json
from payloadrun.testing.processes import SidecarProcess
from payloadrun_devcluster.glusterfs import GlusterServer

CALL_DEADLINE_S = 2.0
READ_DEADLINE_S = 3.0
RUN = "hung-brick-run"
ARGS = ("--call-deadline", str(CALL_DEADLINE_S), "--max-off-policy-steps", "8")
STATE = ("policy_step", "recorded_step", "pending_steps", "pending_files")

# Run on the orchestrator's client: plain files for two batches, and one payload file the
# trainer will read (its segments printed as JSON).
WRITE_FILES = """
import json, sys, uuid
from pathlib import Path
import numpy as np
from payloadrun.codec import PositionedRows
from payloadrun.segments import segments_to_json
from payloadrun.store import PayloadStore
root = Path(sys.argv[1])
batches = {}
for step, version, n in ((1, 0, 12), (2, 1, 8)):
    (root / f"v{version}").mkdir(exist_ok=True)
    batches[step] = []
    for _ in range(n):
        path = root / f"v{version}" / f"{uuid.uuid4().hex}.bin"
        path.write_bytes(b"x" * 100)
        batches[step].append(str(path))
rows = np.arange(64 * 6 * 2, dtype=np.uint8).reshape(64, 6, 2)
segments = PayloadStore(root).write("v1", [PositionedRows("routed_experts", rows, 0)])
print(json.dumps({"batches": batches, "segments": segments_to_json(segments)}))
"""


@pytest.fixture(scope="module")
def stalled(gluster: GlusterServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """A volume of its own with the default ping-timeout, whose brick the test stops."""
    made = make_nodes(gluster, tmp_path_factory.mktemp("stalled"))
    try:
        yield made
    finally:
        gluster.delete_volume(made.volume.name)


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): the state field of /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def on_orchestrator(nodes: Nodes, run_root: Path) -> dict:
    done = subprocess.run(
        [*nodes.on_orchestrator(), sys.executable, "-c", WRITE_FILES, str(run_root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def idle(client: RetentionClient) -> dict:
    return wait_for(
        "the deletions to finish",
        lambda: (s := client.status())["outstanding_jobs"] == 0 and s["queue_files"] == 0 and s,
        60,
    )


def on_brick(nodes: Nodes, files: list[str]) -> set[Path]:
    return {Path(f).relative_to(nodes.root) for f in files}


def test_a_stopped_brick_gets_answers_within_the_deadlines_and_the_journal_replays(
    stalled, tmp_path
):
    nodes = stalled
    run_root = nodes.root / f"run-{uuid.uuid4().hex[:8]}"
    run_root.mkdir()
    journal = f"{run_root}/.retention/journal.jsonl"
    sidecar = SidecarProcess(
        run_root, RUN, args=ARGS, wrap=nodes.on_orchestrator(), log_path=tmp_path / "first.log"
    )
    reader = PayloadReader(run_root, deadline_s=READ_DEADLINE_S)
    with sidecar, RetentionClient(sidecar.url, timeout=30) as client:
        made = on_orchestrator(nodes, run_root)  # after the fresh run's wipe
        consumed, kept = made["batches"]["1"], made["batches"]["2"]
        (segment,) = segments_from_json(made["segments"])
        client.record_batch(1, consumed)
        client.record_batch(2, kept)

        pid = nodes.volume.pause_brick()
        try:
            wait_for("the brick to stop", lambda: stopped(pid), 10)  # signals arrive async
            with pytest.raises(RetentionVolumeHungError) as info:
                client.policy_updated(1)
            hung = info.value
            # answered while the volume still hangs: the append it waited for has not landed
            # (the journal stays fenced until it does and is read back)
            assert hung.body["reason"] == "volume_hung" and hung.fenced
            assert hung.deadline_s == CALL_DEADLINE_S and hung.waited_s >= CALL_DEADLINE_S
            assert journal in str(hung)

            # fenced: the next call is refused at once, measured by the sidecar
            with pytest.raises(RetentionVolumeHungError) as info:
                client.policy_updated(2)
            assert info.value.waited_s < CALL_DEADLINE_S and "is fenced" in str(info.value)

            # the trainer's read of a file it never read: its client must ask the brick
            with pytest.raises(ReadDeadlineError) as info:
                reader.read([segment], ROUTED_EXPERTS, 0, segment.rows)
            err = info.value  # the stuck read is still held by the volume: hung_reads below
            assert (err.file, err.offset, err.expected) == (
                segment.file,
                segment.offset,
                segment.nbytes,
            )
            assert err.waited_s >= READ_DEADLINE_S and reader.hung_reads == 1

            # the probes and /metrics answer while the volume hangs
            base = sidecar.metrics_url.removesuffix("/metrics")
            assert get(f"{base}/healthz")[0] == 200 and get(f"{base}/readyz")[0] == 200
            assert metric(sidecar.metrics_url, "payloadrun_retention_journal_fenced") == 1
            assert (
                metric(
                    sidecar.metrics_url,
                    "payloadrun_retention_volume_hung_answers_total",
                    call="policy_updated",
                )
                == 2
            )
            assert client.status()["journal_fenced"] is True
            assert reader.hung_reads == 1  # still stuck: the volume has not answered it yet
        finally:
            nodes.volume.resume_brick(pid)

        nodes.volume.clients_reconnected()
        # the stuck append lands and the journal is read back; the stuck read returns
        wait_for(
            "the fence to lift",
            lambda: metric(sidecar.metrics_url, "payloadrun_retention_journal_fenced") == 0,
            60,
        )
        wait_for("the stuck read to return", lambda: reader.hung_reads == 0, 60)
        after = idle(client)
        assert after["policy_step"] == 1 and after["pending_steps"] == [2]
        # exactly the consumed batch's files are gone, on the server itself
        left = files_on(nodes.brick)
        assert not (on_brick(nodes, consumed) & left), "a consumed file is left"
        assert on_brick(nodes, kept) <= left, "an unconsumed file was deleted"
        assert on_brick(nodes, [str(run_root / segment.file)]) <= left  # (absolute stays)
        assert after["deleted"]["consumed"]["files"] == len(consumed)
        # the trainer reads again
        rows = reader.read([segment], ROUTED_EXPERTS, 0, segment.rows)
        assert rows.tobytes() == bytes(range(256)) * 3
        before_restart = {k: after[k] for k in STATE}
    reader.close()

    with (
        SidecarProcess(
            run_root, RUN, args=ARGS, wrap=nodes.on_orchestrator(), log_path=tmp_path / "again.log"
        ) as again,
        RetentionClient(again.url, timeout=30) as client,
    ):
        restarted = idle(client)
        assert restarted["mode"] == "restarted"
        assert {k: restarted[k] for k in STATE} == before_restart
        assert on_brick(nodes, kept) <= files_on(nodes.brick)
