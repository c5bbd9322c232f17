"""The RL-loop simulator under both policies, with a real sidecar process."""

from __future__ import annotations

import json

from payloadrun.agentic import Shape
from payloadrun.cli import main
from payloadrun.simulate import DELETE_ON_CONSUME, VERSION_SWEEP, Workload, run_policy

SMALL = Workload(
    batch_size=32,
    group_size=4,
    rollout=Shape(prompt_tokens=12, new_tokens=6, completion_tokens=3, max_turns=5),
    row_bytes=16,
    max_off_policy_steps=3,
    steps=14,
    drop_rate=0.2,
    straggler_rate=0.1,
    seed=3,
)


def test_delete_on_consume_keeps_a_few_batches_and_loses_nothing(tmp_path):
    doc = run_policy(SMALL, DELETE_ON_CONSUME, tmp_path / "doc")
    sweep = run_policy(SMALL, VERSION_SWEEP, tmp_path / "sweep")
    assert doc.missing_files == 0 and sweep.missing_files == 0
    assert doc.written_files == sweep.written_files  # the same workload
    assert doc.written_bytes == sweep.written_bytes
    # multi-turn: one file a turn, several turns a rollout, and the trainer read every branch
    assert doc.written_files > 2 * doc.written_rollouts
    trained = sum(r.batch_rollouts for r in doc.steps)  # every batch is trained by the end
    assert doc.branches_read > trained  # a branch a rollout, more where a turn forked
    assert doc.peak_batches <= 3.5 < sweep.peak_batches
    # every batch recorded is consumed by the end, every discard deleted at once; the backstop
    # takes only what no call named (groups cancelled in flight)
    assert doc.deleted["consumed"]["files"] == doc.recorded_files > 0
    assert doc.deleted["discarded"]["files"] == doc.discarded_files > 0
    cancelled = doc.written_files - doc.recorded_files - doc.discarded_files - doc.final_files
    assert doc.deleted["backstop"]["files"] == cancelled
    assert doc.cancelled_groups > 0  # the seed has some, so the backstop's share is tested
    # the version sweep deletes by directory only: everything it deleted is the backstop's
    assert sweep.deleted["backstop"]["files"] == sweep.written_files - sweep.final_files
    # what is left: rollouts still in flight or waiting for their group, never a consumed one
    left = doc.written_files - sum(v["files"] for v in doc.deleted.values())
    assert doc.final_files == left


def test_simulate_command_prints_steps_and_a_json_summary(tmp_path, capsys):
    code = main(
        [
            "simulate",
            "--root",
            str(tmp_path / "p"),
            "--batch-size",
            "16",
            "--group-size",
            "4",
            "--steps",
            "5",
            "--max-off-policy-steps",
            "2",
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0
    summary = json.loads(out.out)
    assert summary["policy"] == DELETE_ON_CONSUME and len(summary["steps"]) == 5
    assert summary["missing_files"] == 0 and summary["peak_files"] > 0
    assert out.err.count("step ") >= 5 and "peak directory" in out.err
