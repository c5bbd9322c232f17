"""The payload root as the writer sees it: a store opened on first use, and a write probe.

The root may not be mounted yet when the sidecar starts (or may go away): the writer still
serves, sends responses inline, and reports not ready, instead of crash-looping.
"""

from __future__ import annotations

import os
import threading
import uuid

from payloadrun.paths import PayloadPathError
from payloadrun.settings import Env
from payloadrun.store import PayloadStore


class StoreHolder:
    """The payload store, opened on first use and reopened while the root is missing.

    ``get`` runs on worker threads only (it stats the root, which can hang on a dead NFS mount).
    """

    def __init__(self, root: str | None) -> None:
        self.root = root
        self._store: PayloadStore | None = None
        self._lock = threading.Lock()
        self.error = f"no payload root configured: set --payload-root or {Env.PAYLOAD_ROOT}"

    @property
    def opened(self) -> PayloadStore | None:
        """The store if it was opened, without touching the volume (safe on the event loop)."""
        return self._store

    def get(self) -> PayloadStore | None:
        """The store, opened now if it was not (no lock is held while the volume is asked: a
        hung mount holds only the threads that ask it, never those that wait for a lock)."""
        if self._store is not None or self.root is None:
            return self._store
        try:
            store = PayloadStore(self.root)
        except PayloadPathError as exc:
            self.error = str(exc)
            return None
        with self._lock:
            if self._store is None:
                self._store = store
            return self._store


# the background probe's file, created and deleted at once: the only file the writer makes in
# the root that no answer names
PROBE_PREFIX = ".payloadrun-writer-probe-"


def probe_root(holder: StoreHolder) -> str | None:
    """None when a file can be created and deleted in the payload root, else what failed."""
    store = holder.get()
    if store is None:
        return holder.error
    path = store.root.path / f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
        os.unlink(path)
    except OSError as exc:
        return f"payload root {str(store.root.path)!r} is not writable: {exc}"
    return None
