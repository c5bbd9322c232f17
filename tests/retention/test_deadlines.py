"""Deadlines on the retention sidecar's journal: a hung volume gets a 503, never a hung caller.

The sidecar runs as a real process with its payload root and journal on a real filesystem whose
writes hang in the kernel (:mod:`frozen_volume`, an ext4 image frozen with ``FIFREEZE``), and the
real clients call it over loopback. Every check waits on a fact the sidecar shows (the 503's
body, the fence's metrics and status, the journal and the files on disk), never on the clock;
the deadline bounds what the sidecar itself measured (``waited_s``). That an answer came while
the timed-out append was still stuck is read off the product too: the journal on disk had not
grown by its line and the fence had not been read back yet.

The idempotence of the journal's records, which makes a retried event replay safely after its
timed-out append landed late, is checked for every kind of record with generated sequences of
calls on real services (in-process, on real files).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path

import pytest
from frozen_volume import frozen_volume
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from retention_helpers import existing, make_files, wait_for

from payloadrun.retention.client import (
    AsyncRetentionClient,
    RetentionClient,
    RetentionVolumeHungError,
)
from payloadrun.retention.journal import JOURNAL_NAME, read_records
from payloadrun.retention.service import DiscardRefusedError, RetentionService, StartMode
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


def fence(metrics_url: str) -> tuple[float, float]:
    """The fence's metrics: whether it is up, and how many read-backs have lifted one."""
    m = scrape(metrics_url)
    return (
        m["payloadrun_retention_journal_fenced"],
        m["payloadrun_retention_journal_fence_replays_total"],
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
            # every answer above came while the timed-out append was still stuck: its line is
            # not on disk, and the journal has not been read back (the fence is still up)
            assert journal_path.stat().st_size == size and during["journal_bytes"] == size
            assert fence(sidecar.metrics_url) == (1, 0)
            assert existing(consumed + kept + late + stray) == consumed + kept + late + stray
        finally:
            volume.thaw()

        # the stuck append lands (its line is the journal's last, once), then the journal is
        # read back and the fence lifted
        wait_for(lambda: fence(sidecar.metrics_url) == (0, 1))
        landed = list(read_records(journal_path))
        assert landed[-1] == {"op": "policy", "step": 1} and landed.count(landed[-1]) == 1
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
        idle(client)  # the start's own deletion job done: none is queued from here on
        size = journal_path.stat().st_size
        volume.freeze()
        try:
            with pytest.raises(RetentionVolumeHungError) as info:
                if call == "discard":
                    client.discard(doomed)
                else:  # past --max-steps: deleted at once, no batch kept
                    client.record_batch(101, doomed)
            # the call waited its deadline on its own append, then fenced the journal
            hung = info.value
            assert hung.status == 503 and hung.body["reason"] == "volume_hung" and hung.fenced
            assert hung.deadline_s == DEADLINE_S and hung.waited_s >= DEADLINE_S
            assert "its journal append did not return" in str(hung)
            # its record is not on disk and not read back, and the event changed nothing in
            # memory: no batch step, no deletion queued (its files go only once it is on disk)
            assert journal_path.stat().st_size == size
            assert fence(sidecar.metrics_url) == (1, 0)
            during = client.status()
            assert during["journal_fenced"] and during["recorded_step"] == 1
            assert during["pending_steps"] == [1] and during["pending_files"] == 2
            assert during["outstanding_jobs"] == 0 and during["queue_files"] == 0
        finally:
            volume.thaw()
        wait_for(lambda: fence(sidecar.metrics_url) == (0, 1))
        wait_for(lambda: existing(doomed) == [] or None, timeout=60)
        after = idle(client)
        assert existing(kept) == kept and after["pending_steps"] == [1]
    assert "(the event that timed out landed)" in (tmp_path / "sidecar.log").read_text()


def test_calls_behind_a_hung_append_are_answered_503_too(volume, tmp_path):
    """Calls made while one waits on the volume get their own 503: waiting for the call ahead
    of them (within their deadline) or refused by the fence it set. Once it is set, the fence
    refuses a call at once, while the stuck append still has not returned."""
    root = volume.path / "run"
    root.mkdir()
    journal_path = root / ".retention" / JOURNAL_NAME
    with (
        SidecarProcess(
            root, RUN, args=(*ARGS, "--max-steps", "100"), log_path=tmp_path / "sidecar.log"
        ) as sidecar,
        RetentionClient(sidecar.url, timeout=30) as client,
    ):
        batches = [make_files(root, 0, 2) for _ in range(5)]
        size = journal_path.stat().st_size  # the header alone
        volume.freeze()
        try:

            async def record_all() -> list[BaseException | dict]:
                async with AsyncRetentionClient(sidecar.url, timeout=30) as aclient:
                    calls = [aclient.record_batch(i + 1, b) for i, b in enumerate(batches[:4])]
                    return await asyncio.gather(*calls, return_exceptions=True)

            answers = asyncio.run(record_all())
            assert all(isinstance(a, RetentionVolumeHungError) for a in answers), answers
            assert all(a.deadline_s == DEADLINE_S for a in answers)
            assert hung_calls(sidecar.metrics_url)["record_batch"] == 4
            # one call at a time appends: exactly one ran its append, for its whole deadline;
            # the others waited for it, or found the fence it left
            ran = [a for a in answers if "its journal append did not return" in str(a)]
            assert len(ran) == 1, answers
            assert ran[0].fenced and ran[0].waited_s >= DEADLINE_S

            # the fence refuses the next call at once, without queueing an append of its own
            with pytest.raises(RetentionVolumeHungError) as info:
                client.record_batch(5, batches[4])
            refused = info.value
            assert refused.status == 503 and refused.body["reason"] == "volume_hung"
            assert refused.fenced and "is fenced" in str(refused), refused
            assert refused.waited_s < DEADLINE_S
            # ... while the stuck append has not returned: nothing of it is on disk, and the
            # journal has not been read back
            assert journal_path.stat().st_size == size
            assert fence(sidecar.metrics_url) == (1, 0)
            assert hung_calls(sidecar.metrics_url)["record_batch"] == 5
        finally:
            volume.thaw()
        wait_for(lambda: fence(sidecar.metrics_url) == (0, 1))
        # at most the one append that was running landed; each retry then records its batch
        landed = list(read_records(journal_path))[1:]
        assert len(landed) <= 1 and all(r["op"] == "record" for r in landed), landed
        for i, batch in enumerate(batches):
            client.record_batch(i + 1, batch)
        state = idle(client)
        assert state["pending_steps"] == [1, 2, 3, 4, 5] and state["pending_files"] == 10
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


def play(service: RetentionService, sequence: list[tuple]) -> list[int]:
    """Make the calls of ``sequence`` on ``service``, each one's deletions done before the next;
    which calls the service journaled (its journal grew: the others were refused, or changed
    nothing and were answered without touching the volume)."""
    journaled = []
    for index, (kind, step, files, empty) in enumerate(sequence):
        before = service.status()["journal_bytes"]
        if kind == "record":
            service.record_batch(step, files, empty=empty)
        elif kind == "policy":
            service.policy_updated(step)
        else:
            with contextlib.suppress(DiscardRefusedError):  # a pending batch holds one
                service.discard(files)
        assert service.wait_idle(10)
        if service.status()["journal_bytes"] > before:
            journaled.append(index)
    return journaled


def facts(service: RetentionService, root: Path) -> dict:
    """What the service holds and what is left on disk: its state, which files a pending batch
    protects, which files are still there."""
    status = service.status()
    return {
        **{k: status[k] for k in STATE},
        "protected": [f for f in FILES if service.is_protected(f)],
        "on_disk": [f for f in FILES if (root / f).exists()],
    }


def batches_held(service: RetentionService) -> dict[int, list[str]]:
    """The files each pending batch holds, as the service tells them: each batch consumed in
    turn (its step's policy update) releases exactly its own files."""
    held = {}
    for step in service.status()["pending_steps"]:
        before = {f for f in FILES if service.is_protected(f)}
        answer = service.policy_updated(step)
        freed = sorted(before - {f for f in FILES if service.is_protected(f)})
        assert answer["settled"] == [step] and answer["deleting"] == len(freed)
        held[step] = freed
    return held


@settings(
    max_examples=150,
    deadline=None,
    # the fixtures only build services: each example makes its own roots and closes its services
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sequence=calls, retry=st.tuples(st.integers(0, 12), st.integers(0, 12)))
# one of each kind of retry, whatever the generated sequences hold: a batch retried after a later
# batch took its file, or after it was consumed; a discard retried after a batch took its file
# (refused); a policy step retried after a later one (not journaled)
@example(
    sequence=[("record", 3, ["v0/f0.bin"], False), ("record", 5, ["v0/f0.bin"], False)],
    retry=(0, 1),
)
@example(
    sequence=[("record", 2, ["v0/f0.bin", "v1/f1.bin"], False), ("policy", 2, [], False)],
    retry=(0, 1),
)
@example(
    sequence=[("discard", 0, ["v0/f0.bin"], False), ("record", 2, ["v0/f0.bin"], False)],
    retry=(0, 1),
)
@example(sequence=[("policy", 2, [], False), ("policy", 4, [], False)], retry=(0, 1))
def test_an_event_journaled_twice_replays_to_the_state_and_deletions_of_once(
    service_factory, root, sequence, retry
):
    """A timed-out append that landed late, then the client's retry of the same call (at once,
    or after later calls): the service decides the retry as it decides any call (it journals
    the event again, or refuses it, or answers an old policy step without journaling it); the
    service ends in the state the event gives once and has deleted exactly the files the single
    event deleted, and a restart's replay of its journal, duplicate included, rebuilds that
    state and deletes nothing more."""
    base = Path(tempfile.mkdtemp(dir=root))
    services: list[RetentionService] = []

    def start(path: Path) -> RetentionService:
        # deletions in this process (the real queue and deleter, no worker process per service)
        services.append(
            service_factory(root=path, max_steps=5, max_off_policy_steps=8, unlink=os.unlink)
        )
        return services[-1]

    def fresh(name: str) -> tuple[RetentionService, Path]:
        path = base / name
        path.mkdir()
        service = start(path)
        for key in FILES:  # after the start: a fresh run's start moves what it finds aside
            (path / key).parent.mkdir(exist_ok=True)
            (path / key).write_bytes(b"x" * 100)
        return service, path

    try:
        single, single_root = fresh("once")
        journaled = play(single, sequence)
        assume(journaled)  # only an event that was journaled can land late
        # the retried call (one that was journaled) and the call it comes before (or the end)
        i = journaled[retry[0] % len(journaled)]
        j = i + 1 + retry[1] % (len(sequence) - i)
        retried = [*sequence[:j], sequence[i], *sequence[j:]]
        twice, twice_root = fresh("twice")
        journaled_twice = play(twice, retried)
        if sequence[i][0] == "record":  # a batch's retry is always journaled again
            assert j in journaled_twice

        once = facts(single, single_root)
        assert facts(twice, twice_root) == once
        assert twice.status()["deleted"] == single.status()["deleted"]  # none deleted twice

        # a restart's replay of the journal, duplicate included, rebuilds the same state and
        # deletes nothing more; its batches hold the same files
        twice.close()
        restarted = start(twice_root)
        assert restarted.mode is StartMode.RESTARTED
        assert restarted.wait_idle(10)
        assert facts(restarted, twice_root) == once
        assert batches_held(restarted) == batches_held(single)
    finally:
        for service in services:
            service.close()
        shutil.rmtree(base, ignore_errors=True)
