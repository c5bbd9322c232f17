"""What every test folder needs first: ``payloadrun_devcluster`` importable.

It is installed with the project (``pip install -e .``); from a checkout that is not, the tests
take it from ``cluster/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import payloadrun_devcluster  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
