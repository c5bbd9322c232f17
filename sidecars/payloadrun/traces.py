"""Multi-turn rollouts by handle: a trace's payload segments, message node by message node.

An agentic rollout talks to the model for several turns, and each turn's request re-sends the
conversation so far. Frameworks such as verifiers (``verifiers.v1``) keep the rollout as a *trace*:
a tree of message nodes, each holding the tokens it adds to the conversation, whose root-to-leaf
paths (*branches*) become training samples. With router replay each token of a branch needs its
routing row, and each sampled token its sampling mask. Inline, verifiers slices every turn's arrays
onto the nodes that turn created; by handle, this module does the same to the turn's segments,
without moving a byte, and equal to verifiers 0.4.0's inline path bit for bit
(``tests/dataplane/test_traces_oracle.py`` holds it there, with verifiers itself as the oracle).

A turn (:func:`attribute_turn`) reuses a prefix of existing nodes (``k`` tokens) and creates new
ones, the last of them the answer. Its answer's segments have request-absolute positions; the
engine's routing covers ``[s, T - 1)`` (``T`` the prompt and completion tokens, ``s`` the
request's ``routed_experts_prompt_start``: ``k - 1`` on a bridged turn, else 0). Then:

- rows below ``k - 1`` are re-forwarded prefix positions and are dropped: a reused node keeps the
  rows of the turn that created it;
- the row at ``k - 1`` is the first real row of the prefix's final token. When the last
  token-bearing prefix node was sampled (an earlier answer, whose final token no forward pass had
  covered), it becomes a one-row segment for that node that *supersedes* the node's last row (the
  latest turn wins); after a user, tool, system or prompt-supplied node it is dropped;
- each new node gets the rows of its own positions, node-local (``pos`` 0 is its first token),
  when the rows cover it whole; the answer's final token, never forwarded, gets the
  :meth:`~payloadrun.segments.Segment.final_token` placeholder until a later turn supersedes it. A
  node the rows do not cover whole gets none, and no branch through it has routing;
- the sampling mask goes on the answer's node, when its rows are the node's completion tokens.

Nothing is ever rewritten: a turn's result is new :class:`NodeSegment` entries to append (a delta
stream, as verifiers streams its traces), and :func:`branch_segments` resolves superseded rows
(newest wins) when it rebases a branch's segments to branch positions, so that
:class:`~payloadrun.reader.PayloadReader` reads them with no overlap. Handles expire with their
files: keep them in the live trace, never in a trace record written to disk.

:class:`TracePayload` is the same for one rollout as a small accumulator: its node segments, and
every file any turn wrote (:attr:`TracePayload.files`), for ``record_batch`` or ``discard``.
Plain data in and out: node ids are the caller's (verifiers' node indices), and a framework
adapter is a few lines (``examples/verifiers_traces.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from payloadrun.segments import ROUTED_EXPERTS, Segment, SegmentError, files_of

NodeId = Hashable


class TraceError(ValueError):
    """A turn or a branch that does not add up: what was wrong, with the values."""


@dataclass(frozen=True, slots=True)
class Node:
    """What the algebra needs of one message node of a trace.

    ``tokens`` is how many tokens the node adds to the conversation (``len(node.token_ids)`` in
    verifiers), ``sampled`` whether a model call produced it, and ``completion`` how many of its
    tokens, at its end, the model sampled (``sum(node.mask)``: the answer's completion; 0 for any
    other node).
    """

    id: NodeId
    tokens: int
    sampled: bool = False
    completion: int = 0

    def __post_init__(self) -> None:
        if type(self.tokens) is not int or self.tokens < 0:
            raise TraceError(
                f"node {self.id!r}: tokens must be an integer >= 0, got {self.tokens!r}"
            )
        if type(self.completion) is not int or not 0 <= self.completion <= self.tokens:
            raise TraceError(
                f"node {self.id!r}: completion must be an integer between 0 and its "
                f"{self.tokens} tokens, got {self.completion!r}"
            )


@dataclass(frozen=True, slots=True)
class NodeSegment:
    """A segment attributed to one node, at node-local positions.

    ``supersedes`` marks the one-row segment a later turn forwarded for the node's final token: it
    replaces the row there (a placeholder, or an older such row) when a branch is read.
    """

    node: NodeId
    segment: Segment
    supersedes: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "supersedes": self.supersedes, **self.segment.to_json()}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> NodeSegment:
        if not isinstance(obj, Mapping) or "node" not in obj:
            raise SegmentError(f"a node segment is a JSON object with a 'node', got {obj!r}")
        supersedes = obj.get("supersedes", False)
        if not isinstance(supersedes, bool):
            raise SegmentError(
                f"node segment 'supersedes' must be true or false, got {supersedes!r}"
            )
        seg = {k: v for k, v in obj.items() if k not in ("node", "supersedes")}
        return cls(obj["node"], Segment.from_json(seg), supersedes)


def _span(segments: Sequence[Segment]) -> tuple[int, int] | None:
    """``[start, end)`` when ``segments`` (sorted by ``pos``) tile one run of positions, else
    None."""
    start = end = segments[0].pos
    for seg in segments:
        if seg.pos != end:
            return None
        end = seg.end
    return start, end


def _turn_span(segments: Sequence[Segment]) -> tuple[int, int]:
    span = _span(segments)
    if span is None:
        raise TraceError(
            f"a turn's {segments[0].field} segments do not tile one run of positions "
            f"({[(s.pos, s.end) for s in segments]!r}): pass one answer's segments"
        )
    return span


def _local(segments: Iterable[Segment], lo: int, hi: int) -> list[Segment]:
    """The parts of ``segments`` inside ``[lo, hi)``, moved so that ``lo`` is position 0."""
    return [c.shift(-lo) for s in segments if (c := s.clip(lo, hi)) is not None]


def attribute_turn(
    prefix: Sequence[Node],
    new: Sequence[Node],
    segments: Sequence[Segment],
    *,
    bridged_on: Sequence[NodeId] | None = None,
) -> list[NodeSegment]:
    """The node segments one turn adds to its trace (the module's rules), in a fixed order.

    ``prefix`` is the turn's reused prefix as the framework committed it, root first; ``new`` the
    nodes the turn created, in order, the answer last; ``segments`` the answer's segments
    (request-absolute positions, both fields). ``bridged_on`` is the prefix a bridged turn was
    rendered on (the node ids of the prefix the request extended, whose routing then started at
    its final token): such a turn must keep that prefix whole. A re-rendered prefix node (cut and
    created anew) happens only on an unbridged turn; verifiers raises on a bridged one, and so
    does this.
    """
    if not new or not new[-1].sampled:
        raise TraceError(
            "a turn creates at least its answer's node, last and sampled; got new nodes "
            f"{[n.id for n in new]!r} (sampled: {[n.sampled for n in new]!r})"
        )
    if bridged_on is not None:
        kept = [n.id for n in prefix[: len(bridged_on)]]
        if kept != list(bridged_on):
            raise TraceError(
                f"a bridged turn's prompt must extend its stored prefix {list(bridged_on)!r} "
                f"exactly, but the committed prefix is {[n.id for n in prefix]!r}: a prefix node "
                "was re-rendered, which only an unbridged turn (routed_experts_prompt_start 0) "
                "may do"
            )
    k = sum(n.tokens for n in prefix)
    total = k + sum(n.tokens for n in new)
    routing = sorted((s for s in segments if s.field == ROUTED_EXPERTS and s.rows), key=_pos)
    others = [s for s in segments if s.field != ROUTED_EXPERTS and s.rows]
    for seg in (*routing, *others):
        if seg.end > total:
            raise TraceError(
                f"a {seg.field} segment reaches position {seg.end}, past the turn's {total} "
                f"tokens ({k} of the prefix, {total - k} new): the nodes do not add up to the "
                "request's prompt and completion"
            )
    out: list[NodeSegment] = []
    if routing:
        out += _attribute_routing(prefix, new, routing, k, total)
    if others:
        out += _attribute_completion(new[-1], others, total)
    return out


def _pos(segment: Segment) -> int:
    return segment.pos


def _attribute_routing(
    prefix: Sequence[Node], new: Sequence[Node], routing: list[Segment], k: int, total: int
) -> list[NodeSegment]:
    start, end = _turn_span(routing)
    out: list[NodeSegment] = []
    # The prefix's final token: its first real row, for an earlier answer that ended there.
    last = next((n for n in reversed(prefix) if n.tokens), None)
    if last is not None and last.sampled and start <= k - 1 < end:
        for seg in _local(routing, k - 1, k):
            out.append(NodeSegment(last.id, seg.shift(last.tokens - 1), supersedes=True))
    at = k
    for node in new:
        lo, hi = at, at + node.tokens
        at = hi
        if not node.tokens or lo < start:
            continue
        if hi <= end:
            own = _local(routing, lo, hi)
        elif hi == total and end == total - 1:
            # the final token was never forwarded: the previous row stands in for it
            own = [*_local(routing, lo, end), routing[-1].final_token().shift(-lo)]
        else:
            continue
        out += [NodeSegment(node.id, seg) for seg in own]
    return out


def _attribute_completion(answer: Node, segments: list[Segment], total: int) -> list[NodeSegment]:
    """Completion-aligned fields (the sampling mask) on the answer's node, when they cover its
    completion tokens exactly; as verifiers does, nothing otherwise."""
    out: list[NodeSegment] = []
    first = total - answer.completion
    for name in dict.fromkeys(s.field for s in segments):
        mine = sorted((s for s in segments if s.field == name), key=_pos)
        if _turn_span(mine) != (first, total) or not answer.completion:
            continue
        out += [NodeSegment(answer.id, seg) for seg in _local(mine, total - answer.tokens, total)]
    return out


def branch_segments(path: Sequence[Node], node_segments: Iterable[NodeSegment]) -> list[Segment]:
    """A branch's segments at branch positions (0 is the root's first token), superseded rows
    resolved, for :class:`~payloadrun.reader.PayloadReader` over ``[0, sum of tokens)``.

    ``path`` is the branch's nodes, root to leaf. Routing is all or nothing: when a token-bearing
    node of the path has no rows, the result holds no routing segment at all (verifiers'
    ``Branch.routed_experts`` is None), and likewise no sampling-mask segment when no node of the
    path has a mask. ``node_segments`` may hold the whole trace's; only the path's are used.
    """
    on_path = {n.id for n in path}
    if len(on_path) != len(path):
        raise TraceError(f"a branch visits each node once, got {[n.id for n in path]!r}")
    own: dict[NodeId, list[Segment]] = {}
    final: dict[NodeId, list[Segment]] = {}
    for entry in node_segments:
        if entry.node in on_path:
            (final if entry.supersedes else own).setdefault(entry.node, []).append(entry.segment)
    routing: list[Segment] = []
    completion: list[Segment] = []
    has_routing = any(n.tokens for n in path)
    at = 0
    for node in path:
        segs = own.get(node.id, [])
        completion += [s.shift(at) for s in segs if s.field != ROUTED_EXPERTS]
        if node.tokens and has_routing:
            rows = _node_routing(node, [s for s in segs if s.field == ROUTED_EXPERTS], final)
            if rows is None:
                has_routing = False
            else:
                routing += [s.shift(at) for s in rows]
        at += node.tokens
    return [*routing, *completion] if has_routing else completion


def _node_routing(
    node: Node, own: list[Segment], final: Mapping[NodeId, list[Segment]]
) -> list[Segment] | None:
    """The node's routing rows, node-local, its final row the newest superseding one; None when
    the turn that created it did not cover it."""
    if not own:
        return None
    own = sorted(own, key=_pos)
    if _span(own) != (0, node.tokens):
        raise TraceError(
            f"node {node.id!r} of {node.tokens} tokens holds routing rows over "
            f"{[(s.pos, s.end) for s in own]!r}: the node segments are not this trace's (a node "
            "is attributed rows once, when a turn creates it, and covered whole)"
        )
    shape = own[-1].shape
    newest = next((s for s in reversed(final.get(node.id, ())) if s.shape == shape), None)
    if newest is None:
        return own
    return [*_local(own, 0, node.tokens - 1), newest]


@dataclass
class TracePayload:
    """One rollout's payload handles: the node segments of every turn, in commit order, and
    every file any turn wrote.

    ``files`` is what ``record_batch`` takes when the rollout's branches go into a batch, and
    what ``discard`` takes when no batch will (an abandoned or filtered rollout): every turn's
    file, each once, including a turn whose rows no branch reads (they ran short).
    """

    segments: list[NodeSegment] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def commit(
        self,
        prefix: Sequence[Node],
        new: Sequence[Node],
        segments: Sequence[Segment],
        *,
        bridged_on: Sequence[NodeId] | None = None,
    ) -> list[NodeSegment]:
        """Add one turn (:func:`attribute_turn`); returns the entries appended (the delta)."""
        added = attribute_turn(prefix, new, segments, bridged_on=bridged_on)
        self.segments += added
        self.files += [f for f in files_of(list(segments)) if f not in self.files]
        return added

    def branch(self, path: Sequence[Node]) -> list[Segment]:
        """:func:`branch_segments` of this trace."""
        return branch_segments(path, self.segments)
