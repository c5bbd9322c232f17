"""Multi-turn rollouts inline and by handle: bytes on the wire, the orchestrator's memory, and
what the trace algebra costs a turn.

An agentic rollout of ``--turns`` turns (8): an ``--prompt-tokens`` prompt (8,192: a system
message and a task), then each turn a ``--new-tokens`` tool result (512) and a
``--completion-tokens`` answer (256), so the prefix grows past 8k tokens; routing of 48 layers x
top-8 of 128 experts (Qwen3-30B-A3B, 384 B a token, as the other benchmarks) and sampling masks
of up to 20 ids a token, from the fake vLLM (``--layers``, ``--top-k``, ``--mask-width``) behind a
real ``payloadrun writer`` process. Both ways build the same trace in verifiers' own graph
(verifiers 0.4.0, the ``verifiers`` extra): inline, each turn's arrays go into ``TurnTokens`` and
verifiers slices them onto its nodes; by handle, the turn carries segments and
``payloadrun.TracePayload`` attributes them (``examples/verifiers_traces.py``'s adapter). Each
way twice: bridged turns (``routed_experts_prompt_start`` at the prefix's final token, verifiers'
renderer bridge) and unbridged ones (every turn re-forwards its whole prompt).

Per trace, in the same run:

- **wire**: the answers' bytes, inline against by handle (the writer's segments);
- **memory**: what the orchestrator holds once the trace is built (``tracemalloc``): of the
  payloads (inline the nodes' arrays, by handle what payloadrun's segment and trace modules
  hold), of the whole trace (its token ids and messages too, the same both ways), and its peak
  while building it (the answers decoded);
- **algebra**: ``TracePayload.commit`` a turn and ``branch_segments`` a branch, against the
  turn's request through the writer (its round trip): the share of a turn the algebra adds.

Goals: by handle at least 20x fewer bytes on the wire and 20x less payload memory held than
inline (unbridged turns; bridged turns carry less inline and are printed too), and the algebra
at most 1% of a turn's request. Bounded: ``--traces`` traces a way (3), loopback only; about a
minute.

    python bench/multiturn.py
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path

import report
from payloadrun.paths import payload_dir
from payloadrun.segments import PAYLOAD_DIR_ARG, choice_segments
from payloadrun.testing import processes

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "verifiers_traces.py"
GENERATE = "/inference/v1/generate"


def adapter():
    if importlib.util.find_spec("verifiers") is None:
        sys.exit("multiturn: needs verifiers (pip install -e '.[verifiers]'; make venv has it)")
    spec = importlib.util.spec_from_file_location("verifiers_traces", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def post(url: str, body: dict, salt: int) -> tuple[dict, int, float]:
    request = urllib.request.Request(
        url + GENERATE,
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "x-fake-salt": str(salt)},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as answer:
        raw = answer.read()
    seconds = time.perf_counter() - started
    return json.loads(raw), len(raw), seconds


class Trace:
    """One rollout built turn by turn in verifiers' graph, inline or by handle."""

    def __init__(self, vf, args, front: str, root: Path, by_handle: bool, bridged: bool, salt):
        from verifiers.v1.trace import AgentConfig, AgentInfo, TraceTask
        from verifiers.v1.trace import Trace as VerifiersTrace

        self.vf, self.args, self.front, self.root = vf, args, front, root
        self.by_handle, self.bridged, self.salt = by_handle, bridged, salt
        trace = VerifiersTrace(task=TraceTask(type="bench", data={}),
                               agent=AgentInfo(config=AgentConfig()))  # fmt: skip
        self.rollout = vf.ByHandleTrace(trace)
        self.wire = 0
        self.request_seconds: list[float] = []
        self.turns: list[tuple[int, list]] = []  # by handle: nodes before the turn, its segments

    def tokens(self, n: int, key: int) -> list[int]:
        return [(key * 7919 + i * 31) % 150_000 for i in range(n)]

    def turn(self, index: int, prompt: list, answer) -> None:
        from verifiers.v1 import graph
        from verifiers.v1.types import Response, TurnTokens

        trace = self.rollout.trace
        turn = graph.prepare_turn(trace, prompt)
        bridged = self.bridged and turn.previous_renderer_token_ids() is not None
        prompt_ids = [t for i in turn.prefix_node_ids for t in trace.nodes[i].token_ids]
        spans: list[tuple[int, int] | None] = [None] * len(turn.prefix_node_ids)
        for n in range(len(prompt) - len(turn.prefix_node_ids)):
            size = self.args.prompt_tokens // 2 if index == 0 else self.args.new_tokens
            ids = self.tokens(size, self.salt * 100 + index * 10 + n)
            spans.append((len(prompt_ids), len(prompt_ids) + len(ids)))
            prompt_ids += ids
        prompt_ids += self.vf.GENERATION_PROMPT
        params = {
            "max_tokens": self.args.completion_tokens,
            "temperature": 1.0,
            "top_k": 20,
            "routed_experts_prompt_start": max(turn.path_len - 1, 0) if bridged else 0,
        }
        if self.by_handle:
            params["extra_args"] = {PAYLOAD_DIR_ARG: payload_dir(self.root, 0)}
        body = {"model": "bench", "token_ids": prompt_ids, "sampling_params": params}
        reply, size, seconds = post(self.front, body, self.salt * 100 + index)
        self.wire += size
        self.request_seconds.append(seconds)
        choice = reply["choices"][0]
        extra = {} if self.by_handle else self.vf.inline_arrays(choice, len(prompt_ids))
        tokens = TurnTokens.model_construct(
            prompt_ids=prompt_ids, completion_ids=choice["token_ids"], completion_logprobs=[],
            message_spans=spans, bridged=bridged, **extra,
        )  # fmt: skip
        response = Response(id=str(index), created=0, model="bench", message=answer,
                            finish_reason="length", tokens=tokens)  # fmt: skip
        segments = choice_segments(choice) or []
        del reply, choice, extra
        if self.by_handle:
            before = len(self.rollout.trace.nodes)
            self.rollout.commit(turn, response, segments)
            self.turns.append((before, segments))
        else:
            turn.commit(response)

    def algebra_seconds(self) -> list[float]:
        """``attribute_turn`` of each turn again, on what the adapter gave it (median of 5)."""
        from payloadrun.traces import attribute_turn

        trace, vf, out = self.rollout.trace, self.vf, []
        for index, (before, segments) in enumerate(self.turns):
            end = self.turns[index + 1][0] if index + 1 < len(self.turns) else len(trace.nodes)
            new = [vf.node_of(trace, i) for i in range(before, end)]
            prefix = [vf.node_of(trace, i) for i in vf.path_to(trace, new[0].id)[:-1]]
            runs = []
            for _ in range(5):
                started = time.perf_counter()
                attribute_turn(prefix, new, segments)
                runs.append(time.perf_counter() - started)
            out.append(statistics.median(runs))
        return out

    def payload_bytes(self, snapshot: tracemalloc.Snapshot | None) -> int:
        """What the trace holds of the payloads: inline, its nodes' arrays; by handle, what
        payloadrun's segment and trace modules allocated and still hold."""
        if not self.by_handle:
            nodes = self.rollout.trace.nodes
            routing = sum(n.routed_experts.nbytes for n in nodes if n.routed_experts is not None)
            masks = sum(
                n.sampling_mask.ids.nbytes + n.sampling_mask.counts.nbytes
                for n in nodes
                if n.sampling_mask is not None
            )
            return routing + masks
        mine = snapshot.filter_traces(
            [
                tracemalloc.Filter(True, "*payloadrun/segments.py"),
                tracemalloc.Filter(True, "*payloadrun/traces.py"),
            ]
        )
        return sum(stat.size for stat in mine.statistics("filename"))

    def play(self) -> None:
        from verifiers.v1.types import AssistantMessage, SystemMessage, ToolMessage, UserMessage

        prompt = [
            SystemMessage(content="tools: run(cmd)"),
            UserMessage(content=f"task {self.salt}"),
        ]
        for index in range(self.args.turns):
            answer = AssistantMessage(content=f"step {index} of {self.salt}")
            self.turn(index, prompt, answer)
            prompt = [
                *prompt,
                answer,
                ToolMessage(tool_call_id=f"c{index}", content=f"out {index}"),
            ]


def build(vf, args, front, root, by_handle: bool, bridged: bool, salt: int) -> dict:
    """One trace built twice with the same answers: once timed, once under tracemalloc (which
    slows what it watches) for what the orchestrator holds."""
    timed = Trace(vf, args, front, root, by_handle, bridged, salt)
    timed.play()
    algebra = timed.algebra_seconds() if by_handle else [0.0]
    branch_seconds = []
    trace = timed.rollout.trace
    paths = [
        [vf.node_of(trace, i) for i in vf.path_to(trace, leaf)]
        for leaf in (vf.graph.leaves(trace) if by_handle else [])
    ]
    for _ in range(5):
        for path in paths:
            started = time.perf_counter()
            timed.rollout.payload.branch(path)
            branch_seconds.append(time.perf_counter() - started)
    del timed.rollout
    gc.collect()
    tracemalloc.start()
    watched = Trace(vf, args, front, root, by_handle, bridged, salt)
    watched.play()
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    snapshot = tracemalloc.take_snapshot() if by_handle else None
    tracemalloc.stop()
    return {
        "wire": timed.wire,
        "held": held,
        "peak": peak,
        "payload": watched.payload_bytes(snapshot),
        "request_ms": statistics.median(timed.request_seconds) * 1e3,
        "algebra_us": statistics.median(algebra) * 1e6,
        "branches_us": statistics.median(branch_seconds) * 1e6 if branch_seconds else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--completion-tokens", type=int, default=256)
    p.add_argument("--traces", type=int, default=3, help="traces a way (the medians are printed)")
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--mask-width", type=int, default=20)
    args = p.parse_args(argv)
    vf = adapter()
    report.print_load("start")
    model = ("--layers", str(args.layers), "--top-k", str(args.top_k), "--experts", "128",
             "--mask-width", str(args.mask_width))  # fmt: skip
    results: dict[tuple[bool, bool], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="payloadrun-multiturn-") as tmp:
        root = Path(tmp) / "payloads"
        root.mkdir()
        with processes.fake_vllm(*model) as vllm, processes.writer(vllm.url, root) as front:
            for n in range(args.traces):
                for bridged in (False, True):
                    for by_handle in (False, True):  # the same salts: the same answers
                        run = build(vf, args, front.url, root, by_handle, bridged, 1 + n)
                        results.setdefault((bridged, by_handle), []).append(run)
    med = {
        key: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for key, runs in results.items()
    }
    print(
        f"\nper trace of {args.turns} turns ({args.prompt_tokens}-token prompt, "
        f"+{args.new_tokens} a turn, {args.completion_tokens}-token answers), "
        f"medians of {args.traces}:"
    )
    head = (f"{'turns':<11}{'way':<11}{'wire MB':>9}{'held MB':>9}{'payload MB':>11}"
            f"{'peak MB':>9}{'request ms':>12}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for (bridged, by_handle), m in sorted(med.items()):
        way = "by handle" if by_handle else "inline"
        print(f"{'bridged' if bridged else 'unbridged':<11}{way:<11}"
              f"{m['wire'] / 1e6:>9.2f}{m['held'] / 1e6:>9.2f}{m['payload'] / 1e6:>11.3f}"
              f"{m['peak'] / 1e6:>9.2f}"
              f"{m['request_ms']:>12.1f}")  # fmt: skip
    goals = []
    for bridged in (False, True):
        inline, handle = med[bridged, False], med[bridged, True]
        label = "bridged" if bridged else "unbridged"
        wire, held = inline["wire"] / handle["wire"], inline["held"] / handle["held"]
        payload, peak = inline["payload"] / handle["payload"], inline["peak"] / handle["peak"]
        if bridged:
            goals.append(report.Goal.figure(f"{label}: wire, inline / by handle", wire))
            goals.append(report.Goal.figure(f"{label}: payloads held, inline / by handle", payload))
        else:
            goals.append(report.Goal.at_least(f"{label}: wire, inline / by handle", wire, 20))
            goals.append(report.Goal.at_least(f"{label}: payloads held, inline / by handle",
                                              payload, 20))  # fmt: skip
        goals.append(report.Goal.figure(f"{label}: whole trace held, inline / by handle", held))
        goals.append(report.Goal.figure(f"{label}: peak memory, inline / by handle", peak))
        share = handle["algebra_us"] / (handle["request_ms"] * 1e3)
        goals.append(report.Goal.at_most(f"{label}: algebra a turn / its request", share, 0.01))
        print(
            f"{label}: attribute_turn {handle['algebra_us']:.0f} us a turn, branch_segments "
            f"{handle['branches_us']:.0f} us a branch, a request {handle['request_ms']:.1f} ms"
        )
    report.print_goals(goals, "{:.4g}".format)
    report.print_load("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
