"""The CRD as the real API server serves it: kubectl explain, the condition rules, kubectl get.

No operator runs here: the tests write status through the status subresource themselves, as
the operator does, so what they check is the API server's schema and nothing else.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from builders import run_body
from payloadrun_operator.api.conditions import (
    ConditionType,
    ReadyReason,
    ValidatedReason,
    VolumeReadyReason,
)
from payloadrun_operator.api.crd import CRD_FILE, build_crd
from payloadrun_operator.api.models import GROUP, PLURAL, VERSION
from payloadrun_operator.observed.status import Check, rfc3339, status_update

READY = ConditionType.READY
VALIDATED = ConditionType.VALIDATED
VOLUME_READY = ConditionType.VOLUME_READY

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crd(kube_cluster) -> dict[str, Any]:
    result = kube_cluster.kubectl("apply", "--server-side", "-f", str(REPO / CRD_FILE))
    assert result.returncode == 0, result.stderr
    kube_cluster.wait_established(f"{PLURAL}.{GROUP}")
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def custom(kube_api_client) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_api_client)


def words(text: str) -> str:
    """``text`` with its whitespace folded: kubectl wraps descriptions at its own width."""
    return " ".join(text.split())


def explain(kube_cluster, field: str, *expect: str, timeout: float = 30.0) -> str:
    """``kubectl explain field``, once the API server publishes the CRD's schema with every text
    of ``expect``.

    The OpenAPI document follows a new or changed CRD after a moment, so this retries: until all
    of them, since another module's CRD (an older one, test_render_api.py's) may still be the
    published one, with the same descriptions at the top and fields missing below (Kubernetes
    1.29 publishes a changed CRD's schema later than 1.37).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = kube_cluster.kubectl("explain", field)
        shown = words(result.stdout)
        missing = [text for text in expect if words(text) not in shown]
        if result.returncode == 0 and not missing:
            return result.stdout
        if time.monotonic() > deadline:
            pytest.fail(
                f"kubectl explain {field} did not show {missing!r} within {timeout} s:\n"
                f"{result.stdout}{result.stderr}"
            )
        time.sleep(0.5)


# the smallest run the API server takes: the one every test here creates
SPEC = {
    "routerReplay": True,
    "inference": {"image": "vllm/vllm-openai:v0.33.0"},
    "orchestrator": {"image": "example/orchestrator:1"},
    "trainer": {"image": "example/trainer:1"},
}


def write_status(custom, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """Replace the run's status through the status subresource, as the operator writes it."""
    run = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    run["status"] = status
    return custom.replace_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, run
    )


def condition(ctype: str = READY, **changes: Any) -> dict[str, Any]:
    cond = {
        "type": ctype,
        "status": "True",
        "reason": "WorkloadsReady",
        "message": "run-inference 1/1 ready",
        "lastTransitionTime": "2026-12-01T10:00:00Z",
        "observedGeneration": 1,
    }
    cond.update(changes)
    return {k: v for k, v in cond.items() if v is not None}


# --- kubectl explain -----------------------------------------------------------------------------


def test_explain_describes_the_run_and_its_status(kube_cluster, crd):
    explain(kube_cluster, "payloadrun", crd["description"],
            *(crd["properties"][name]["description"] for name in ("spec", "status")))  # fmt: skip

    status = crd["properties"]["status"]
    out = explain(
        kube_cluster,
        "payloadrun.status",
        status["description"],
        *(field["description"] for field in status["properties"].values()),
    )
    for name, field in status["properties"].items():
        assert re.search(rf"^  {name}\t<", out, re.M), f"{name} missing:\n{out}"
        assert words(field["description"]) in words(out), f"{name}'s description missing:\n{out}"


def test_explain_describes_every_condition_field(kube_cluster, crd):
    conditions = crd["properties"]["status"]["properties"]["conditions"]
    out = explain(
        kube_cluster,
        "payloadrun.status.conditions",
        conditions["description"],
        *(field["description"] for field in conditions["items"]["properties"].values()),
    )
    for name, field in conditions["items"]["properties"].items():
        assert words(field["description"]) in words(out), f"{name}'s description missing:\n{out}"
    for name in ("type", "status", "reason", "message", "lastTransitionTime"):
        assert re.search(rf"^  {name}\t<\w+> -required-$", out, re.M), f"{name}:\n{out}"
    assert "enum: True, False, Unknown" in out


# --- the API server enforces metav1.Condition's rules -------------------------------------------


def refusal(error: ApiException) -> dict[str, str]:
    """The fields an HTTP 422 names, with what the API server said of each."""
    assert error.status == 422, error.body
    causes = json.loads(error.body)["details"]["causes"]
    # Kubernetes 1.29 (the oldest control plane) names a status field from inside the status
    # (conditions[0].status), 1.37 from the object (status.conditions[0].status)
    return {status_field(c.get("field", "")): c["message"] for c in causes}


def status_field(field: str) -> str:
    return f"status.{field}" if field.startswith("conditions") else field


@pytest.mark.parametrize(
    ("bad", "field", "says"),
    [
        (condition(status="Maybe"), "status", 'Unsupported value: "Maybe"'),
        (condition(lastTransitionTime=None), "lastTransitionTime", "Required value"),
        (condition(lastTransitionTime="yesterday"), "lastTransitionTime", "date-time"),
        (condition(reason="not camel case"), "reason", "should match"),
        (condition(reason=""), "reason", "at least 1 chars long"),
        (condition(type="Ready!"), "type", "should match"),
        (condition(observedGeneration=-1), "observedGeneration", "greater than or equal to 0"),
        (condition(message="m" * 32769), "message", "Too long"),
    ],
    ids=[
        "bad-status",
        "no-lastTransitionTime",
        "time-not-rfc3339",
        "reason-pattern",
        "empty-reason",
        "type-pattern",
        "negative-generation",
        "message-too-long",
    ],
)
def test_api_server_refuses_a_malformed_condition(crd, custom, namespace, bad, field, says):
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, run_body("run", SPEC))
    with pytest.raises(ApiException) as refused:
        write_status(custom, namespace, "run", {"phase": "Running", "conditions": [bad]})
    causes = refusal(refused.value)
    where = f"status.conditions[0].{field}"
    assert where in causes, causes
    assert says in causes[where], causes


def test_api_server_keeps_one_condition_per_type(crd, custom, namespace):
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, run_body("run", SPEC))
    with pytest.raises(ApiException) as refused:
        write_status(custom, namespace, "run", {"conditions": [condition(), condition()]})
    assert "Duplicate value" in refusal(refused.value).get("status.conditions[1]", ""), (
        refused.value.body
    )


def test_what_the_operator_writes_is_accepted(crd, custom, namespace):
    """status.py's output, a message past the limit included, passes the API server's rules."""
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, run_body("run", SPEC))
    now = rfc3339(datetime.now(UTC))
    checks = {
        VALIDATED: Check(True, ValidatedReason.SPEC_VALID, "the spec is valid"),
        VOLUME_READY: Check(False, VolumeReadyReason.CLAIM_PENDING, "x" * 40_000),
        READY: Check(False, ReadyReason.WORKLOADS_NOT_READY, "waiting for run-inference 0/1 ready"),
    }
    update = status_update({}, 1, checks, {"observedGeneration": 1, "payloadMode": "ByHandle"}, now)
    run = write_status(custom, namespace, "run", update.fields)
    written = {c["type"]: c for c in run["status"]["conditions"]}
    assert set(written) == {VALIDATED, VOLUME_READY, READY}
    assert written[READY]["lastTransitionTime"] == now
    assert len(written[VOLUME_READY]["message"]) == 32768


# --- kubectl get -------------------------------------------------------------------------------


def test_kubectl_get_shows_ready(kube_cluster, crd, custom, namespace):
    for name in ("ready-run", "waiting-run", "new-run"):
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, run_body(name, SPEC)
        )
    write_status(
        custom,
        namespace,
        "ready-run",
        {"payloadMode": "ByHandle", "phase": "Running", "conditions": [condition()]},
    )
    write_status(
        custom,
        namespace,
        "waiting-run",
        {
            "payloadMode": "ByHandle",
            "phase": "Provisioning",
            "conditions": [
                condition(VALIDATED, reason="SpecValid"),
                condition(status="False", reason="WorkloadsNotReady"),
            ],
        },
    )
    table = kube_cluster.kubectl("get", "payloadruns", "-n", namespace, check=True).stdout
    header, *lines = table.splitlines()
    assert header.split() == ["NAME", "MODE", "PHASE", "READY", "CLAIM", "AGE"]
    rows = {line.split()[0]: line.split() for line in lines}
    assert rows["ready-run"][1:4] == ["ByHandle", "Running", "True"]
    assert rows["waiting-run"][1:4] == ["ByHandle", "Provisioning", "False"]
    # a run the operator has not seen yet: an empty cell, no error
    ready_at = header.index("READY")
    new_run = next(line for line in lines if line.startswith("new-run"))
    assert new_run[ready_at : ready_at + len("READY")].strip() == "", table

    wide = kube_cluster.kubectl("get", "prun", "-n", namespace, "-o", "wide", check=True).stdout
    assert wide.splitlines()[0].split() == [
        "NAME",
        "MODE",
        "PHASE",
        "READY",
        "CLAIM",
        "QUEUE",  # a run's Kueue LocalQueue (empty: not queued)
        "REASON",
        "ROOT",
        "RESTARTS",
        "LAST",  # LAST STEP
        "STEP",
        "FINISHED",
        "AGE",
    ]
