"""The payload root's health: watched off the request path, never in readiness (issue 33).

The monitor's decisions are pure (``next_health``, ``change_line``); its deadline is checked
with a probe that really blocks its thread; the writer's readiness, metric and log line with a
real payload root replaced by a plain file.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time

from payloadrun.writer.payload_root import PROBE_PREFIX
from payloadrun.writer.root_monitor import RootHealth, RootMonitor, change_line, next_health

from .conftest import files_under, http, metric, wait_for_metric

GEN = "/inference/v1/generate"
WRITABLE = "payloadrun_writer_payload_root_writable"
LAST_OK = "payloadrun_writer_payload_root_last_writable_timestamp_seconds"


def _body(payload_dir: str) -> bytes:
    return json.dumps(
        {
            "token_ids": list(range(64)),
            "sampling_params": {"max_tokens": 8, "extra_args": {"payload_dir": payload_dir}},
        }
    ).encode()


# --- pure ---


def test_a_good_probe_makes_the_root_writable_and_stamps_it():
    assert next_health(RootHealth(), None, 10.0) == RootHealth(True, None, 10.0)


def test_a_failed_probe_keeps_the_time_of_the_last_good_one():
    assert next_health(RootHealth(True, None, 10.0), "EIO", 20.0) == RootHealth(False, "EIO", 10.0)
    assert next_health(RootHealth(), "EIO", 20.0) == RootHealth(False, "EIO", None)


def test_one_log_line_per_change_of_writability_never_per_probe():
    unknown, ok = RootHealth(), RootHealth(True, None, 1.0)
    bad, worse = RootHealth(False, "EIO", 1.0), RootHealth(False, "ENOSPC", 1.0)
    assert change_line(unknown, ok) is None  # a healthy start says nothing
    assert change_line(unknown, bad) == (
        "payload root is not writable, payloads go inline until it is: EIO"
    )
    assert change_line(ok, bad) is not None
    assert change_line(bad, worse) is None  # still down: no line per probe
    assert change_line(bad, ok) == "payload root is writable again"
    assert change_line(ok, RootHealth(True, None, 2.0)) is None


def test_readyz_describes_the_root_as_information():
    assert RootHealth().describe() == "not probed yet"
    assert RootHealth(True, None, 1.0).describe() == "ok"
    assert RootHealth(False, "EIO", 1.0).describe() == "not writable: EIO"


# --- the monitor's deadline, with a probe that really blocks its thread ---


def test_a_hung_probe_is_reported_at_its_deadline_and_no_second_one_starts():
    release, started = threading.Event(), []

    def probe():
        started.append(threading.current_thread().name)
        # a system call on a hung mount: nothing can interrupt it. Bounded (at 600 deadlines)
        # only so that a monitor waiting for it fails here instead of hanging the run.
        release.wait(30)

    monitor = RootMonitor(probe, interval=3600, deadline=0.05)
    try:
        began = time.monotonic()
        first = monitor.check_once()
        assert time.monotonic() - began >= 0.05, "answered before its deadline"
        assert first.writable is False and "within 0.05 s (still blocked" in first.problem
        # the monitor's own word that its probe has not returned: it answered without it
        assert monitor.wait_outstanding(0) is False
        second = monitor.check_once()
        assert second.writable is False
        assert len(started) == 1, "at most one probe outstanding"
    finally:
        release.set()
    assert monitor.wait_outstanding(10)
    assert monitor.check_once().writable is True  # the blocked probe returned: its result counts
    assert len(started) == 1
    assert monitor.check_once().writable is True and len(started) == 2


def test_a_probe_that_raises_is_a_root_that_cannot_take_a_file():
    def probe():
        raise PermissionError(13, "Permission denied")

    health = RootMonitor(probe, interval=3600, deadline=5).check_once()
    assert health.writable is False and "PermissionError" in health.problem


# --- the writer: ready while the root cannot take a file ---


def test_readiness_stays_while_the_root_is_a_file_and_answers_go_inline(
    fake, tmp_path, start_writer, caplog
):
    root = tmp_path / "payloads"
    root.mkdir()
    caplog.set_level(logging.INFO, logger="payloadrun.writer")
    before_start = time.time()
    writer = start_writer(fake.url, root, root_probe_interval=0.01)
    assert http("GET", writer.url + "/readyz").json() == {
        "ready": True,
        "upstream": "ok",
        "payload_root": "ok",
    }
    assert metric(writer, WRITABLE) == 1
    good_at = metric(writer, LAST_OK)
    # the Unix time of a probe this writer made: after it was started, and by now
    assert before_start <= good_at <= time.time()

    shutil.rmtree(root)
    root.write_bytes(b"not a directory")
    wait_for_metric(writer, WRITABLE, 0)
    ready = http("GET", writer.url + "/readyz")
    assert ready.status == 200, "a volume outage must not take the pod out of its Service"
    assert ready.json()["ready"] is True and ready.json()["upstream"] == "ok"
    assert ready.json()["payload_root"].startswith("not writable: ")
    for _ in range(3):
        via = http("POST", writer.url + GEN, _body(f"{root}/v1"))
        direct = http("POST", fake.url + GEN, _body(f"{root}/v1"))
        assert via.status == 200 and via.body == direct.body
        assert via.headers["x-payloadrun-mode"] == "inline"
    assert metric(writer, "payloadrun_writer_fallbacks_total", reason="volume_gone") == 3

    back_at = time.time()
    root.unlink()
    root.mkdir()
    wait_for_metric(writer, WRITABLE, 1)
    # stamped by a probe that found the new directory: after it came, not kept from before
    assert back_at <= metric(writer, LAST_OK) <= time.time()
    reply = http("POST", writer.url + GEN, _body(f"{root}/v1"))
    assert reply.headers["x-payloadrun-mode"] == "handle"
    # the probe (every 10 ms here) may hold its file for an instant: count the answer's files
    payloads = [p for p in files_under(root) if not p.name.startswith(PROBE_PREFIX)]
    assert len(payloads) == 1, payloads

    lines = [r.getMessage() for r in caplog.records if "payload root" in r.getMessage()]
    assert len([m for m in lines if "is not writable" in m]) == 1, lines
    assert lines[-1] == "payload root is writable again"
    assert len([m for m in lines if "writable again" in m]) == 1, lines


def test_the_probe_never_uses_the_request_pool(fake, root, start_writer):
    """The probe runs on the monitor's threads: the request pool's threads never touch the root
    for readiness (the old /readyz ran its probe there)."""
    before = set(threading.enumerate())
    writer = start_writer(fake.url, root, root_probe_interval=0.01, workers=1)
    for _ in range(20):
        http("GET", writer.url + "/readyz")
    names = [t.name for t in threading.enumerate() if t not in before]
    # one writer, one monitor thread (its probes come and go on threads of their own)
    assert names.count("payloadrun-writer-root-monitor") == 1, names
    assert not any(n.startswith("payloadrun-writer_") for n in names), (
        "/readyz started work on the request pool"
    )
