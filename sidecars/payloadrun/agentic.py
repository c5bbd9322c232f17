"""Simulated agentic rollouts: a conversation tree grown turn by turn, for the simulator, the
benchmarks and the demo.

A rollout's first turn is its prompt (a system message and a task, ``prompt_tokens``) and the
model's answer. Each later turn adds one message (a tool result or a user's reply,
``new_tokens``) and the next answer: after the latest answer, or, with ``fork_rate``, after an
earlier node of the tree (a retry, a subagent, a compaction: a fork, whose branch reuses only the
prefix up to that node). A turn that extends an answer is bridged with ``bridge_rate`` (its
request asks routing from the prefix's final token on, ``routed_experts_prompt_start``, as
verifiers' renderer bridge does); any other turn re-forwards its whole prompt. Every answer's node
holds one token of scaffold (the generation prompt, the prompt's last token) and the completion.

:class:`Rollout` makes each turn's request (:meth:`Rollout.next_turn`) and, once answered,
attributes the answer's segments to the tree's nodes (:meth:`Rollout.commit`, through
:class:`~payloadrun.traces.TracePayload`); its branches (root to leaf) are the training samples.
Nothing here does I/O: the caller sends the request, to a writer or to files of its own.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from payloadrun.segments import Segment
from payloadrun.traces import Node, NodeSegment, TracePayload

VOCAB = 150_000  # token ids drawn below this (Qwen3's vocabulary is about 151,000)
SCAFFOLD = 151_644  # the generation prompt's token ("<|im_start|>assistant\n" in one id)


@dataclass(frozen=True)
class Shape:
    """How a simulated rollout grows: the distribution its turns are drawn from."""

    prompt_tokens: int = 64  # the first turn's prompt (system message and task)
    new_tokens: int = 32  # each later turn's new message (a tool result, a user's reply)
    completion_tokens: int = 16  # each answer's sampled tokens
    max_turns: int = 8  # turns per rollout: uniform from 1 to max_turns (mean 4.5 by default)
    fork_rate: float = 0.2  # a later turn extends an earlier node instead of the latest answer
    bridge_rate: float = 0.5  # a turn that extends an answer asks routing from its final token

    def __post_init__(self) -> None:
        if min(self.prompt_tokens, self.new_tokens, self.completion_tokens, self.max_turns) < 1:
            raise ValueError(
                "prompt, new and completion tokens and turns must be >= 1, got "
                f"{self.prompt_tokens}, {self.new_tokens}, {self.completion_tokens}, "
                f"{self.max_turns}"
            )
        for name in ("fork_rate", "bridge_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    def turns(self, rng: random.Random) -> int:
        return rng.randint(1, self.max_turns)

    @property
    def mean_turns(self) -> float:
        return (1 + self.max_turns) / 2


@dataclass(frozen=True)
class Turn:
    """One turn's request: its prompt, where its routing starts, and the nodes it extends and
    creates (the answer's node is made by :meth:`Rollout.commit`, which knows the completion)."""

    prompt_ids: list[int]
    prompt_start: int  # routed_experts_prompt_start: the prefix's final token when bridged, else 0
    prefix: tuple[Node, ...]
    message: Node  # the turn's new message
    bridged_on: tuple[int, ...] | None


@dataclass
class Rollout:
    """A conversation tree and its payload handles (:class:`~payloadrun.traces.TracePayload`)."""

    shape: Shape
    rng: random.Random
    nodes: list[Node] = field(default_factory=list)  # node i has id i
    parents: list[int | None] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    payload: TracePayload = field(default_factory=TracePayload)

    def _path(self, node: int | None) -> list[int]:
        path = []
        while node is not None:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def _add(self, node: Node, parent: int | None, tokens: list[int]) -> Node:
        self.nodes.append(node)
        self.parents.append(parent)
        self.tokens.append(tokens)
        return node

    def next_turn(self) -> Turn:
        """The next turn's request, on the latest answer or (``fork_rate``) an earlier node."""
        shape, rng = self.shape, self.rng
        answers = [n.id for n in self.nodes if n.sampled]
        if not answers:
            base, size = None, shape.prompt_tokens
        elif rng.random() < shape.fork_rate:
            base, size = rng.randrange(len(self.nodes)), shape.new_tokens
        else:
            base, size = answers[-1], shape.new_tokens
        prefix = tuple(self.nodes[i] for i in self._path(base))
        bridged = bool(prefix) and prefix[-1].sampled and rng.random() < shape.bridge_rate
        message = self._add(Node(len(self.nodes), size), base, _ids(rng, size))
        path_ids = [t for node in prefix for t in self.tokens[node.id]]
        k = len(path_ids)
        return Turn(
            prompt_ids=[*path_ids, *self.tokens[message.id], SCAFFOLD],
            prompt_start=k - 1 if bridged else 0,
            prefix=prefix,
            message=message,
            bridged_on=tuple(n.id for n in prefix) if bridged else None,
        )

    def commit(
        self, turn: Turn, completion_ids: Sequence[int], segments: Sequence[Segment]
    ) -> list[NodeSegment]:
        """The turn's answer: its node, and the answer's segments attributed to the tree."""
        answer = Node(len(self.nodes), 1 + len(completion_ids), True, len(completion_ids))
        self._add(answer, turn.message.id, [SCAFFOLD, *completion_ids])
        return self.payload.commit(
            turn.prefix, [turn.message, answer], segments, bridged_on=turn.bridged_on
        )

    def branches(self) -> list[list[Node]]:
        """Every root-to-leaf path: one training sample each."""
        parents = set(self.parents)
        leaves = [n.id for n in self.nodes if n.id not in parents]
        return [[self.nodes[i] for i in self._path(leaf)] for leaf in leaves]

    def branch_segments(self) -> list[list[Segment]]:
        return [self.payload.branch(path) for path in self.branches()]

    @property
    def files(self) -> list[str]:
        """Every file the rollout's turns wrote: what ``record_batch`` or ``discard`` takes."""
        return self.payload.files


_VOCABULARY = range(VOCAB)


def _ids(rng: random.Random, count: int) -> list[int]:
    return rng.choices(_VOCABULARY, k=count)


def completion(rng: random.Random, shape: Shape) -> list[int]:
    """A simulated answer's token ids."""
    return _ids(rng, shape.completion_tokens)
