"""verifiers' multi-turn traces by handle: the adapter, and one agentic rollout through a writer.

verifiers (``verifiers.v1``) keeps a rollout as a graph of message nodes and turns each
root-to-leaf path into a training sample (``Trace.branches``). Inline, every turn's
``TurnTokens.routed_experts`` and ``sampling_mask`` are sliced onto the nodes the turn created.
By handle the arrays stay on the shared volume, and :class:`ByHandleTrace` below does the same
slicing to the turn's segments with ``payloadrun.TracePayload``: verifiers still decides the graph
(prefix reuse, re-rendered nodes, forks), the library attributes the rows. Bit for bit the same
rows as verifiers' inline path; ``tests/writer/test_traces_oracle.py`` holds it there with this
adapter.

Run it where the operator's environment is set (or set it yourself), with verifiers installed
(``pip install "payloadrun[verifiers]"``):

    PAYLOAD_ROOT               the run's payload root on the shared volume
    PAYLOADRUN_INFERENCE_URL   the writer sidecar in front of vLLM (the inference Service)

    python examples/verifiers_traces.py

It plays one agentic rollout of three turns: a question, a tool call and its result (a bridged
turn: the request re-sends the conversation and asks routing from its last token on), and a
second question forked off the system prompt. verifiers' renderer needs a tokenizer from the
Hugging Face hub; the example stands in one that gives each message a few token ids. Each
branch's rows are then read back, as the trainer would, and their shapes printed.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.request
import zlib
from collections.abc import Sequence

import numpy as np
from verifiers.v1 import graph
from verifiers.v1.trace import AgentConfig, AgentInfo, Branch, Trace, TraceTask
from verifiers.v1.types import (
    AssistantMessage,
    Message,
    Response,
    SamplingMask,
    SystemMessage,
    ToolCall,
    ToolMessage,
    TurnTokens,
    UserMessage,
)

from payloadrun import (
    PAYLOAD_DIR_ARG,
    ROUTED_EXPERTS,
    SAMPLING_MASK,
    Env,
    Node,
    PayloadReader,
    Segment,
    TracePayload,
    choice_segments,
    payload_dir,
)
from payloadrun.codec import decode_routed_experts

# --- the adapter ---------------------------------------------------------------------------------


def node_of(trace: Trace, node_id: int) -> Node:
    """What payloadrun's trace algebra needs of one of verifiers' message nodes."""
    node = trace.nodes[node_id]
    return Node(node_id, len(node.token_ids), node.sampled, sum(node.mask))


def path_to(trace: Trace, node_id: int | None) -> list[int]:
    """The node ids from the root down to ``node_id`` (empty for None)."""
    path: list[int] = []
    while node_id is not None:
        path.append(node_id)
        node_id = trace.nodes[node_id].parent
    return path[::-1]


class ByHandleTrace:
    """A verifiers trace whose turns carry payload segments instead of inline arrays."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.payload = TracePayload()  # node segments (append-only) and every turn's file

    def commit(self, turn: graph.PendingTurn, response: Response, segments: Sequence[Segment]):
        """verifiers commits the turn (its graph decides the nodes); the segments follow them."""
        before = len(self.trace.nodes)
        answer = turn.commit(response)  # raises ValueError on a bridged turn that was re-rendered
        new = [node_of(self.trace, i) for i in range(before, len(self.trace.nodes))]
        prefix = [node_of(self.trace, i) for i in path_to(self.trace, new[0].id)[:-1]]
        bridged = response.tokens is not None and response.tokens.bridged
        self.payload.commit(
            prefix, new, segments, bridged_on=turn.prefix_node_ids if bridged else None
        )
        return answer

    def branches(self) -> list[tuple[Branch, list[Segment]]]:
        """Each of verifiers' branches with its segments at branch positions."""
        paths = [path_to(self.trace, leaf) for leaf in graph.leaves(self.trace)]
        return [
            (branch, self.payload.branch([node_of(self.trace, i) for i in path]))
            for branch, path in zip(self.trace.branches, paths, strict=True)
        ]


def inline_arrays(answer: dict, prompt_len: int) -> dict:
    """verifiers' inline path, the baseline: a vLLM answer's routed experts and sampling mask as
    ``TurnTokens`` holds them, built as verifiers' train client builds them
    (``response_from_generate``; pass them to ``TurnTokens.model_construct``, which keeps the
    routing's dtype where validating through its ``RoutedExperts`` type drops it). The rows
    begin where the answer's routing does (``routed_experts_prompt_start``) and end at the
    last token but one."""
    rows, _ = decode_routed_experts(answer[ROUTED_EXPERTS])
    total = prompt_len + len(answer["token_ids"])
    mask = answer.get(SAMPLING_MASK)
    return {
        ROUTED_EXPERTS: {
            "data": base64.b64encode(rows.tobytes()).decode(),
            "shape": list(rows.shape),
            "start": total - 1 - len(rows),
            "dtype": str(rows.dtype),
        },
        SAMPLING_MASK: SamplingMask.from_sampling_mask(mask) if mask else None,
    }


# --- one agentic rollout -------------------------------------------------------------------------

GENERATION_PROMPT = [151_644]  # "<|im_start|>assistant\n", the answer's leading scaffold


def render(message: Message) -> list[int]:
    """A stand-in tokenizer: a few ids a message, always the same for the same message."""
    text = json.dumps(message.model_dump(mode="json"), sort_keys=True).encode()
    return [zlib.crc32(text + bytes([i])) % 150_000 for i in range(2 + len(text) % 3)]


def generate(prompt_ids: list[int], start: int) -> tuple[list[int], list[Segment]]:
    """One tokens-in generate request through the writer, the payloads by handle: the answer's
    completion ids and segments."""
    url = os.environ[Env.INFERENCE_URL].rstrip("/") + "/inference/v1/generate"
    directory = payload_dir(os.environ[Env.PAYLOAD_ROOT], 0)  # policy v0
    params = {
        "max_tokens": 8,
        "temperature": 1.0,
        "top_k": 20,
        "routed_experts_prompt_start": start,  # the bridged turn's first forwarded token
        "extra_args": {PAYLOAD_DIR_ARG: directory},
    }
    body = json.dumps({"model": "policy", "token_ids": prompt_ids, "sampling_params": params})
    request = urllib.request.Request(url, body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        choice = json.loads(answer.read())["choices"][0]
    segments = choice_segments(choice)
    if segments is None:
        raise RuntimeError("the writer answered inline: is the run by handle?")
    return choice["token_ids"], segments


def ask(
    rollout: ByHandleTrace,
    prompt: list[Message],
    answer: AssistantMessage,
    bridge: bool,
    generate=generate,
):
    """One turn: render (bridged on the stored prefix, or whole), generate, commit."""
    turn = graph.prepare_turn(rollout.trace, prompt)
    bridged = bridge and turn.previous_renderer_token_ids() is not None
    if bridged:  # verifiers' renderer bridge: the stored tokens, then the new messages
        prompt_ids = [t for i in turn.prefix_node_ids for t in rollout.trace.nodes[i].token_ids]
        tail = prompt[len(turn.prefix_node_ids) :]
    else:
        prompt_ids, tail = [], prompt
    spans: list[tuple[int, int] | None] = [None] * (len(prompt) - len(tail))
    for message in tail:
        ids = render(message)
        spans.append((len(prompt_ids), len(prompt_ids) + len(ids)))
        prompt_ids += ids
    prompt_ids += GENERATION_PROMPT
    start = max(turn.path_len - 1, 0) if bridged else 0  # routed_experts_prompt_start
    completion, segments = generate(prompt_ids, start)
    tokens = TurnTokens(prompt_ids=prompt_ids, completion_ids=completion, message_spans=spans,
                        bridged=bridged)  # fmt: skip
    response = Response(id="", created=0, model="policy", message=answer, finish_reason="stop",
                        tokens=tokens)  # fmt: skip
    return rollout.commit(turn, response, segments)


def agentic_rollout(generate=generate, rollout: ByHandleTrace | None = None) -> ByHandleTrace:
    """Three turns: a question, a tool call and its result (bridged), a fork off the system.
    ``generate`` sends a turn (this module's: to the writer at $PAYLOADRUN_INFERENCE_URL)."""
    if rollout is None:
        rollout = ByHandleTrace(Trace(task=TraceTask(type="example", data={}),
                                      agent=AgentInfo(config=AgentConfig())))  # fmt: skip
    system = SystemMessage(content="You can call get_weather(city).")
    question = UserMessage(content="Is it raining in Paris?")
    call = AssistantMessage(tool_calls=[ToolCall(id="call_0", name="get_weather",
                                                 arguments='{"city": "Paris"}')])  # fmt: skip
    result = ToolMessage(tool_call_id="call_0", content='{"rain": true}')
    ask(rollout, [system, question], call, False, generate)
    ask(rollout, [system, question, call, result], AssistantMessage(content="Yes."), True, generate)
    other = UserMessage(content="And in Rome?")
    ask(rollout, [system, other], AssistantMessage(content="Let me check."), False, generate)
    return rollout


def main() -> int:
    rollout = agentic_rollout()
    reader = PayloadReader(os.environ[Env.PAYLOAD_ROOT])  # the trainer's read
    for branch, segments in rollout.branches():
        total = len(branch.token_ids)
        routing = reader.read(segments, ROUTED_EXPERTS, 0, total)
        mask = reader.read(segments, SAMPLING_MASK, 0, total)
        trainable = int(np.count_nonzero(branch.sampled_mask))
        print(
            f"branch {branch.index}: {total} tokens ({trainable} sampled), routing "
            f"{list(routing.shape)} {routing.dtype}, sampling mask {list(mask.shape)}"
        )
    print(f"{len(rollout.payload.files)} files for record_batch: {rollout.payload.files}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
