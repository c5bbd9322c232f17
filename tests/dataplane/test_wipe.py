"""``payloadrun wipe``: a finished run's payload root emptied and removed, on a real filesystem."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from payloadrun.cli import main
from payloadrun.retention.config import STATE_DIR, TRASH_DIR
from payloadrun.wipe import plan
from payloadrun_devkit.required import skip_or_fail


def write(path: Path, size: int) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return size


def make_run(root: Path) -> tuple[int, int]:
    """What a run leaves: v0..v3 with payload files, a trash, a journal. (files, bytes) made."""
    files = size = 0
    for k in range(4):
        for i in range(k + 2):
            size += write(root / f"v{k}" / f"{k}-{i}.bin", 1000 * k + i)
            files += 1
    size += write(root / TRASH_DIR / "1733000000" / "v7" / "old.bin", 4096)
    size += write(root / TRASH_DIR / "1733000000" / "v8" / "older.bin", 17)
    size += write(root / STATE_DIR / "journal.jsonl", 321)
    return files + 3, size


def tree(path: Path) -> list[tuple[str, int]]:
    """Every entry below ``path`` (relative, with its size for files), symlinks not followed."""
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            size = p.lstat().st_size if not p.is_dir() or p.is_symlink() else -1
            out.append((str(p.relative_to(path)), size))
    return sorted(out)


def wipe_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = main(["wipe", "--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("PAYLOAD_ROOT", raising=False)
    return tmp_path / "payloads" / "ns" / "run" / "payloads"


def test_a_finished_run_is_wiped_and_its_root_removed(root, capsys):
    files, size = make_run(root)
    code, summary, progress = wipe_json(capsys, "--root", str(root))
    assert code == 0, progress
    assert not root.exists() and root.parent.is_dir()  # only the root itself goes
    assert (summary["files"], summary["bytes"]) == (files, size)
    assert summary["root"] == str(root) and summary["kept"] == [] and summary["root_removed"]
    assert summary["error_count"] == 0 and summary["errors"] == [] and not summary["dry_run"]
    names = [d["name"] for d in summary["directories"]]
    assert names == ["v0", "v1", "v2", "v3", TRASH_DIR, STATE_DIR]
    v3 = summary["directories"][3]
    assert v3 == {"name": "v3", "files": 5, "bytes": 5 * 3000 + 10, "removed": True}
    assert "removed v3: 5 files, 15010 bytes" in progress.splitlines()
    assert f"removed the root {root}" in progress


def test_text_output_has_a_line_per_directory_and_a_summary(root, capsys):
    files, size = make_run(root)
    assert main(["wipe", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "removed v0: 2 files, 1 bytes"
    assert f"removed {STATE_DIR}: 1 file, 321 bytes" in lines
    assert lines[-1].startswith(f"wiped {root}: {files} files, {size} bytes in ")
    assert lines[-1].endswith(" s")


def test_the_root_can_come_from_payload_root(root, capsys, monkeypatch):
    make_run(root)
    monkeypatch.setenv("PAYLOAD_ROOT", str(root))
    assert main(["wipe"]) == 0
    assert not root.exists()


def test_unknown_entries_are_kept_and_listed_and_so_is_the_root(root, tmp_path, capsys):
    files, size = make_run(root)
    outside = tmp_path / "outside"
    write(outside / "precious", 5)
    write(root / "README", 7)
    write(root / "notes" / "a.txt", 3)
    write(root / "v5", 9)  # a v<k> that is a file, not a directory
    write(root / "v01" / "x", 1)  # not the run's spelling of a version
    (root / "v9").symlink_to(outside, target_is_directory=True)
    (root / f"{TRASH_DIR}x").mkdir()
    code, summary, progress = wipe_json(capsys, "--root", str(root))
    assert code == 0
    kept = sorted(["README", "notes", "v5", "v01", "v9", f"{TRASH_DIR}x"])
    assert summary["kept"] == kept
    assert sorted(p.name for p in root.iterdir()) == kept  # the run's own entries are gone
    assert (summary["files"], summary["bytes"]) == (files, size)
    assert not summary["root_removed"] and root.is_dir()
    assert (outside / "precious").read_bytes() == b"xxxxx"
    assert "kept v9: a symlink the run does not write" in progress
    assert "kept README: a file the run does not write" in progress
    assert f"kept the root {root}" in progress


def test_a_symlink_inside_a_version_directory_is_removed_not_followed(root, tmp_path, capsys):
    files, size = make_run(root)
    outside = tmp_path / "outside"
    write(outside / "target.bin", 11)
    write(outside / "dir" / "inner.bin", 13)
    (root / "v1" / "link.bin").symlink_to(outside / "target.bin")
    (root / "v1" / "dirlink").symlink_to(outside / "dir", target_is_directory=True)
    (root / TRASH_DIR / "1733000000" / "v7" / "up").symlink_to(tmp_path)
    links = sum(os.lstat(p).st_size for p in (root / "v1" / "link.bin", root / "v1" / "dirlink"))
    links += os.lstat(root / TRASH_DIR / "1733000000" / "v7" / "up").st_size
    code, summary, _ = wipe_json(capsys, "--root", str(root))
    assert code == 0 and not root.exists()
    assert (summary["files"], summary["bytes"]) == (files + 3, size + links)  # the links, as links
    assert (outside / "target.bin").read_bytes() == b"x" * 11
    assert (outside / "dir" / "inner.bin").read_bytes() == b"x" * 13


def test_a_root_that_is_a_symlink_is_refused(root, tmp_path, capsys):
    make_run(root)
    link = tmp_path / "link-to-root"
    link.symlink_to(root, target_is_directory=True)
    before = tree(root)
    assert main(["wipe", "--root", str(link)]) == 2
    err = capsys.readouterr().err
    assert f"payload root {str(link)!r} is a symlink (to {str(root)!r})" in err
    assert "pass the real directory" in err
    assert tree(root) == before and link.is_symlink()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("payloads/run", "'payloads/run' is a relative path: pass the run's absolute payload"),
        ("", "payload root is empty or '.'"),
        ("/", "'/' is the filesystem root"),
        ("//", "'//' is the filesystem root"),
        ("/payloads/run/..", "contains '..'"),
    ],
)
def test_a_root_that_could_reach_beyond_the_run_is_refused(given, message, capsys):
    assert main(["wipe", "--root", given]) == 2
    assert message in capsys.readouterr().err


def test_a_root_that_is_a_file_or_not_given_is_refused(root, capsys):
    write(root, 3)
    assert main(["wipe", "--root", str(root)]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert root.read_bytes() == b"xxx"
    assert main(["wipe"]) == 2
    assert "no payload root: pass --root or set PAYLOAD_ROOT" in capsys.readouterr().err


def test_a_missing_root_is_success_so_a_retried_job_finds_its_work_done(root, capsys):
    assert main(["wipe", "--root", str(root)]) == 0
    assert f"nothing to wipe: {root} does not exist" in capsys.readouterr().out
    code, summary, _ = wipe_json(capsys, "--root", str(root))
    assert code == 0 and (summary["files"], summary["bytes"], summary["kept"]) == (0, 0, [])


def test_dry_run_deletes_nothing_and_counts_what_a_wipe_removes(root, capsys):
    files, size = make_run(root)
    write(root / "README", 7)
    before = tree(root)
    code, dry, progress = wipe_json(capsys, "--root", str(root), "--dry-run")
    assert code == 0 and tree(root) == before
    assert dry["dry_run"] and (dry["files"], dry["bytes"]) == (files, size)
    assert dry["kept"] == ["README"] and not dry["root_removed"]
    assert not any(d["removed"] for d in dry["directories"])
    assert "would remove v0: 2 files, 1 bytes" in progress
    (root / "README").unlink()
    assert main(["wipe", "--root", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would remove the root {root}" in out and "dry run, nothing deleted" in out
    assert root.is_dir() and len(tree(root)) == len(before) - 1
    code, wiped, _ = wipe_json(capsys, "--root", str(root))
    assert code == 0 and (wiped["files"], wiped["bytes"]) == (files, size)


def chattr(flag: str, path: Path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)


def test_what_cannot_be_deleted_is_reported_with_its_path_and_the_rest_goes(root, capsys):
    # Tests run as root, which chmod does not stop; an immutable directory stops even root.
    files, size = make_run(root)
    stuck = [root / "v2", root / TRASH_DIR / "1733000000" / "v8"]
    if shutil.which("chattr") is None:
        skip_or_fail(
            "no chattr: cannot make a directory undeletable for root (apt-get install e2fsprogs)"
        )
    try:
        chattr("+i", stuck[0])
    except subprocess.CalledProcessError as exc:
        skip_or_fail(f"chattr +i failed here (needs root and ext4/xfs/btrfs): {exc.stderr!r}")
    try:
        chattr("+i", stuck[1])
        code, summary, progress = wipe_json(capsys, "--root", str(root))
        assert code == 1
        assert sorted(p.name for p in root.iterdir()) == [TRASH_DIR, "v2"]
        assert [p.name for p in (root / "v2").iterdir()] != []  # nothing in it went
        left = 4 + 1  # v2's files and older.bin
        assert summary["files"] == files - left
        assert summary["bytes"] == size - sum(2000 + i for i in range(4)) - 17
        assert summary["error_count"] == len(summary["errors"]) > 0 and not summary["root_removed"]
        errors = {(e["path"], e["error"]) for e in summary["errors"]}
        assert (f"{root}/v2/2-0.bin", "EPERM") in errors
        assert (f"{root}/{TRASH_DIR}/1733000000/v8/older.bin", "EPERM") in errors
        assert f"error: {root}/v2/2-0.bin: EPERM (Operation not permitted)" in progress
        by_name = {d["name"]: d for d in summary["directories"]}
        assert not by_name["v2"]["removed"] and not by_name[TRASH_DIR]["removed"]
        assert by_name["v3"]["removed"] and by_name[STATE_DIR]["removed"]
        assert "removed v2" not in progress and "left v2: 0 files, 0 bytes removed" in progress
        assert main(["wipe", "--root", str(root)]) == 1
        last = capsys.readouterr().out.splitlines()[-1]
        assert last.startswith(f"incomplete wipe of {root}: ") and "error(s)" in last
    finally:
        for path in stuck:
            subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)
    code, summary, _ = wipe_json(capsys, "--root", str(root))  # the Job's retry finishes it
    assert code == 0 and summary["files"] == left and not root.exists()


def test_the_command_as_a_process(root, tmp_path):
    files, _ = make_run(root)
    write(tmp_path / "outside" / "t", 2)
    (root / "v0" / "out").symlink_to(tmp_path / "outside" / "t")
    env = {k: v for k, v in os.environ.items() if k != "PAYLOAD_ROOT"}
    proc = subprocess.run(
        [sys.executable, "-m", "payloadrun.cli", "wipe", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PAYLOAD_ROOT": str(root)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["files"] == files + 1 and summary["root_removed"] and not root.exists()
    assert "removed v0: 3 files" in proc.stderr
    assert (tmp_path / "outside" / "t").read_bytes() == b"xx"
    link = tmp_path / "root-link"
    link.symlink_to(tmp_path / "outside", target_is_directory=True)
    proc = subprocess.run(
        [sys.executable, "-m", "payloadrun.cli", "wipe", "--root", str(link)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 2 and "is a symlink" in proc.stderr
    help_text = subprocess.run(
        [sys.executable, "-m", "payloadrun.cli", "wipe", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout
    for word in ("--root", "PAYLOAD_ROOT", "--dry-run", "--json", TRASH_DIR, STATE_DIR, "exit"):
        assert word in help_text


def test_the_plan_removes_versions_oldest_first_then_trash_then_journal():
    got = plan(
        [
            (STATE_DIR, True),
            ("v10", True),
            ("v2", True),
            (TRASH_DIR, True),
            ("v3", False),
            ("lost+found", True),
            (STATE_DIR + ".bak", True),
            ("v0", True),
        ]
    )
    assert got.remove == ("v0", "v2", "v10", TRASH_DIR, STATE_DIR)
    assert got.kept == (STATE_DIR + ".bak", "lost+found", "v3")
