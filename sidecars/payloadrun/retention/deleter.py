"""Unlinking payload files, safely and idempotently, and measuring them.

Every path is opened relative to a descriptor of the payload root, one level at a time, with
``O_NOFOLLOW``: a ``v<k>`` that is (or became) a symlink is refused at the moment of deletion, so
no race between a check and the unlink can lead outside the root. A file already gone counts as
done. Other errors are retried with exponential backoff, reported to ``on_error`` with a bounded
reason, and left after the last attempt: the deletion queue defers such files and tries them again
in later rounds until they are gone (:class:`Retry` says when).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from payloadrun.failures import failure_reason
from payloadrun.paths import PayloadRoot
from payloadrun.reasons import DeleteError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOT_A_DIR = frozenset({errno.ELOOP, errno.ENOTDIR})

# (error label, path, exception, attempt number from 1, final attempt?)
ErrorHook = Callable[[DeleteError, str, OSError, int, bool], None]


@dataclass(frozen=True, slots=True)
class Retry:
    """How often, and how patiently, a failing unlink is tried again.

    ``attempts`` tries one after the other, ``backoff_s`` apart and doubling; a file still there
    after them is deferred, and the deferred files go again in a later round, ``later_s`` after
    the failure, doubling up to ``later_max_s`` while rounds keep failing (a server that is away
    for minutes is not hammered, and is noticed within ``later_max_s`` once it is back).
    """

    attempts: int = 5
    backoff_s: float = 0.05
    later_s: float = 1.0
    later_max_s: float = 30.0

    def delay(self, attempt: int) -> float:
        return self.backoff_s * (2 ** (attempt - 1))

    def later(self, failed_rounds: int) -> float:
        """Seconds before the next round of deferred files, after ``failed_rounds`` (>= 1)."""
        return min(self.later_max_s, self.later_s * (2 ** (failed_rounds - 1)))


@dataclass(slots=True)
class Removed:
    """Files and bytes actually unlinked by one call (files already gone are not counted)."""

    files: int = 0
    bytes: int = 0

    def add(self, other: Removed) -> None:
        self.files += other.files
        self.bytes += other.bytes


def error_reason(exc: OSError) -> DeleteError:
    """A bounded label: the store's write-failure labels, plus symlinks and directories."""
    if exc.errno in _NOT_A_DIR:
        return DeleteError.NOT_A_DIRECTORY
    if exc.errno in (errno.EISDIR, errno.ENOTEMPTY):
        return DeleteError.IS_A_DIRECTORY
    return DeleteError.of(failure_reason(exc))


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
    names: Sequence[str],
    *,
    retry: Retry,
    on_error: ErrorHook,
    sizes: Sequence[int] | None = None,
    unlink: Callable[..., None] = os.unlink,
    stop: threading.Event | None = None,
    shown_as: str | None = None,
    ours: Collection[str] = frozenset(),
) -> Removed:
    """Unlink ``root/dir_name/<name>`` for each name; counts what was really removed.

    ``sizes`` gives each file's size when it is known (measured when its batch was recorded, see
    :meth:`LocalDeleter.measure`), -1 when not: a known size spares the ``stat`` that would
    otherwise read it just before the unlink, which is most of the cost of a deletion after the
    unlink itself. ``ours`` names files an earlier attempt may have removed whose answer was lost
    (its deletion worker died before answering): one of them found gone, its size known, was
    removed by that attempt, and is counted here, so that the counters hold every file removed
    whichever attempt removed it. ``stop`` cuts retries short at shutdown (the journal replays
    what is left).
    Errors name the directory ``shown_as`` (default ``dir_name``), so a caller deep in a tree can
    name the path.
    """
    where = shown_as or dir_name
    dfd = _open_or_report(root_fd, dir_name, where, on_error)
    if dfd is None:
        return Removed()
    files = total = 0
    try:
        for name, known in zip(names, sizes or itertools.repeat(-1), strict=False):
            failed = None
            if known >= 0:  # the common case, kept to one call: as cheap as a bare unlink loop
                try:
                    unlink(name, dir_fd=dfd)
                    files += 1
                    total += known
                    continue
                except FileNotFoundError:
                    if ours and name in ours:
                        files += 1
                        total += known
                    continue
                except OSError as exc:
                    failed = exc  # the first attempt: reported and retried below
            where_file = f"{where}/{name}"
            size = _unlink_one(dfd, where_file, name, known, retry, on_error, unlink, stop, failed)
            if size is not None:
                files += 1
                total += size
    finally:
        os.close(dfd)
    return Removed(files, total)


def _unlink_one(
    dfd: int,
    where: str,
    name: str,
    size: int,
    retry: Retry,
    on_error: ErrorHook,
    unlink: Callable[..., None],
    stop: threading.Event | None,
    failed: OSError | None = None,
) -> int | None:
    """The size of the file removed, or None (already gone, a directory, or left for later).

    ``failed`` is the error of a first attempt made by the caller: it counts as attempt 1.
    """
    for attempt in range(1, retry.attempts + 1):
        try:
            if failed is not None:
                error, failed = failed, None
                raise error
            if size < 0:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(errno.EISDIR, "a directory inside a version directory")
                size = st.st_size
            unlink(name, dir_fd=dfd)  # never removes a directory: EISDIR
            return size
        except FileNotFoundError:
            return None
        except IsADirectoryError as exc:
            on_error(DeleteError.IS_A_DIRECTORY, where, exc, attempt, True)
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


# ------------------------------------------------------------------ one root's deletions, whole


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt, as an :data:`ErrorHook` receives it, in a form that crosses a pipe."""

    label: DeleteError
    where: str
    errno: int | None
    message: str
    attempt: int
    final: bool

    def error(self) -> OSError:
        return OSError(self.errno, self.message)

    def report(self, on_error: ErrorHook) -> None:
        on_error(self.label, self.where, self.error(), self.attempt, self.final)


@dataclass(slots=True)
class Outcome:
    """What one deletion call removed, and every failed attempt on the way."""

    removed: Removed = field(default_factory=Removed)
    failures: list[Failure] = field(default_factory=list)

    def hook(self, label: DeleteError, where: str, exc: OSError, attempt: int, final: bool) -> None:
        """An :data:`ErrorHook` that keeps the failure."""
        message = exc.strerror or str(exc)
        self.failures.append(Failure(label, where, exc.errno, message, attempt, final))


@dataclass(frozen=True, slots=True)
class Census:
    """What the version directories hold: regular files, their bytes, and the directories."""

    files: int
    bytes: int
    dirs: int


class Deleter(Protocol):
    """Every deletion of one payload root (:class:`LocalDeleter`, or the worker process's)."""

    def unlink(
        self,
        dir_name: str,
        names: Sequence[str],
        sizes: Sequence[int],
        ours: Collection[str] = (),
    ) -> Outcome: ...
    def measure(self, dir_name: str, names: Sequence[str]) -> list[int]: ...
    def remove_tree(self, dir_name: str) -> Outcome: ...
    def scan(self) -> Census: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


class LocalDeleter:
    """Every deletion of one payload root, done in this process, below a descriptor of the root.

    The retention sidecar runs one inside its deletion worker process (:mod:`worker`), so that
    its per-file work never competes with the API for the sidecar's interpreter; tests run one
    in-process to inject failures through ``unlink``. ``stop`` cuts retries short.

    The root is opened at the first call that needs it, and again at the next call when that
    failed: a worker started while the volume's server is away reports each call's directory as
    failed (and the queue defers its files) instead of exiting at start, once per call.
    """

    def __init__(self, root: Path, retry: Retry, unlink: Callable[..., None] = os.unlink) -> None:
        self._root_path = Path(root)
        self._payload_root: PayloadRoot | None = None
        self.retry = retry
        self._unlink = unlink
        self._root_fd = -1
        self._opening = threading.Lock()
        self.stopping = threading.Event()

    @property
    def root(self) -> PayloadRoot:
        if self._payload_root is None:
            self._payload_root = PayloadRoot(self._root_path)
        return self._payload_root

    def _root(self) -> int:
        """The root's descriptor, opened now if it is not yet (``OSError`` when it cannot be)."""
        with self._opening:
            if self._root_fd < 0:
                self._root_fd = os.open(self._root_path, _ROOT_FLAGS)
            return self._root_fd

    def unlink(
        self,
        dir_name: str,
        names: Sequence[str],
        sizes: Sequence[int],
        ours: Collection[str] = (),
    ) -> Outcome:
        """:func:`unlink_names`; ``sizes[i]`` is -1 where the size is not known, ``ours`` the
        names an attempt whose answer was lost may have removed."""
        out = Outcome()
        try:
            root_fd = self._root()
        except OSError as exc:
            out.hook(error_reason(exc), dir_name, exc, 1, True)
            return out
        out.removed = unlink_names(
            root_fd,
            dir_name,
            names,
            sizes=sizes,
            retry=self.retry,
            on_error=out.hook,
            unlink=self._unlink,
            stop=self.stopping,
            ours=frozenset(ours),
        )
        return out

    def measure(self, dir_name: str, names: Sequence[str]) -> list[int]:
        """Each regular file's size, -1 for anything else (gone, a directory, a symlink...)."""
        try:
            dfd = open_dir(self._root(), dir_name)
        except OSError:
            dfd = None
        if dfd is None:
            return [-1] * len(names)
        sizes = []
        try:
            for name in names:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    sizes.append(-1)
                    continue
                sizes.append(st.st_size if stat.S_ISREG(st.st_mode) else -1)
        finally:
            os.close(dfd)
        return sizes

    def remove_tree(self, dir_name: str) -> Outcome:
        """:func:`remove_tree` of ``root/dir_name``."""
        out = Outcome()
        try:
            root_fd = self._root()
        except OSError as exc:
            out.hook(error_reason(exc), dir_name, exc, 1, True)
            return out
        out.removed = remove_tree(root_fd, dir_name, retry=self.retry, on_error=out.hook)
        return out

    def scan(self) -> Census:
        """Count the regular files in every ``v<k>`` and their bytes."""
        files = size = 0
        dirs = self.root.version_dirs()
        for path in dirs.values():
            try:
                with os.scandir(path) as it:
                    for entry in it:
                        if entry.is_file(follow_symlinks=False):
                            try:
                                size += entry.stat(follow_symlinks=False).st_size
                            except FileNotFoundError:
                                continue
                            files += 1
            except FileNotFoundError:
                continue
        return Census(files, size, len(dirs))

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        self.stopping.set()
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1
