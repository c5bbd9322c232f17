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


@pytest.fixture
def busy_port():
    """A loopback port another socket holds (listening) for the test's length."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]
