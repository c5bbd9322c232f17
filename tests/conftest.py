"""What every test folder needs first: the two dev-only packages importable.

``hack/venv.sh`` installs both editable beside the product: the local cluster
(``payloadrun_devcluster``, ``cluster/``) and the development kit (``payloadrun_devkit``,
``devkit/``). From an environment that lacks them (``pip install -e .`` alone), the tests take
them from the checkout.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for package, home in (("payloadrun_devcluster", "cluster"), ("payloadrun_devkit", "devkit")):
    if importlib.util.find_spec(package) is None:
        sys.path.insert(0, str(REPO / home))
