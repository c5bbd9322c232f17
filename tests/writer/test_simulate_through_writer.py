"""The simulator with its rollouts coming through the writer sidecar (the demo's data path)."""

from pathlib import Path

from payloadrun.agentic import Shape
from payloadrun.simulate import DELETE_ON_CONSUME, VERSION_SWEEP, Workload, run_policy

from .conftest import metric

WORKLOAD = Workload(
    batch_size=16,
    group_size=4,
    rollout=Shape(prompt_tokens=24, new_tokens=8, completion_tokens=8, max_turns=4),
    max_off_policy_steps=2,
    steps=6,
    seed=3,
)


def test_rollouts_by_handle_are_deleted_on_consume(writer, root: Path):
    summary = run_policy(WORKLOAD, DELETE_ON_CONSUME, root, writer_url=writer.url)
    assert summary.missing_files == 0  # the trainer found every file it read
    assert summary.written_rollouts > 0
    assert summary.written_files > summary.written_rollouts  # multi-turn: one file a turn
    # every payload file came from the writer: handle mode, and bytes it wrote
    handled = metric(writer, "payloadrun_writer_requests_total", mode="handle", code="200")
    assert handled == summary.written_files
    written = sum(
        metric(writer, "payloadrun_writer_payload_written_bytes_total", field=field)
        for field in ("routed_experts", "sampling_mask")
    )
    assert written == summary.written_bytes
    # consumed and discarded files are gone; what is left is in flight or for the backstop
    assert summary.peak_batches < 3.5
    left = [p for p in root.rglob("*.bin")]
    assert len(left) == summary.final_files < summary.written_files


def test_the_version_sweep_baseline_keeps_more_on_the_same_rollouts(writer, root: Path):
    consume = run_policy(WORKLOAD, DELETE_ON_CONSUME, root, writer_url=writer.url)
    sweep = run_policy(WORKLOAD, VERSION_SWEEP, root, writer_url=writer.url)
    assert sweep.missing_files == 0
    assert sweep.written_files == consume.written_files  # the same seeded workload
    assert sweep.peak_files > consume.peak_files
