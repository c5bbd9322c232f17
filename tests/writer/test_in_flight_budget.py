"""The in-flight budget: many large answers finishing at once do not pile up in the writer.

The admission rules run on a real event loop; the end-to-end cases run a real writer process in
front of a real fake-vLLM process that holds its prepared answers and sends them all at the same
instant (``x-fake-hold``), and read what the writer reserved from its own /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from payloadrun import settings
from payloadrun.settings import parse_bytes
from payloadrun.testing import processes
from payloadrun.writer.budget import (
    COST_PER_BODY_BYTE,
    GIB,
    InFlightBudget,
    container_memory_limit,
    default_budget,
    response_cost,
)
from payloadrun.writer.config import WriterConfig

from .conftest import http

MIB = 1 << 20
ROW_BYTES = 48 * 8  # the fake's routing rows with --layers=48 --top-k=8 (uint8)


# --- admission -----------------------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def test_admits_while_it_fits_then_first_come_first_served():
    async def main():
        budget = InFlightBudget(100)
        order: list[str] = []
        assert await budget.acquire(60) is False
        assert await budget.acquire(40) is False
        assert budget.in_flight == 100

        async def wait(name: str, cost: int) -> None:
            await budget.acquire(cost)
            order.append(name)

        big = asyncio.create_task(wait("big", 90))
        await asyncio.sleep(0)
        small = asyncio.create_task(wait("small", 10))  # would fit after 10, but big came first
        await asyncio.sleep(0)
        budget.release(40)
        await asyncio.sleep(0)
        assert order == []  # 60 + 90 > 100, and small waits behind big
        budget.release(60)
        await asyncio.gather(big, small)
        assert order == ["big", "small"]
        assert budget.in_flight == 100 and budget.peak == 100

    run(main())


def test_an_answer_larger_than_the_budget_is_admitted_alone():
    async def main():
        budget = InFlightBudget(100)
        assert await budget.acquire(500) is False  # nothing in flight: admitted
        assert budget.peak == 500
        second = asyncio.create_task(budget.acquire(500))
        await asyncio.sleep(0)
        assert not second.done()
        budget.release(500)
        assert await second is True
        budget.release(500)
        await budget.acquire(30)
        third = asyncio.create_task(budget.acquire(500))  # waits for the 30 to go
        await asyncio.sleep(0)
        assert not third.done()
        budget.release(30)
        await third
        assert budget.in_flight == 500

    run(main())


def test_a_waiter_cancelled_reserves_nothing_and_unblocks_the_next():
    async def main():
        budget = InFlightBudget(100)
        await budget.acquire(50)
        big = asyncio.create_task(budget.acquire(80))
        await asyncio.sleep(0)
        small = asyncio.create_task(budget.acquire(20))  # fits, but queued behind big
        await asyncio.sleep(0)
        assert not small.done()
        big.cancel()
        with pytest.raises(asyncio.CancelledError):
            await big
        await small
        assert budget.in_flight == 70

    run(main())


def test_changes_are_reported():
    seen: list[tuple[int, int]] = []

    async def main():
        budget = InFlightBudget(10, lambda in_flight, waiting: seen.append((in_flight, waiting)))
        await budget.acquire(10)
        waiter = asyncio.create_task(budget.acquire(5))
        await asyncio.sleep(0)
        budget.release(10)
        await waiter

    run(main())
    assert seen == [(10, 0), (10, 1), (5, 0)]


def test_response_cost_and_default():
    assert response_cost(1000, False, 10**9) == COST_PER_BODY_BYTE * 1000
    assert response_cost(None, False, 12345) == 12345  # unknown length: read alone
    assert response_cost(1000, True, 12345) == 12345  # coded: its decoded size is unknown
    assert default_budget(None) == GIB
    assert default_budget(4 * GIB) == GIB
    assert default_budget(1 * GIB) == GIB // 2


def test_container_memory_limit_from_cgroup_files(tmp_path: Path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    assert container_memory_limit((str(v2), str(v1))) is None  # no cgroup files
    v1.write_text("9223372036854771712\n")  # cgroup v1's "no limit"
    assert container_memory_limit((str(v2), str(v1))) is None
    v1.write_text("2147483648\n")
    assert container_memory_limit((str(v2), str(v1))) == 2 * GIB
    v2.write_text("max\n")
    assert container_memory_limit((str(v2), str(v1))) is None
    v2.write_text("536870912\n")
    assert container_memory_limit((str(v2), str(v1))) == 512 * MIB


def test_parse_bytes():
    assert parse_bytes("1Gi") == GIB
    assert parse_bytes(" 512Mi ") == 512 * MIB
    assert parse_bytes("4096") == 4096
    for bad in ("1GB", "Gi", "-1", "1.5Gi", ""):
        with pytest.raises(ValueError, match="byte count"):
            parse_bytes(bad)


# --- a real writer in front of a fake vLLM that releases its answers together -----------------


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


def generate(url: str, root: Path, payload_bytes: int, together: int, i: int = 0):
    """A generate request for ``payload_bytes`` of routing, held until ``together`` are ready."""
    rows = payload_bytes // ROW_BYTES
    body = {
        "token_ids": [i, *range(rows - 16)],
        "sampling_params": {"max_tokens": 16, "extra_args": {"payload_dir": f"{root}/v1"}},
    }
    headers = {"x-fake-cache": "1", "x-fake-hold": str(together)}
    return http("POST", url + "/inference/v1/generate", body, headers, timeout=120)


@pytest.fixture(scope="module")
def fake_big():
    with processes.fake_vllm(
        "--layers=48", "--top-k=8", "--experts=128", "--no-sampling-mask"
    ) as fake:
        yield fake


def release_together(fake_url: str, root: Path, budget: str, payload: int, count: int):
    """``count`` identical answers of ``payload`` routing bytes, sent by the fake at the same
    instant through a writer with ``budget``: (the replies, the writer's metrics after)."""
    with processes.writer(
        fake_url, root, "--log-level=WARNING", "--in-flight-budget", budget
    ) as writer:
        with ThreadPoolExecutor(count) as pool:
            replies = list(
                pool.map(lambda _: generate(writer.url, root, payload, count), range(count))
            )
        return replies, scrape(writer.metrics_url)


def test_answers_released_together_stay_within_the_budget(fake_big, tmp_path: Path):
    root = tmp_path / "payloads"
    root.mkdir()
    count, payload = 12, 4 * MIB
    replies, m = release_together(fake_big.url, root, "24Mi", payload, count)
    assert [r.status for r in replies] == [200] * count
    assert {r.headers["x-payloadrun-mode"] for r in replies} == {"handle"}
    files = {seg["file"] for r in replies for seg in r.json()["choices"][0]["payload"]}
    assert len(files) == count
    assert all(Path(f).stat().st_size >= payload - ROW_BYTES * 16 for f in files)
    assert m["payloadrun_writer_in_flight_budget_bytes"] == 24 * MIB
    # Each answer (about 5.6 MB of JSON) reserves 2x its body: two fit in 24 MiB, never three.
    assert 0 < m["payloadrun_writer_in_flight_peak_bytes"] <= 24 * MIB
    assert m["payloadrun_writer_in_flight_bytes"] == 0
    assert m["payloadrun_writer_budget_waiting_responses"] == 0
    assert m["payloadrun_writer_budget_waits_total"] >= count - 2
    assert m["payloadrun_writer_budget_wait_seconds_total"] > 0
    assert m["payloadrun_writer_requests_total{code=200,mode=handle}"] == count
    assert m["payloadrun_writer_response_work_seconds_count{mode=handle}"] == count
    assert m["payloadrun_writer_fallbacks_total{reason=io_error}"] == 0


def test_an_answer_larger_than_the_budget_goes_through_alone(fake_big, tmp_path: Path):
    root = tmp_path / "payloads"
    root.mkdir()
    replies, m = release_together(fake_big.url, root, "1Mi", 2 * MIB, 2)
    assert [r.status for r in replies] == [200, 200]
    assert {r.headers["x-payloadrun-mode"] for r in replies} == {"handle"}
    # Admitted one at a time: the peak is one answer's cost (2x ~2.8 MB of JSON), not two.
    peak = m["payloadrun_writer_in_flight_peak_bytes"]
    assert 2 * MIB < peak < 2 * 2 * 2 * MIB, peak
    assert m["payloadrun_writer_budget_waits_total"] == 1
    for reply in replies:
        seg = reply.json()["choices"][0]["payload"][0]
        assert seg["rows"] == 2 * MIB // ROW_BYTES


def test_budget_flag_and_variable():
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, WriterConfig)
    args = parser.parse_args([])
    assert WriterConfig().in_flight_budget is None  # the default: decided at start
    env = {"PAYLOADRUN_WRITER_IN_FLIGHT_BUDGET": "512Mi"}
    assert settings.from_args(WriterConfig, args, env).in_flight_budget == 512 * MIB
    args = parser.parse_args(["--in-flight-budget", "2Gi"])
    assert settings.from_args(WriterConfig, args, env).in_flight_budget == 2 * GIB
    with pytest.raises(settings.SettingsError, match="PAYLOADRUN_WRITER_IN_FLIGHT_BUDGET"):
        settings.from_args(WriterConfig, parser.parse_args([]), {env.popitem()[0]: "lots"})
