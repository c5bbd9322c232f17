import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from payloadrun_operator.api.conditions import (
    REASONS,
    TRUE_REASONS,
    AppliedReason,
    CompleteReason,
    ConditionType,
    ReadyReason,
    SuspendedReason,
    ValidatedReason,
    VolumeReadyReason,
)
from payloadrun_operator.api.models import MAX_CONDITION_MESSAGE, PayloadRunStatus
from payloadrun_operator.observed.status import (
    Check,
    bounded_message,
    claim_check,
    deserves_event,
    phase,
    rfc3339,
    set_condition,
    status_update,
    transitions,
    workload_ready,
    workloads_check,
)
from payloadrun_operator.reconcile import utc_now

READY = ConditionType.READY
VALIDATED = ConditionType.VALIDATED
VOLUME_READY = ConditionType.VOLUME_READY


def test_set_condition_keeps_transition_time_while_status_holds():
    waiting = Check(False, ReadyReason.WORKLOADS_NOT_READY, "m1")
    conds = set_condition([], READY, waiting, generation=1, now="t1")
    assert conds == [
        {
            "type": READY,
            "status": "False",
            "reason": "WorkloadsNotReady",
            "message": "m1",
            "lastTransitionTime": "t1",
            "observedGeneration": 1,
        }
    ]
    refused = Check(False, ReadyReason.APPLY_FAILED, "m2")
    same = set_condition(conds, READY, refused, generation=2, now="t2")
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["reason"] == "ApplyFailed"
    done = Check(True, ReadyReason.WORKLOADS_READY, "m3")
    flipped = set_condition(same, READY, done, generation=2, now="t3")
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["status"] == "True"


def test_set_condition_leaves_others_alone():
    valid = Check(True, ValidatedReason.SPEC_VALID, "ok")
    conds = set_condition([], VALIDATED, valid, generation=1, now="t")
    waiting = Check(False, ReadyReason.WORKLOADS_NOT_READY, "w")
    conds = set_condition(conds, READY, waiting, generation=1, now="t")
    assert [c["type"] for c in conds] == [VALIDATED, READY]


def test_transitions_report_status_or_reason_changes():
    a, b = ReadyReason.WORKLOADS_NOT_READY, ReadyReason.STOPPED
    before = set_condition([], READY, Check(False, a, "x"), generation=1, now="t")
    after = set_condition(before, READY, Check(False, a, "other message"), generation=1, now="t")
    assert transitions(before, after) == []
    after = set_condition(before, READY, Check(False, b, "x"), generation=1, now="t")
    assert [c["reason"] for c in transitions(before, after)] == ["Stopped"]


def test_phase():
    valid = Check(True, ValidatedReason.SPEC_VALID, "m")
    invalid = Check(False, ValidatedReason.INVALID_SPEC, "m")
    ready = Check(True, ReadyReason.WORKLOADS_READY, "m")
    waiting = Check(False, ReadyReason.STOPPED, "m")
    assert phase([]) == "Provisioning"
    assert phase(set_condition([], VALIDATED, invalid, generation=1, now="t")) == "Rejected"
    conds = set_condition([], VALIDATED, valid, generation=1, now="t")
    assert phase(set_condition(conds, READY, waiting, generation=1, now="t")) == "Provisioning"
    assert phase(set_condition(conds, READY, ready, generation=1, now="t")) == "Running"


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
    checks = {READY: Check(False, ReadyReason.WORKLOADS_NOT_READY, "waiting", warning=False)}
    first = status_update({}, 3, checks, {"payloadMode": "ByHandle"}, "t1")
    assert first.fields["payloadMode"] == "ByHandle" and first.fields["phase"] == "Provisioning"
    # a new run's Ready=False is written, and worth no event (each is a request)
    assert first.events == []
    again = status_update(first.fields, 3, checks, {"payloadMode": "ByHandle"}, "t2")
    assert again.fields is None and again.events == []
    failed = status_update(
        first.fields,
        3,
        {READY: Check(False, ReadyReason.APPLY_FAILED, "422", warning=True)},
        {},
        "t3",
    )
    assert failed.events == [("Warning", "ApplyFailed", "Ready is False: 422")]
    assert failed.fields["conditions"][0]["lastTransitionTime"] == "t1"  # still False
    ready = status_update(
        first.fields, 3, {READY: Check(True, ReadyReason.WORKLOADS_READY, "all ready")}, {}, "t4"
    )
    assert ready.events == [("Normal", "WorkloadsReady", "Ready is True: all ready")]


def test_a_condition_whose_message_alone_changed_is_written_without_an_event():
    """Ready False with the same reason, 0/2 groups ready then 1/2: what the status says stays
    true (it was left at 0/2 when no other field changed in the pass that saw 1/2), and no event
    is posted for it."""
    waiting = {READY: Check(False, ReadyReason.WORKLOADS_NOT_READY, "waiting for w 0/2 ready")}
    first = status_update({}, 3, waiting, {}, "t1")
    fewer = {READY: Check(False, ReadyReason.WORKLOADS_NOT_READY, "waiting for w 1/2 ready")}
    update = status_update(first.fields, 3, fewer, {}, "t2")
    assert update.fields is not None and update.events == []
    (ready,) = update.fields["conditions"]
    assert ready["message"] == "waiting for w 1/2 ready"
    assert ready["lastTransitionTime"] == "t1"  # still False: no transition


def condition_as(ctype: ConditionType, check: Check) -> dict:
    (cond,) = set_condition([], ctype, check, generation=1, now="t0")
    return cond


def test_normal_events_only_for_what_a_user_acts_on():
    """Warnings whenever they change; Normal events for a status that flips, or a condition
    that is news when it appears; a new run's conditions and a reason changing under the same
    status post nothing."""
    valid = Check(True, ValidatedReason.SPEC_VALID, "ok")
    invalid = Check(False, ValidatedReason.INVALID_SPEC, "bad", warning=True)
    pending = Check(False, VolumeReadyReason.CLAIM_PENDING, "pending")
    missing = Check(False, VolumeReadyReason.CLAIM_MISSING, "missing")
    bound = Check(True, VolumeReadyReason.CLAIM_BOUND, "bound")
    lost = Check(False, VolumeReadyReason.CLAIM_LOST, "lost", warning=True)
    not_ready = Check(False, ReadyReason.WORKLOADS_NOT_READY, "waiting")
    ready = Check(True, ReadyReason.WORKLOADS_READY, "ready")
    applied = Check(True, AppliedReason.CHILDREN_APPLIED, "applied")
    suspended = Check(True, SuspendedReason.SPEC_SUSPENDED, "suspended")
    resumed = Check(False, SuspendedReason.RESUMED, "resumed")
    done = Check(True, CompleteReason.TRAINERS_SUCCEEDED, "done")
    # a new run: nothing
    for ctype, check in (
        (VALIDATED, valid),
        (ConditionType.APPLIED, applied),
        (VOLUME_READY, pending),
        (VOLUME_READY, bound),
        (READY, not_ready),
    ):
        assert not deserves_event(ctype, check, None), (ctype, check.reason)
    # news when they appear, and warnings
    assert deserves_event(ConditionType.SUSPENDED, suspended, None)
    assert deserves_event(ConditionType.COMPLETE, done, None)
    assert deserves_event(VALIDATED, invalid, None)
    # flips
    assert deserves_event(READY, ready, condition_as(READY, not_ready))
    assert deserves_event(READY, not_ready, condition_as(READY, ready))
    assert deserves_event(VOLUME_READY, bound, condition_as(VOLUME_READY, pending))
    assert deserves_event(VALIDATED, valid, condition_as(VALIDATED, invalid))
    assert deserves_event(
        ConditionType.SUSPENDED, resumed, condition_as(ConditionType.SUSPENDED, suspended)
    )
    # a warning's reason changing under the same status; not a Normal one's, nor no change
    assert deserves_event(VOLUME_READY, lost, condition_as(VOLUME_READY, pending))
    assert not deserves_event(VOLUME_READY, pending, condition_as(VOLUME_READY, missing))
    assert not deserves_event(READY, ready, condition_as(READY, ready))
    assert not deserves_event(VOLUME_READY, lost, condition_as(VOLUME_READY, lost))


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
        [], READY, Check(False, ReadyReason.APPLY_FAILED, "é" * 40_000), generation=1, now=T0
    )
    message = conds[0]["message"]
    assert len(message) == MAX_CONDITION_MESSAGE and message.endswith("\u2026")
    assert bounded_message("short") == "short"


def test_a_condition_without_transition_time_gets_one():
    old = [{"type": READY, "status": "False", "reason": "Stopped", "message": ""}]
    stopped = Check(False, ReadyReason.STOPPED, "still")
    (cond,) = set_condition(old, READY, stopped, generation=1, now=T0)
    assert cond["lastTransitionTime"] == T0


T0 = "2026-12-01T00:00:00Z"
TYPES = [VALIDATED, VOLUME_READY, READY]


def checks_of(ctype: ConditionType) -> st.SearchStrategy[Check]:
    """Any check the vocabulary allows for ``ctype``: one of its reasons, with its status."""
    return st.builds(
        lambda reason, message, warning: Check(reason in TRUE_REASONS, reason, message, warning),
        st.sampled_from(list(REASONS[ctype])),
        st.text(max_size=200) | st.just("m" * 40_000),
        st.booleans(),
    )


CHECKS = st.fixed_dictionaries({}, optional={ctype: checks_of(ctype) for ctype in TYPES})
TIMES = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            CHECKS,
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
