"""Bounded labels for why a file system call failed, shared by the writer and the retention side.

Only the standard library: the retention sidecar's deletion worker imports it, and stays small.
"""

from __future__ import annotations

import errno

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_DENIED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
# the volume, or its server, is not there: a local disk that went, NFS's stale handles and
# timeouts, a GlusterFS client whose brick is down (ENOTCONN)
_GONE = frozenset(
    {
        errno.ENOENT,
        errno.ESTALE,
        errno.ENOTDIR,
        errno.ENODEV,
        errno.EIO,
        errno.ENOTCONN,
        errno.ETIMEDOUT,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ECONNREFUSED,
    }
)


def failure_reason(exc: OSError) -> str:
    """A bounded label for why a write failed: no_space, permission, volume_gone or io_error."""
    if exc.errno in _NO_SPACE:
        return "no_space"
    if exc.errno in _DENIED:
        return "permission"
    if exc.errno in _GONE:
        return "volume_gone"
    return "io_error"
