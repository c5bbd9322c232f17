"""The election's decisions, pure (the Lease on a real API server: tests/integration)."""

from datetime import UTC, datetime

import pytest

from payloadrun_operator.platform.election import (
    Heartbeat,
    Timing,
    claimed_spec,
    free_for,
    released_spec,
)

NOW = datetime(2026, 12, 2, 9, 0, 0, 123456, tzinfo=UTC)


def test_a_lease_is_free_when_unheld_ours_or_unchanged_for_its_duration():
    held = {"holderIdentity": "other", "leaseDurationSeconds": 15}
    assert free_for({}, "me", 0, 15)
    assert free_for({"holderIdentity": ""}, "me", 0, 15)
    assert free_for({"holderIdentity": "me"}, "me", 0, 15)
    assert not free_for(held, "me", 14.9, 15)
    assert free_for(held, "me", 15, 15)
    # the holder's own duration counts, not the candidate's
    assert not free_for({**held, "leaseDurationSeconds": 60}, "me", 30, 15)


def test_taking_over_counts_a_transition_and_renewing_does_not():
    created = claimed_spec({}, "me", NOW, 15)
    assert created == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-12-02T09:00:00.123456Z",
        "acquireTime": "2026-12-02T09:00:00.123456Z",
        "leaseTransitions": 0,
    }
    renewed = claimed_spec(created, "me", NOW.replace(second=2), 15)
    assert renewed["leaseTransitions"] == 0 and renewed["acquireTime"] == created["acquireTime"]
    assert renewed["renewTime"] == "2026-12-02T09:00:02.123456Z"
    taken = claimed_spec(renewed, "you", NOW.replace(second=30), 15)
    assert taken["leaseTransitions"] == 1 and taken["holderIdentity"] == "you"
    released = released_spec(taken, NOW)
    assert released["holderIdentity"] == "" and released["leaseDurationSeconds"] == 1
    assert claimed_spec(released, "me", NOW, 15)["leaseTransitions"] == 2


def test_timing_must_let_a_leader_give_up_before_a_standby_takes_over():
    Timing(15, 10, 2)
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        Timing(15, 15, 2)


def test_a_heartbeat_is_stale_only_once_it_has_beaten_and_stopped():
    now = [100.0]
    beat = Heartbeat(clock=lambda: now[0])
    assert not beat.stale(5)  # not started: a standby has no loop to watch
    beat.beat()
    now[0] += 5
    assert not beat.stale(5)
    now[0] += 0.1
    assert beat.stale(5)
