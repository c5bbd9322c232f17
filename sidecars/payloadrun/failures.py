"""Which bounded label a file system call's error gets, shared by the writer and the retention side.

The labels are :class:`payloadrun.reasons.WriteFailure`. Only the standard library: the retention
sidecar's deletion worker imports it, and stays small.
"""

from __future__ import annotations

import errno

from payloadrun.reasons import WriteFailure

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


def failure_reason(exc: OSError) -> WriteFailure:
    """A bounded label for why a write failed: no_space, permission, volume_gone or io_error."""
    if exc.errno in _NO_SPACE:
        return WriteFailure.NO_SPACE
    if exc.errno in _DENIED:
        return WriteFailure.PERMISSION
    if exc.errno in _GONE:
        return WriteFailure.VOLUME_GONE
    return WriteFailure.IO_ERROR
