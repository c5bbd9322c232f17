"""Delete everything a finished PayloadRun left under its payload root.

The operator runs this in the run's cleanup Job (the sidecar image, the
sidecar's uid, the run's claim mounted read-write); it can be run by hand too,
once no pod of the run writes to the root any more.

What goes, directly under the root:
  v<k>/               payload files of policy version k (the writer sidecar)
  .retention-trash/   version directories a fresh run moved aside to delete
  .retention/         the retention sidecar's journal (its default --state-dir)
and then the root itself, once it is empty. Anything else directly under the
root (another file or directory, a symlink, a v<k> that is not a directory)
is left in place and listed, and the root is kept: the root may be a
directory you chose (spec.payloads.root). A journal put elsewhere with
--state-dir is not touched.

Safety: the root must be an absolute path, not '/', without '..', and not a
symlink itself. Symlinks are never followed: one inside v<k> is removed, its
target is not touched. Each directory is opened below its parent's descriptor
without following symlinks, so nothing outside the root is reached even if
the tree changes meanwhile.

Output: a line per directory removed (name, files, bytes), a line per entry
kept, then a summary (files, bytes, seconds). Files are everything that is
not a directory (symlinks too); bytes are their sizes as stored. --dry-run
lists the same without deleting anything. With --json those lines go to
stderr and stdout gets one JSON object:
  {"root", "files", "bytes", "seconds", "kept": [names],
   "directories": [{"name", "files", "bytes", "removed"}] (removed is
   false in a dry run),
   "root_removed", "dry_run", "error_count",
   "errors": [{"path", "error", "message"}] (the first 100)}
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import stat
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from payloadrun import settings
from payloadrun.paths import parse_version_dir_name
from payloadrun.retention import deleter
from payloadrun.retention.config import STATE_DIR, TRASH_DIR
from payloadrun.settings import Env

EPILOG = """\
exit status:
  0  wiped, or nothing to wipe (a root that does not exist is success, so a
     retried Job finds its work done); entries kept do not make it fail
  1  something could not be deleted (or, with --dry-run, read): each is
     reported on stderr with its path and errno name (EACCES, EPERM, EIO...);
     everything else was deleted, and running again retries the rest
  2  the root was not given, or refused: relative, '/', with '..', a symlink,
     or not a directory
"""

# One attempt per entry: the Job's own retries (backoffLimit) are the retry, and the wipe is
# idempotent; a permission error does not heal in 50 ms, and a directory of thousands of files
# that all fail would otherwise take minutes of backoff.
RETRY = deleter.Retry(attempts=1)
MAX_REPORTED_ERRORS = 100
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RootRefusedError(ValueError):
    """The root is not a directory this command may empty; the message says why and what to do."""


def root_problem(root: Path) -> str | None:
    """Why ``root`` may not be wiped, from its spelling alone; None when it may."""
    shown = repr(str(root))
    if str(root) == ".":
        return (
            "payload root is empty or '.': pass the run's absolute payload root "
            f"(--root or {Env.PAYLOAD_ROOT})"
        )
    if not root.is_absolute():
        return (
            f"payload root {shown} is a relative path: pass the run's absolute payload root "
            f"(--root or {Env.PAYLOAD_ROOT}), e.g. /payloads/NAMESPACE/RUN/payloads"
        )
    if ".." in root.parts:
        return f"payload root {shown} contains '..': pass the direct path of the run's root"
    if root.parent == root:
        return f"payload root {shown} is the filesystem root: pass the run's own directory"
    return None


@dataclass(frozen=True)
class WipeConfig:
    """What ``payloadrun wipe`` is asked to do."""

    root: Path = settings.payload_root("the run's payload root (required, by flag or variable)")
    dry_run: bool = False
    json: bool = False

    def __post_init__(self) -> None:
        settings.validate(self)
        problem = root_problem(self.root)
        if problem:
            raise settings.SettingsError(problem)


@dataclass(frozen=True)
class Plan:
    """The entries directly under the root: the ones to remove, in order, and the ones kept."""

    remove: tuple[str, ...]
    kept: tuple[str, ...]


def plan(entries: Iterable[tuple[str, bool]]) -> Plan:
    """Which ``(name, is a real directory)`` entries go: ``v<k>`` oldest first, then the trash,
    then the journal (the record of the run goes last); everything else is kept."""
    versions: list[tuple[int, str]] = []
    own: list[str] = []
    kept: list[str] = []
    for name, is_dir in entries:
        version = parse_version_dir_name(name)
        if is_dir and version is not None:
            versions.append((version, name))
        elif is_dir and name in (TRASH_DIR, STATE_DIR):
            own.append(name)
        else:
            kept.append(name)
    own.sort(key=(TRASH_DIR, STATE_DIR).index)
    return Plan(tuple(name for _, name in sorted(versions)) + tuple(own), tuple(sorted(kept)))


@dataclass(frozen=True)
class WipeError:
    path: str
    error: str  # the errno name: EACCES, EPERM, EIO, ...
    message: str

    @classmethod
    def of(cls, path: str, exc: OSError) -> WipeError:
        name = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else type(exc).__name__
        return cls(path, name, exc.strerror or str(exc))


@dataclass
class DirectoryResult:
    name: str
    files: int = 0
    bytes: int = 0
    removed: bool = False


@dataclass
class WipeSummary:
    root: str
    dry_run: bool
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    kept: list[str] = field(default_factory=list)
    directories: list[DirectoryResult] = field(default_factory=list)
    root_removed: bool = False
    error_count: int = 0
    errors: list[WipeError] = field(default_factory=list)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["seconds"] = round(self.seconds, 3)
        return out


class Reporter:
    """Prints progress and errors as they happen; keeps the first errors for the summary."""

    def __init__(self, summary: WipeSummary, progress: TextIO) -> None:
        self.summary = summary
        self.progress = progress

    def line(self, text: str) -> None:
        print(text, file=self.progress, flush=True)

    def error(self, path: str, exc: OSError) -> None:
        s = self.summary
        s.error_count += 1
        if s.error_count <= MAX_REPORTED_ERRORS:
            err = WipeError.of(path, exc)
            s.errors.append(err)
            print(f"error: {err.path}: {err.error} ({err.message})", file=sys.stderr, flush=True)
        elif s.error_count == MAX_REPORTED_ERRORS + 1:
            print(
                f"error: more than {MAX_REPORTED_ERRORS} errors; the rest are counted, not shown",
                file=sys.stderr,
                flush=True,
            )

    def hook(self, _label: str, where: str, exc: OSError, _attempt: int, final: bool) -> None:
        """A :data:`deleter.ErrorHook`: ``where`` is relative to the root."""
        if final:
            self.error(f"{self.summary.root}/{where}", exc)


def _files(n: int) -> str:
    return f"{n} file{'' if n == 1 else 's'}"


def measure(parent_fd: int, name: str, shown: str, report: Reporter) -> deleter.Removed:
    """What :func:`deleter.remove_tree` would remove from ``parent/name``, counted the same way."""
    found = deleter.Removed()
    try:
        dfd = deleter.open_dir(parent_fd, name)
    except OSError as exc:
        report.hook("", shown, exc, 1, True)
        return found
    if dfd is None:
        return found
    try:
        subdirs = []
        with os.scandir(dfd) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
                    continue
                try:
                    found.bytes += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
                found.files += 1
        for sub in subdirs:
            found.add(measure(dfd, sub, f"{shown}/{sub}", report))
    except OSError as exc:
        report.hook("", shown, exc, 1, True)
    finally:
        os.close(dfd)
    return found


def _exists(parent_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _kind(root_fd: int, name: str) -> str:
    try:
        mode = os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mode
    except OSError:
        return "gone"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a file"
    return "a special file"


def open_root(root: Path) -> int | None:
    """A descriptor of the root, never through a symlink; None when it does not exist.

    Raises :class:`RootRefusedError` for a symlink or something that is not a directory.
    """
    shown = repr(str(root))
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise RootRefusedError(
            f"payload root {shown}: a component of the path is not a directory; pass the run's "
            "payload root"
        ) from None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" (to {os.readlink(root)!r})"
        except OSError:
            target = ""
        raise RootRefusedError(
            f"payload root {shown} is a symlink{target}: refusing to wipe through it; pass the "
            "real directory"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise RootRefusedError(f"payload root {shown} is not a directory: pass the run's root")
    try:
        return os.open(root, _ROOT_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # replaced since the lstat
            raise RootRefusedError(
                f"payload root {shown} is no longer a directory (it was replaced while being "
                "checked): pass the real directory"
            ) from None
        raise


def wipe(config: WipeConfig, progress: TextIO) -> WipeSummary:
    """Empty and remove the root (see the module's docstring); errors are in the summary.

    Raises :class:`RootRefusedError` when the root may not be wiped.
    """
    t0 = time.monotonic()
    root = str(config.root)
    summary = WipeSummary(root=root, dry_run=config.dry_run)
    report = Reporter(summary, progress)
    try:
        root_fd = open_root(config.root)
    except OSError as exc:
        report.error(root, exc)
        root_fd = None
    else:
        if root_fd is None:
            report.line(f"nothing to wipe: {root} does not exist")
    if root_fd is not None:
        try:
            with os.scandir(root_fd) as it:
                the_plan = plan((e.name, e.is_dir(follow_symlinks=False)) for e in it)
            for name in the_plan.remove:
                summary.directories.append(_remove(root_fd, name, config.dry_run, report))
            for name in the_plan.kept:
                summary.kept.append(name)
                report.line(f"kept {name}: {_kind(root_fd, name)} the run does not write")
        except OSError as exc:  # listing the root itself failed
            report.error(root, exc)
        finally:
            os.close(root_fd)
        if summary.kept:
            report.line(f"kept the root {root}: it holds the entries listed as kept")
        elif summary.error_count == 0 and config.dry_run:
            report.line(f"would remove the root {root}")
        elif summary.error_count == 0:
            _remove_root(config.root, summary, report)
    summary.seconds = time.monotonic() - t0
    return summary


def _remove(root_fd: int, name: str, dry_run: bool, report: Reporter) -> DirectoryResult:
    """Remove (or measure) one directory of the run, directly under the root; report it."""
    summary = report.summary
    errors_before = summary.error_count
    if dry_run:
        found = measure(root_fd, name, name, report)
    else:
        found = deleter.remove_tree(root_fd, name, retry=RETRY, on_error=report.hook, shown_as=name)
    summary.files += found.files
    summary.bytes += found.bytes
    result = DirectoryResult(name, found.files, found.bytes)
    counts = f"{_files(found.files)}, {found.bytes} bytes"
    if dry_run:
        report.line(f"would remove {name}: {counts}")
    elif not _exists(root_fd, name):
        result.removed = True
        report.line(f"removed {name}: {counts}")
    else:
        if summary.error_count == errors_before:  # nothing failed, yet it is still there
            still = OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY))
            report.error(f"{summary.root}/{name}", still)
        report.line(f"left {name}: {counts} removed, the directory is not empty")
    return result


def _remove_root(root: Path, summary: WipeSummary, report: Reporter) -> None:
    try:
        os.rmdir(root)  # rmdir never follows a symlink
    except FileNotFoundError:
        summary.root_removed = True
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            report.line(f"kept the root {root}: it is a mount point (empty now)")
        else:  # ENOTEMPTY: something appeared meanwhile; a retry wipes or lists it
            report.error(str(root), exc)
        return
    else:
        summary.root_removed = True
    report.line(f"removed the root {root}")


def summary_line(s: WipeSummary) -> str:
    done = f"{_files(s.files)}, {s.bytes} bytes in {s.seconds:.2f} s"
    if s.error_count:
        verb = "would not read all of" if s.dry_run else "incomplete wipe of"
        return f"{verb} {s.root}: {s.error_count} error(s), see above; {done}"
    if s.dry_run:
        return f"dry run, nothing deleted: would wipe {s.root}: {done}"
    return f"wiped {s.root}: {done}"


COMMAND = "wipe"
JSON_FLAG = "--json"


def command_line(root: str) -> list[str]:
    """The arguments that wipe ``root`` with a JSON summary (the operator's cleanup Job)."""
    root_flag = settings.settings_of(WipeConfig)["root"][0].flag
    return [COMMAND, str(root_flag), root, JSON_FLAG]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        COMMAND,
        help="delete what a finished run left under its payload root (the cleanup Job runs it)",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    settings.add_arguments(p, WipeConfig)
    p.add_argument(
        "--dry-run", action="store_true", help="list what would be removed; delete nothing"
    )
    p.add_argument(
        JSON_FLAG,
        action="store_true",
        help="print one JSON summary object on stdout (progress goes to stderr)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = dataclasses.replace(
            settings.from_args(WipeConfig, args), dry_run=args.dry_run, json=args.json
        )
    except settings.SettingsError as exc:
        print(f"payloadrun wipe: {exc}", file=sys.stderr)
        return 2
    try:
        summary = wipe(config, sys.stderr if config.json else sys.stdout)
    except RootRefusedError as exc:
        print(f"payloadrun wipe: {exc}", file=sys.stderr)
        return 2
    if config.json:
        print(json.dumps(summary.to_json()), flush=True)
    else:
        print(summary_line(summary), flush=True)
    return 1 if summary.error_count else 0
