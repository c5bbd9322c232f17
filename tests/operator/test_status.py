from payloadrun_operator.status import (
    READY,
    VALIDATED,
    VOLUME_READY,
    Check,
    claim_check,
    phase,
    set_condition,
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
    from payloadrun_operator.status import status_update

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
