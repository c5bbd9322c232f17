"""Multi-turn rollouts by handle equal verifiers' own inline path, bit for bit.

The oracle is verifiers 0.4.0 itself (the ``verifiers`` extra): hypothesis generates
conversations (linear, bridged and unbridged turns, forks off sampled and non-sampled nodes,
re-rendered prefix nodes, turns whose routing rows run short, uint8 and uint16 routing, sampling
masks on some turns), every turn is served through the real writer in front of the fake vLLM
(real sockets, a real payload root) and, with the same salt, inline by the fake vLLM. verifiers
builds its inline graph from the inline answers; the adapter of ``examples/verifiers_traces.py``
attributes the by-handle segments to the same graph with ``payloadrun.TracePayload``. Every
branch's rows read back by ``PayloadReader`` must equal verifiers' ``Branch.routed_experts`` in
dtype and bytes, and its sampling mask, turned into verifiers' ``(ids, counts)``, must equal
``Branch.sampling_mask``; None exactly where verifiers says None. The fake's rows are a function
of the turn's salt and the position, so a re-forwarded row differs from the original and "the
latest turn wins" can be seen. The test counts the traces that hit each case, and every case
must be hit.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from payloadrun import ROUTED_EXPERTS, SAMPLING_MASK, PayloadReader, TraceError, attribute_turn
from payloadrun.codec import csr_from_mask_rows
from payloadrun.paths import payload_dir
from payloadrun.segments import PAYLOAD_DIR_ARG, Segment, choice_segments
from payloadrun.traces import Node
from payloadrun_devkit.required import skip_or_fail

from .conftest import http

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verifiers_traces.py"
LAYERS, TOP_K = 2, 2
GENERATION_PROMPT = [7]
CASES = (
    "linear",
    "bridged",
    "fork off a sampled node",
    "fork off a non-sampled node",
    "re-rendered prefix node",
    "bridged re-render refused",
    "rows ran short",
    "row superseded",
    "uint8",
    "uint16",
    "mask on a branch",
    "branch with a node without mask",
    "branch without routing",
    "branch with routing",
)


def verifiers_modules() -> Any:
    """The example's adapter module (which imports verifiers), or skip (fail under CI)."""
    if importlib.util.find_spec("verifiers") is None:
        skip_or_fail("verifiers is not installed (pip install -e '.[verifiers]'; make test does)")
    spec = importlib.util.spec_from_file_location("verifiers_traces", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class TurnPlan:
    base: str  # what the prompt extends: "last answer", "an answer", "a node" or "a new root"
    pick: int  # which answer or node
    tail: tuple[str, ...]  # roles of the new prompt messages
    tail_key: int  # small: an identical tail may meet an existing node
    rerender: int | None  # index into the prompt's prefix messages whose tokens change
    bridge: bool
    skip_rows: int
    completion: int
    mask: bool


turn_plans = st.builds(
    TurnPlan,
    base=st.sampled_from(("last answer", "last answer", "an answer", "a node", "a new root")),
    pick=st.integers(0, 40),
    tail=st.lists(st.sampled_from(("user", "tool", "system", "assistant")), max_size=2).map(tuple),
    tail_key=st.integers(0, 2),
    rerender=st.none() | st.integers(0, 6),
    bridge=st.booleans(),
    skip_rows=st.sampled_from((0, 0, 0, 0, 0, 1, 2, 4)),
    completion=st.integers(1, 3),
    mask=st.booleans(),
)


class Conversation:
    """One generated rollout: verifiers' trace (inline arrays) plus the by-handle adapter."""

    def __init__(self, vf: Any, front: str, fake: str, root: Path, experts: int, salt: int):
        from verifiers.v1.trace import AgentConfig, AgentInfo, Trace, TraceTask

        self.vf = vf
        self.front, self.fake, self.root = front, fake, root
        self.headers = {"x-fake-experts": str(experts), "x-fake-layers": str(LAYERS),
                        "x-fake-top-k": str(TOP_K)}  # fmt: skip
        self.salt = salt
        trace = Trace(task=TraceTask(type="oracle", data={}), agent=AgentInfo(config=AgentConfig()))
        self.rollout = vf.ByHandleTrace(trace)
        self.trace = trace
        self.cases: set[str] = set()
        self.count = 0

    def message(self, role: str, key: int) -> Any:
        from verifiers.v1.types import AssistantMessage, SystemMessage, ToolMessage, UserMessage

        content = f"{role} {key}"
        return {
            "user": lambda: UserMessage(content=content),
            "system": lambda: SystemMessage(content=content),
            "tool": lambda: ToolMessage(tool_call_id=f"call_{key}", content=content),
            "assistant": lambda: AssistantMessage(content=content),  # prompt-supplied
        }[role]()

    @staticmethod
    def tokens(message: Any, variant: int = 0) -> list[int]:
        text = json.dumps(message.model_dump(mode="json"), sort_keys=True) + f"#{variant}"
        digest = [b for b in text.encode()]
        return [1000 + (sum(digest) * (i + 3) + variant) % 9000 for i in range(1 + len(text) % 3)]

    def ask(self, body: dict[str, Any], to: str, salt: int, skip: int, mask: bool) -> Any:
        headers = {**self.headers, "x-fake-salt": str(salt), "x-fake-skip-rows": str(skip),
                   "x-fake-sampling-mask": "1" if mask else "0"}  # fmt: skip
        reply = http("POST", to + "/inference/v1/generate", body, headers)
        assert reply.status == 200, reply.body[:500]
        return reply.json()["choices"][0]

    def turn(self, plan: TurnPlan) -> None:
        from verifiers.v1 import graph
        from verifiers.v1.types import AssistantMessage, Response, TurnTokens

        nodes = self.trace.nodes
        answers = [i for i, n in enumerate(nodes) if n.sampled]
        base = {
            "last answer": answers[-1:],
            "an answer": answers[plan.pick % len(answers) :][:1] if answers else [],
            "a node": [plan.pick % len(nodes)] if nodes else [],
            "a new root": [],
        }[plan.base]
        base = base[0] if base else None
        path = self.vf.path_to(self.trace, base)
        tail = [self.message(role, plan.tail_key + 10 * i) for i, role in enumerate(plan.tail)]
        if not path and not tail:
            tail = [self.message("user", plan.tail_key)]
        prompt = [nodes[i].message for i in path] + tail
        turn = graph.prepare_turn(self.trace, prompt)
        rerender = None if plan.rerender is None or not path else plan.rerender % len(path)
        bridged = bool(plan.bridge and tail and turn.previous_renderer_token_ids() is not None)
        # render: the prepared prefix's own tokens on a bridged turn, else message by message
        rendered = [list(nodes[i].token_ids) for i in turn.prefix_node_ids] if bridged else [
            list(nodes[i].token_ids) for i in path]  # fmt: skip
        if rerender is not None and (not bridged or rerender < len(rendered)):
            rendered[rerender] = rendered[rerender] + [self.tokens(prompt[rerender], 1)[0]]
        rendered += [self.tokens(m) for m in prompt[len(rendered) :]]
        prompt_ids, spans = [], []
        for ids in rendered:
            spans.append((len(prompt_ids), len(prompt_ids) + len(ids)))
            prompt_ids += ids
        prompt_ids += GENERATION_PROMPT
        start = max(turn.path_len - 1, 0) if bridged else 0
        self.count += 1
        salt = self.salt * 1000 + self.count
        params = {"max_tokens": plan.completion, "temperature": 1.0,
                  "routed_experts_prompt_start": start}  # fmt: skip
        body = {"model": "oracle", "token_ids": prompt_ids, "sampling_params": params}
        inline = self.ask(body, self.fake, salt, plan.skip_rows, plan.mask)
        extra = {PAYLOAD_DIR_ARG: payload_dir(self.root, 0)}
        by_handle = {**body, "sampling_params": {**params, "extra_args": extra}}
        answer = self.ask(by_handle, self.front, salt, plan.skip_rows, plan.mask)
        segments = choice_segments(answer)
        assert segments is not None, "the writer answered inline"
        assert answer["token_ids"] == inline["token_ids"]
        # as verifiers' train client builds it (response_from_generate)
        tokens = TurnTokens.model_construct(
            prompt_ids=prompt_ids,
            completion_ids=inline["token_ids"],
            completion_logprobs=[],
            message_spans=spans,
            bridged=bridged,
            **self.vf.inline_arrays(inline, len(prompt_ids)),
        )
        answer_message = AssistantMessage(content=f"answer {salt}")
        response = Response(id=str(salt), created=0, model="oracle", message=answer_message,
                            finish_reason="length", tokens=tokens)  # fmt: skip
        before = len(nodes)
        try:
            self.rollout.commit(turn, response, segments)
        except ValueError as exc:  # verifiers refuses a bridged turn whose prefix was re-rendered
            assert bridged and rerender is not None, exc
            assert len(nodes) == before, "verifiers committed part of a refused turn"
            self.refused_too(turn, prompt_ids, segments, len(prompt_ids) + plan.completion)
            self.cases.add("bridged re-render refused")
            return
        self.note(plan, base, turn, bridged, before, tokens.routed_experts["dtype"])

    def refused_too(self, turn: Any, prompt_ids: list[int], segments: list[Segment], total: int):
        """The library refuses what verifiers refused: the same prefix, cut where it differs."""
        kept, at = [], 0
        for i in turn.prefix_node_ids:
            ids = self.trace.nodes[i].token_ids
            if prompt_ids[at : at + len(ids)] != ids:
                break
            kept.append(self.vf.node_of(self.trace, i))
            at += len(ids)
        rest = total - at
        new = [Node("rest", rest - 1), Node("answer", 1, sampled=True, completion=1)]
        with pytest.raises(TraceError, match="bridged turn's prompt must extend"):
            attribute_turn(kept, new, segments, bridged_on=turn.prefix_node_ids)

    def note(self, plan: TurnPlan, base: int | None, turn: Any, bridged: bool, before: int, dtype):
        nodes = self.trace.nodes
        new = list(range(before, len(nodes)))
        prefix = self.vf.path_to(self.trace, nodes[new[0]].parent)
        self.cases.add(str(dtype))
        if bridged:
            self.cases.add("bridged")
        if prefix != list(turn.prefix_node_ids[: len(prefix)]) or len(prefix) < len(
            turn.prefix_node_ids
        ):
            self.cases.add("re-rendered prefix node")
        if base is not None and prefix and prefix[-1] == base and not bridged:
            siblings = [n for n in nodes[:before] if n.parent == base]
            if nodes[base].sampled:
                self.cases.add("fork off a sampled node" if siblings else "linear")
        last = next((i for i in reversed(prefix) if nodes[i].token_ids), None)
        if last is not None and not nodes[last].sampled and not bridged and plan.tail:
            self.cases.add("fork off a non-sampled node")
        added = self.rollout.payload.segments
        if any(e.supersedes for e in added if e.node in prefix):
            self.cases.add("row superseded")
        owners = {e.node for e in added if e.segment.field == ROUTED_EXPERTS}
        if any(nodes[i].token_ids and i not in owners for i in new):
            self.cases.add("rows ran short")

    def check_branches(self) -> None:
        """Every branch read back by handle equals verifiers' inline branch."""
        reader = PayloadReader(self.root, deadline_s=None)
        for branch, segments in self.rollout.branches():
            total = len(branch.token_ids)
            fields = {s.field for s in segments}
            want = branch.routed_experts
            if want is None:
                assert ROUTED_EXPERTS not in fields, (branch.index, segments)
                self.cases.add("branch without routing")
            else:
                got = reader.read(segments, ROUTED_EXPERTS, 0, total)
                assert got.dtype == want.dtype and got.shape == want.shape
                assert got.tobytes() == want.tobytes(), (branch.index, got, want)
                self.cases.add("branch with routing")
            mask = branch.sampling_mask
            if mask is None:
                assert SAMPLING_MASK not in fields
                continue
            ids, counts = csr_from_mask_rows(reader.read(segments, SAMPLING_MASK, 0, total))
            np.testing.assert_array_equal(counts, mask.counts)
            np.testing.assert_array_equal(ids, mask.ids)
            assert ids.dtype == mask.ids.dtype == np.int32
            self.cases.add("mask on a branch")
            if any(n.sampled and n.sampling_mask is None for n in branch.nodes):
                self.cases.add("branch with a node without mask")


def test_every_branch_equals_verifiers_inline_path(fake, writer, root):
    vf = verifiers_modules()
    hits: Counter[str] = Counter()
    salts = iter(range(1, 1_000_000))

    @settings(max_examples=70, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(experts=st.sampled_from((64, 300)), plans=st.lists(turn_plans, min_size=1, max_size=5))
    def conversation(experts: int, plans: list[TurnPlan]) -> None:
        convo = Conversation(vf, writer.url, fake.url, root, experts, next(salts))
        for plan in plans:
            convo.turn(plan)
        convo.check_branches()
        hits.update(convo.cases)

    conversation()
    print("traces per case:", dict(sorted(hits.items())))
    missing = [case for case in CASES if not hits[case]]
    assert not missing, f"no generated trace hit {missing}: {dict(hits)}"


def test_the_example_runs_its_agentic_rollout_by_handle(fake, writer, root, monkeypatch):
    """examples/verifiers_traces.py, as a user runs it: three turns, every branch read back."""
    vf = verifiers_modules()
    monkeypatch.setenv("PAYLOAD_ROOT", str(root))
    monkeypatch.setenv("PAYLOADRUN_INFERENCE_URL", writer.url)
    rollout = vf.agentic_rollout()
    branches = rollout.branches()
    assert len(branches) == 2  # the tool-call branch and the fork off the system prompt
    assert len(rollout.payload.files) == 3  # one file a turn
    for branch, segments in branches:
        fields = {s.field for s in segments}
        assert fields == {ROUTED_EXPERTS, SAMPLING_MASK}, (branch.index, segments)
    assert vf.main() == 0
