"""The operator as a local process against a cluster: for tests, benchmarks and the demo::

    with LocalOperator(kubeconfig) as op:
        print(op.metrics_url)

The process gets loopback-only metrics and liveness ports, its own log file, and is stopped with
SIGTERM (then SIGKILL) when the block ends. Importing this module does not import kopf.

It runs as in the operator image, which has no Kubernetes client library: the development
environment has the ``kubernetes`` package (the tests' client), and kopf imports it whenever it
can (its ``thirdparty`` module, at ``import kopf``), which costs memory (11 MiB at the
operator's start, bench/operator.py) and would hide an accidental dependence on it. The child
process makes ``import kubernetes`` (and ``kubernetes_asyncio``, ``pykube``) fail, as it does
in the image; ``client_libraries=True`` lets it import them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from payloadrun.settings import env_of
from payloadrun.testing.processes import free_port
from payloadrun_operator.api.names import OPERATOR_CONTAINER
from payloadrun_operator.platform.settings import OperatorSettings

# The client libraries kopf uses when it can import them; the operator image has none of them.
CLIENT_LIBRARIES = ("kubernetes", "kubernetes_asyncio", "pykube")
# `python -c` this, then the operator's arguments: the operator with those imports failing.
AS_IN_THE_IMAGE = (
    "import sys\n"
    f"sys.modules.update(dict.fromkeys({CLIENT_LIBRARIES!r}))  # None: the import fails\n"
    "from payloadrun_operator.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
METRICS_PORT_ENV = env_of(OperatorSettings, "metrics_port")
HEALTH_PORT_ENV = env_of(OperatorSettings, "health_port")
# The chart's container gets ports for its pod; a local process gets free loopback ports.
_LOCAL_PORT_SETTINGS = (METRICS_PORT_ENV, HEALTH_PORT_ENV)


def operator_env_from_deployment(deployment: dict[str, Any]) -> dict[str, str]:
    """The operator container's environment in a Deployment (the chart's), minus its ports."""
    (container,) = [
        c
        for c in deployment["spec"]["template"]["spec"]["containers"]
        if c["name"] == OPERATOR_CONTAINER
    ]
    return {
        e["name"]: e["value"]
        for e in container.get("env", [])
        if "value" in e and e["name"] not in _LOCAL_PORT_SETTINGS
    }


class LocalOperator:
    def __init__(
        self,
        kubeconfig: str | os.PathLike[str],
        *,
        namespaces: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        client_libraries: bool = False,
    ) -> None:
        self.kubeconfig = str(kubeconfig)
        self.client_libraries = client_libraries
        self.namespaces = namespaces
        self.extra_env = dict(env or {})
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="payloadrun-operator-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.starts = 0  # how often start() ran
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/healthz"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("the operator is not running")
        return self.process.pid

    def start(self, timeout: float = 60.0) -> LocalOperator:
        if self.starts:
            # a restart takes fresh ports: the last ones were free while this process held them,
            # and any process on the machine may have taken one since (make test runs four parts
            # at once); the restarted operator then exited "cannot listen on port ...: in use",
            # while the other process's /healthz answered 200 for it
            self.metrics_port, self.health_port = free_port(), free_port()
        self.starts += 1
        env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            METRICS_PORT_ENV: str(self.metrics_port),
            HEALTH_PORT_ENV: str(self.health_port),
            **self.extra_env,
        }
        if self.client_libraries:
            args = [sys.executable, "-m", "payloadrun_operator"]
        else:
            args = [sys.executable, "-c", AS_IN_THE_IMAGE]
        args += ["--host", "127.0.0.1"]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child keeps it open)
        try:
            self.process = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        self._wait_healthy(timeout)
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"the operator exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.health_url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the operator was not healthy after {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> LocalOperator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
