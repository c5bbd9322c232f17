"""Refusals in plain words: each problem once, at its field's path, without the validator's
own prefix (issue 49: "spec.inference: Value error, spec.inference.workerTemplate is ...")."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from bad_runs import BASE_RUN, set_path
from pydantic import BaseModel, ValidationError, model_validator

from payloadrun_operator.api import validation
from payloadrun_operator.desired.admission import admit
from payloadrun_operator.platform.settings import OperatorSettings, _peers


def refusals(**changes: Any) -> list[str]:
    body = copy.deepcopy(BASE_RUN)
    body["metadata"] = {"name": "bad", "namespace": "ml", "uid": "u"}
    for path, value in changes.items():
        set_path(body, path, value)
    verdict = admit(body, OperatorSettings())
    assert verdict.ctx is None
    return verdict.errors


WORKER = {"spec": {"containers": [{"name": "vllm"}]}}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"spec.inference.workerTemplate": WORKER},
            "spec.inference.workerTemplate is the template of a replica's workers, and this "
            "run's replicas have one pod each: set spec.inference.podsPerReplica above 1, or "
            "remove spec.inference.workerTemplate",
        ),
        (
            {"spec.inference.clients": [{}]},
            "spec.inference.clients[0]: a network peer needs podSelector, namespaceSelector or "
            "ipBlock (namespaceSelector: {} alone is every pod of every namespace)",
        ),
        (
            {
                "spec.inference.clients": [
                    {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}
                ]
            },
            "spec.inference.clients[0].podSelector.matchExpressions[0]: matchExpressions 'a' In "
            "needs values: name at least one, or use Exists / DoesNotExist",
        ),
    ],
    ids=["worker-template", "empty-peer", "selector"],
)
def test_a_model_refusal_names_its_field_once_in_plain_words(changes, expected):
    assert refusals(**changes) == [expected]


def test_admission_and_render_refuse_another_container_on_an_api_servers_port():
    """The operator's admission, which render runs too, with the field's path."""
    template = {"spec": {"containers": [{"name": "proxy", "image": "p",
                                         "ports": [{"containerPort": 8000}]}]}}  # fmt: skip
    assert refusals(**{"spec.inference.template": template}) == [
        "spec.inference.template.spec.containers[proxy].ports: container proxy declares port "
        "8000, the port of http in the main container vllm of the same pod (one of the two "
        "could not bind it): use another port"
    ]


def test_the_operators_peer_setting_says_which_peer_in_the_same_words():
    with pytest.raises(ValueError) as info:
        _peers('[{"podSelector": {}}, {}]')
    text = str(info.value)
    assert "peer 1 ({})" in text and "the peer: a network peer needs podSelector" in text
    assert "Value error" not in text


class Inner(BaseModel):
    value: int

    @model_validator(mode="after")
    def _check(self) -> Inner:
        if self.value < 0:
            raise ValueError("must be >= 0")
        if self.value == 7:
            raise ValueError("spec.outer[2].value 7 is unlucky: pick another")
        return self


class Outer(BaseModel):
    items: list[Inner]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-1, "spec.items[0]: must be >= 0"),
        (7, "spec.outer[2].value 7 is unlucky: pick another"),  # it names its field: once
        ("x", "spec.items[0].value: Input should be a valid integer, unable to parse string"),
    ],
)
def test_pydantic_errors_lose_their_prefix_and_keep_one_path(value, expected):
    with pytest.raises(ValidationError) as info:
        Outer.model_validate({"items": [{"value": value}]})
    [said] = validation.messages(info.value)
    assert said.startswith(expected)
    assert "Value error" not in said
