"""Every container of a run's pods has exactly the env docs/operator.md's table says.

The table (#what-every-pod-learns) is read here, so the doc and the pods cannot drift: a row
names variables and the containers that get them, with a condition in brackets when it applies
only sometimes. The pods are built by the pure builders, the sidecars' and the cleanup Job's
containers included.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from payloadrun_operator.api import names
from payloadrun_operator.api.models import PayloadRunSpec
from payloadrun_operator.desired.builders import build_children, build_cleanup
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.decisions import decide_payload_mode
from payloadrun_operator.platform.settings import OperatorSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
SECTION = "## What every pod learns"
CONTAINERS = (
    names.VLLM_CONTAINER,
    names.ORCHESTRATOR_CONTAINER,
    names.TRAINER_CONTAINER,
    names.WRITER_CONTAINER,
    names.RETENTION_CONTAINER,
    names.CLEANUP_CONTAINER,
)
# The table's conditions, as facts of the spec the pods are built from.
CONDITIONS: dict[str, Callable[[RunContext], bool]] = {
    "by handle": lambda ctx: ctx.by_handle,
    "with `runDirectory`": lambda ctx: ctx.spec.run_directory is not None,
    "with `maxSteps`": lambda ctx: ctx.spec.max_steps is not None,
    "with `processesPerNode: 1`": lambda ctx: ctx.spec.trainer.processes_per_node == 1,
}
ROW_CONTAINERS = re.compile(r"(?P<containers>[^()]+?)(?: \((?P<condition>[^()]+)\))?")


def table_rows() -> Iterator[tuple[set[str], set[str], str | None]]:
    """(variables, containers, condition or None) of each row of the section's table."""
    text = DOC.read_text()
    section = text[text.index(SECTION) + len(SECTION) :]
    section = section[: section.index("\n## ")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, f"no table under {SECTION!r} in {DOC}"
    for line in rows:
        first, second = [cell.strip() for cell in line.strip("|").split("|")][:2]
        variables = re.findall(r"`([A-Z][A-Z0-9_]*\*?)`", first)
        patterns = {v for v in variables if v.endswith("*")}  # `PET_*` of each: PET_<each>
        plain = set(variables) - patterns
        expanded = {p[:-1] + v for p in patterns for v in plain}
        match = ROW_CONTAINERS.fullmatch(second)
        assert match, f"docs/operator.md: cannot read the containers of {line!r}"
        listed = {c.strip() for c in match["containers"].split(",")}
        containers = set(CONTAINERS) if listed == {"all"} else listed
        assert containers <= set(CONTAINERS), f"unknown container in {line!r}"
        yield plain | expanded, containers, match["condition"]


def documented(ctx: RunContext) -> dict[str, set[str]]:
    """Container -> the variables the table gives it, for the run ``ctx`` describes."""
    env: dict[str, set[str]] = {c: set() for c in CONTAINERS}
    for variables, containers, condition in table_rows():
        if condition is not None:
            assert condition in CONDITIONS, (
                f"docs/operator.md: a condition this test does not know: {condition!r}"
            )
            if not CONDITIONS[condition](ctx):
                continue
        for container in containers:
            env[container] |= variables
    return env


def built(ctx: RunContext) -> dict[str, set[str]]:
    """Container -> the variables the operator gives it, in every pod it builds for ``ctx``."""
    children = build_children(ctx)
    if ctx.by_handle:
        children.append(build_cleanup(ctx))
    env: dict[str, set[str]] = {}
    for child in children:
        template = (child.get("spec") or {}).get("template")
        if template is None:
            continue
        pod = template["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            assert container["name"] not in env, f"{container['name']} in two pods"
            env[container["name"]] = {e["name"] for e in container.get("env", [])}
    return env


def context(spec: dict[str, Any]) -> RunContext:
    model = PayloadRunSpec.model_validate(spec)
    settings = OperatorSettings(sidecar_image="registry.example/payloadrun:test")
    return RunContext("run1", "ml", "uid-123", model, decide_payload_mode(model), settings)


def test_the_table_reads_as_rows_of_variables_and_containers():
    rows = list(table_rows())
    identity = {"PAYLOADRUN_RUN", "PAYLOADRUN_RUN_ID", "PAYLOADRUN_PAYLOAD_MODE"}
    assert (identity, set(CONTAINERS), None) in rows
    (rendezvous,) = [v for v, _, _ in rows if "MASTER_ADDR" in v]
    assert {"PET_MASTER_ADDR", "PET_NODE_RANK"} <= rendezvous and "PET_" not in rendezvous


def test_every_container_of_a_by_handle_run_has_exactly_the_documented_env(spec_dict):
    """Every condition of the table holds: every row applies."""
    spec = copy.deepcopy(spec_dict)
    spec |= {"maxSteps": 100, "runDirectory": {"mountPath": "/data"}}
    ctx = context(spec)
    assert ctx.by_handle and all(holds(ctx) for holds in CONDITIONS.values())
    env = built(ctx)
    assert set(env) == set(CONTAINERS)
    assert env == documented(ctx)


@pytest.mark.parametrize("processes", [1, 8])
def test_every_container_of_an_inline_run_has_exactly_the_documented_env(spec_dict, processes):
    """No volume, no sidecar, no cleanup Job; only the rows without a condition that fails."""
    spec = copy.deepcopy(spec_dict)
    spec["payloads"] = {"mode": "Inline"}
    spec["trainer"]["processesPerNode"] = processes
    ctx = context(spec)
    assert not ctx.by_handle
    env = built(ctx)
    assert set(env) == {names.VLLM_CONTAINER, names.ORCHESTRATOR_CONTAINER, names.TRAINER_CONTAINER}
    assert env == {c: v for c, v in documented(ctx).items() if c in env}


IDENTITY = {"PAYLOADRUN_RUN", "PAYLOADRUN_RUN_ID", "PAYLOADRUN_PAYLOAD_MODE"}


def with_extra_containers(spec: dict[str, Any]) -> dict[str, Any]:
    """Each role's template with a container and an init container of the user's own; the
    trainers' sidecar names its run itself."""
    spec = copy.deepcopy(spec)
    for role in ("inference", "orchestrator", "trainer"):
        own = [{"name": "LOG_DIR", "value": "/logs/$(PAYLOADRUN_RUN)"}]
        if role == "trainer":
            own.append({"name": "PAYLOADRUN_RUN", "value": "named-by-me"})
        spec[role]["template"] = {
            "spec": {
                "containers": [{"name": f"{role}-shipper", "image": "busybox", "env": own}],
                "initContainers": [{"name": f"{role}-warmup", "image": "busybox"}],
            }
        }
    return spec


@pytest.mark.parametrize("mode", ["ByHandle", "Inline"])
def test_a_templates_own_containers_are_told_which_run_they_belong_to(spec_dict, mode):
    """The table's "all": every container of the run's pods, the user's too; a variable the
    user's container sets is its own."""
    spec = with_extra_containers(spec_dict)
    spec["payloads"] = {"mode": mode}
    ctx = context(spec)
    pods = [
        c["spec"]["template"]["spec"]
        for c in build_children(ctx)
        if (c.get("spec") or {}).get("template")
    ]
    containers = {
        c["name"]: c for pod in pods for c in [*pod.get("initContainers", []), *pod["containers"]]
    }
    for role in ("inference", "orchestrator", "trainer"):
        for name in (f"{role}-shipper", f"{role}-warmup"):
            env = containers[name]["env"]
            values = {e["name"]: e["value"] for e in env}
            assert set(values) - {"LOG_DIR"} == IDENTITY, name
            assert values["PAYLOADRUN_RUN_ID"] == "uid-123"
            assert values["PAYLOADRUN_PAYLOAD_MODE"] == mode
            in_order = [e["name"] for e in env]
            if name == "trainer-shipper":  # the user's own, where the user put it
                assert values["PAYLOADRUN_RUN"] == "named-by-me"
                assert in_order == [*in_order[:2], "LOG_DIR", "PAYLOADRUN_RUN"]
            else:
                assert values["PAYLOADRUN_RUN"] == "run1"
                if "LOG_DIR" in values:  # after the variable it refers to
                    assert in_order.index("LOG_DIR") > in_order.index("PAYLOADRUN_RUN")
