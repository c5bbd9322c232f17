"""A multi-turn rollout's files with a real retention sidecar: its API unchanged, traces on top.

A rollout writes one file a turn, each into the version its turn was dispatched at; its branches
share the files of their common prefix. The batch that takes a rollout records every file any
turn wrote (``TracePayload.files``), a turn whose rows no branch reads included; a file two
batches name stays until the later one is consumed, and a discard of a file a pending batch holds
is refused (409), as for single-turn rollouts.
"""

from __future__ import annotations

import random

import pytest
from retention_helpers import existing, wait_for

from payloadrun.agentic import Rollout, Shape
from payloadrun.paths import PayloadRoot
from payloadrun.retention.client import DiscardConflictError, RetentionClient
from payloadrun.segments import files_of
from payloadrun.simulate import LocalFiles, Workload
from payloadrun.testing.processes import SidecarProcess

LINEAR = Shape(prompt_tokens=8, new_tokens=4, completion_tokens=2, fork_rate=0.0, bridge_rate=1.0)


@pytest.fixture
def sidecar(root):
    with SidecarProcess(root, "trace-run", args=("--max-off-policy-steps", "4")) as proc:
        yield proc


def play(root, shape: Shape, versions: list[int], seed: int = 0) -> Rollout:
    """A rollout of one turn per version in ``versions``, its files written as a writer would."""
    inference = LocalFiles(Workload(rollout=shape, row_bytes=8), PayloadRoot(root))
    rollout = Rollout(shape, random.Random(seed))
    for version in versions:
        turn = rollout.next_turn()
        answer, segments = inference.write(turn, version, rollout.rng)
        rollout.commit(turn, answer, segments)
    return rollout


def idle(client: RetentionClient) -> bool:
    status = client.status()
    return status["queue_files"] == 0 and status["outstanding_jobs"] == 0


def test_a_rollouts_turns_go_under_their_own_versions_and_are_all_recorded(sidecar, root):
    rollout = play(root, LINEAR, [0, 0, 1, 2])  # a turn dispatched after each policy update
    files = rollout.files
    assert len(files) == 4 and [f.split("/")[-2] for f in files] == ["v0", "v0", "v1", "v2"]
    [branch] = rollout.branch_segments()  # linear: one branch, reading every turn's file
    assert set(files_of(branch)) == set(files)
    with RetentionClient(sidecar.url, timeout=5) as client:
        client.record_batch(3, files)
        client.policy_updated(3)
        wait_for(lambda: idle(client))
        assert existing(files) == []


def test_a_file_two_batches_name_stays_until_the_later_is_consumed(sidecar, root):
    forks = Shape(prompt_tokens=8, new_tokens=4, completion_tokens=2, fork_rate=1.0)
    rollout = play(root, forks, [0, 0, 0, 0], seed=5)
    first, *others = rollout.branch_segments()
    assert others, "forks make several branches"
    one, two = set(files_of(first)), {f for b in others for f in files_of(b)}
    shared = sorted(one & two)
    assert shared, "the branches share their prefix's files"
    with RetentionClient(sidecar.url, timeout=5) as client:
        client.record_batch(1, sorted(one))  # the first branch's sample in batch 1
        client.record_batch(2, sorted(two))  # the others' in batch 2
        with pytest.raises(DiscardConflictError) as info:
            client.discard(sorted(two))  # e.g. a filter that changed its mind: refused whole
        assert info.value.status == 409
        client.policy_updated(1)
        wait_for(lambda: idle(client))
        assert existing(sorted(one - two)) == []
        assert existing(shared) == shared  # batch 2 still holds them
        client.policy_updated(2)
        wait_for(lambda: idle(client))
        assert existing(sorted(one | two)) == []


def test_a_turn_no_branch_reads_still_goes_with_its_rollout(sidecar, root):
    rollout = play(root, LINEAR, [0, 0])
    # a third turn whose routing ran short: rows from past its new message's first token
    inference = LocalFiles(Workload(rollout=LINEAR, row_bytes=8), PayloadRoot(root))
    turn = rollout.next_turn()
    answer, segments = inference.write(turn, 1, rollout.rng)
    short = [s.clip(len(turn.prompt_ids) - 2, s.end) for s in segments]
    rollout.commit(turn, answer, short)
    read = {f for branch in rollout.branch_segments() for f in files_of(branch)}
    assert short[0].file not in read and short[0].file in rollout.files
    with RetentionClient(sidecar.url, timeout=5) as client:
        client.discard(rollout.files)  # an abandoned rollout: every turn's file
        wait_for(lambda: idle(client))
        assert existing(rollout.files) == []
