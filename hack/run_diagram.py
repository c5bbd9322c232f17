"""Generate docs/run-diagram.md: a run's pods, ports, Services and network policies, as rendered.

    python hack/run_diagram.py            # rewrite the page
    python hack/run_diagram.py --check    # exit 1 when it differs from what this would write

The picture is drawn from ``payloadrun-operator render -f examples/multinode-by-handle.yaml``
(the operator's own builders, no cluster), never by hand: every container, port, Service, volume
mount and allowed flow on the page is one the operator renders, so a changed port or policy
changes the page, and ``--check`` (run by tests/integration/test_docs.py and
tests/docs/test_run_diagram.py) fails until it is regenerated. The operator's settings are its
defaults: the ``PAYLOADRUN_*`` variables of the calling shell are left out.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/multinode-by-handle.yaml"
PAGE = REPO / "docs" / "run-diagram.md"
COMPONENT = "app.kubernetes.io/component"
RUN_LABEL = "payloadrun.dev/run"
WORKLOADS = ("StatefulSet", "Job")


def rendered(example: str = EXAMPLE) -> list[dict[str, Any]]:
    """The manifests ``render`` prints for ``example``, with the operator's default settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAYLOADRUN_")}
    result = subprocess.run(
        [sys.executable, "-m", "payloadrun_operator", "render", "-f", example],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"render -f {example} failed ({result.returncode}): {result.stderr}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@dataclass(frozen=True)
class Container:
    name: str
    sidecar: bool  # a native sidecar: an init container with restartPolicy Always
    ports: tuple[tuple[str, int], ...]
    mounts: tuple[tuple[str, str, bool], ...]  # volume, path, read-only
    env: dict[str, str]


@dataclass(frozen=True)
class Workload:
    kind: str
    name: str
    component: str
    pods: int
    containers: tuple[Container, ...]
    volumes: dict[str, str]  # volume name -> what it is


def _container(c: dict[str, Any], sidecar: bool) -> Container:
    return Container(
        name=c["name"],
        sidecar=sidecar,
        ports=tuple((p.get("name", ""), p["containerPort"]) for p in c.get("ports", [])),
        mounts=tuple(
            (m["name"], m["mountPath"], bool(m.get("readOnly", False)))
            for m in c.get("volumeMounts", [])
        ),
        env={e["name"]: e["value"] for e in c.get("env", []) if "value" in e},
    )


def _volume(v: dict[str, Any]) -> str:
    if "persistentVolumeClaim" in v:
        return f"claim {v['persistentVolumeClaim']['claimName']}"
    if "configMap" in v:
        return f"ConfigMap {v['configMap']['name']}"
    if "emptyDir" in v:
        return "emptyDir" + (f" ({v['emptyDir']['medium']})" if v["emptyDir"].get("medium") else "")
    return next(iter(k for k in v if k != "name"), "?")


def workloads(manifests: list[dict[str, Any]]) -> list[Workload]:
    out = []
    for m in manifests:
        if m["kind"] not in WORKLOADS:
            continue
        spec = m["spec"]
        pod = spec["template"]["spec"]
        sidecars = [
            _container(c, True) for c in pod.get("initContainers", [])
            if c.get("restartPolicy") == "Always"
        ]  # fmt: skip
        out.append(
            Workload(
                kind=m["kind"],
                name=m["metadata"]["name"],
                component=m["metadata"]["labels"][COMPONENT],
                pods=spec["replicas"] if m["kind"] == "StatefulSet" else spec["parallelism"],
                containers=(*[_container(c, False) for c in pod["containers"]], *sidecars),
                volumes={v["name"]: _volume(v) for v in pod.get("volumes", [])},
            )
        )
    return out


def _peer(peer: dict[str, Any], run: str) -> str:
    pods = peer.get("podSelector", {}).get("matchLabels", {})
    if "ipBlock" in peer:
        return f"ipBlock {peer['ipBlock']['cidr']}"
    if pods == {RUN_LABEL: run} and "namespaceSelector" not in peer:
        return "every pod of the run"
    where = "any namespace" if peer.get("namespaceSelector") == {} else "its namespace"
    if "namespaceSelector" in peer and peer["namespaceSelector"] != {}:
        where = f"namespaces {peer['namespaceSelector']}"
    labels = ", ".join(f"{k}={v}" for k, v in pods.items()) or "any pod"
    return f"pods {labels} ({where})"


def ingress_rules(manifests: list[dict[str, Any]], run: str) -> list[tuple[str, str, str]]:
    """(to component, from peer, ports) for every ingress rule of the run's NetworkPolicies."""
    rules = []
    for m in manifests:
        if m["kind"] != "NetworkPolicy":
            continue
        to = m["spec"]["podSelector"]["matchLabels"][COMPONENT]
        for rule in m["spec"].get("ingress", []):
            ports = ", ".join(
                f"{p['port']}/{p.get('protocol', 'TCP')}" for p in rule.get("ports", [])
            )
            for peer in rule.get("from", []):
                rules.append((to, _peer(peer, run), ports or "every port"))
    return rules


def services(manifests: list[dict[str, Any]]) -> list[tuple[str, bool, str, list[tuple[str, int]]]]:
    """(name, headless, component, [(port name, port)]) of every Service."""
    return [
        (
            m["metadata"]["name"],
            m["spec"].get("clusterIP") == "None",
            m["spec"]["selector"][COMPONENT],
            [(p.get("name", ""), p["port"]) for p in m["spec"]["ports"]],
        )
        for m in manifests
        if m["kind"] == "Service"
    ]


# The operator's variables that hold an address another container listens on.
URL_VARIABLES = (
    "PAYLOADRUN_INFERENCE_URL",
    "PAYLOADRUN_RETENTION_URL",
    "PAYLOADRUN_WRITER_UPSTREAM",
)


def _listens_on(c: Container, port: int) -> bool:
    """A container that declares ``port``, or is told to listen on it (a loopback-only port)."""
    return any(p == port for _, p in c.ports) or any(
        name.endswith("_PORT") and value == str(port) for name, value in c.env.items()
    )


def _url_edge(w: Workload, c: Container, var: str, svcs: list) -> str | None:
    """The arrow from ``c`` to what its variable ``var`` names: a Service or a container of its
    own pod on loopback."""
    parts = urlsplit(c.env[var])
    host, port = parts.hostname or "", parts.port
    source = _id(f"{w.component}_{c.name}")
    target = next((s for s in svcs if host.startswith(f"{s[0]}.")), None)
    if target is not None:
        return f'  {source} -- "{var}<br/>:{port}" --> {_id(target[0])}'
    if host in ("127.0.0.1", "localhost"):
        local = next((o for o in w.containers if o is not c and _listens_on(o, port)), None)
        if local is not None:
            target_id = _id(f"{w.component}_{local.name}")
            return f'  {source} -- "{var}<br/>127.0.0.1:{port}" --> {target_id}'
    return None


def _id(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def mermaid(run: str, loads: list[Workload], svcs: list, rules: list) -> list[str]:
    lines = ["```mermaid", "flowchart LR"]
    for w in loads:
        lines.append(
            f'  subgraph {_id(w.component)}["{w.component}: {w.kind} {w.name}, {w.pods} pod(s)"]'
        )
        for c in w.containers:
            ports = " ".join(f"{n}:{p}" if n else str(p) for n, p in c.ports) or "no port"
            kind = "sidecar " if c.sidecar else ""
            lines.append(f'    {_id(w.component + "_" + c.name)}["{kind}{c.name}<br/>{ports}"]')
        lines.append("  end")
    for name, headless, component, ports in svcs:
        shown = " ".join(f"{n}:{p}" if n else str(p) for n, p in ports)
        shape = "Service (headless)" if headless else "Service"
        lines.append(f'  {_id(name)}(["{shape} {name}<br/>{shown}"]) --> {_id(component)}')
    # the addresses the operator hands the containers: Services by name, sidecars on loopback
    for w in loads:
        for c in w.containers:
            for var in URL_VARIABLES:
                if var in c.env:
                    edge = _url_edge(w, c, var, svcs)
                    if edge:
                        lines.append(edge)
    peers: dict[str, str] = {}
    for to, peer, ports in rules:
        if peer == "every pod of the run":
            continue
        if peer not in peers:
            peers[peer] = f"peer{len(peers)}"
            lines.append(f'  {peers[peer]}[/"{peer}"/]')
        lines.append(f'  {peers[peer]} -. "{ports}" .-> {_id(to)}')
    lines.append("```")
    return lines


def page(manifests: list[dict[str, Any]]) -> str:
    run_obj = next(m for m in manifests if m["kind"] in WORKLOADS)
    run = run_obj["metadata"]["labels"][RUN_LABEL]
    loads, svcs, rules = workloads(manifests), services(manifests), ingress_rules(manifests, run)
    lines = [
        "# A run's pods, ports and network policies",
        "",
        "<!-- Generated by hack/run_diagram.py from `payloadrun-operator render`; do not edit. -->",
        "",
        f"What the operator makes of [{EXAMPLE}](../{EXAMPLE}) (run `{run}`), read off",
        f"`payloadrun-operator render -f {EXAMPLE}` with the operator's default settings: the",
        "containers and their ports, the Services, the volume mounts and the flows the run's",
        "NetworkPolicies allow. `hack/run_diagram.py` draws this page from that output and its",
        "`--check` (a test) fails when the page and the rendered manifests differ. Run `render` on",
        "your own run for its picture in YAML.",
        "",
        "Solid arrows: a Service to its pods, and the addresses the operator hands the",
        "containers (the orchestrator's `PAYLOADRUN_INFERENCE_URL` and `PAYLOADRUN_RETENTION_URL`,",
        "the writer's `PAYLOADRUN_WRITER_UPSTREAM`). Dotted arrows:",
        "who else the NetworkPolicies let in, on which ports. Not drawn, since it holds for every",
        "pair: every pod of the run reaches every port of every other pod of the run (NCCL's,",
        "Gloo's and NIXL's bootstraps open ports no template declares). Anything else is refused",
        "on a CNI that enforces NetworkPolicy.",
        "",
        *mermaid(run, loads, svcs, rules),
        "",
        "## Pods and containers",
        "",
        "| workload | pods | container | ports | mounts (volume: path) |",
        "|---|---|---|---|---|",
    ]
    for w in loads:
        for c in w.containers:
            ports = ", ".join(f"`{n}` {p}" if n else str(p) for n, p in c.ports) or "none"
            mounts = ", ".join(
                f"`{v}` ({w.volumes.get(v, '?')}): `{path}`{' read-only' if ro else ''}"
                for v, path, ro in c.mounts
            ) or "none"  # fmt: skip
            kind = " (native sidecar)" if c.sidecar else ""
            lines.append(
                f"| {w.kind} `{w.name}` | {w.pods} | `{c.name}`{kind} | {ports} | {mounts} |"
            )
    lines += ["", "## Services", "", "| Service | kind | pods | ports |", "|---|---|---|---|"]
    for name, headless, component, ports in svcs:
        shown = ", ".join(f"`{n}` {p}" if n else str(p) for n, p in ports)
        kind = "headless (every pod by name)" if headless else "load-balanced"
        lines.append(f"| `{name}` | {kind} | {component} | {shown} |")
    lines += [
        "",
        "## Who may connect (NetworkPolicy ingress)",
        "",
        "| to the pods of | from | ports |",
        "|---|---|---|",
    ]
    for to, peer, ports in rules:
        lines.append(f"| {to} | {peer} | {ports} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the page differs")
    args = parser.parse_args()
    text = page(rendered())
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"stale: {PAGE.relative_to(REPO)}; run python hack/run_diagram.py")
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
