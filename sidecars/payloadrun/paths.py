"""The payload root's layout, and the checks that keep every path from a request inside it.

Layout: ``<root>/v<k>/<name>.bin``: one directory per policy version ``k`` (the dispatch version
of the rollouts written there), one file per request. Paths arrive in requests (a writer's
``payload_dir``, a segment's ``file``, a retention call's file list) and are trusted only after
they are proven to name that layout inside the root: no ``..``, no other directory names, no
symlink that leads out.

A path may be given absolute (as prime-rl sends it: the root is mounted at the same path on every
node) or relative to the root.
"""

from __future__ import annotations

import operator
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

_VERSION_DIR = re.compile(r"v(0|[1-9][0-9]{0,17})")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
# ``v<k>/<name>`` in one match: the two patterns above joined by the only "/" allowed. No part can
# be "." or ".." (a name starts with a letter or digit), nor hold a NUL, backslash or percent sign.
# File names, one a line: no "/" or "\n" in any (neither is in the class). Possessive repeats
# (never given back: no "\n" is in the class, so giving back could never help) save a fifth.
_FILE_NAMES = re.compile(rf"(?:{_FILE_NAME.pattern}+\n)*+{_FILE_NAME.pattern}")
_VERSION_AND_FILE = re.compile(r"(v(?:0|[1-9][0-9]{0,17}))/([A-Za-z0-9][A-Za-z0-9._-]{0,254})")


class PayloadPathError(ValueError):
    """A path from a request does not name a payload directory or file inside the root."""


def version_dir_name(version: int) -> str:
    """``v<k>``: the directory of policy version ``k`` (the rollouts dispatched at it)."""
    try:
        k = -1 if isinstance(version, bool) else operator.index(version)
    except TypeError:
        k = -1
    if k < 0:
        raise PayloadPathError(f"a policy version is an integer >= 0, got {version!r}")
    return f"v{k}"


def payload_dir(root: str | os.PathLike[str], version: int) -> str:
    """The ``payload_dir`` an orchestrator names in a request for a rollout at ``version``.

    ``<root>/v<k>``, where ``root`` is the run's payload root (``PAYLOAD_ROOT``, mounted at the
    same path on every node) and ``k`` the policy version the rollout is dispatched at: the
    retention sidecar's backstop sweeps whole version directories, so a rollout must land in its
    own version's. Pure: the writer checks the path against its root when the request arrives.
    """
    base = os.fspath(root)
    if not base:
        raise PayloadPathError("payload root is empty: pass the run's PAYLOAD_ROOT")
    return f"{base.rstrip('/')}/{version_dir_name(version)}"


def parse_version_dir_name(name: str) -> int | None:
    """``k`` for a directory named ``v<k>``, else None."""
    m = _VERSION_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class PayloadFile:
    """A validated payload file: its version and name under a root (strings: no pathlib on the
    hot path of a reader resolving thousands of files)."""

    version: int
    name: str
    root: str

    @property
    def key(self) -> str:
        """``v<k>/<name>``: the file relative to the root."""
        return f"v{self.version}/{self.name}"

    @property
    def dir_str(self) -> str:
        return f"{self.root}/v{self.version}"

    @property
    def path_str(self) -> str:
        return f"{self.root}/v{self.version}/{self.name}"

    @property
    def dir(self) -> Path:
        return Path(self.dir_str)

    @property
    def path(self) -> Path:
        return Path(self.path_str)


class PayloadRoot:
    """A payload root on disk and the rules for paths under it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        given = os.fspath(root)
        if not given:
            raise PayloadPathError("payload root is empty: set it to the shared volume's mount")
        real = os.path.realpath(given)
        try:
            is_dir = stat.S_ISDIR(os.stat(real).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            is_dir = False
        except OSError as exc:  # there, but its server does not answer (or it cannot be read)
            raise PayloadPathError(
                f"payload root {given!r} cannot be checked: {exc.strerror or exc}; is the shared "
                "volume's server reachable from this node?"
            ) from exc
        if not is_dir:
            raise PayloadPathError(
                f"payload root {given!r} is not a directory: mount the shared volume there or "
                "create the directory"
            )
        self.path = Path(real)
        self._real = real
        self._given = os.path.normpath(os.path.abspath(given))
        # The fast path of payload_file_strs: v<k>/<name>, bare or under a spelling of the root
        # that is the root by its letters alone ("/" has none: "/" + "/" would be "//").
        prefixes = "|".join(re.escape(f"{p}/") for p in {real, self._given} if p != "/")
        self._fast_file = re.compile(
            (f"(?:{prefixes})?" if prefixes else "") + _VERSION_AND_FILE.pattern
        )
        # For payload_file_names: the same once per line of "\n"-joined files, and a version
        # directory alone (its name the first group, as above).
        self._fast_lines = re.compile(f"^{self._fast_file.pattern}$", re.MULTILINE)
        self._fast_dir = re.compile(
            (f"(?:{prefixes})?" if prefixes else "") + r"(v(?:0|[1-9][0-9]{0,17}))"
        )

    def __repr__(self) -> str:
        return f"PayloadRoot({str(self.path)!r})"

    def _relative_parts(self, value: object, what: str, depth: int) -> list[str]:
        """The ``depth`` components of ``value`` below the root, checked as plain names."""
        if not isinstance(value, str) or not value:
            raise PayloadPathError(f"{what} must be a non-empty string, got {value!r}")
        if "\x00" in value or "\\" in value or "%" in value:
            raise PayloadPathError(
                f"{what} {value!r} contains a NUL, a backslash or a percent sign: send a plain "
                f"path under the payload root {str(self.path)!r}"
            )
        raw_parts = value.split("/")
        if ".." in raw_parts or "." in raw_parts:
            raise PayloadPathError(f"{what} {value!r} contains '..' or '.': use a direct path")
        if os.path.isabs(value):
            parent, rest = _split_root(value.rstrip("/"), depth)
            if parent is None or not self._is_root(parent):
                raise PayloadPathError(
                    f"{what} {value!r} is not inside the payload root {str(self.path)!r}"
                )
            parts = rest
        else:
            parts = value.rstrip("/").split("/")
        if len(parts) != depth or any(not p for p in parts):
            layout = "v<k>" if depth == 1 else "v<k>/<name>"
            raise PayloadPathError(
                f"{what} {value!r} does not have the form <payload root>/{layout}"
            )
        return parts

    def _is_root(self, candidate: str) -> bool:
        if candidate in (self._given, self._real) or os.path.normpath(candidate) in (
            self._given,
            self._real,
        ):
            return True
        return os.path.realpath(candidate) == self._real

    def version_dir(self, payload_dir: object) -> Path:
        """The checked path of ``<root>/v<k>`` named by ``payload_dir`` (it may not exist yet)."""
        (name,) = self._relative_parts(payload_dir, "payload_dir", 1)
        if parse_version_dir_name(name) is None:
            raise PayloadPathError(
                f"payload_dir {payload_dir!r} must end in a directory named v<digits> "
                f"(the policy version), got {name!r}"
            )
        path = self.path / name
        self._refuse_symlink(path, payload_dir, "payload_dir")
        return path

    def payload_file(self, file: object, *, follow_check: bool = True) -> PayloadFile:
        """The checked ``<root>/v<k>/<name>`` named by ``file``.

        With ``follow_check`` the version directory and the file are proven not to be symlinks
        (an lstat each). A reader that opens with ``O_NOFOLLOW`` and checks each directory once
        passes False to skip the per-file system calls.
        """
        dir_name, name = self._relative_parts(file, "payload file", 2)
        version = parse_version_dir_name(dir_name)
        if version is None:
            raise PayloadPathError(
                f"payload file {file!r} is not in a directory named v<digits>, but {dir_name!r}"
            )
        if not _FILE_NAME.fullmatch(name):
            raise PayloadPathError(
                f"payload file {file!r} has a name {name!r} that is not a plain file name"
            )
        checked = PayloadFile(version, name, self._real)
        if follow_check:
            self._refuse_symlink(checked.dir_str, file, "payload file")
            self._refuse_symlink(checked.path_str, file, "payload file")
        return checked

    def payload_file_strs(self, file: object) -> tuple[str, str]:
        """``(version directory, file path)`` of ``file`` under the real root, checked as by
        :meth:`payload_file` with ``follow_check=False`` (the same errors, the same paths).

        The reader resolves every segment's file on every call; this is its hot path. A file
        given as ``v<k>/<name>`` or as that under the root's own spelling is decided by one
        pattern match, without building a :class:`PayloadFile`; any other form takes the full
        check, so both accept and refuse exactly the same names.
        """
        if type(file) is str and (m := self._fast_file.fullmatch(file)):
            parent = f"{self._real}/{m[1]}"
            return parent, f"{parent}/{m[2]}"
        checked = self.payload_file(file, follow_check=False)
        return checked.dir_str, checked.path_str

    def payload_file_names(self, files: list[str]) -> tuple[list[str], list[str]]:
        """The version directory name and the file name of each of ``files``, checked as by
        :meth:`payload_file` with ``follow_check=False`` (the same errors).

        The reader checks all the files of a call at once, in C rather than a Python step per
        file. Joined by newlines, as many lines as files (no file holds a newline itself):

        - all under one directory (a micro-batch of one policy version): that directory, as
          given, is checked once; a count shows that every line starts with it, and the names
          left when it is cut from every file are matched by one pattern;
        - otherwise one search for whole lines of the form ``v<k>/<name>``, bare or under the
          root's own spelling; as many matches as lines means every line matched whole.

        Anything else takes the full check file by file, which names the first one refused.
        """
        n = len(files)
        try:
            joined = "\n".join(files)
        except TypeError:  # not all strings: the full check says which
            joined = None
        if joined is not None and joined.count("\n") == n - 1:
            head = files[0].rpartition("/")[0]
            if (m := self._fast_dir.fullmatch(head)) and f"\n{joined}".count(f"\n{head}/") == n:
                cut = len(head) + 1
                names = [f[cut:] for f in files]
                if _FILE_NAMES.fullmatch("\n".join(names)):
                    return [m[1]] * n, names
            parts = self._fast_lines.findall(joined)
            if len(parts) == n:
                return [v for v, _ in parts], [name for _, name in parts]
        checked = [self.payload_file(f, follow_check=False) for f in files]
        return [f"v{c.version}" for c in checked], [c.name for c in checked]

    @staticmethod
    def symlink_refused(path: str | Path, given: object, what: str) -> PayloadPathError:
        """The error for ``given``, which leads through the symlink ``path``."""
        return PayloadPathError(
            f"{what} {given!r} leads through the symlink {str(path)!r}: payload directories "
            "and files must be real, inside the payload root"
        )

    def check_version_dir(self, path: str | Path, given: object) -> None:
        """Refuse a version directory that is a symlink (it could lead out of the root)."""
        self._refuse_symlink(path, given, "payload file")

    @staticmethod
    def _refuse_symlink(path: str | Path, given: object, what: str) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise PayloadRoot.symlink_refused(path, given, what)

    def version_dirs(self) -> dict[int, Path]:
        """The ``v<k>`` directories present under the root (symlinks excluded)."""
        found: dict[int, Path] = {}
        with os.scandir(self.path) as it:
            for entry in it:
                version = parse_version_dir_name(entry.name)
                if version is not None and entry.is_dir(follow_symlinks=False):
                    found[version] = Path(entry.path)
        return found


def _split_root(value: str, depth: int) -> tuple[str | None, list[str]]:
    """Split an absolute path into its parent ``depth`` levels up and the last ``depth`` parts."""
    parts = value.split("/")
    if len(parts) <= depth:
        return None, []
    return "/".join(parts[:-depth]) or "/", parts[-depth:]
