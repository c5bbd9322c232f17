"""What every test folder needs first: the two dev-only packages importable; shared fixtures.

``hack/venv.sh`` installs both editable beside the product: the local cluster
(``payloadrun_devcluster``, ``cluster/``) and the development kit (``payloadrun_devkit``,
``devkit/``). From an environment that lacks them (``pip install -e .`` alone), the tests take
them from the checkout.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for package, home in (("payloadrun_devcluster", "cluster"), ("payloadrun_devkit", "devkit")):
    if importlib.util.find_spec(package) is None:
        sys.path.insert(0, str(REPO / home))

# What a test holds of what the machine has one of, by the fixtures it uses (directly or through
# another fixture): its marker says so, marked by hand or not. hack/test.py (make test) runs the
# suite as pytest processes at once by these markers, and `make unit` takes the tests with
# none of them: a test that reaches the node, a control plane or glusterd through a fixture never
# runs beside another that holds it (and glusterd's users take turns: glusterfs.machine_lock).
MACHINE_FIXTURES = {
    "kube_cluster": ("integration", "control_plane"),  # the session's control plane
    "node_cluster": ("integration", "node"),  # ... with its node, where pods run
    "node_binaries": ("integration", "node"),  # a node of the test's own
    "lws": ("integration", "node"),  # LeaderWorkerSet's controller, a pod on the session's node
    "kueue": ("integration", "node"),  # Kueue's controller manager, a pod on the session's node
    "gluster": ("sharedfs",),  # glusterd (it serves the node's volume too: glusterfs.machine_lock)
}


def machine_markers(fixturenames: list[str] | tuple[str, ...]) -> set[str]:
    """The markers a test using ``fixturenames`` (its whole fixture closure) must carry."""
    return {
        marker
        for name, markers in MACHINE_FIXTURES.items()
        if name in fixturenames
        for marker in markers
    }


def in_node_part(markers: set[str]) -> bool:
    """Whether hack/test.py's node part runs a test with ``markers``: its expression
    ``(integration or sharedfs) and not (integration and not node and not sharedfs)``."""
    machine = "integration" in markers or "sharedfs" in markers
    no_node = "integration" in markers and not {"node", "sharedfs"} & markers
    return machine and not no_node


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        wanted = machine_markers(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("node_lifecycle"):  # starts and stops nodes of its own
            wanted |= {"integration", "node"}
        for marker in wanted:
            if item.get_closest_marker(marker) is None:
                item.add_marker(marker)
    # hack/test.py's node part collects only these folders: a test it would run elsewhere would
    # run in no part. The unit part, which collects the whole suite, says so.
    node_paths = os.environ.get("PAYLOADRUN_NODE_PATHS")
    if node_paths:
        roots = [REPO / path for path in node_paths.split(os.pathsep)]
        lost = [
            item.nodeid
            for item in items
            if in_node_part({mark.name for mark in item.iter_markers()})
            and not any(item.path.is_relative_to(root) for root in roots)
        ]
        if lost:
            raise pytest.UsageError(
                f"{len(lost)} tests need the node or glusterd but lie outside hack/test.py's "
                f"NODE_PATHS ({node_paths}), which its node part collects: {lost[:5]}; move "
                "them there or add their folder to NODE_PATHS"
            )


@pytest.fixture
def busy_port():
    """A loopback port another socket holds (listening) for the test's length."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def compositions(monkeypatch):
    """How often each role's pod template was composed (by role), from now on: the real
    ``compose``, counted (tests/operator/test_build_once.py, tests/integration/test_one_pass.py)."""
    from collections import Counter

    from payloadrun_operator.desired import pods

    counts: Counter[str] = Counter()
    real = pods.compose

    def counting(template, parts):
        counts[parts.role] += 1
        return real(template, parts)

    monkeypatch.setattr(pods, "compose", counting)
    return counts
