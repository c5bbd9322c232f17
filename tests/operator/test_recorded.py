"""What a run's status records, read into one typed value (api/recorded.py): under the CRD
model's names, tolerant of what a hand or another version wrote, never an error."""

from __future__ import annotations

import dataclasses

import pytest

from payloadrun_operator.api.conditions import ConditionType, Phase
from payloadrun_operator.api.models import PayloadRunStatus
from payloadrun_operator.api.recorded import NOTHING, Recorded

# a value of each attribute's kind, as the operator writes it
WRITTEN = {
    "observed_generation": 3,
    "phase": "Running",
    "payload_mode": "ByHandle",
    "payload_root": "/payloads/ns/run/payloads",
    "claim_name": "run-payloads",
    "sidecars": {"image": "payloadrun:0.2.0", "podLayout": 2},
    "start_time": "2026-12-06T10:00:00Z",
    "queue": {"name": "team", "workload": "run"},
    "trainer_restarts": 2,
    "last_trainer_restart": {"jobUid": "u1", "message": "rank 1 exited"},
    "inference_group_restarts": 1,
    "last_inference_group_restart": {"podUid": "p1", "container": "vllm"},
    "conditions": (
        {"type": "Ready", "status": "True", "reason": "WorkloadsReady", "message": "ok"},
    ),
}


def test_every_attribute_is_read_from_the_crd_models_field_of_its_name():
    fields = PayloadRunStatus.model_fields
    assert {f.name for f in dataclasses.fields(Recorded)} == WRITTEN.keys()
    status = {}
    for name, value in WRITTEN.items():
        assert name in fields, f"{name} is no field of the CRD's status"
        alias = fields[name].alias
        status[alias] = list(value) if isinstance(value, tuple) else value
    recorded = Recorded.of({"status": status})
    assert {name: getattr(recorded, name) for name in WRITTEN} == WRITTEN


@pytest.mark.parametrize("status", [None, {}, "not a status", []])
def test_nothing_recorded_reads_as_the_defaults(status):
    recorded = Recorded.of_status(status)
    assert recorded == Recorded()
    assert (recorded.trainer_restarts, recorded.last_trainer_restart) == (0, NOTHING)
    assert recorded.sidecars is None and recorded.queue is None and not recorded.final
    assert Recorded.of({}) == Recorded()  # a run with no status yet


def test_a_field_of_another_type_reads_as_absent_never_as_an_error():
    odd = {
        "observedGeneration": "3",
        "phase": 5,
        "payloadMode": None,
        "claimName": "",
        "sidecars": [],
        "startTime": {},
        "queue": "team",
        "trainerRestarts": "2",
        "lastTrainerRestart": "yesterday",
        "inferenceGroupRestarts": True,
        "conditions": ["Ready", {"status": "True"}, {"type": "Ready", "status": "True"}],
    }
    recorded = Recorded.of_status(odd)
    assert dataclasses.replace(recorded, conditions=()) == Recorded()
    assert recorded.conditions == ({"type": "Ready", "status": "True"},)  # the one condition
    assert Recorded.of_status({"trainerRestarts": -1}).trainer_restarts == 0
    assert Recorded.of_status({"sidecars": None, "phase": "Provisioning"}).sidecars is None


def test_conditions_by_type_and_the_end():
    recorded = Recorded.of_status(
        {
            "phase": "Succeeded",
            "conditions": [
                {"type": "Complete", "status": "True"},
                {"type": "Suspended", "status": "False"},
            ],
        }
    )
    assert recorded.holds(ConditionType.COMPLETE)
    assert recorded.condition(ConditionType.SUSPENDED) == {"type": "Suspended", "status": "False"}
    assert not recorded.holds(ConditionType.SUSPENDED)  # there, and False
    assert recorded.condition(ConditionType.FAILED) is None and not recorded.holds(
        ConditionType.FAILED
    )
    assert recorded.final
    for phase in Phase:
        assert Recorded.of_status({"phase": phase}).final is phase.final
