import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from payloadrun_operator.handlers import utc_now
from payloadrun_operator.models import MAX_CONDITION_MESSAGE, PayloadRunStatus
from payloadrun_operator.status import (
    READY,
    VALIDATED,
    VOLUME_READY,
    Check,
    bounded_message,
    claim_check,
    phase,
    rfc3339,
    set_condition,
    status_update,
    transitions,
    workload_ready,
    workloads_check,
)


def test_set_condition_keeps_transition_time_while_status_holds():
    conds = set_condition([], READY, Check(False, "Waiting", "m1"), generation=1, now="t1")
    assert conds == [
        {
            "type": READY,
            "status": "False",
            "reason": "Waiting",
            "message": "m1",
            "lastTransitionTime": "t1",
            "observedGeneration": 1,
        }
    ]
    same = set_condition(conds, READY, Check(False, "StillWaiting", "m2"), generation=2, now="t2")
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["reason"] == "StillWaiting"
    flipped = set_condition(same, READY, Check(True, "Done", "m3"), generation=2, now="t3")
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["status"] == "True"


def test_set_condition_leaves_others_alone():
    conds = set_condition([], VALIDATED, Check(True, "SpecValid", "ok"), generation=1, now="t")
    conds = set_condition(conds, READY, Check(False, "W", "w"), generation=1, now="t")
    assert [c["type"] for c in conds] == [VALIDATED, READY]


def test_transitions_report_status_or_reason_changes():
    before = set_condition([], READY, Check(False, "A", "x"), generation=1, now="t")
    after = set_condition(before, READY, Check(False, "A", "other message"), generation=1, now="t")
    assert transitions(before, after) == []
    after = set_condition(before, READY, Check(False, "B", "x"), generation=1, now="t")
    assert [c["reason"] for c in transitions(before, after)] == ["B"]


def test_phase():
    ok = Check(True, "R", "m")
    bad = Check(False, "R", "m")
    assert phase([]) == "Provisioning"
    assert phase(set_condition([], VALIDATED, bad, generation=1, now="t")) == "Rejected"
    conds = set_condition([], VALIDATED, ok, generation=1, now="t")
    assert phase(set_condition(conds, READY, bad, generation=1, now="t")) == "Provisioning"
    assert phase(set_condition(conds, READY, ok, generation=1, now="t")) == "Running"


def test_claim_check():
    assert claim_check(None, None).reason == "NotNeeded"
    assert claim_check(None, "c").reason == "ClaimMissing"
    pending = claim_check({"status": {"phase": "Pending"}}, "c")
    assert (
        not pending.ok and pending.reason == "ClaimPending" and "ReadWriteMany" in pending.message
    )
    assert claim_check({"status": {"phase": "Bound"}}, "c").ok


def workload(ready, replicas=2, generation=1, observed=1):
    return {
        "metadata": {"name": "w", "generation": generation},
        "spec": {"replicas": replicas},
        "status": {"readyReplicas": ready, "observedGeneration": observed},
    }


def test_workload_ready():
    assert workload_ready(None) == (False, "not created yet")
    assert workload_ready(workload(2)) == (True, "w 2/2 ready")
    assert workload_ready(workload(1))[0] is False
    assert workload_ready(workload(2, generation=2, observed=1))[0] is False  # stale status
    check = workloads_check([workload(2), workload(0)])
    assert not check.ok and check.reason == "WorkloadsNotReady" and "w 0/2 ready" in check.message
    assert workloads_check([workload(2)]).ok
    assert VOLUME_READY == "VolumeReady"


def test_status_update_writes_only_what_changed_and_names_the_events():
    checks = {READY: Check(False, "WorkloadsNotReady", "waiting", warning=False)}
    first = status_update({}, 3, checks, {"payloadMode": "ByHandle"}, "t1")
    assert first.fields["payloadMode"] == "ByHandle" and first.fields["phase"] == "Provisioning"
    assert first.events == [("Normal", "WorkloadsNotReady", "Ready is False: waiting")]
    again = status_update(first.fields, 3, checks, {"payloadMode": "ByHandle"}, "t2")
    assert again.fields is None and again.events == []
    failed = status_update(
        first.fields, 3, {READY: Check(False, "ApplyFailed", "422", warning=True)}, {}, "t3"
    )
    assert failed.events == [("Warning", "ApplyFailed", "Ready is False: 422")]
    assert failed.fields["conditions"][0]["lastTransitionTime"] == "t1"  # still False


# --- what the API server accepts: metav1.Condition's rules (models.Condition) -------------------

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def test_rfc3339_is_utc_with_a_z():
    moment = datetime(2026, 12, 1, 13, 4, 5, 999, tzinfo=timezone(timedelta(hours=2)))
    assert rfc3339(moment) == "2026-12-01T11:04:05Z"
    with pytest.raises(ValueError, match="no time zone"):
        rfc3339(datetime(2026, 12, 1))
    assert RFC3339.match(utc_now())


def test_a_reason_the_api_server_would_refuse_is_refused_here():
    for bad in ("", "Claim Pending", "1Reason", "Ends-", "x" * 1025):
        with pytest.raises(ValueError, match="does not match"):
            Check(False, bad, "m")
    for phase_name in ("Pending", "Bound", "Lost"):  # every PersistentVolumeClaim phase
        claim_check({"status": {"phase": phase_name}}, "c")


def test_a_long_message_is_cut_to_the_limit():
    conds = set_condition(
        [], READY, Check(False, "ApplyFailed", "é" * 40_000), generation=1, now=T0
    )
    message = conds[0]["message"]
    assert len(message) == MAX_CONDITION_MESSAGE and message.endswith("\u2026")
    assert bounded_message("short") == "short"


def test_a_condition_without_transition_time_gets_one():
    old = [{"type": READY, "status": "False", "reason": "W", "message": ""}]
    (cond,) = set_condition(old, READY, Check(False, "W", "still"), generation=1, now=T0)
    assert cond["lastTransitionTime"] == T0


T0 = "2026-12-01T00:00:00Z"
CHECKS = st.builds(
    Check,
    ok=st.booleans(),
    reason=st.from_regex(r"[A-Za-z]([A-Za-z0-9_,:]{0,30}[A-Za-z0-9_])?", fullmatch=True),
    message=st.text(max_size=200) | st.just("m" * 40_000),
    warning=st.booleans(),
)
TIMES = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from([VALIDATED, VOLUME_READY, READY]), CHECKS),
            st.one_of(st.none(), st.integers(min_value=0, max_value=2**63 - 1)),
            TIMES,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_every_status_the_operator_writes_passes_the_crd_rules(steps):
    """Whatever checks come in whatever order, the status satisfies models.PayloadRunStatus."""
    status: dict = {}
    for checks, generation, moment in steps:
        update = status_update(
            status, generation, checks, {"payloadMode": "ByHandle"}, rfc3339(moment)
        )
        if update.fields is not None:
            status = {**status, **update.fields}
        parsed = PayloadRunStatus.model_validate(status)
        for cond in status.get("conditions", []):
            assert RFC3339.match(cond["lastTransitionTime"]), cond
        assert len({c.type for c in parsed.conditions}) == len(parsed.conditions)


def test_a_complete_job_counts_as_ready_while_the_others_run():
    orchestrator = {
        "kind": "Job",
        "metadata": {"name": "r-orchestrator"},
        "spec": {"parallelism": 1},
        "status": {"ready": 0, "conditions": [{"type": "Complete", "status": "True"}]},
    }
    trainer = {
        "kind": "Job",
        "metadata": {"name": "r-trainer"},
        "spec": {"parallelism": 2},
        "status": {"ready": 2},
    }
    assert workload_ready(orchestrator) == (True, "r-orchestrator complete")
    assert workloads_check([orchestrator, trainer]).ok
    trainer["status"]["ready"] = 1
    assert workloads_check([orchestrator, trainer]).message == "waiting for r-trainer 1/2 ready"
