"""What every test folder needs first: the two dev-only packages importable; shared fixtures.

``hack/venv.sh`` installs both editable beside the product: the local cluster
(``payloadrun_devcluster``, ``cluster/``) and the development kit (``payloadrun_devkit``,
``devkit/``). From an environment that lacks them (``pip install -e .`` alone), the tests take
them from the checkout.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for package, home in (("payloadrun_devcluster", "cluster"), ("payloadrun_devkit", "devkit")):
    if importlib.util.find_spec(package) is None:
        sys.path.insert(0, str(REPO / home))

# Fixtures that hold what the machine has one of: the control plane and its node, glusterd. A
# test that uses one, directly or through another fixture, carries its marker, so the unit half
# (``-m "not integration and not sharedfs"``: ``make unit``, and the half of ``make test`` that
# runs beside the cluster's, hack/test.py) never runs it beside them, marked by hand or not.
MACHINE_FIXTURES = {"kube_cluster": "integration", "gluster": "sharedfs"}


def machine_markers(fixturenames: list[str] | tuple[str, ...]) -> set[str]:
    """The markers a test using ``fixturenames`` (its whole fixture closure) must carry."""
    return {marker for name, marker in MACHINE_FIXTURES.items() if name in fixturenames}


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in machine_markers(getattr(item, "fixturenames", ())):
            if item.get_closest_marker(marker) is None:
                item.add_marker(marker)


@pytest.fixture
def busy_port():
    """A loopback port another socket holds (listening) for the test's length."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]
