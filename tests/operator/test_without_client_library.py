"""The operator as its image runs it: no Kubernetes client library can be imported.

The development environment has the ``kubernetes`` package (the tests' client) and kopf imports
it whenever it can; :class:`LocalOperator` and bench/operator.py make that import fail, as it does
in the image. Here: the operator and its handlers load without it, and nothing imports it.
"""

from __future__ import annotations

import subprocess
import sys

from payloadrun_devkit.local_operator import AS_IN_THE_IMAGE, CLIENT_LIBRARIES

CHECK = f"""
import sys
sys.modules.update(dict.fromkeys({CLIENT_LIBRARIES!r}))
import kopf
from payloadrun_operator.__main__ import build_parser
from payloadrun_operator.handlers import register
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.runtime import Operator
from payloadrun_operator.platform.settings import OperatorSettings
register(kopf.OperatorRegistry(), Operator(OperatorSettings(), KubeClient(), OperatorMetrics()))
print(sorted(m for m in sys.modules if m.split(".")[0] in {CLIENT_LIBRARIES!r} and sys.modules[m]))
"""


def test_the_operator_loads_and_registers_without_a_client_library():
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_the_local_operator_launcher_runs_the_operators_main():
    out = subprocess.run(
        [sys.executable, "-c", AS_IN_THE_IMAGE, "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("payloadrun-operator ")
