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

from builders import context, group_spec
from payloadrun_operator.api import names
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.cleanup import build_cleanup
from payloadrun_operator.desired.context import RunContext
from payloadrun_operator.desired.shape import inference_world_size

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
# The pods a container can be in: each workload's, and a LeaderWorkerSet's two templates.
LEADER, WORKER, OTHER = "leader", "worker", "other"


def exact_start_rank(ctx: RunContext) -> bool:
    shape = ctx.inference_shape
    return shape.api_servers == "Leader" or shape.api_servers_per_pod == 1


# The table's conditions, as facts of the spec the pods are built from and of the pod (OTHER:
# not a group's).
CONDITIONS: dict[str, Callable[[RunContext, str], bool]] = {
    "by handle": lambda ctx, pod: ctx.by_handle,
    "with `runDirectory`": lambda ctx, pod: ctx.spec.run_directory is not None,
    "with `maxSteps`": lambda ctx, pod: ctx.spec.max_steps is not None,
    "with `processesPerNode: 1`": lambda ctx, pod: ctx.spec.trainer.processes_per_node == 1,
    "with more than one pod or API server a replica, and GPUs": lambda ctx, pod: (
        inference_world_size(ctx.spec.inference) is not None
    ),
    "in a group": lambda ctx, pod: pod in (LEADER, WORKER),
    "in a group's serving pods": lambda ctx, pod: (
        pod in (LEADER, WORKER) and ctx.inference_shape.serves(pod)
    ),
    "in a group's serving pods, where exact": lambda ctx, pod: (
        pod in (LEADER, WORKER) and ctx.inference_shape.serves(pod) and exact_start_rank(ctx)
    ),
}
# The conditions of the rows about a run's pods, which a run of one-pod replicas meets.
RUN_CONDITIONS = (
    "by handle",
    "with `runDirectory`",
    "with `maxSteps`",
    "with `processesPerNode: 1`",
)
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


def documented(ctx: RunContext, pod: str = OTHER) -> dict[str, set[str]]:
    """Container -> the variables the table gives it, for the run ``ctx`` describes, in a pod
    of the kind ``pod`` says."""
    env: dict[str, set[str]] = {c: set() for c in CONTAINERS}
    for variables, containers, condition in table_rows():
        if condition is not None:
            assert condition in CONDITIONS, (
                f"docs/operator.md: a condition this test does not know: {condition!r}"
            )
            if not CONDITIONS[condition](ctx, pod):
                continue
        for container in containers:
            env[container] |= variables
    return env


def pod_templates(child: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind of pod, pod spec) of each pod template of a child."""
    spec = child.get("spec") or {}
    if child["kind"] == "LeaderWorkerSet":
        templates = spec["leaderWorkerTemplate"]
        yield LEADER, templates["leaderTemplate"]["spec"]
        yield WORKER, templates["workerTemplate"]["spec"]
    elif spec.get("template") is not None:
        yield OTHER, spec["template"]["spec"]


def built(ctx: RunContext, kind: str = OTHER) -> dict[str, set[str]]:
    """Container -> the variables the operator gives it, in every pod of the kind ``kind`` says
    that it builds for ``ctx``."""
    children = build_children(ctx)
    if ctx.by_handle:
        children.append(build_cleanup(ctx))
    env: dict[str, set[str]] = {}
    for child in children:
        for pod_kind, pod in pod_templates(child):
            if pod_kind != kind:
                continue
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                assert container["name"] not in env, f"{container['name']} in two pods"
                env[container["name"]] = {e["name"] for e in container.get("env", [])}
    return env


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
    assert all(CONDITIONS[condition](ctx, OTHER) for condition in RUN_CONDITIONS)
    env = built(ctx)
    assert set(env) == set(CONTAINERS)
    assert env == documented(ctx)


@pytest.mark.parametrize(
    ("layout", "servers"), [("EveryPod", 1), ("EveryPod", 2), ("Leader", 2), ("Leader", 1)]
)
@pytest.mark.parametrize("mode", ["ByHandle", "Inline"])
def test_every_container_of_a_group_run_has_exactly_the_documented_env(layout, servers, mode):
    """Every group's leader and worker, and the run's other pods, in both layouts: each row's
    condition holds for some of them."""
    spec = group_spec(apiServers=layout, apiServersPerPod=servers)
    spec |= {"maxSteps": 100, "runDirectory": {"mountPath": "/data"}, "payloads": {"mode": mode}}
    ctx = context(spec)
    assert all(CONDITIONS[condition](ctx, OTHER) for condition in RUN_CONDITIONS[1:])
    others = built(ctx)
    assert others == {c: v for c, v in documented(ctx).items() if c in others}
    assert names.VLLM_CONTAINER not in others
    for pod in (LEADER, WORKER):
        env = built(ctx, pod)
        serves = ctx.inference_shape.serves(pod)
        with_writer = mode == "ByHandle" and serves
        assert set(env) == {names.VLLM_CONTAINER} | (
            {names.WRITER_CONTAINER} if with_writer else set()
        )
        assert env == {c: v for c, v in documented(ctx, pod).items() if c in env}, pod


def test_every_condition_of_the_table_holds_for_some_pod_of_the_runs_above():
    """So that no row goes untested: each condition holds in a pod the tests above check."""
    runs = [
        group_spec(apiServers=layout, apiServersPerPod=servers)
        for layout, servers in (("EveryPod", 1), ("Leader", 2))
    ]
    held = {
        condition
        for spec in runs
        for pod in (LEADER, WORKER, OTHER)
        for condition, holds in CONDITIONS.items()
        if holds(context(spec | {"maxSteps": 1, "runDirectory": {"mountPath": "/d"}}), pod)
    }
    assert held == set(CONDITIONS)


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
