"""The operator's typed vocabulary: one table of the Kubernetes kinds it touches; a run's pod
layout is asked for what it has, never for its number; phases, workload plans and restart
actions are enums whose values are the strings the status, the metrics and the tests have
always read."""

from __future__ import annotations

import ast
from pathlib import Path

import payloadrun_operator
from payloadrun_operator.api.conditions import FINAL_PHASES, EventReason, Phase
from payloadrun_operator.api.kinds import FOLLOWED, KINDS, PLURALS
from payloadrun_operator.api.models import PayloadModeReason, PayloadRunSpec, PayloadRunStatus
from payloadrun_operator.api.names import WORKLOADS
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.cleanup import build_cleanup
from payloadrun_operator.desired.context import RunContext, is_final
from payloadrun_operator.desired.decisions import decide_payload_mode
from payloadrun_operator.desired.pinning import CURRENT_LAYOUT, POD_LAYOUT, PodLayout, layout_of
from payloadrun_operator.observed.plan import WorkloadPlan
from payloadrun_operator.observed.restarts import ACTIONS, RestartAction
from payloadrun_operator.platform.settings import OperatorSettings

ROOT = Path(payloadrun_operator.__file__).parent
CAPABILITIES = [name for name, value in vars(PodLayout).items() if isinstance(value, property)]


def test_layout_1_has_none_of_what_layout_2_brought() -> None:
    assert CAPABILITIES, "PodLayout names no capability"
    for name in CAPABILITIES:
        assert getattr(PodLayout(1), name) is False, name
        assert getattr(PodLayout(2), name) is True, name
    assert CURRENT_LAYOUT == PodLayout(POD_LAYOUT) == PodLayout.of(POD_LAYOUT)
    assert layout_of({}) == PodLayout(1)  # a run recorded before layouts
    assert layout_of({"podLayout": 2}) == PodLayout(2)


def layout_number_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    """Comparisons of something named ``*layout*`` with a number (``layout >= 2``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any("layout" in ast.unparse(s).lower() for s in sides)
        number = any(isinstance(s, ast.Constant) and isinstance(s.value, int) for s in sides)
        if named and number:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_compares_a_layout_with_a_number() -> None:
    found = [c for path in sorted(ROOT.rglob("*.py")) for c in layout_number_comparisons(path)]
    assert not found, f"ask the PodLayout for what it has (a property) instead: {found}"


def test_the_reader_finds_a_layout_compared_with_a_number(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f(ctx):\n    return 0 if ctx.layout >= 2 else 1\n")
    assert layout_number_comparisons(source, tmp_path) == ["m.py:2: ctx.layout >= 2"]


def test_the_enums_keep_the_strings_of_the_status_and_metrics() -> None:
    assert [str(p) for p in Phase] == [
        "Rejected",
        "Provisioning",
        "Running",
        "Suspended",
        "Queued",
        "Succeeded",
        "Failed",
    ]
    assert {p for p in Phase if p.final} == FINAL_PHASES == {Phase.SUCCEEDED, Phase.FAILED}
    assert is_final("Failed") and is_final(Phase.SUCCEEDED) and not is_final(None)
    assert [str(p) for p in WorkloadPlan] == ["apply", "scale", "keep", "recreate", "wait"]
    assert set(ACTIONS) == set(RestartAction), "every restart action has its steps"


def test_every_child_the_builders_make_is_a_kind_of_the_table(spec_dict: dict) -> None:
    """The client finds each child's API path in the one table, and the status follows the
    kinds of every workload."""
    spec = PayloadRunSpec.model_validate(spec_dict)
    ctx = RunContext.of({"name": "r", "namespace": "ns", "uid": "u"}, spec, OperatorSettings())
    made = {(c["apiVersion"], c["kind"]) for c in [*build_children(ctx), build_cleanup(ctx)]}
    assert made <= set(PLURALS), sorted(made - set(PLURALS))
    followed = {(k.api_version, k.kind) for k in FOLLOWED}
    assert {(api, kind) for api, kind, _ in WORKLOADS} <= followed
    assert len({(k.api_version, k.kind) for k in KINDS}) == len(KINDS) == len(PLURALS)


def bare_event_words(path: Path, root: Path = ROOT) -> list[str]:
    """Calls of ``post_event`` whose type or reason is a string literal, not the enums'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("post_event")):
            continue
        words = node.args[1:3]  # (obj, event_type, reason, message, now)
        if any(isinstance(word, ast.Constant) for word in words):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_event_the_operator_posts_has_its_type_and_reason_from_the_enums(
    tmp_path: Path,
) -> None:
    found = [c for path in sorted(ROOT.rglob("*.py")) for c in bare_event_words(path)]
    assert not found, f"use EventType and EventReason (api/conditions.py): {found}"
    assert [str(r) for r in EventReason] == ["TrainersRestarted", "InferenceGroupRestarted"]
    source = tmp_path / "m.py"
    source.write_text("async def f(c, run):\n    await c.post_event(run, 'Warning', 'X', 'm', 0)\n")
    assert len(bare_event_words(source, tmp_path)) == 1


# where a kind's name is not the table's: the run's kind is defined (models.py), an add-on is
# named after its kind (addons.py)
KIND_WORDS_ALLOWED = {"api/kinds.py", "api/models.py", "api/addons.py"}


def kind_literals(path: Path, root: Path = ROOT) -> list[str]:
    """String literals in code (not docstrings) that are a kind of the table or a group's
    apiVersion (``batch/v1``): what the table's rows say (``JOB.kind``, ``**JOB.type_meta``)."""
    words = {k.kind for k in KINDS} | {k.api_version for k in KINDS if "/" in k.api_version}
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{path.relative_to(root)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in words and id(node) not in docstrings
    ]


def test_kinds_and_api_versions_come_from_the_table_only(tmp_path: Path) -> None:
    found = [
        literal
        for path in sorted(ROOT.rglob("*.py"))
        if str(path.relative_to(ROOT)) not in KIND_WORDS_ALLOWED
        for literal in kind_literals(path)
    ]
    assert not found, f"name the kinds' rows of api/kinds.py instead: {found}"
    source = tmp_path / "m.py"
    source.write_text('"""A Job."""\n\ndef f(o):\n    return o["kind"] == "Job", "batch/v1"\n')
    assert sorted(kind_literals(source, tmp_path)) == ["m.py:4: 'Job'", "m.py:4: 'batch/v1'"]


def test_payload_mode_reasons_are_the_enums_members_everywhere() -> None:
    """Each reason is written once, in its enum (api/models.py, where DeploymentType's
    SingleNode is another word); the code and the CRD's descriptions name the members."""
    reasons = {str(r) for r in PayloadModeReason}
    literals = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for path in sorted(ROOT.rglob("*.py"))
        if path != ROOT / "api" / "models.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in reasons
    ]
    assert not literals, f"name PayloadModeReason's members instead: {literals}"
    described = PayloadRunStatus.model_fields["payload_mode_reason"].description or ""
    assert all(reason in described for reason in reasons)
    decided = {decide_payload_mode(PayloadRunSpec.model_validate(s)).reason for s in MODE_SPECS}
    assert decided == set(PayloadModeReason), "each reason is one rule's"


# one spec for each rule of decide_payload_mode, in its order
_BASE = {
    "orchestrator": {"image": "o"},
    "trainer": {"image": "t"},
    "inference": {"image": "v", "replicas": 2},
}
MODE_SPECS = [
    _BASE | {"payloads": {"mode": "Inline"}},
    _BASE | {"payloads": {"mode": "ByHandle"}},
    _BASE | {"payloads": {"root": "/payloads/run"}},
    _BASE | {"routerReplay": False, "samplingMaskCapture": False},
    _BASE | {"routerReplay": True, "deploymentType": "SingleNode"},
    _BASE
    | {
        "routerReplay": True,
        "deploymentType": "MultiNode",
        "inference": _BASE["inference"] | {"disaggregated": True},
    },
    _BASE | {"routerReplay": True, "deploymentType": "MultiNode"},
]
