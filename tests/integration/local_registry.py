"""A real OCI registry on loopback, for the release path's end-to-end test.

distribution's ``registry`` (github.com/distribution/distribution/v3, the registry Docker Hub's and
GHCR's API descend from), built by ``cluster/build.sh`` at the version of ``cluster/versions.env``,
runs as a managed process on ``127.0.0.1:<free port>`` with its storage in a directory of the
test's. It speaks plain HTTP: ``hack/publish.sh ... --plain-http`` pushes to it, helm installs from
it with ``--plain-http``, and the node's containerd pulls from it once
:meth:`~payloadrun_devcluster.node.LocalNode.trust_plain_http_registry` names it.

Its access log (one line per request, with the client's User-Agent) is how a test tells that
containerd, not an import, brought an image into the node.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from payloadrun.testing.processes import free_port, wait_http
from payloadrun_devcluster.binaries import cache_dir, read_versions
from payloadrun_devcluster.processes import ManagedProcess
from payloadrun_devkit.required import skip_or_fail

# a gorilla/handlers combined log line: "GET /v2/... HTTP/1.1" 200 1234 "referer" "user agent"
ACCESS = re.compile(
    r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[0-9.]+" (?P<status>\d{3}) .*"(?P<agent>[^"]*)"$'
)


def registry_binary() -> Path:
    """The built registry, or a skip (a failure under ``PAYLOADRUN_REQUIRE_CLUSTER``)."""
    version = read_versions()["REGISTRY_VERSION"]
    binary = cache_dir() / "bin" / f"registry-{version}" / "registry"
    if not os.access(binary, os.X_OK):
        skip_or_fail(f"the OCI registry {version} is not built ({binary}): bash cluster/build.sh")
    return binary


def registry_config(port: int, storage: Path) -> dict:
    """distribution's configuration: loopback, plain HTTP, filesystem storage, access log on."""
    return {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    status: int
    agent: str


@dataclass
class LocalRegistry:
    process: ManagedProcess
    port: int

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, directory: Path, attempts: int = 3) -> LocalRegistry:
        """Started and answering ``GET /v2/``; a port taken between choosing it and binding it
        makes the registry exit, and another port is tried."""
        binary = registry_binary()
        for attempt in range(attempts):
            port = free_port()
            config = directory / f"config-{port}.json"  # JSON is YAML
            config.write_text(json.dumps(registry_config(port, directory / "storage")))
            process = ManagedProcess.spawn(
                "registry",
                [str(binary), "serve", str(config)],
                directory / f"registry-{port}.log",
                cwd=directory,
                die_with_parent=True,
                # no OpenTelemetry exporter dialling localhost:4318 for nothing
                env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
            )
            try:
                wait_http(f"http://127.0.0.1:{port}/v2/", timeout=30, process=process.popen)
            except OSError:
                process.stop()
                if attempt == attempts - 1:
                    raise RuntimeError(
                        f"the registry did not answer on 127.0.0.1:{port}; its log:\n"
                        + process.log_tail()
                    ) from None
                continue
            return cls(process, port)
        raise AssertionError("unreachable")

    def stop(self) -> None:
        self.process.stop()

    def requests(self) -> list[Request]:
        """Every request the registry has logged so far."""
        found = []
        for line in self.process.log_path.read_text(errors="replace").splitlines():
            if match := ACCESS.search(line):
                found.append(
                    Request(match["method"], match["path"], int(match["status"]), match["agent"])
                )
        return found
