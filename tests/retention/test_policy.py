import pytest

from payloadrun.retention.policy import (
    Disposition,
    backstop_bound,
    backstop_versions,
    batch_disposition,
    discard_conflicts,
    min_fresh_version,
    settled_steps,
)
from payloadrun.retention.state import RetentionState


def test_min_fresh_version_is_prime_rl_bound():
    assert min_fresh_version(41, 32) == 8
    assert min_fresh_version(1, 0) == 0
    assert min_fresh_version(3, 8) == -6  # nothing is stale early in a run
    with pytest.raises(ValueError, match="max_off_policy_steps must be >= 0"):
        min_fresh_version(5, -1)


def test_backstop_removes_versions_below_the_next_batch_bound():
    assert backstop_bound(40, 32) == 8
    assert backstop_versions([0, 5, 7, 8, 9, 40], 40, 32) == [0, 5, 7]
    assert backstop_versions([0, 1, 2], None, 0) == []  # no policy update yet
    assert backstop_versions([0, 1, 2, 3], 2, 0) == [0, 1]  # batch 3 may read v2


def test_settled_steps_are_every_batch_up_to_the_policy_step():
    assert settled_steps({1, 2, 3, 5}, 3) == [1, 2, 3]
    assert settled_steps({4, 5}, 3) == []


@pytest.mark.parametrize(
    ("step", "empty", "policy", "max_steps", "expected"),
    [
        (3, False, None, None, Disposition.PENDING),
        (3, False, 2, None, Disposition.PENDING),
        (3, False, 3, None, Disposition.CONSUMED),  # late: already read by the trainer
        (3, True, None, None, Disposition.DISCARDED),
        (11, False, 2, 10, Disposition.DISCARDED),  # past max_steps: never trained
        (10, False, 2, 10, Disposition.PENDING),
    ],
)
def test_batch_disposition(step, empty, policy, max_steps, expected):
    assert batch_disposition(step, empty=empty, policy_step=policy, max_steps=max_steps) is expected


def test_discard_conflicts_name_the_owning_batch():
    assert discard_conflicts(["a", "b", "c"], {"b": 4, "z": 1}) == {"b": 4}
    assert discard_conflicts(["a"], {}) == {}


def test_state_record_twice_adds_and_a_file_stays_until_its_latest_batch():
    state = RetentionState()
    assert state.record(1, ["v0/a", "v0/b"], Disposition.PENDING) == []
    assert state.record(1, ["v0/b", "v0/c"], Disposition.PENDING) == []
    assert {k: set(v) for k, v in state.pending.items()} == {1: {"v0/a", "v0/b", "v0/c"}}
    state.record(3, ["v0/c"], Disposition.PENDING)  # listed again in a later batch
    settled = state.policy_updated(1)
    assert settled.steps == (1,)
    assert sorted(settled.files) == ["v0/a", "v0/b"]
    assert state.is_protected("v0/c")
    assert state.policy_updated(1).files == ()  # repeated or older steps change nothing
    assert state.policy_updated(0).files == ()
    assert state.policy_updated(3).files == ("v0/c",)
    assert state.pending == {} and state.owner == {}


def test_state_immediate_batches_spare_files_a_pending_batch_holds():
    state = RetentionState()
    state.record(5, ["v1/kept"], Disposition.PENDING)
    assert state.record(6, ["v1/kept", "v1/gone"], Disposition.DISCARDED) == ["v1/gone"]
    assert state.conflicts(["v1/kept", "v1/gone"]) == {"v1/kept": 5}


def test_settled_files_come_out_in_recorded_order():
    """Unlinking in recorded (about creation) order is what keeps deletion near raw speed."""
    state = RetentionState()
    names = [f"v0/{i:04d}-{h}" for i, h in enumerate("zyxwvutsrq")]
    state.record(1, names[:5], Disposition.PENDING)
    state.record(2, names[5:], Disposition.PENDING)
    assert state.policy_updated(2).files == tuple(names)
