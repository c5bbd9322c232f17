"""What every payloadrun process has in common: its version, log format and /metrics basics.

The sidecars run as real processes here; the operator as a process where it needs no cluster
(tests/integration/test_operator.py runs it against one).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from payloadrun.logs import JsonFormatter, severity
from payloadrun.retention.client import RetentionClient
from payloadrun.settings import Env
from payloadrun.testing.processes import SidecarProcess, free_port, writer

REPO = Path(__file__).resolve().parents[2]
VERSION = metadata.version("payloadrun")


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, env=env, check=False
    )


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (("-m", "payloadrun.cli", "--version"), "payloadrun"),
        (("-m", "payloadrun.cli", "writer", "--version"), "payloadrun writer"),
        (("-m", "payloadrun.cli", "retention", "--version"), "payloadrun retention"),
        (("-m", "payloadrun_operator", "--version"), "payloadrun-operator"),
    ],
)
def test_every_command_prints_the_installed_version(argv, prog):
    result = run(*argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{prog} {VERSION}\n"


def test_one_version_everywhere():
    """pyproject.toml is where the version is written; everything else reads or matches it."""
    import payloadrun
    import payloadrun_operator
    from payloadrun.version import __release__, python_version
    from payloadrun_operator.platform.settings import DEFAULT_SIDECAR_IMAGE

    assert payloadrun.__version__ == payloadrun_operator.__version__ == VERSION
    # the written version (the images' tag, the chart's) is the one installed, in its own form
    assert python_version(__release__) == VERSION
    assert DEFAULT_SIDECAR_IMAGE.endswith(f":{__release__}")
    chart = yaml.safe_load((REPO / "charts/payloadrun/Chart.yaml").read_text())
    assert chart["appVersion"] == __release__, "Chart.yaml's appVersion is not the package's"


# --- logs -----------------------------------------------------------------------------------

# The keys every JSON line has, in every process; kopf's JSON has these but "logger".
COMMON_KEYS = {"timestamp", "severity", "logger", "message"}
SEVERITIES = {"debug", "info", "warn", "error", "fatal"}
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00$")
PLAIN_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
)


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of a log as JSON, each with the common keys (fails on the first that is not)."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"line {number} is not JSON: {line!r}\n---\n{text[-3000:]}")
        assert isinstance(entry, dict) and entry.keys() >= COMMON_KEYS, line
        assert TIMESTAMP.match(entry["timestamp"]), entry["timestamp"]
        assert entry["severity"] in SEVERITIES, line
        entries.append(entry)
    assert entries, "nothing was logged"
    return entries


def record(msg: str = "hello %s", *args: Any, level: int = logging.INFO, **attrs: Any):
    args = args or (("w",) if "%s" in msg else ())
    rec = logging.LogRecord("payloadrun.test", level, __file__, 1, msg, args, None)
    rec.created = 1_796_120_365.592378  # microseconds that are not zero
    vars(rec).update(attrs)
    return rec


def test_the_json_shape_is_kopfs_plus_the_logger_name():
    from kopf._core.actions.loggers import make_formatter

    kopf_json = make_formatter(kopf.LogFormat.JSON)
    ref = {"apiVersion": "payloadrun.dev/v1alpha1", "kind": "PayloadRun", "name": "r",
           "uid": "u-1", "namespace": "ns"}  # fmt: skip
    for rec in (
        record(),
        record(level=logging.WARNING, k8s_ref=ref, k8s_skip=False, settings=object()),
        record(level=logging.CRITICAL, step=7),
    ):
        ours, theirs = json.loads(JsonFormatter().format(rec)), json.loads(kopf_json.format(rec))
        assert ours.keys() == theirs.keys() | {"logger"}
        assert {k: ours[k] for k in theirs} == theirs
        assert ours["logger"] == "payloadrun.test"
    assert json.loads(JsonFormatter().format(record(step=7)))["step"] == 7


def test_json_lines_carry_tracebacks_in_one_field():
    try:
        raise ValueError("boom")
    except ValueError:
        rec = record("failed", level=logging.ERROR, exc_info=sys.exc_info())
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["severity"] == "error" and entry["exc_info"].endswith("ValueError: boom")
    rec = record()
    rec.created = 1_796_120_365.0  # zero microseconds still print six digits
    assert TIMESTAMP.match(json.loads(JsonFormatter().format(rec))["timestamp"])
    assert [severity(n) for n in (5, 10, 20, 30, 40, 50)] == [
        "debug", "debug", "info", "warn", "error", "fatal"
    ]  # fmt: skip


def test_the_writer_logs_json_lines_and_plain_stays_as_it_was(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: a 502 and a warning
    env = {Env.LOG_FORMAT: "json", Env.WRITER_LOG_LEVEL_DEPRECATED: "DEBUG"}
    with writer(dead, tmp_path, env=env, log_path=tmp_path / "json.log") as proc:
        answer = urllib.request.Request(proc.url + "/v1/models")
        with pytest.raises(urllib.error.HTTPError, match="502"):
            urllib.request.urlopen(answer, timeout=10)
        urllib.request.urlopen(proc.metrics_url, timeout=10).read()
    entries = json_lines((tmp_path / "json.log").read_text())
    assert {e["severity"] for e in entries} >= {"debug", "info", "warn"}
    assert any(e["logger"] == "payloadrun.writer" and "listening" in e["message"] for e in entries)
    with writer(dead, tmp_path, "--log-format", "plain", log_path=tmp_path / "plain.log"):
        pass
    first = (tmp_path / "plain.log").read_text().splitlines()[0]
    assert PLAIN_LINE.match(first) and "INFO payloadrun.writer: writer listening on" in first


def test_the_retention_sidecar_logs_json_lines(tmp_path):
    log = tmp_path / "retention.log"
    sidecar = SidecarProcess(
        tmp_path / "root", "run-1", args=("--log-format", "json"), log_path=log
    )
    with sidecar, RetentionClient(sidecar.url) as client:
        client.record_batch(1, [])
        with pytest.raises(Exception, match="400"):
            client.record_batch(2, ["../escape.bin"])
    entries = json_lines(log.read_text())
    assert any(e["logger"] == "payloadrun.retention" for e in entries)


def test_a_sidecar_that_cannot_listen_says_so_in_its_log_format(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run(
            "-m", "payloadrun.cli", "writer", "--log-format", "json",
            "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0",
        )  # fmt: skip
    assert result.returncode == 1
    (entry,) = json_lines(result.stderr)
    assert entry["severity"] == "fatal" and entry["logger"] == "payloadrun.writer"
    assert f"cannot listen on port {port}: in use" in entry["message"]


class DeadApiServer:
    """A port that takes every connection and closes it at once: an API server that never
    answers, whose connection attempts can be counted (a refused port shows none)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.connections += 1
            # a reset, every time the same error (a plain close gives the client one of several)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    def close(self) -> None:
        self.sock.close()


def run_operator_without_a_cluster(
    tmp_path, until: Callable[[list[dict], int], bool], **env: str
) -> tuple[int, list[dict]]:
    """The operator against a kubeconfig whose API server never answers, until ``until(log
    entries so far, connections to the API server)`` holds, then SIGTERM: its exit code and
    its JSON log lines."""
    api = DeadApiServer()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{api.port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "payloadrun_operator", "--host", "127.0.0.1"],
        env={
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PAYLOADRUN_METRICS_PORT": "0",
            "PAYLOADRUN_HEALTH_PORT": "0",
            Env.LOG_FORMAT: "json",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()  # every line the operator writes, until it exits
    deadline = time.monotonic() + 120  # a bound for a broken operator, not a timing
    try:
        while not until(json_lines("".join(lines)) if lines else [], api.connections):
            assert proc.poll() is None, f"the operator exited first:\n{''.join(lines)}"
            assert time.monotonic() < deadline, f"never happened:\n{''.join(lines)}"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        reader.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        api.close()
    out = ""
    return proc.returncode, json_lines("".join(lines) + out)


def test_the_operator_logs_json_lines_without_a_cluster(tmp_path):
    """No API server answers and no election: kopf logs its startup, and the operator's first
    request (which add-on APIs the cluster serves, in kopf's login) names the API server it
    cannot reach once, not at every retry, as JSON lines."""
    seen: dict[str, int] = {}

    def retried_after_warning(entries: list[dict], connections: int) -> bool:
        warned = any(e["logger"] == "payloadrun.discovery" for e in entries)
        if warned and "at" not in seen:
            seen["at"] = connections
        return warned and connections > seen["at"] + 1  # two retries came after the warning

    _, entries = run_operator_without_a_cluster(
        tmp_path, retried_after_warning, PAYLOADRUN_LEADER_ELECTION="false"
    )
    loggers = {e["logger"].split(".")[0] for e in entries}
    assert "kopf" in loggers
    (warning,) = [e for e in entries if e["logger"] == "payloadrun.discovery"]
    assert warning["severity"] == "warn"
    assert "discovering the cluster's APIs failed" in warning["message"]
    assert "127.0.0.1" in warning["message"]  # the API server it cannot reach


def test_a_candidate_that_cannot_reach_the_lease_says_so_once_and_stops_on_sigterm(tmp_path):
    """With the election (the default) the operator waits for the Lease before kopf starts: it
    names the API server it cannot reach once (not every retry), claims no holder it never read,
    and a SIGTERM on standby is a clean stop."""
    seen: dict[str, int] = {}

    def retried_after_warning(entries: list[dict], connections: int) -> bool:
        warned = any(
            e["logger"] == "payloadrun.election" and e["severity"] == "warn" for e in entries
        )
        if warned and "at" not in seen:
            seen["at"] = connections
        return warned and connections > seen["at"]  # a retry came after the warning

    code, entries = run_operator_without_a_cluster(tmp_path, retried_after_warning)
    assert code == 0
    election = [e for e in entries if e["logger"] == "payloadrun.election"]
    (warning,) = [e for e in election if e["severity"] == "warn"]
    assert "cannot reach the API server at https://127.0.0.1:" in warning["message"]
    assert "retrying every 2 s" in warning["message"]
    assert not any("held by" in e["message"] for e in election), election
    assert not any(e["logger"].startswith("kopf") for e in entries)  # a standby runs no kopf


# --- metrics every component exports, and docs/metrics.md ---------------------------------------

METRICS_MD = REPO / "docs" / "metrics.md"
# docs/metrics.md section heading (its start) -> the components whose /metrics it describes
SECTIONS = {
    "Every component": ("operator", "writer", "retention"),
    "Writer sidecar": ("writer",),
    "Retention sidecar": ("retention",),
    "Operator": ("operator",),
}
# client_python's collectors: the only families a group row (``process_*``) may stand for
GROUP_PREFIXES = ("process_", "python_")
TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)


def exported(text: str) -> dict[str, str]:
    """Name -> type of every family in an exposition (counters by their ``_total`` name)."""
    return dict(TYPE_LINE.findall(text))


def documented() -> dict[str, dict[str, tuple[str, str]]]:
    """Component -> {name or ``prefix_*``: (type, the row's text)} from docs/metrics.md's tables."""
    found: dict[str, dict[str, tuple[str, str]]] = {
        c: {} for c in ("operator", "writer", "retention")
    }
    components: tuple[str, ...] = ()
    for line in METRICS_MD.read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:]
            components = next((c for s, c in SECTIONS.items() if heading.startswith(s)), ())
        elif line.startswith("| `") and components:
            cells = [c.strip() for c in line.strip("|").split("|")]
            for name in re.findall(r"`([^`]+)`", cells[0]):
                for component in components:
                    assert name not in found[component], f"{name} documented twice"
                    found[component][name] = (cells[1], line)
    return found


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


@pytest.fixture(scope="module")
def expositions(tmp_path_factory) -> dict[str, str]:
    """/metrics of a real writer and retention sidecar, and of the operator's metrics."""
    from prometheus_client import generate_latest

    from payloadrun_operator.platform.metrics import OperatorMetrics

    tmp = tmp_path_factory.mktemp("metrics")
    with (
        writer(f"http://127.0.0.1:{free_port()}", tmp / "writer") as w,
        SidecarProcess(tmp / "retention", "run-1") as r,
    ):
        texts = {"writer": scrape(w.metrics_url), "retention": scrape(r.metrics_url)}
    # The operator's process needs a cluster (tests/integration/test_operator.py scrapes it);
    # here its registry, which the process serves as it is.
    texts["operator"] = generate_latest(OperatorMetrics().registry).decode()
    return texts


@pytest.mark.parametrize("component", ["operator", "writer", "retention"])
def test_build_info_process_metrics_and_no_created_series(expositions, component):
    text = expositions[component]
    build = [line for line in text.splitlines() if line.startswith("payloadrun_build_info{")]
    assert build == [
        f'payloadrun_build_info{{component="{component}",'
        f'python_version="{platform.python_version()}",version="{VERSION}"}} 1.0'
    ]
    families = exported(text)
    for name in ("process_resident_memory_bytes", "process_open_fds", "python_info"):
        assert families.get(name) == "gauge", name
    assert families["process_cpu_seconds_total"] == "counter"
    assert families["python_gc_collections_total"] == "counter"
    assert "_created" not in text


@pytest.mark.parametrize("component", ["operator", "writer", "retention"])
def test_metrics_md_names_exactly_what_each_component_exports(expositions, component):
    """Every family a component exports has a row in its section (or in "Every component"),
    with its type, and every row names a family the component exports. A group row
    (``process_*``) stands for client_python's collectors only, and its text names each of
    their families that the components export."""
    families = exported(expositions[component])
    docs = documented()[component]
    groups = {name[:-1]: row for name, (_, row) in docs.items() if name.endswith("*")}
    assert set(groups) <= set(GROUP_PREFIXES), groups
    for name, kind in families.items():
        group = next((row for prefix, row in groups.items() if name.startswith(prefix)), None)
        if group is not None:
            assert f"`{name}`" in group, f"{name} ({component}) is not named in its group row"
            continue
        assert name in docs, f"{component} exports {name} ({kind}): add a row to docs/metrics.md"
        assert docs[name][0] == kind, f"{name} is a {kind}, docs/metrics.md says {docs[name][0]}"
    for name, (_, row) in docs.items():
        if name.endswith("*"):
            assert any(f.startswith(name[:-1]) for f in families), f"nothing matches {name}"
            listed = re.findall(rf"`({re.escape(name[:-1])}[a-z_]+)`", row)
            missing = set(listed) - set(families)
            assert not missing, f"the {name} row names {missing}, {component} exports none of them"
        else:
            assert name in families, f"docs/metrics.md names {name}, {component} does not export it"
