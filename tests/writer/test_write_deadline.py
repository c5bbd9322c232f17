"""The write deadline, the breaker and the thread cap on a real frozen filesystem.

``fsfreeze -f`` on a small ext4 (a loop device) makes every call that would change it block in
the kernel until ``fsfreeze -u``, while lookups still answer: a write that hangs after its
``payload_dir`` was checked, deterministically (the GlusterFS brick SIGSTOPped in
tests/sharedfs/test_hung_writer.py hangs lookups too, and the caches decide which call blocks).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from payloadrun_devkit.required import skip_or_fail

from .conftest import files_under, http, metric, wait_for_metric

GEN = "/inference/v1/generate"
WORK = "payloadrun_writer_response_work_seconds"  # from vLLM's last byte to the client's first
# What the writer's own work on one small answer may add to its deadline, as a share of the
# deadline: the event loop's wake-up when the deadline's timer fires, a copy of vLLM's answer on
# the request pool, the first bytes sent. bench/writer_deadline.py measured 4 and 23 ms beyond
# the deadline (the latter at a load of 9 on this 2-core machine); this test, with six busy
# processes on the two cores, 67 ms. Half the deadline (250 ms at 0.5 s) is well past those, so
# a busy machine does not fail it; a writer that waited past its deadline for a write (twice
# it, or for the write itself: the volume stays frozen until the test thaws it) does.
MARGIN = 0.5


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)


@pytest.fixture
def freezable(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB ext4 on a loop device, mounted; thawed and unmounted at the end, whatever
    happened (a filesystem left frozen would hang whoever touches it next)."""
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    image.write_bytes(b"")
    made = _run("truncate", "-s", "64M", str(image))
    made = made if made.returncode else _run("mkfs.ext4", "-q", "-F", str(image))
    mounted = made if made.returncode else _run("mount", "-o", "loop", str(image), str(mnt))
    if mounted.returncode:
        skip_or_fail(f"cannot mount an ext4 loop device here (needs root): {mounted.stderr}")
    try:
        yield mnt
    finally:
        _run("fsfreeze", "-u", str(mnt))
        _run("umount", str(mnt))


class Frozen:
    def __init__(self, mnt: Path) -> None:
        self.mnt = mnt

    def __enter__(self) -> Frozen:
        result = _run("fsfreeze", "-f", str(self.mnt))
        assert result.returncode == 0, result.stderr
        return self

    def __exit__(self, *exc: object) -> None:
        result = _run("fsfreeze", "-u", str(self.mnt))
        assert result.returncode == 0, result.stderr


def _body(payload_dir: str, tag: int) -> bytes:
    return json.dumps(
        {
            "token_ids": [tag, *range(300)],
            "sampling_params": {"max_tokens": 8, "extra_args": {"payload_dir": payload_dir}},
        }
    ).encode()


def _ask_inline(writer, fake, body: bytes, deadline: float) -> str:
    """One request while the volume hangs: inline, vLLM's bytes; its fallback reason.

    How long the writer kept it is read from the writer's own measure of its work
    (``response_work_seconds``: from vLLM's last byte to the first byte sent, what the deadline
    bounds), not from the client's clock, so vLLM's time and the client's do not count: a late
    write is answered after its whole deadline and within ``MARGIN`` of it beyond; a request that
    skips the volume (breaker open, threads full) waits for no deadline at all.
    """
    count, total = (metric(writer, f"{WORK}_{k}", mode="inline") for k in ("count", "sum"))
    started = time.monotonic()
    via = http("POST", writer.url + GEN, body)
    took = time.monotonic() - started
    direct = http("POST", fake.url + GEN, body)
    assert via.status == 200 and via.headers["x-payloadrun-mode"] == "inline"
    assert via.body == direct.body, "the inline answer is vLLM's own, byte for byte"
    reason = via.headers["x-payloadrun-fallback"]
    assert metric(writer, f"{WORK}_count", mode="inline") == count + 1
    work = metric(writer, f"{WORK}_sum", mode="inline") - total
    if reason == "write_timeout":
        # no earlier than the deadline (a slower machine only adds), by either clock
        assert took >= deadline and work >= deadline, (took, work, deadline)
        assert work < deadline * (1 + MARGIN), f"kept {work:.3f} s with a {deadline} s deadline"
    else:
        assert work < deadline * MARGIN, f"a request that skips the volume was kept {work:.3f} s"
    return reason


def _named(reply) -> str:
    (choice,) = reply.json()["choices"]
    (file,) = {seg["file"] for seg in choice["payload"]}
    return file


def test_a_late_write_is_answered_inline_at_its_deadline_and_its_file_removed_when_it_returns(
    fake, freezable, start_writer
):
    root = freezable / "payloads"
    root.mkdir()
    writer = start_writer(
        fake.url, root, write_deadline=0.5, breaker_cooldown=3600, root_probe_interval=3600
    )
    deadline = metric(writer, "payloadrun_writer_write_deadline_seconds")
    assert deadline == 0.5
    first = http("POST", writer.url + GEN, _body(f"{root}/v1", 1))
    assert first.headers["x-payloadrun-mode"] == "handle"
    kept = _named(first)

    with Frozen(freezable):
        assert _ask_inline(writer, fake, _body(f"{root}/v1", 2), deadline) == "write_timeout"
        assert metric(writer, "payloadrun_writer_write_threads_held") == 1
        assert metric(writer, "payloadrun_writer_write_breaker_state", state="open") == 1
        # the breaker is open: the next request does not touch the volume at all
        assert _ask_inline(writer, fake, _body(f"{root}/v1", 3), deadline) == "breaker_open"
        assert metric(writer, "payloadrun_writer_late_writes_total", outcome="removed") == 0
    # thawed: the late write returns, and its file goes before its thread counts as free
    wait_for_metric(writer, "payloadrun_writer_write_threads_held", 0)
    assert metric(writer, "payloadrun_writer_late_writes_total", outcome="removed") == 1
    assert [str(p) for p in files_under(root)] == [kept], "no file outlives its request unnamed"
    assert metric(writer, "payloadrun_writer_fallbacks_total", reason="write_timeout") == 1
    assert metric(writer, "payloadrun_writer_fallbacks_total", reason="breaker_open") == 1
    assert metric(writer, "payloadrun_writer_write_breaker_opened_total") == 1
    assert metric(writer, "payloadrun_writer_requests_total", mode="inline", code="200") == 2


def test_at_the_thread_cap_requests_skip_the_volume_then_a_probe_closes_the_breaker(
    fake, freezable, start_writer
):
    root = freezable / "payloads"
    root.mkdir()
    writer = start_writer(
        fake.url,
        root,
        write_deadline=0.5,
        write_threads=1,
        breaker_cooldown=0,  # half open at once: only the cap stops the next request
        root_probe_interval=3600,
    )
    deadline = metric(writer, "payloadrun_writer_write_deadline_seconds")
    assert http("POST", writer.url + GEN, _body(f"{root}/v1", 1)).status == 200
    with Frozen(freezable):
        assert _ask_inline(writer, fake, _body(f"{root}/v1", 2), deadline) == "write_timeout"
        assert metric(writer, "payloadrun_writer_write_threads_held") == 1
        # the one write thread is held: no probe is spent, nothing more is started
        for tag in (3, 4):
            reason = _ask_inline(writer, fake, _body(f"{root}/v1", tag), deadline)
            assert reason == "write_threads_full"
        assert metric(writer, "payloadrun_writer_write_breaker_state", state="open") == 1
    wait_for_metric(writer, "payloadrun_writer_write_threads_held", 0)
    # the next request probes, its check and write come back in time: closed, by handle
    reply = http("POST", writer.url + GEN, _body(f"{root}/v1", 5))
    assert reply.headers["x-payloadrun-mode"] == "handle"
    assert metric(writer, "payloadrun_writer_write_breaker_state", state="closed") == 1
    assert metric(writer, "payloadrun_writer_fallbacks_total", reason="write_timeout") == 1
    assert metric(writer, "payloadrun_writer_fallbacks_total", reason="write_threads_full") == 2
    assert len(files_under(root)) == 2  # the first answer's and the last one's
