"""Generate the chart's Grafana dashboards (charts/payloadrun/dashboards/*.json).

    python hack/dashboards.py            # rewrite the JSON files and docs/dashboards.md
    python hack/dashboards.py --check    # exit 1 when they differ from what this would write

Dashboards as code: every panel's query is written once here, the JSON follows Grafana's current
schema (``python hack/dashboard-schema/check_dashboards.py`` checks it against Grafana's published
types, and a chart test runs that check), the datasource is the ``${datasource}`` template
variable (never a fixed uid), and each dashboard has a fixed uid so links survive
re-provisioning. ``queries()`` lists every expression, which the Prometheus test evaluates against
live sidecars.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "charts" / "payloadrun" / "dashboards"
PAGE = REPO / "docs" / "dashboards.md"
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
RUN = 'namespace=~"$namespace", run=~"$run"'
# A multi-value variable's saved selection, "All" (Grafana's schema requires text and value).
ALL = {"text": ["All"], "value": ["$__all"]}


def panel(
    title: str,
    exprs: list[tuple[str, str]],
    unit: str,
    *,
    description: str,
    width: int = 12,
    stack: bool = False,
) -> dict[str, Any]:
    custom: dict[str, Any] = {"lineWidth": 1, "fillOpacity": 10 if stack else 0}
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"w": width, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "options": {
            "legend": {
                "displayMode": "list",
                "placement": "bottom",
                "showLegend": True,
                "calcs": [],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(exprs)
        ],
    }


def variables(metric: str, with_run: bool = True) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "hide": 0,
        },
        {
            "name": "namespace",
            "label": "Namespace",
            "type": "query",
            "datasource": DS,
            "query": {"query": f"label_values({metric}, namespace)", "refId": "namespace"},
            "includeAll": True,
            "allValue": ".*",
            "multi": True,
            "refresh": 2,
            "current": ALL,
            "hide": 0,
        },
    ]
    if with_run:
        out.append(
            {
                "name": "run",
                "label": "PayloadRun",
                "type": "query",
                "datasource": DS,
                "query": {
                    "query": f'label_values({metric}{{namespace=~"$namespace"}}, run)',
                    "refId": "run",
                },
                "includeAll": True,
                "allValue": ".*",
                "multi": True,
                "refresh": 2,
                "current": ALL,
                "hide": 0,
            }
        )
    return out


def dashboard(uid: str, title: str, description: str, panels: list, templating: list) -> dict:
    x = y = 0
    laid = []
    for i, p in enumerate(panels):
        w = p["gridPos"]["w"]
        if x + w > 24:
            x, y = 0, y + 8
        laid.append({**p, "id": i + 1, "gridPos": {**p["gridPos"], "x": x, "y": y}})
        x += w
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["payloadrun"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-3h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "templating": {"list": templating},
        "annotations": {"list": []},
        "links": [],
        "panels": laid,
    }


def retention_dashboard() -> dict:
    r = "payloadrun_retention_"
    panels = [
        panel(
            "Payload directory size",
            [(f"sum by (namespace, run) ({r}directory_bytes{{{RUN}}})", "{{namespace}}/{{run}}")],
            "bytes",
            description="Bytes of payload files under each run's root (accounting, corrected "
            "by the periodic scan). Delete-on-consume keeps it near a few batches.",
        ),
        panel(
            "Payload files",
            [(f"sum by (namespace, run) ({r}directory_files{{{RUN}}})", "{{namespace}}/{{run}}")],
            "short",
            description="Payload files under each run's root.",
        ),
        panel(
            "Files deleted per second, by reason",
            [
                (
                    f"sum by (reason) (rate({r}deleted_files_total{{{RUN}}}[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            "ops",
            stack=True,
            description="consumed: read by the trainer; discarded: no batch will read them; "
            "backstop: v<k> past the staleness bound; wipe: a fresh run's start.",
        ),
        panel(
            "Bytes deleted per second, by reason",
            [
                (
                    f"sum by (reason) (rate({r}deleted_bytes_total{{{RUN}}}[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            "Bps",
            stack=True,
            description="Bytes freed per second.",
        ),
        panel(
            "Deletion duration per policy update",
            [
                (
                    "histogram_quantile(0.5, sum by (le) (rate("
                    f"{r}policy_update_delete_seconds_bucket{{{RUN}}}[$__rate_interval])))",
                    "p50",
                ),
                (
                    "histogram_quantile(0.95, sum by (le) (rate("
                    f"{r}policy_update_delete_seconds_bucket{{{RUN}}}[$__rate_interval])))",
                    "p95",
                ),
            ],
            "s",
            description="From policy_updated to its last file unlinked, in the background "
            "(tens of seconds on NFS at batch 512 is expected).",
        ),
        panel(
            "Pending batches and files",
            [
                (f"sum by (run) ({r}pending_batches{{{RUN}}})", "batches {{run}}"),
                (f"sum by (run) ({r}pending_files{{{RUN}}})", "files {{run}}"),
                (f"sum by (run) ({r}delete_queue_files{{{RUN}}})", "queued for deletion {{run}}"),
            ],
            "short",
            description="Recorded batches the trainer has not consumed, their files, and files "
            "waiting in the deletion queue.",
        ),
        panel(
            "Policy step and version directories",
            [
                (f"max by (run) ({r}policy_step{{{RUN}}})", "policy step {{run}}"),
                (f"max by (run) ({r}version_directories{{{RUN}}})", "v<k> dirs {{run}}"),
            ],
            "short",
            description="The last policy step reported, and how many v<k> directories exist.",
        ),
        panel(
            "Delete errors and scan duration",
            [
                (
                    f"sum by (error) (rate({r}delete_errors_total{{{RUN}}}[$__rate_interval]))",
                    "errors: {{error}}",
                ),
                (
                    "histogram_quantile(0.95, sum by (le) (rate("
                    f"{r}scan_duration_seconds_bucket{{{RUN}}}[$__rate_interval])))",
                    "scan p95 (s)",
                ),
            ],
            "short",
            description="Failed unlink attempts per second (retried), and the periodic "
            "directory scan's p95 duration.",
        ),
    ]
    return dashboard(
        "payloadrun-retention",
        "payloadrun / payload directory and retention",
        "Size of each run's payload directory and what the retention sidecar deletes.",
        panels,
        variables(f"{r}directory_bytes"),
    )


def writer_dashboard() -> dict:
    w = "payloadrun_writer_"
    panels = [
        panel(
            "Payload bytes written per second, by field",
            [
                (
                    "sum by (field) "
                    f"(rate({w}payload_written_bytes_total{{{RUN}}}[$__rate_interval]))",
                    "{{field}}",
                )
            ],
            "Bps",
            stack=True,
            description="Routed experts and sampling masks written to payload files.",
        ),
        panel(
            "Inline bytes kept off the wire per second",
            [
                (
                    "sum by (run) "
                    f"(rate({w}response_reduction_bytes_total{{{RUN}}}[$__rate_interval]))",
                    "{{run}}",
                ),
                (
                    f"sum by (run) (rate({w}response_bytes_total{{{RUN}}}[$__rate_interval]))",
                    "sent {{run}}",
                ),
            ],
            "Bps",
            description="Response bytes the orchestrator did not have to receive and buffer, "
            "against the bytes actually sent.",
        ),
        panel(
            "Requests per second, by mode and HTTP code",
            [
                (
                    f"sum by (mode, code) (rate({w}requests_total{{{RUN}}}[$__rate_interval]))",
                    "{{mode}} {{code}}",
                )
            ],
            "reqps",
            stack=True,
            description="handle: arrays by handle; inline: asked by handle but sent inline; "
            "passthrough: everything else; rejected: bad payload_dir.",
        ),
        panel(
            "Write-and-fsync latency",
            [
                (
                    "histogram_quantile(0.5, sum by (le) (rate("
                    f"{w}payload_write_seconds_bucket{{{RUN}}}[$__rate_interval])))",
                    "p50",
                ),
                (
                    "histogram_quantile(0.99, sum by (le) (rate("
                    f"{w}payload_write_seconds_bucket{{{RUN}}}[$__rate_interval])))",
                    "p99",
                ),
            ],
            "s",
            description="Writing, fsyncing and closing one payload file, before the response.",
        ),
        panel(
            "Fallbacks to inline, by reason",
            [
                (
                    f"sum by (reason) (rate({w}fallbacks_total{{{RUN}}}[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            "reqps",
            description="Responses sent inline because the payload could not be written "
            "(no_space, permission, volume_gone, ...): nothing was lost, but check the volume.",
        ),
        panel(
            "Upstream failures and requests in flight",
            [
                (
                    f"sum by (kind) (rate({w}upstream_failures_total{{{RUN}}}[$__rate_interval]))",
                    "vLLM {{kind}}",
                ),
                (f"sum by (run) ({w}requests_in_flight{{{RUN}}})", "in flight {{run}}"),
            ],
            "short",
            description="Requests vLLM did not answer (502/504), and requests being served.",
        ),
    ]
    return dashboard(
        "payloadrun-writer",
        "payloadrun / writer sidecars",
        "Throughput, latency and fallbacks of the writer sidecars beside vLLM.",
        panels,
        variables(f"{w}requests_total"),
    )


def operator_dashboard() -> dict:
    o = "payloadrun_operator_"
    ns = 'namespace=~"$namespace"'
    panels = [
        panel(
            "Reconciles per second, by result",
            [
                (
                    f"sum by (result) (rate({o}reconciles_total{{{ns}}}[$__rate_interval]))",
                    "{{result}}",
                )
            ],
            "ops",
            stack=True,
            description="applied: children applied; rejected: the spec was refused; "
            "error: the API server refused a child (retried).",
        ),
        panel(
            "Reconcile duration",
            [
                (
                    "histogram_quantile(0.95, sum by (le) (rate("
                    f"{o}reconcile_duration_seconds_bucket{{{ns}}}[$__rate_interval])))",
                    "p95",
                )
            ],
            "s",
            description="Validating, building and applying one run's children.",
        ),
        panel(
            "Runs by phase and payload mode",
            [(f"sum by (phase, mode) ({o}runs{{{ns}}})", "{{phase}} {{mode}}")],
            "short",
            width=24,
            description="PayloadRuns the operator handles, by phase: Provisioning, Running, "
            "Suspended, Succeeded and Failed (final, until the run is deleted), Rejected.",
        ),
    ]
    return dashboard(
        "payloadrun-operator",
        "payloadrun / operator",
        "Reconciles and runs of the payloadrun operator.",
        panels,
        variables(f"{o}reconciles_total", with_run=False),
    )


DASHBOARDS = {
    "payloadrun-retention.json": retention_dashboard,
    "payloadrun-writer.json": writer_dashboard,
    "payloadrun-operator.json": operator_dashboard,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2) + "\n"


def queries() -> dict[str, list[str]]:
    """Every panel expression, by dashboard file."""
    return {
        name: [t["expr"] for p in build()["panels"] for t in p["targets"]]
        for name, build in DASHBOARDS.items()
    }


METRIC = re.compile(r"\bpayloadrun_[a-z_]+")


def _cell(text: str) -> str:
    """Text for a Markdown table cell: no column breaks, no angle brackets read as HTML."""
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def panel_metrics(panel: dict[str, Any]) -> list[str]:
    """The payloadrun metrics a panel reads, histogram series named by their histogram."""
    names = {name for target in panel["targets"] for name in METRIC.findall(target["expr"])}
    return sorted({name.removesuffix("_bucket") for name in names})


def page(dashboards: dict[str, dict[str, Any]]) -> str:
    """docs/dashboards.md: every dashboard's panels, from the JSON this script writes."""
    lines = [
        "# Dashboards",
        "",
        "<!-- Generated by hack/dashboards.py from the dashboards' JSON; do not edit. -->",
        "",
        "The chart installs these Grafana dashboards as ConfigMaps labelled "
        '`grafana_dashboard: "1"` (`dashboards.enabled`, on by default), for Grafana\'s '
        "dashboard sidecar. Each has a `Data source` variable (any Prometheus that scrapes the "
        "chart's PodMonitor and ServiceMonitor jobs), a `Namespace` variable and, for the "
        "sidecars' dashboards, a `PayloadRun` variable. The metrics are in "
        "[metrics.md](metrics.md); `hack/dashboards.py` writes the JSON and this page, and a "
        "test evaluates every panel's query against a real Prometheus scraping live sidecars.",
    ]
    for name, board in dashboards.items():
        variables = ", ".join(f"`{v['label']}`" for v in board["templating"]["list"])
        lines += [
            "",
            f"## {board['title']}",
            "",
            f"{board['description']} File "
            f"[`charts/payloadrun/dashboards/{name}`](../charts/payloadrun/dashboards/{name}), "
            f"uid `{board['uid']}`, variables {variables}.",
            "",
            "| panel | unit | what it shows | series (legend) | metrics |",
            "|---|---|---|---|---|",
        ]
        for p in board["panels"]:
            legends = ", ".join(f"`{t['legendFormat']}`" for t in p["targets"])
            metrics = ", ".join(f"`{m}`" for m in panel_metrics(p))
            unit = p["fieldConfig"]["defaults"]["unit"]
            lines.append(
                f"| {_cell(p['title'])} | `{unit}` | {_cell(p['description'])} | {legends} "
                f"| {metrics} |"
            )
    return "\n".join(lines) + "\n"


def outputs() -> dict[Path, str]:
    """Every file this script writes, with its text."""
    files = {OUT / name: render(build) for name, build in DASHBOARDS.items()}
    files[PAGE] = page({name: build() for name, build in DASHBOARDS.items()})
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the files differ")
    args = parser.parse_args()
    stale = []
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(REPO)))
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python hack/dashboards.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
