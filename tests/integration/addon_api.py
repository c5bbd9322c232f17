"""An add-on's API in the control plane's tests: its CRDs (no controller), present or absent as a
test needs, whatever another test of the session did, and left as the module found it."""

from __future__ import annotations

from collections.abc import Callable


class AddonApi:
    """An add-on's API (its CRDs, no controller) installed or removed on demand: ``install()``,
    ``remove()``; at the module's end the cluster is left as the module found it."""

    def __init__(self, served: Callable[[], bool], install: Callable[[], None],
                 remove: Callable[[], None]) -> None:  # fmt: skip
        self.served, self._install, self._remove = served, install, remove
        self.there_before = served()

    def install(self) -> None:
        if not self.served():
            self._install()

    def remove(self) -> None:
        if self.served():
            self._remove()

    def restore(self) -> None:
        (self.install if self.there_before else self.remove)()
