"""Which local API server takes a request (pure), and ``--upstream``'s list form."""

from __future__ import annotations

import collections

import pytest

from payloadrun import settings
from payloadrun.cli import build_parser
from payloadrun.writer.cli import configs
from payloadrun.writer.config import WriterConfig
from payloadrun.writer.upstreams import (
    DOWN_SECONDS,
    Upstreams,
    parse_upstreams,
    pick,
    pick_for_session,
    session_order,
)

UP = (False, False, False, False)


# --- pick ----------------------------------------------------------------------------------------


def test_fewest_in_flight_wins():
    assert pick([3, 1, 2, 5], UP, 0) == 1
    assert pick([3, 1, 2, 0], UP, 0) == 3


def test_ties_go_to_the_first_at_or_after_start_round_the_end():
    assert pick([0, 0, 0, 0], UP, 0) == 0
    assert pick([0, 0, 0, 0], UP, 2) == 2
    assert pick([1, 0, 1, 0], UP, 2) == 3
    assert pick([0, 1, 1, 0], UP, 1) == 3  # from 1: 1, 2, 3 (the first 0), 0
    assert pick([0, 1, 1, 1], UP, 1) == 0  # round the end


def test_a_down_upstream_only_when_every_other_is_down_or_skipped():
    down = (True, False, False, False)
    assert pick([0, 5, 6, 7], down, 0) == 1  # busy but up beats idle but down
    assert pick([0, 5, 6, 7], down, 0, skip={1, 2, 3}) == 0
    assert pick([2, 1, 0, 0], (True,) * 4, 0) == 2  # all down: fewest in flight still wins


def test_none_when_every_upstream_is_skipped():
    assert pick([0, 0], (False, False), 0, skip={0, 1}) is None
    assert pick([0], (False,), 0, skip={0}) is None


def test_sequential_requests_take_turns():
    ups = Upstreams(["http://a:1", "http://a:2", "http://a:3"])
    order = []
    for _ in range(6):
        up = ups.take(0.0)
        order.append(up.url)
        ups.release(up)
    assert order == ["http://a:1", "http://a:2", "http://a:3"] * 2


def test_concurrent_requests_spread_evenly_and_count_in_flight():
    ups = Upstreams([f"http://a:{p}" for p in range(8000, 8004)])
    held = [ups.take(0.0) for _ in range(10)]
    counts = collections.Counter(up.url for up in held)
    assert sorted(counts.values()) == [2, 2, 3, 3]
    assert [up.in_flight for up in ups.all] == [3, 3, 2, 2]
    for up in held[:3]:  # three end: the next go where fewest are in flight
        ups.release(up)
    assert [up.in_flight for up in ups.all] == [2, 2, 1, 2]
    assert ups.take(0.0).url == "http://a:8002"


def test_a_failed_connect_puts_an_upstream_off_until_it_answers_or_time_passes():
    ups = Upstreams(["http://a:1", "http://a:2"])
    first = ups.take(10.0)
    ups.release(first)
    ups.connect_failed(first, 10.0)
    assert [ups.take(10.5).url for _ in range(3)] == ["http://a:2"] * 3
    after = ups.take(10.0 + DOWN_SECONDS + 0.1)  # back in turn once DOWN_SECONDS passed
    assert after is first
    ups.connect_failed(first, 20.0)
    ups.answered(first)
    assert not first.is_down(20.0)


def test_take_skips_what_a_request_tried():
    ups = Upstreams(["http://a:1", "http://a:2"])
    a = ups.take(0.0)
    b = ups.take(0.0, tried=[a])
    assert {a.url, b.url} == {"http://a:1", "http://a:2"}
    assert ups.take(0.0, tried=[a, b]) is None
    one = Upstreams(["http://a:1"])
    only = one.take(0.0)
    assert one.take(0.0, tried=[only]) is None
    assert only.in_flight == 1


# --- sessions -----------------------------------------------------------------------------------

URLS = [f"http://127.0.0.1:{p}" for p in range(8000, 8004)]


def test_a_session_has_one_order_in_every_process():
    order = session_order("rollout-17", URLS)
    assert sorted(order) == [0, 1, 2, 3]
    assert session_order("rollout-17", URLS) == order
    # the same order, computed by a fresh interpreter (no per-process hash salt)
    import subprocess
    import sys

    code = (
        "from payloadrun.writer.upstreams import session_order; "
        f"print(session_order('rollout-17', {URLS!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(order)


def test_sessions_spread_over_the_upstreams():
    firsts = collections.Counter(session_order(f"s{i}", URLS)[0] for i in range(4000))
    assert sorted(firsts) == [0, 1, 2, 3]
    assert min(firsts.values()) > 850  # 1,000 each, give or take a few standard deviations


def test_an_upstream_gone_moves_only_its_own_sessions():
    sessions = [f"s{i}" for i in range(400)]
    before = {s: URLS[session_order(s, URLS)[0]] for s in sessions}
    rest = [u for u in URLS if u != URLS[2]]
    after = {s: rest[session_order(s, rest)[0]] for s in sessions}
    moved = {s for s in sessions if before[s] != after[s]}
    assert moved == {s for s in sessions if before[s] == URLS[2]}
    assert moved  # some were on it


def test_a_session_takes_its_first_upstream_that_is_up():
    assert pick_for_session([2, 0, 3, 1], UP) == 2
    assert pick_for_session([2, 0, 3, 1], (False, False, True, False)) == 0
    assert pick_for_session([2, 0, 3, 1], (True,) * 4) == 2  # all down: still its own
    assert pick_for_session([2, 0, 3, 1], UP, skip={2, 0}) == 3  # tried: the next
    assert pick_for_session([2, 0], (False, False), skip={0, 2}) is None


def test_a_session_ignores_the_counts_and_leaves_the_turns_alone():
    ups = Upstreams(URLS)
    mine = URLS[session_order("busy", URLS)[0]]
    held = [ups.take(0.0, session="busy") for _ in range(5)]
    assert {up.url for up in held} == {mine}  # five in flight there, none elsewhere
    plain = [ups.take(0.0) for _ in range(3)]
    assert mine not in {up.url for up in plain}  # without a session: the least busy
    first = ups.take(0.0, tried=held[:1], session="busy")
    assert first.url == URLS[session_order("busy", URLS)[1]]  # tried: the session's next


# --- parse_upstreams and the config --------------------------------------------------------------


def test_one_url_is_todays_upstream():
    assert parse_upstreams("http://127.0.0.1:8000") == ("http://127.0.0.1:8000",)
    assert parse_upstreams("http://127.0.0.1:8000/") == ("http://127.0.0.1:8000",)
    assert WriterConfig().upstreams == ("http://127.0.0.1:8000",)


def test_a_comma_separated_list_in_order():
    value = "http://127.0.0.1:8000, http://127.0.0.1:8001,https://vllm.local/prefix/"
    assert parse_upstreams(value) == (
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8001",
        "https://vllm.local/prefix",
    )


@pytest.mark.parametrize(
    ("value", "named", "why"),
    [
        ("http://127.0.0.1:8000,127.0.0.1:8001", "'127.0.0.1:8001'", "scheme must be http"),
        ("http://127.0.0.1:8000,ftp://h:1", "'ftp://h:1'", "scheme must be http"),
        ("http://127.0.0.1:99999", "'http://127.0.0.1:99999'", "out of range"),
        ("http://127.0.0.1:80x0", "'http://127.0.0.1:80x0'", "not a base URL"),
        ("http://:8000", "'http://:8000'", "no host"),
        ("http://h:8000/?a=1", "'http://h:8000/?a=1'", "no query"),
        ("http://h:0", "'http://h:0'", "port 0"),
    ],
)
def test_each_bad_url_is_named(value, named, why):
    with pytest.raises(ValueError) as err:
        parse_upstreams(value)
    assert named in str(err.value) and why in str(err.value)
    assert "http://127.0.0.1:8000" in str(err.value)  # and the form to write


def test_empty_entries_and_duplicates_are_refused():
    with pytest.raises(ValueError, match="empty entry \\(number 2\\)"):
        parse_upstreams("http://h:1,,http://h:2")
    with pytest.raises(ValueError, match="no upstream"):
        parse_upstreams(" ")
    with pytest.raises(ValueError, match="http://h:1 is listed twice"):
        parse_upstreams("http://h:1,http://h:1/")


def test_the_variable_the_operator_sets_and_the_flag():
    env = {"PAYLOADRUN_WRITER_UPSTREAM": "http://127.0.0.1:8000,http://127.0.0.1:8001"}
    config, _ = configs(None, env)
    assert config.upstreams == ("http://127.0.0.1:8000", "http://127.0.0.1:8001")
    args = build_parser().parse_args(["writer", "--upstream", "http://h:1,http://h:2"])
    config, _ = configs(args, env)  # the flag wins
    assert config.upstreams == ("http://h:1", "http://h:2")


def test_a_bad_list_names_the_url_and_the_setting():
    with pytest.raises(settings.SettingsError) as err:
        configs(None, {"PAYLOADRUN_WRITER_UPSTREAM": "http://h:1,h:2"})
    assert "PAYLOADRUN_WRITER_UPSTREAM" in str(err.value) and "'h:2'" in str(err.value)
    with pytest.raises(settings.SettingsError) as err:
        WriterConfig(upstream="http://h:1,h:2")  # built in code: checked the same way
    assert "--upstream" in str(err.value) and "'h:2'" in str(err.value)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["writer", "--upstream", "http://h:1,h:2"])
