"""Deadlines on the retention sidecar's journal: a hung volume gets a 503, never a hung caller.

The sidecar runs as a real process with its payload root and journal on a real filesystem whose
writes hang in the kernel (:mod:`frozen_volume`, an ext4 image frozen with ``FIFREEZE``), and the
real clients call it over loopback. Every check waits on a fact (the volume still frozen when
the answer came, a metric, a status field), never on the clock; the deadline bounds what the
sidecar itself measured (``waited_s``).

The idempotence of the journal's records, which makes a retried event replay safely after its
timed-out append landed late, is checked for every kind of record with generated sequences.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from frozen_volume import frozen_volume
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from retention_helpers import existing, make_files, wait_for

from payloadrun.retention import journal
from payloadrun.retention.client import (
    AsyncRetentionClient,
    RetentionClient,
    RetentionVolumeHungError,
)
from payloadrun.retention.journal import JOURNAL_NAME
from payloadrun.retention.state import RetentionState
from payloadrun.testing.processes import SidecarProcess

DEADLINE_S = 0.5
RUN = "hung-run"
ARGS = ("--call-deadline", str(DEADLINE_S), "--max-off-policy-steps", "8")
STATE = ("policy_step", "recorded_step", "pending_steps", "pending_files")


@pytest.fixture
def volume(tmp_path: Path):
    with frozen_volume(tmp_path) as made:
        yield made


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        name: float(value)
        for line in text.splitlines()
        if line and not line.startswith("#")
        for name, _, value in [line.rpartition(" ")]
    }


def status_code(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status


def idle(client: RetentionClient) -> dict:
    """The status once no deletion is queued or running."""
    return wait_for(
        lambda: (s := client.status())["outstanding_jobs"] == 0 and s["queue_files"] == 0 and s,
        timeout=60,
    )


def hung_calls(metrics_url: str) -> dict[str, float]:
    m = scrape(metrics_url)
    return {
        call: m[f'payloadrun_retention_volume_hung_answers_total{{call="{call}"}}']
        for call in ("record_batch", "policy_updated", "discard")
    }


def test_a_hung_journal_is_answered_503_fenced_then_read_back_to_the_same_state(volume, tmp_path):
    root = volume.path / "run"
    root.mkdir()
    journal_path = root / ".retention" / JOURNAL_NAME
    with (
        SidecarProcess(root, RUN, args=ARGS, log_path=tmp_path / "first.log") as sidecar,
        RetentionClient(sidecar.url, timeout=30) as client,
    ):
        consumed, kept, late = (
            make_files(root, 0, 20),
            make_files(root, 1, 10),
            make_files(root, 1, 5),
        )
        stray = make_files(root, 1, 3)
        client.record_batch(1, consumed)
        client.record_batch(2, kept)
        size = journal_path.stat().st_size

        volume.freeze()
        try:
            # the append blocks in the kernel: the call is answered at its deadline
            with pytest.raises(RetentionVolumeHungError) as info:
                client.policy_updated(1)
            first = info.value
            assert first.status == 503 and first.body["reason"] == "volume_hung"
            assert first.deadline_s == DEADLINE_S and first.waited_s >= DEADLINE_S
            assert first.fenced  # by this call: its append may still land
            assert "its journal append did not return" in str(first)
            assert str(journal_path) in str(first) and "Retry the call later" in str(first)

            # the journal is fenced: the next calls are refused without waiting, by both clients
            with pytest.raises(RetentionVolumeHungError) as info:
                client.record_batch(3, late)
            assert info.value.fenced and info.value.waited_s < DEADLINE_S
            assert "is fenced" in str(info.value)

            async def discard() -> None:
                async with AsyncRetentionClient(sidecar.url, timeout=30) as aclient:
                    await aclient.discard(stray)

            with pytest.raises(RetentionVolumeHungError) as info:
                asyncio.run(discard())
            assert info.value.fenced and info.value.waited_s < DEADLINE_S

            # the probes, /metrics and the status answer while the volume hangs
            base = sidecar.metrics_url.removesuffix("/metrics")
            assert status_code(f"{base}/healthz") == 200 and status_code(f"{base}/readyz") == 200
            assert scrape(sidecar.metrics_url)["payloadrun_retention_journal_fenced"] == 1
            assert hung_calls(sidecar.metrics_url) == {
                "record_batch": 1,
                "policy_updated": 1,
                "discard": 1,
            }
            during = client.status()
            assert during["journal_fenced"] and during["policy_step"] is None
            # every answer above came while the append was still stuck in the kernel
            assert volume.frozen and journal_path.stat().st_size == size
            assert existing(consumed + kept + late + stray) == consumed + kept + late + stray
        finally:
            volume.thaw()

        # the stuck append lands; the journal is read back, the fence lifted
        wait_for(lambda: scrape(sidecar.metrics_url)["payloadrun_retention_journal_fenced"] == 0)
        after = idle(client)
        assert after["policy_step"] == 1 and after["pending_steps"] == [2]
        assert after["journal_fenced"] is False
        assert existing(consumed) == [] and existing(kept + late + stray) == kept + late + stray
        assert scrape(sidecar.metrics_url)["payloadrun_retention_journal_fence_replays_total"] == 1

        # the retries replay safely: nothing is settled or deleted twice
        assert client.policy_updated(1)["settled"] == []
        assert client.record_batch(3, late)["disposition"] == "pending"
        assert client.discard(stray)["files"] == 3
        done = idle(client)
        assert done["deleted"]["consumed"] == {"files": 20, "bytes": 20 * 100}
        assert done["deleted"]["discarded"] == {"files": 3, "bytes": 3 * 100}
        assert done["pending_steps"] == [2, 3] and done["pending_files"] == 15
        assert existing(kept + late) == kept + late and existing(stray) == []
        before_restart = {k: done[k] for k in STATE}

    # a restart from the journal rebuilds the same state, and deletes nothing it holds
    with (
        SidecarProcess(root, RUN, args=ARGS, log_path=tmp_path / "second.log") as again,
        RetentionClient(again.url, timeout=30) as client,
    ):
        restarted = idle(client)
        assert restarted["mode"] == "restarted"
        assert {k: restarted[k] for k in STATE} == before_restart
        assert existing(kept + late) == kept + late


@pytest.mark.parametrize("call", ["discard", "empty_batch"])
def test_a_late_append_that_changes_no_batch_still_releases_its_files(volume, tmp_path, call):
    """A discard, or a batch deleted at once, changes no pending batch: whether its timed-out
    append landed is read off the journal, so its files go without a retry."""
    root = volume.path / "run"
    root.mkdir()
    journal_path = root / ".retention" / JOURNAL_NAME
    with (
        SidecarProcess(
            root, RUN, args=(*ARGS, "--max-steps", "100"), log_path=tmp_path / "sidecar.log"
        ) as sidecar,
        RetentionClient(sidecar.url, timeout=30) as client,
    ):
        doomed, kept = make_files(root, 0, 4), make_files(root, 0, 2)
        client.record_batch(1, kept)
        size = journal_path.stat().st_size
        volume.freeze()
        try:
            with pytest.raises(RetentionVolumeHungError) as info:
                if call == "discard":
                    client.discard(doomed)
                else:  # past --max-steps: deleted at once, no batch kept
                    client.record_batch(101, doomed)
            assert info.value.fenced
            assert volume.frozen and journal_path.stat().st_size == size
        finally:
            volume.thaw()
        wait_for(lambda: scrape(sidecar.metrics_url)["payloadrun_retention_journal_fenced"] == 0)
        wait_for(lambda: existing(doomed) == [] or None, timeout=60)
        after = idle(client)
        assert existing(kept) == kept and after["pending_steps"] == [1]
    assert "(the event that timed out landed)" in (tmp_path / "sidecar.log").read_text()


def test_calls_behind_a_hung_append_are_answered_503_too(volume, tmp_path):
    """Calls made while one waits on the volume get their own 503: waiting for the call ahead
    of them (within their deadline) or refused by the fence it set."""
    root = volume.path / "run"
    root.mkdir()
    with (
        SidecarProcess(
            root, RUN, args=(*ARGS, "--max-steps", "100"), log_path=tmp_path / "sidecar.log"
        ) as sidecar,
        RetentionClient(sidecar.url, timeout=30) as client,
    ):
        batches = [make_files(root, 0, 2) for _ in range(4)]
        volume.freeze()
        try:

            async def record_all() -> list[BaseException | dict]:
                async with AsyncRetentionClient(sidecar.url, timeout=30) as aclient:
                    calls = [aclient.record_batch(i + 1, b) for i, b in enumerate(batches)]
                    return await asyncio.gather(*calls, return_exceptions=True)

            answers = asyncio.run(record_all())
            assert all(isinstance(a, RetentionVolumeHungError) for a in answers), answers
            assert hung_calls(sidecar.metrics_url)["record_batch"] == 4
            assert volume.frozen
        finally:
            volume.thaw()
        wait_for(lambda: scrape(sidecar.metrics_url)["payloadrun_retention_journal_fenced"] == 0)
        # at most the one append that was running landed; each retry then records its batch
        for i, batch in enumerate(batches):
            client.record_batch(i + 1, batch)
        state = idle(client)
        assert state["pending_steps"] == [1, 2, 3, 4] and state["pending_files"] == 8
        assert existing([f for b in batches for f in b]) == [f for b in batches for f in b]


# --- retried events replay safely ---------------------------------------------------------------

FILES = [f"v{v}/f{i}.bin" for v in range(3) for i in range(4)]
calls = st.lists(
    st.one_of(
        st.tuples(
            st.just("record"),
            st.integers(0, 6),
            st.lists(st.sampled_from(FILES), max_size=4),
            st.booleans(),
        ),
        st.tuples(st.just("policy"), st.integers(0, 6), st.just([]), st.just(False)),
        st.tuples(
            st.just("discard"),
            st.just(0),
            st.lists(st.sampled_from(FILES), max_size=3),
            st.just(False),
        ),
    ),
    min_size=1,
    max_size=12,
)


def run_calls(
    sequence: list[tuple],
) -> tuple[RetentionState, list[journal.Record], set[str], list[int]]:
    """The state, what the service journals for ``sequence``, every file released, and which
    calls were journaled (the others were refused or changed nothing).

    Each record is decided the way the service decides it (the disposition from the state, an
    old policy step not journaled, a discard a pending batch holds refused) and applied through
    :func:`journal.replay`, as a restart and the fence's read-back apply it.
    """
    state, records, released, journaled = RetentionState(), [], set(), []
    for index, (kind, step, files, empty) in enumerate(sequence):
        if kind == "record":
            disposition = state.disposition(step, empty=empty, max_steps=5)
            record = journal.record_op(step, files, disposition)
        elif kind == "policy":
            if state.policy_step is not None and step <= state.policy_step:
                continue
            record = journal.policy_op(step)
        else:
            if state.conflicts(files):
                continue
            record = journal.discard_op(files)
        records.append(record)
        journaled.append(index)
        for _, keys in journal.replay([record], state):
            released.update(keys)
    return state, records, released, journaled


@settings(max_examples=400, deadline=None)
@given(sequence=calls, data=st.data())
def test_an_event_journaled_twice_replays_to_the_state_and_deletions_of_once(sequence, data):
    """A timed-out append that landed late, then the client's retry of the same call (at once,
    or after later calls): the journal holds the event twice (or the retry is refused, or is
    an old policy step and not journaled); replaying it gives the state the event gives once,
    and releases exactly the files the single event released."""
    once, _, released_once, journaled = run_calls(sequence)
    assume(journaled)  # only an event that was journaled can land late
    i = data.draw(st.sampled_from(journaled), label="retried call")
    j = data.draw(st.integers(i + 1, len(sequence)), label="retried before call")
    retried = [*sequence[:j], sequence[i], *sequence[j:]]
    twice, records_twice, released_twice, _ = run_calls(retried)
    assert journal.same_state(once, twice) and once.recorded_step == twice.recorded_step
    assert released_twice == released_once
    # and a restart's replay of the journal, duplicate included, rebuilds the same state
    replayed = RetentionState()
    released_replay = journal.replay(records_twice, replayed)
    assert journal.same_state(replayed, twice)
    assert {k for _, keys in released_replay for k in keys} == released_once
