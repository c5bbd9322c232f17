"""The multi-turn trace algebra (payloadrun.traces) on hand-made turns, bytes read back for real.

Each turn's rows are written to a real file as the writer lays them out (routing end-anchored at
the last forwarded token, then the mask rows at the prompt's end), and every row is a function of
its turn and its position, so a row re-forwarded by a later turn differs from the one the turn
that created its node wrote: reading a branch back shows which turn each row came from. The three
named cases are the seed's (verifiers' by-handle change, tests/unit/test_graph.py there); the
property test against verifiers itself is tests/writer/test_traces_oracle.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from payloadrun import (
    MASK_PAD,
    ROUTED_EXPERTS,
    SAMPLING_MASK,
    Node,
    NodeSegment,
    PayloadReader,
    Segment,
    TraceError,
    TracePayload,
    attribute_turn,
    branch_segments,
    sample_segments,
)

SHAPE = (2, 3)  # layers, top_k


def row(turn: int, pos: int) -> np.ndarray:
    """Routing row of ``pos`` as turn ``turn`` forwarded it: the turn and position readable."""
    return np.full(SHAPE, turn * 100 + pos, dtype=np.uint16)


class Turns:
    """Writes each turn's file as the writer would and answers with its segments."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "v0"
        self.dir.mkdir(parents=True)
        self.count = 0

    def answer(self, prompt: int, completion: int, start: int = 0, masks: int = 0):
        """Turn ``self.count + 1``: routing rows ``[start, T - 1)`` and, with ``masks`` (the
        widest), one mask row per completion token."""
        self.count += 1
        total = prompt + completion
        routing = np.stack([row(self.count, p) for p in range(start, total - 1)])
        path = self.dir / f"turn{self.count}.bin"
        mask = np.array(
            [[self.count * 1000 + i, MASK_PAD] for i in range(completion)], dtype=np.int32
        )[:, :masks]
        path.write_bytes(routing.tobytes() + (mask.tobytes() if masks else b""))
        segments = [Segment(ROUTED_EXPERTS, str(path), 0, start, len(routing), "uint16", SHAPE)]
        if masks:
            segments.append(
                Segment(
                    SAMPLING_MASK, str(path), routing.nbytes, prompt, completion, "int32", (masks,)
                )
            )
        return segments


def expected(*spans: tuple[int, int, int]) -> np.ndarray:
    """Rows ``(turn, first position, last position + 1)`` stacked, as a branch should read."""
    return np.stack([row(t, p) for t, lo, hi in spans for p in range(lo, hi)])


@pytest.fixture
def turns(tmp_path: Path) -> Turns:
    return Turns(tmp_path)


def read(tmp_path: Path, segments: list[Segment], field: str, total: int) -> np.ndarray:
    return PayloadReader(tmp_path, deadline_s=None).read(segments, field, 0, total)


# Nodes of the seed's conversation (tokens): system 3, user 2, answer 1 (scaffold 1 + 2 sampled),
# tool 2, answer 2 (1 + 2), and the fork's user 2 and answer 3 (1 + 2).
S, U, A1 = Node("s", 3), Node("u", 2), Node("a1", 3, sampled=True, completion=2)
T, A2 = Node("t", 2), Node("a2", 3, sampled=True, completion=2)
U2, A3 = Node("u2", 2), Node("a3", 3, sampled=True, completion=2)


BRIDGE = ["s", "u", "a1"]  # the prefix a bridged turn on the first answer extends


def seed_trace(turns: Turns) -> TracePayload:
    trace = TracePayload()
    trace.commit([], [S, U, A1], turns.answer(6, 2, masks=2))  # rows [0, 7)
    # bridged on [s, u, a1]: 8 tokens, routing from the prefix's final token, position 7
    trace.commit([S, U, A1], [T, A2], turns.answer(11, 2, start=7, masks=2), bridged_on=BRIDGE)
    trace.commit([S], [U2, A3], turns.answer(6, 2))  # unbridged: rows [0, 7) again
    return trace


def test_a_bridged_turn_gives_the_prior_answer_its_final_row(turns, tmp_path):
    """Seed case 1: the bridged turn's row path_len - 1 goes to the prior sampled node, as a
    one-row segment that supersedes its placeholder; nothing written before is changed."""
    trace = TracePayload()
    first = trace.commit([], [S, U, A1], turns.answer(6, 2))
    placeholder = [e for e in first if e.node == "a1"][-1].segment
    assert (placeholder.pos, placeholder.rows) == (2, 1)  # a1's last token: a copy of row 6
    added = trace.commit([S, U, A1], [T, A2], turns.answer(11, 2, start=7), bridged_on=BRIDGE)
    final = [e for e in added if e.supersedes]
    assert [(e.node, e.segment.pos, e.segment.rows) for e in final] == [("a1", 2, 1)]
    assert trace.segments[: len(first)] == first  # append-only
    got = read(tmp_path, trace.branch([S, U, A1, T, A2]), ROUTED_EXPERTS, 13)
    # a1's last row is turn 2's row 7, where the inline path had a placeholder (turn 1's row 6)
    want = expected((1, 0, 7), (2, 7, 12), (2, 11, 12))
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.uint16


def test_a_fork_off_a_non_sampled_node_drops_its_re_forwarded_rows(turns, tmp_path):
    """Seed case 2: the fork re-forwards the system prompt; those rows (and the one at the
    prefix's end, a system node's) are dropped: the system node keeps turn 1's rows."""
    trace = TracePayload()
    trace.commit([], [S, U, A1], turns.answer(6, 2))
    added = trace.commit([S], [U2, A3], turns.answer(6, 2))
    assert {e.node for e in added} == {"u2", "a3"} and not any(e.supersedes for e in added)
    got = read(tmp_path, trace.branch([S, U2, A3]), ROUTED_EXPERTS, 8)
    np.testing.assert_array_equal(got, expected((1, 0, 3), (2, 3, 7), (2, 6, 7)))


def test_both_branches_are_rebased_with_masks(turns, tmp_path):
    """Seed case 3: each branch's segments at branch positions, masks on the answers only."""
    trace = seed_trace(turns)
    long, fork = [S, U, A1, T, A2], [S, U2, A3]
    routing = read(tmp_path, trace.branch(long), ROUTED_EXPERTS, 13)
    np.testing.assert_array_equal(routing, expected((1, 0, 7), (2, 7, 12), (2, 11, 12)))
    np.testing.assert_array_equal(
        read(tmp_path, trace.branch(fork), ROUTED_EXPERTS, 8),
        expected((1, 0, 3), (3, 3, 7), (3, 6, 7)),
    )
    mask = read(tmp_path, trace.branch(long), SAMPLING_MASK, 13)
    want = np.full((13, 2), MASK_PAD, dtype=np.int32)
    want[6:8, 0] = [1000, 1001]  # a1's two sampled tokens
    want[11:13, 0] = [2000, 2001]  # a2's
    np.testing.assert_array_equal(mask, want)
    assert not [s for s in trace.branch(fork) if s.field == SAMPLING_MASK]  # turn 3: no mask
    assert trace.files == [str(turns.dir / f"turn{i}.bin") for i in (1, 2, 3)]


def test_the_latest_turn_wins_whichever_child_it_came_from(turns, tmp_path):
    trace = TracePayload()
    trace.commit([], [S, U, A1], turns.answer(6, 2))
    trace.commit([S, U, A1], [T, A2], turns.answer(11, 2))  # unbridged: rows [0, 12)
    trace.commit([S, U, A1], [U2, A3], turns.answer(11, 2, start=7), bridged_on=BRIDGE)
    # both branches through a1 read turn 3's row 7 for a1's final token
    for path, tail in (([S, U, A1, T, A2], 2), ([S, U, A1, U2, A3], 3)):
        got = read(tmp_path, trace.branch(path), ROUTED_EXPERTS, 13)
        assert got[7].max() == 307
        assert got[8].max() == tail * 100 + 8


def test_a_node_the_rows_do_not_cover_has_no_routing_nor_its_branches(turns, tmp_path):
    trace = TracePayload()
    trace.commit([], [S, U, A1], turns.answer(6, 2))
    # rows start at 9, past the tool node's first token: the tool node gets none
    added = trace.commit([S, U, A1], [T, A2], turns.answer(11, 2, start=9))
    assert {e.node for e in added} == {"a2"}
    assert not [s for s in trace.branch([S, U, A1, T, A2]) if s.field == ROUTED_EXPERTS]
    # a later turn forwards the tool node's last token: not sampled, so nothing supersedes
    # there, and the branch through it still has no routing
    a4 = Node("a4", 1, sampled=True, completion=1)
    added = trace.commit([S, U, A1, T], [a4], turns.answer(10, 1, start=9))
    assert [(e.node, e.supersedes) for e in added] == [("a4", False)]
    assert not [s for s in trace.branch([S, U, A1, T, a4]) if s.field == ROUTED_EXPERTS]
    # the covered branch above it still reads whole, and every turn's file is the trace's
    assert len(read(tmp_path, trace.branch([S, U, A1]), ROUTED_EXPERTS, 8)) == 8
    assert len(trace.files) == 3


def test_rows_that_stop_early_leave_the_answer_without_routing(turns):
    """Routing that ends before the last forwarded token (not end-anchored: another writer's) has
    no row to copy for the final token: the answer's node gets none, as verifiers' does."""
    routing = turns.answer(6, 2)[0]
    short = routing.clip(0, 6)  # rows [0, 6): position 6, a1's first sampled token, is missing
    added = attribute_turn([], [S, U, A1], [short])
    assert {e.node for e in added} == {"s", "u"}
    assert not [s for s in branch_segments([S, U, A1], added) if s.field == ROUTED_EXPERTS]


def test_one_turn_reads_what_sample_segments_reads(turns, tmp_path):
    segments = turns.answer(6, 2, masks=2)
    trace = TracePayload()
    trace.commit([], [S, U, A1], segments)
    for field in (ROUTED_EXPERTS, SAMPLING_MASK):
        np.testing.assert_array_equal(
            read(tmp_path, trace.branch([S, U, A1]), field, 8),
            read(tmp_path, sample_segments(segments, 6, 2), field, 8),
        )


def test_a_bridged_turn_whose_prefix_was_re_rendered_is_refused(turns):
    with pytest.raises(TraceError, match=r"bridged turn's prompt must extend its stored prefix"):
        attribute_turn(
            [S],
            [Node("u'", 2), Node("a", 3, True, 2)],
            turns.answer(8, 2, start=7),
            bridged_on=BRIDGE,
        )


@pytest.mark.parametrize(
    ("prefix", "new", "message"),
    [
        ([], [], "at least its answer's node"),
        ([], [Node("u", 2)], "last and sampled"),
        ([S], [Node("a", 2, True, 1)], r"reaches position 7, past the turn's 5 tokens"),
    ],
)
def test_turns_that_do_not_add_up_are_refused(turns, prefix, new, message):
    with pytest.raises(TraceError, match=message):
        attribute_turn(prefix, new, turns.answer(6, 2))


def test_segments_of_two_answers_are_refused(turns):
    one, two = turns.answer(6, 2)[0], turns.answer(6, 2)[0]
    gap = Segment(ROUTED_EXPERTS, two.file, 0, 0, 3, two.dtype, two.shape)
    with pytest.raises(TraceError, match="do not tile one run of positions"):
        attribute_turn([], [S, U, A1], [one.clip(4, 7), gap])


def test_node_segments_of_another_trace_are_refused(turns):
    trace = seed_trace(turns)
    doubled = [*trace.segments, *trace.segments]
    with pytest.raises(TraceError, match="not this trace's"):
        branch_segments([S, U, A1], doubled)
    with pytest.raises(TraceError, match="visits each node once"):
        branch_segments([S, S], trace.segments)


@pytest.mark.parametrize(
    ("tokens", "completion"), [(-1, 0), (2, 3), (1.5, 0)], ids=["negative", "over", "float"]
)
def test_a_node_says_what_is_wrong_with_it(tokens, completion):
    with pytest.raises(TraceError, match="node 'x'"):
        Node("x", tokens, completion=completion)


def test_node_segments_travel_as_json(turns):
    trace = seed_trace(turns)
    wire = json.loads(json.dumps([e.to_json() for e in trace.segments]))
    assert [NodeSegment.from_json(e) for e in wire] == trace.segments
    assert {"node", "supersedes", "field", "file", "offset", "pos", "rows"} <= set(wire[0])
