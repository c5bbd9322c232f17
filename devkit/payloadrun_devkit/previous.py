"""The previous release, as the upgrade tests install it beside this tree.

``CHANGELOG.md`` names it: the newest section with a version (not ``[Unreleased]``), whose link
reference gives its tree (``[0.1.0]: .../tree/<commit>``, for a release that was never tagged) or
its tag (``v<version>``). :func:`checkout` makes a clone of it that shares this repository's
objects (nothing is written to this checkout), and :func:`build_previous_images` builds its
images with its own ``hack/images.sh`` under a cache of their own (its wheelhouse differs from
this tree's, and each script keeps one wheelhouse), the base image linked from this tree's cache
when its name is the same (a tarball names its recipe's key; 0.1.0's names no architecture, so
it builds its own base once, about two minutes cold).

``python -m payloadrun_devkit.previous`` builds those images into the cache ahead of the tests:
``hack/prepare.sh`` (``make test``) does it beside the Go builds, so the node's tests, the
suite's critical path, find them built.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .images import build_images

SECTION = re.compile(r"^## \[(\d+\.\d+\.\d+[^\]]*)\]", re.MULTILINE)
BASE_TARBALLS = "localhost_payloadrun-python_3.11-bookworm-*.tar"


class PreviousReleaseMissing(RuntimeError):
    """The previous release's commit is not in this clone (a shallow one)."""


@dataclass(frozen=True)
class Release:
    version: str
    ref: str  # a commit, or the tag v<version>


def previous_release(repo: Path) -> Release:
    """The newest released version ``CHANGELOG.md`` describes, and the ref of its tree."""
    text = (repo / "CHANGELOG.md").read_text()
    found = SECTION.search(text)
    if found is None:
        raise ValueError(f"{repo / 'CHANGELOG.md'} has no released section (## [X.Y.Z])")
    version = found.group(1)
    link = re.search(rf"^\[{re.escape(version)}\]: \S+/tree/([0-9a-f]{{40}})$", text, re.MULTILINE)
    return Release(version, link.group(1) if link else f"v{version}")


def checkout(repo: Path, release: Release, into: Path) -> Path:
    """``release``'s tree at ``into`` (a clone sharing ``repo``'s objects), made once."""
    if (into / ".git").is_dir():
        return into

    def git(*args: str, cwd: Path = repo) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120
        )

    if git("cat-file", "-e", f"{release.ref}^{{commit}}").returncode != 0:
        raise PreviousReleaseMissing(
            f"the previous release {release.version} ({release.ref}) is not in {repo}: a shallow "
            "clone? `git fetch --unshallow --tags` brings it"
        )
    into.parent.mkdir(parents=True, exist_ok=True)
    for args, cwd in (
        (("clone", "--quiet", "--shared", "--no-checkout", str(repo), str(into)), repo),
        (("checkout", "--quiet", "--detach", release.ref), into),
    ):
        done = git(*args, cwd=cwd)
        if done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return into


def build_previous_images(tree: Path, release: Release, cache: Path) -> dict[str, Path]:
    """Image name -> tarball of ``release``'s images (tag: its version), built by its own
    ``hack/images.sh`` under ``<cache>/previous/<version>``."""
    own = cache / "previous" / release.version
    (own / "images").mkdir(parents=True, exist_ok=True)
    for base in (cache / "images").glob(BASE_TARBALLS):
        linked = own / "images" / base.name
        if not linked.exists():
            linked.hardlink_to(base)
    return build_images(
        tree, env={"PAYLOADRUN_CACHE": str(own), "PAYLOADRUN_IMAGE_TAG": release.version}
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m payloadrun_devkit.previous",
        description=(
            "Build the previous release's images (the release CHANGELOG.md names, from a "
            "temporary clone of its tree) into the cache, where the upgrade tests find them. "
            "Prints each image's name and tarball."
        ),
    )
    parser.add_argument(
        "--repo",
        type=Path,
        default=Path(__file__).resolve().parents[2],
        help="this project's checkout, whose history holds the release (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    from payloadrun_devcluster.binaries import cache_dir

    release = previous_release(args.repo)
    with tempfile.TemporaryDirectory(prefix="payloadrun-previous-") as scratch:
        try:
            tree = checkout(args.repo, release, Path(scratch) / release.version)
        except PreviousReleaseMissing as missing:
            print(f"python -m payloadrun_devkit.previous: {missing}", file=sys.stderr)
            return 1
        for name, tarball in build_previous_images(tree, release, cache_dir()).items():
            print(name, tarball)
    return 0


if __name__ == "__main__":
    sys.exit(main())
