"""Unlinking payload files, safely and idempotently, from worker threads.

Every path is opened relative to a descriptor of the payload root, one level at a time, with
``O_NOFOLLOW``: a ``v<k>`` that is (or became) a symlink is refused at the moment of deletion, so
no race between a check and the unlink can lead outside the root. A file already gone counts as
done. Other errors are retried with exponential backoff, reported to ``on_error`` with a bounded
reason, and given up after the last attempt (the version-sweep backstop gets another chance).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from payloadrun.store import failure_reason

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOT_A_DIR = frozenset({errno.ELOOP, errno.ENOTDIR})

# (reason label, path, exception, attempt number from 1, final attempt?)
ErrorHook = Callable[[str, str, OSError, int, bool], None]


@dataclass(frozen=True, slots=True)
class Retry:
    """How often, and how patiently, a failing unlink is tried again."""

    attempts: int = 5
    backoff_s: float = 0.05

    def delay(self, attempt: int) -> float:
        return self.backoff_s * (2 ** (attempt - 1))


@dataclass(slots=True)
class Removed:
    """Files and bytes actually unlinked by one call (files already gone are not counted)."""

    files: int = 0
    bytes: int = 0

    def add(self, other: Removed) -> None:
        self.files += other.files
        self.bytes += other.bytes


def error_reason(exc: OSError) -> str:
    """A bounded label: the store's write-failure labels, plus symlinks and directories."""
    if exc.errno in _NOT_A_DIR:
        return "not_a_directory"
    if exc.errno in (errno.EISDIR, errno.ENOTEMPTY):
        return "is_a_directory"
    return failure_reason(exc)


def open_dir(root_fd: int, name: str) -> int | None:
    """A descriptor of ``root/name`` (never through a symlink); None when it does not exist."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=root_fd)
    except FileNotFoundError:
        return None


def _open_or_report(root_fd: int, dir_name: str, shown: str, on_error: ErrorHook) -> int | None:
    """``open_dir``, with a failure (not a missing directory) reported to ``on_error``."""
    try:
        return open_dir(root_fd, dir_name)
    except OSError as exc:
        on_error(error_reason(exc), shown, exc, 1, True)
        return None


def unlink_names(
    root_fd: int,
    dir_name: str,
    names: Iterable[str],
    *,
    retry: Retry,
    on_error: ErrorHook,
    unlink: Callable[..., None] = os.unlink,
    stop: threading.Event | None = None,
    shown_as: str | None = None,
) -> Removed:
    """Unlink ``root/dir_name/<name>`` for each name; counts what was really removed.

    ``stop`` cuts retries short at shutdown (the journal replays what is left). Errors name the
    directory ``shown_as`` (default ``dir_name``), so a caller deep in a tree can name the path.
    """
    removed = Removed()
    where = shown_as or dir_name
    dfd = _open_or_report(root_fd, dir_name, where, on_error)
    if dfd is None:
        return removed
    try:
        for name in names:
            size = _unlink_one(dfd, f"{where}/{name}", name, retry, on_error, unlink, stop)
            if size is not None:
                removed.files += 1
                removed.bytes += size
    finally:
        os.close(dfd)
    return removed


def _unlink_one(
    dfd: int,
    where: str,
    name: str,
    retry: Retry,
    on_error: ErrorHook,
    unlink: Callable[..., None],
    stop: threading.Event | None,
) -> int | None:
    for attempt in range(1, retry.attempts + 1):
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                exc = IsADirectoryError(errno.EISDIR, "a directory inside a version directory")
                on_error("is_a_directory", where, exc, attempt, True)
                return None
            unlink(name, dir_fd=dfd)
            return st.st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            final = attempt == retry.attempts or (stop is not None and stop.is_set())
            on_error(error_reason(exc), where, exc, attempt, final)
            if final:
                return None
            if stop is not None:
                stop.wait(retry.delay(attempt))
            else:
                time.sleep(retry.delay(attempt))
    return None


def list_names(root_fd: int, dir_name: str) -> list[str]:
    """The entry names of ``root/dir_name`` (empty when it is gone)."""
    dfd = open_dir(root_fd, dir_name)
    if dfd is None:
        return []
    try:
        return os.listdir(dfd)
    finally:
        os.close(dfd)


def rmdir_if_empty(root_fd: int, dir_name: str) -> bool:
    """Remove ``root/dir_name`` when it is an empty directory; True when it went."""
    try:
        os.rmdir(dir_name, dir_fd=root_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            return False
        raise
    return True


def remove_tree(
    root_fd: int,
    dir_name: str,
    *,
    retry: Retry,
    on_error: ErrorHook,
    shown_as: str | None = None,
) -> Removed:
    """Remove ``root/dir_name`` and everything in it; every non-directory removed is counted.

    Used for the trash of a wiped run (and by ``payloadrun wipe``), where anything may be found:
    files and symlinks are unlinked one by one (a symlink itself, never its target),
    subdirectories are removed the same way, each opened ``O_NOFOLLOW`` below its parent's
    descriptor. A directory that cannot be opened or listed is reported to ``on_error`` and left;
    the rest of the tree still goes. Errors name paths below ``shown_as`` (default ``dir_name``).
    A directory left behind (an error inside it, or an entry created meanwhile) is not an error
    here: the caller checks whether ``dir_name`` is gone.
    """
    removed = Removed()
    shown = shown_as or dir_name
    dfd = _open_or_report(root_fd, dir_name, shown, on_error)
    if dfd is None:
        return removed
    files: list[str] = []
    try:
        subdirs = []
        with os.scandir(dfd) as it:
            for entry in it:
                (subdirs if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
        for sub in subdirs:
            removed.add(
                remove_tree(dfd, sub, retry=retry, on_error=on_error, shown_as=f"{shown}/{sub}")
            )
    except OSError as exc:
        on_error(error_reason(exc), shown, exc, 1, True)
    finally:
        os.close(dfd)
    removed.add(
        unlink_names(root_fd, dir_name, files, retry=retry, on_error=on_error, shown_as=shown)
    )
    try:
        rmdir_if_empty(root_fd, dir_name)
    except OSError as exc:
        on_error(error_reason(exc), shown, exc, 1, True)
    return removed
