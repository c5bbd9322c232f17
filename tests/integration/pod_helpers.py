"""Helpers of the tests that run a PayloadRun's pods on the local node, with the operator as a
host process that a test can restart or upgrade (the fixtures are in conftest.py)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from payloadrun_operator.testing import LocalOperator

REPO = Path(__file__).resolve().parents[2]
IMAGE = "payloadrun:e2e"
NEXT_IMAGE = "payloadrun:e2e-next"  # the same image under a new tag: an upgrade's new sidecars
# An orchestrator or trainer that waits until stopped, and stops at SIGTERM (not after the
# grace period, as a `python -c "time.sleep(...)"` as PID 1 would)
SLEEP = ["python", "-m", "payloadrun.testing.roles", "idle"]


class Operator:
    """The operator as a host process that a test can restart, or upgrade to other settings."""

    def __init__(self, cluster, namespace: str, tmp_path: Path) -> None:
        self.cluster, self.namespace, self.tmp_path = cluster, namespace, tmp_path
        self.process: LocalOperator | None = None
        self.starts = 0

    def start(self, sidecar_image: str = IMAGE) -> LocalOperator:
        self.stop()
        self.starts += 1
        self.process = LocalOperator(
            self.cluster.kubeconfig,
            namespaces=(self.namespace,),
            env={
                "PAYLOADRUN_SIDECAR_IMAGE": sidecar_image,
                "PAYLOADRUN_SIDECAR_IMAGE_PULL_POLICY": "Never",
                "PAYLOADRUN_READINESS_CHECK_SECONDS": "1",
            },
            log_path=self.tmp_path / f"operator-{self.starts}.log",
        ).start()
        return self.process

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def reconciled(self) -> float:
        """How many reconciles this operator process has applied (from its /metrics)."""
        assert self.process is not None
        with urllib.request.urlopen(self.process.metrics_url, timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith('payloadrun_operator_reconciles_total{result="applied"}'):
                    return float(line.split()[-1])
        return 0.0


def kubectl(cluster, namespace: str, *args: str, input: str | None = None) -> str:
    result = cluster.kubectl("-n", namespace, *args, input=input)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def get(cluster, namespace: str, *what: str) -> dict[str, Any]:
    return json.loads(kubectl(cluster, namespace, "get", *what, "-o", "json"))


def apply(cluster, namespace: str, manifest: dict[str, Any]) -> None:
    kubectl(cluster, namespace, "apply", "-f", "-", input=json.dumps(manifest))


def patch_run(cluster, namespace: str, name: str, patch: dict[str, Any]) -> None:
    kubectl(
        cluster, namespace, "patch", "payloadrun", name, "--type=merge", "-p", json.dumps(patch)
    )


def wait_for(
    what: str,
    probe: Callable[[], Any],
    timeout: float = 180.0,
    seen: Callable[[], Any] | None = None,
) -> Any:
    """``probe()`` once it is truthy; else fail with ``seen()`` (what there was instead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := probe():
            return result
        time.sleep(1)
    pytest.fail(f"timed out after {timeout} s waiting for {what}; saw {seen() if seen else None}")


def wait_for_phase(cluster, namespace: str, name: str, phase: str) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        return get(cluster, namespace, "payloadrun", name)

    return wait_for(
        f"{name} {phase}",
        lambda: (r := run()).get("status", {}).get("phase") == phase and r,
        seen=lambda: run().get("status"),
    )


def find(cluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    out = kubectl(cluster, namespace, "get", kind, name, "--ignore-not-found", "-o", "json")
    return json.loads(out) if out.strip() else None


def pods(cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return get(cluster, namespace, "pods", "-l", f"payloadrun.dev/run={name}")["items"]


def live_pods(cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(cluster, namespace, name)
        if p["status"].get("phase") in ("Pending", "Running")
        and not p["metadata"].get("deletionTimestamp")
    ]


def running(cluster, namespace: str, name: str) -> dict[str, Any]:
    return wait_for_phase(cluster, namespace, name, "Running")
