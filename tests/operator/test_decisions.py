import pytest
from pydantic import ValidationError

from payloadrun_operator.api.models import (
    DISAGGREGATED_BY_HANDLE_MESSAGE,
    TWO_MOUNT_PATHS_MESSAGE,
    PayloadRunSpec,
)
from payloadrun_operator.desired.decisions import (
    PayloadMode,
    claim_name,
    claim_owned_by_run,
    decide_payload_mode,
    payload_root,
    validation_errors,
)


def spec_with(base, **changes):
    spec = dict(base)
    for path, value in changes.items():
        node = spec
        keys = path.split("__")
        for key in keys[:-1]:
            node[key] = dict(node.get(key, {}))
            node = node[key]
        node[keys[-1]] = value
    return PayloadRunSpec.model_validate(spec)


# (changes to the base multi-node router-replay spec, expected mode, expected reason)
MODE_TABLE = [
    ({}, PayloadMode.BY_HANDLE, "MultiNodePerTokenPayloads"),
    (
        {"routerReplay": False, "samplingMaskCapture": True},
        PayloadMode.BY_HANDLE,
        "MultiNodePerTokenPayloads",
    ),
    ({"routerReplay": False}, PayloadMode.INLINE, "NoPerTokenPayloads"),
    ({"deploymentType": "SingleNode"}, PayloadMode.INLINE, "SingleNode"),
    ({"inference__disaggregated": True}, PayloadMode.INLINE, "Disaggregated"),
    ({"payloads__mode": "Inline"}, PayloadMode.INLINE, "InlineRequested"),
    (
        {"payloads__mode": "ByHandle", "routerReplay": False},
        PayloadMode.BY_HANDLE,
        "ByHandleRequested",
    ),
    (
        {"payloads__mode": "ByHandle", "deploymentType": "SingleNode"},
        PayloadMode.BY_HANDLE,
        "ByHandleRequested",
    ),
    (
        {"payloads__root": "/payloads/mine", "routerReplay": False},
        PayloadMode.BY_HANDLE,
        "PayloadRootSet",
    ),
    (
        {"inference__disaggregated": True, "payloads__mode": "Inline"},
        PayloadMode.INLINE,
        "InlineRequested",
    ),
]


@pytest.mark.parametrize(("changes", "mode", "reason"), MODE_TABLE)
def test_mode_decision_table(spec_dict, changes, mode, reason):
    spec = spec_with(spec_dict, **changes)
    assert validation_errors(spec) == []
    decision = decide_payload_mode(spec)
    assert (decision.mode, decision.reason) == (mode, reason)
    assert decision.message


def test_auto_message_names_what_is_on(spec_dict):
    both = spec_with(spec_dict, samplingMaskCapture=True)
    assert "router replay and sampling-mask capture" in decide_payload_mode(both).message


@pytest.mark.parametrize(
    "changes",
    [
        {"inference__disaggregated": True, "payloads__mode": "ByHandle"},
        {"inference__disaggregated": True, "payloads__root": "/payloads/x"},
    ],
)
def test_by_handle_with_disaggregation_is_rejected(spec_dict, changes):
    errors = validation_errors(spec_with(spec_dict, **changes))
    assert errors == [DISAGGREGATED_BY_HANDLE_MESSAGE]
    assert "P/D router does not stitch by-handle routing segments" in errors[0]


def test_root_outside_mount_path_is_rejected(spec_dict):
    errors = validation_errors(spec_with(spec_dict, payloads__root="/elsewhere/x"))
    assert errors == [
        "spec.payloads.root '/elsewhere/x' must be a directory under the payload volume's mount "
        "path '/payloads' (spec.payloads.mountPath, or spec.runDirectory.mountPath when the run "
        "directory is the payload volume)"
    ]


def test_the_payload_root_may_live_in_the_run_directory(spec_dict):
    spec = spec_with(
        spec_dict, runDirectory={"mountPath": "/data"}, payloads__root="/data/outputs/payloads"
    )
    assert validation_errors(spec) == []
    outside = spec_with(spec_dict, runDirectory={"mountPath": "/data"}, payloads__root="/p/x")
    assert "under the payload volume's mount path '/data'" in validation_errors(outside)[0]


def test_a_run_directory_on_the_payload_volume_has_its_path(spec_dict):
    spec = spec_with(spec_dict, runDirectory={"mountPath": "/data"}, payloads__mountPath="/p")
    assert validation_errors(spec) == [TWO_MOUNT_PATHS_MESSAGE]
    same = spec_with(spec_dict, runDirectory={"mountPath": "/data"}, payloads__mountPath="/data")
    assert validation_errors(same) == []
    own = spec_with(
        spec_dict,
        runDirectory={"mountPath": "/data", "claimName": "mine"},
        payloads__mountPath="/p",
    )
    assert validation_errors(own) == []


def test_claim_name_and_managed_fields_together_are_rejected(spec_dict):
    spec = spec_with(spec_dict, payloads__volume={"claimName": "shared", "size": "1Ti"})
    assert "not both" in validation_errors(spec)[0]


def test_payload_root_and_claim(spec_dict):
    spec = spec_with(spec_dict)
    assert payload_root(spec, "ml", "run1") == "/payloads/ml/run1/payloads"
    assert claim_name(spec, "run1") == "run1-payloads"
    assert claim_owned_by_run(spec)
    own = spec_with(spec_dict, payloads__volume={"claimName": "shared"})
    assert claim_name(own, "run1") == "shared" and not claim_owned_by_run(own)
    kept = spec_with(spec_dict, payloads__volume={"deletionPolicy": "Retain"})
    assert not claim_owned_by_run(kept)
    hand = spec_with(spec_dict, payloads__root="/payloads/fixed")
    assert payload_root(hand, "ml", "run1") == "/payloads/fixed"


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"maxOffPolicySteps": -1}, "maxOffPolicySteps"),
        ({"inference__replicas": 0}, "inference.replicas"),
        ({"payloads__mode": "Sometimes"}, "payloads.mode"),
        ({"payloads__mountPath": "relative"}, "payloads.mountPath"),
        ({"trainer__imag": "typo"}, "trainer.imag"),
    ],
)
def test_model_bounds(spec_dict, changes, where):
    with pytest.raises(ValidationError) as info:
        spec_with(spec_dict, **changes)
    assert where.split(".")[-1] in str(info.value)
