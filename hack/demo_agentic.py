"""``make demo``'s agentic rollout: three turns by handle through the run's writer, in its pods.

The conversation is ``examples/verifiers_traces.py``'s (a question, a tool call and its result on
a bridged turn, a second question forked off the system prompt), built in verifiers' own graph by
this host process; each turn goes out from the orchestrator pod (``kubectl exec``) to the
inference Service: once by handle (the writer stores the arrays on the run's volume and answers
with segments) and once inline, with the same salt (the fake vLLM's ``x-fake-salt``: the same
answer). The trainer pod reads every branch back from its read-only mount
(``payloadrun.PayloadReader``) and prints digests of the rows; this host rebuilds the same turns
with the inline answers in verifiers' inline path (``TurnTokens.routed_experts`` and
``sampling_mask``) and compares each branch's ``Branch.routed_experts`` and
``Branch.sampling_mask`` with what the trainer read. Then the rollout's files are recorded and
consumed (``record_batch`` / ``policy_updated`` from the orchestrator pod).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "verifiers_traces.py"

# In the orchestrator pod: send each request to the inference Service, by handle or not.
POST = """
import json, os, sys, urllib.request
from payloadrun import PAYLOAD_DIR_ARG, Env, payload_dir
url = os.environ[Env.INFERENCE_URL].rstrip("/") + "/inference/v1/generate"
answers = []
for request in json.loads(sys.argv[1]):
    body = request["body"]
    if request["by_handle"]:
        directory = payload_dir(os.environ[Env.PAYLOAD_ROOT], 0)
        body["sampling_params"]["extra_args"] = {PAYLOAD_DIR_ARG: directory}
    headers = {"Content-Type": "application/json", "x-fake-salt": str(request["salt"]),
               "X-Session-ID": "demo-rollout"}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=120) as response:
        answers.append(json.loads(response.read())["choices"][0])
print(json.dumps(answers))
"""
# In the trainer pod: every branch's rows, read from the run's volume, as digests.
READ_BRANCHES = """
import hashlib, json, os, sys
from payloadrun import ROUTED_EXPERTS, SAMPLING_MASK, Env, PayloadReader, segments_from_json
from payloadrun.codec import csr_from_mask_rows
digest = lambda a: [str(a.dtype), list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()[:16]]
out = []
with PayloadReader(os.environ[Env.PAYLOAD_ROOT]) as reader:
    for branch in json.loads(sys.argv[1]):
        segments = segments_from_json(branch["segments"])
        fields, read = {s.field for s in segments}, {}
        if ROUTED_EXPERTS in fields:
            read["routing"] = digest(reader.read(segments, ROUTED_EXPERTS, 0, branch["total"]))
        if SAMPLING_MASK in fields:
            rows = reader.read(segments, SAMPLING_MASK, 0, branch["total"])
            read["mask"] = [digest(a) for a in csr_from_mask_rows(rows)]
        out.append(read)
print(json.dumps(out))
"""
CONSUME = """
import json, sys
from payloadrun import RetentionClient
client = RetentionClient()
client.record_batch(2, json.loads(sys.argv[1]))
client.policy_updated(2)
"""


def digest(array: Any) -> list:
    return [str(array.dtype), list(array.shape), hashlib.sha256(array.tobytes()).hexdigest()[:16]]


def load_example() -> Any | None:
    """The example's module, or None when verifiers is not installed in this environment."""
    if importlib.util.find_spec("verifiers") is None:
        return None
    spec = importlib.util.spec_from_file_location("verifiers_traces", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run(in_pod: Callable[..., str], say: Callable[[str], None]) -> None:
    """The rollout through the pods, the trainer's reads, verifiers' inline branches compared."""
    vf = load_example()
    if vf is None:
        say("  (verifiers is not installed in this environment: pip install -e '.[verifiers]')")
        return
    from verifiers.v1 import graph
    from verifiers.v1.trace import AgentConfig, AgentInfo, Trace, TraceTask
    from verifiers.v1.types import TurnTokens

    from payloadrun import segments_from_json, segments_to_json

    turns: list[tuple[Any, Any]] = []  # each turn's prompt and response, as committed

    class Recording(vf.ByHandleTrace):
        def commit(self, turn, response, segments):
            turns.append((turn.prompt, response))
            return super().commit(turn, response, segments)

    inline_answers: list[dict] = []

    def generate(prompt_ids: list[int], start: int):
        body = {"model": "policy", "token_ids": prompt_ids,
                "sampling_params": {"max_tokens": 8, "temperature": 1.0, "top_k": 20,
                                    "routed_experts_prompt_start": start}}  # fmt: skip
        salt = len(inline_answers) + 1
        requests = [{"body": body, "by_handle": True, "salt": salt},
                    {"body": body, "by_handle": False, "salt": salt}]  # fmt: skip
        by_handle, inline = json.loads(in_pod("orchestrator", POST, json.dumps(requests)))
        inline_answers.append(inline)
        if by_handle.get("payload") is None:
            raise RuntimeError("the writer answered inline: is the run by handle?")
        return by_handle["token_ids"], segments_from_json(by_handle["payload"])

    trace = Trace(task=TraceTask(type="demo", data={}), agent=AgentInfo(config=AgentConfig()))
    rollout = vf.agentic_rollout(generate, Recording(trace))
    branches = rollout.branches()
    say(f"  3 turns by handle: {len(trace.nodes)} message nodes, {len(branches)} branches, "
        f"{len(rollout.payload.files)} files (one a turn)")  # fmt: skip
    wanted = [{"total": len(b.token_ids), "segments": segments_to_json(s)} for b, s in branches]
    read = json.loads(in_pod("trainer", READ_BRANCHES, json.dumps(wanted)))

    # verifiers' inline path, from the same turns with the arrays the engine sent inline
    inline = Trace(task=TraceTask(type="demo", data={}), agent=AgentInfo(config=AgentConfig()))
    for (prompt, response), answer in zip(turns, inline_answers, strict=True):
        tokens = response.tokens
        arrays = TurnTokens.model_construct(
            **{k: getattr(tokens, k) for k in ("prompt_ids", "completion_ids", "bridged")},
            completion_logprobs=[],
            message_spans=tokens.message_spans,
            **vf.inline_arrays(answer, len(tokens.prompt_ids)),
        )
        graph.prepare_turn(inline, prompt).commit(response.model_copy(update={"tokens": arrays}))
    mismatched = 0
    for (branch, _), got, expected in zip(branches, read, inline.branches, strict=True):
        want: dict[str, Any] = {}
        if expected.routed_experts is not None:
            want["routing"] = digest(expected.routed_experts)
        if expected.sampling_mask is not None:
            mask = expected.sampling_mask
            want["mask"] = [digest(mask.ids), digest(mask.counts)]
        same = got == want and [n.token_ids for n in branch.nodes] == [
            n.token_ids for n in expected.nodes
        ]
        mismatched += not same
        routing = got.get("routing")
        say(f"  branch {branch.index}: {len(branch.token_ids)} tokens, trainer pod read routing "
            f"{routing[1] if routing else None} {routing[0] if routing else ''} and the sampling "
            f"mask: {'equal to' if same else 'NOT equal to'} verifiers' inline branch")  # fmt: skip
    if mismatched:
        raise RuntimeError(f"{mismatched} branch(es) read by handle differ from verifiers' inline")
    in_pod("orchestrator", CONSUME, json.dumps(rollout.payload.files))
    say(f"  the rollout's {len(rollout.payload.files)} files recorded as batch 2 and consumed")
