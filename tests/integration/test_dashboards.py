"""Every query of the chart's dashboards returns data from a real Prometheus.

A fake vLLM, the writer sidecar in front of it, a retention sidecar driven by the simulator, and
the operator reconciling a run on the local control plane are all scraped once a second by a real
Prometheus server (Debian's, installed by hack/prometheus.sh) on loopback. Then each panel query
(with Grafana's variables filled in) and each template-variable query goes through Prometheus'
HTTP API and must return at least one series. The same Prometheus loads the chart's alerting
rules (scrape jobs named as the chart's monitors name them): every rule evaluates without error
on these real series, and none is pending or firing on this healthy system.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from example_runs import example_run

from payloadrun.testing import processes
from payloadrun.testing.processes import SidecarProcess, free_port, wait_http
from payloadrun_devkit import required
from payloadrun_devkit.local_operator import LocalOperator

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))
import dashboards  # noqa: E402  (hack/dashboards.py: the dashboards' single source)

NAMESPACE, RUN = "demo", "demo-run"
RULES = REPO / "charts/payloadrun/alerts/payloadrun.rules.yaml"


def http(url: str, body: dict | None = None, timeout: float = 10.0) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def spawn(stack: ExitStack, args: list[str], log: Path) -> subprocess.Popen:
    out = open(log, "wb")  # noqa: SIM115 (closed by the stack)
    stack.callback(out.close)
    proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    stack.callback(stop)
    return proc


def prometheus_binary() -> str:
    return required.tool("prometheus", "bash hack/prometheus.sh installs Debian's")


def fill_variables(expr: str) -> str:
    return expr.replace("$__rate_interval", "20s").replace("$namespace", ".*").replace("$run", ".*")


@pytest.fixture(scope="module")
def scraped(kube_cluster, tmp_path_factory):
    """Everything running and scraped; yields Prometheus' base URL."""
    prometheus = prometheus_binary()
    tmp = tmp_path_factory.mktemp("dashboards")
    root = tmp / "payloads"
    root.mkdir()
    with ExitStack() as stack:
        fake = stack.enter_context(processes.fake_vllm(log_path=tmp / "vllm.log"))
        writer_process = stack.enter_context(
            processes.writer(fake.url, root, log_path=tmp / "writer.log")
        )
        retention = stack.enter_context(
            SidecarProcess(root, "dashboard-test", args=["--scan-interval", "1"]).start()
        )
        kube_cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"), check=True)
        kube_cluster.wait_established("payloadruns.payloadrun.dev")
        kube_cluster.kubectl("create", "namespace", NAMESPACE)
        operator = stack.enter_context(
            LocalOperator(kube_cluster.kubeconfig, namespaces=(NAMESPACE,), log_path=tmp / "op.log")
        )
        run = example_run("multinode-by-handle.yaml")
        run["metadata"]["name"] = RUN
        kube_cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(run), check=True)

        prom_port = free_port()
        targets = {
            "payloadrun-writer": urllib.parse.urlparse(writer_process.metrics_url).netloc,
            "payloadrun-retention": urllib.parse.urlparse(retention.metrics_url).netloc,
            "payloadrun-operator": f"127.0.0.1:{operator.metrics_port}",
        }
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [
                        {"targets": [target], "labels": {"namespace": NAMESPACE, "run": RUN}}
                    ],
                }
                for job, target in targets.items()
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        spawn(
            stack,
            [
                prometheus,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            tmp / "prometheus.log",
        )
        base = f"http://127.0.0.1:{prom_port}"
        wait_http(f"{base}/-/ready")

        # traffic: requests by handle, passthrough and rejected through the writer ...
        writer = writer_process.url
        for i in range(6):
            http(
                f"{writer}/inference/v1/generate",
                {
                    "model": "fake",
                    "token_ids": list(range(20 + i)),
                    "sampling_params": {
                        "max_tokens": 8,
                        "extra_args": {"payload_dir": f"{root}/v0"},
                    },
                },
            )
            http(f"{writer}/v1/completions", {"model": "fake", "prompt": f"p{i}", "max_tokens": 4})
        with pytest.raises(urllib.error.HTTPError):
            http(
                f"{writer}/v1/completions",
                {"model": "f", "prompt": "x", "vllm_xargs": {"payload_dir": "/etc"}},
            )
        # ... and an RL loop driving the retention sidecar
        sim = subprocess.run(
            [
                sys.executable, "-m", "payloadrun.cli", "simulate",
                "--url", retention.url, "--root", str(root),
                "--batch-size", "32", "--group-size", "4", "--steps", "12",
                "--max-off-policy-steps", "2", "--json",
            ],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert sim.returncode == 0, sim.stderr

        def all_up() -> bool:
            result = http(f"{base}/api/v1/query?query=up")["data"]["result"]
            return len(result) == 3 and all(r["value"][1] == "1" for r in result)

        def scrapes() -> dict[str, int]:
            """Scrapes so far per target (one ``up`` sample each)."""
            query = urllib.parse.quote("count_over_time(up[1h])")
            result = http(f"{base}/api/v1/query?query={query}")["data"]["result"]
            return {r["metric"]["instance"]: int(r["value"][1]) for r in result}

        deadline = time.monotonic() + 30
        while not all_up():
            assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)
        # two more scrapes of every target after the traffic, so every rate() has two samples
        after = scrapes()
        deadline = time.monotonic() + 30
        while not all(n >= after[target] + 2 for target, n in scrapes().items()):
            assert time.monotonic() < deadline, (scrapes(), after)
            time.sleep(0.5)
        yield base


QUERIES = [(name, expr) for name, exprs in dashboards.queries().items() for expr in exprs]


@pytest.mark.parametrize(
    ("board", "expr"), QUERIES, ids=[f"{b}:{i}" for i, (b, _) in enumerate(QUERIES)]
)
def test_every_panel_query_returns_data(scraped, board, expr):
    query = fill_variables(expr)
    body = http(f"{scraped}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
    assert body["status"] == "success", body
    assert body["data"]["result"], f"{board}: no data for {query}"


def test_every_template_variable_resolves(scraped):
    for name in dashboards.DASHBOARDS:
        board = json.loads((REPO / "charts/payloadrun/dashboards" / name).read_text())
        for var in board["templating"]["list"]:
            if var["type"] != "query":
                continue
            query = var["query"]["query"]  # label_values(metric{...}, label)
            inner = query[len("label_values(") : -1]
            selector, label = (part.strip() for part in inner.rsplit(",", 1))
            params = {"match[]": fill_variables(selector.replace('=~"$namespace"', '=~".*"'))}
            url = f"{scraped}/api/v1/label/{label}/values?" + urllib.parse.urlencode(params)
            values = http(url)["data"]
            assert values, f"{name}: variable {var['name']} has no values"


def test_every_alerting_rule_evaluates_and_stays_silent_when_healthy(scraped):
    expected = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    deadline = time.monotonic() + 30
    while True:
        groups = http(f"{scraped}/api/v1/rules?type=alert")["data"]["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        if set(rules) == expected and all(
            r.get("lastEvaluation", "0001").startswith("2") for r in rules.values()
        ):
            break
        assert time.monotonic() < deadline, f"rules not all evaluated: {sorted(rules)}"
        time.sleep(0.5)
    broken = {name: r.get("lastError") for name, r in rules.items() if r["health"] != "ok"}
    assert not broken, broken
    active = {name: r["alerts"] for name, r in rules.items() if r["state"] != "inactive"}
    assert not active, f"alerts active on a healthy system: {active}"
