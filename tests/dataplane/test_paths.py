import os

import numpy as np
import pytest

from payloadrun.paths import (
    PayloadPathError,
    PayloadRoot,
    parse_version_dir_name,
    payload_dir,
    version_dir_name,
)


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "payloads"
    path.mkdir()
    return PayloadRoot(path)


def test_version_dir_names():
    assert version_dir_name(7) == "v7"
    assert parse_version_dir_name("v7") == 7
    assert parse_version_dir_name("v0") == 0
    assert parse_version_dir_name("v0012") is None  # one name per version: no leading zeros
    for bad in ("v", "7", "v-1", "v1a", "V1", "v1 ", "v" + "9" * 19):
        assert parse_version_dir_name(bad) is None
    with pytest.raises(PayloadPathError):
        version_dir_name(-1)
    assert version_dir_name(np.int64(4)) == "v4"  # a version computed with numpy is welcome
    for bad in (True, 1.0, "1", None):
        with pytest.raises(PayloadPathError, match="a policy version is an integer >= 0"):
            version_dir_name(bad)


def test_payload_dir_is_what_the_writer_accepts(root):
    """An orchestrator's payload_dir names the version directory the writer's check resolves."""
    assert payload_dir("/payloads/run", 3) == "/payloads/run/v3"
    assert payload_dir("/payloads/run/", 0) == "/payloads/run/v0"
    assert payload_dir("/", 1) == "/v1"
    for given in (root.path, str(root.path), f"{root.path}/"):
        assert root.version_dir(payload_dir(given, 12)) == root.path / "v12"
    with pytest.raises(PayloadPathError, match="payload root is empty"):
        payload_dir("", 1)
    with pytest.raises(PayloadPathError, match="got -1"):
        payload_dir("/payloads/run", -1)


def test_root_must_exist(tmp_path):
    with pytest.raises(PayloadPathError, match="is not a directory"):
        PayloadRoot(tmp_path / "missing")
    with pytest.raises(PayloadPathError, match="empty"):
        PayloadRoot("")


def test_version_dir_absolute_and_relative(root):
    assert root.version_dir(f"{root.path}/v3") == root.path / "v3"
    assert root.version_dir(f"{root.path}/v3/") == root.path / "v3"
    assert root.version_dir("v3") == root.path / "v3"


def test_version_dir_through_a_symlinked_root(tmp_path, root):
    link = tmp_path / "mnt"
    link.symlink_to(root.path)
    via_link = PayloadRoot(link)
    assert via_link.version_dir(f"{link}/v1") == root.path / "v1"
    assert via_link.version_dir(f"{root.path}/v1") == root.path / "v1"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/elsewhere/v1", "is not inside the payload root"),
        ("{root}/../v1", "contains '..' or '.'"),
        ("{root}/v1/..", "contains '..' or '.'"),
        ("{root}/./v1", "contains '..' or '.'"),
        ("{root}/v1/extra", "is not inside the payload root"),
        ("{root}/x1", "must end in a directory named v<digits>"),
        ("{root}", "is not inside the payload root"),
        ("{root}/v1%2F..%2Fx", "percent sign"),
        ("{root}/v1\x00", "NUL"),
        ("v1\\..\\x", "backslash"),
        ("", "non-empty string"),
        (None, "non-empty string"),
        ("v1/v2", "does not have the form <payload root>/v<k>"),
        ("/", "is not inside the payload root"),
    ],
)
def test_version_dir_rejects(root, value, message):
    if isinstance(value, str):
        value = value.format(root=root.path)
    with pytest.raises(PayloadPathError, match=message) as info:
        root.version_dir(value)
    assert repr(value) in str(info.value)  # the error names the offending value


def test_version_dir_symlink_escape_is_refused(tmp_path, root):
    outside = tmp_path / "outside"
    outside.mkdir()
    (root.path / "v5").symlink_to(outside)
    with pytest.raises(PayloadPathError, match="leads through the symlink"):
        root.version_dir("v5")


def test_payload_file(root):
    checked = root.payload_file(f"{root.path}/v2/abc.bin")
    assert (checked.version, checked.name, checked.path) == (2, "abc.bin", root.path / "v2/abc.bin")
    assert root.payload_file("v2/abc.bin").path == checked.path


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{root}/v2/../../etc/passwd", "contains '..'"),
        ("{root}/v2/.hidden", "not a plain file name"),
        ("{root}/x/abc.bin", "not in a directory named v<digits>"),
        ("{root}/abc.bin", "is not inside the payload root"),
        ("/etc/v1/passwd", "is not inside the payload root"),
        ("v1", "does not have the form <payload root>/v<k>/<name>"),
    ],
)
def test_payload_file_rejects(root, value, message):
    with pytest.raises(PayloadPathError, match=message):
        root.payload_file(value.format(root=root.path))


def test_payload_file_symlinks_are_refused(tmp_path, root):
    secret = tmp_path / "secret"
    secret.write_text("x")
    (root.path / "v1").mkdir()
    (root.path / "v1" / "a.bin").symlink_to(secret)
    with pytest.raises(PayloadPathError, match="symlink"):
        root.payload_file("v1/a.bin")
    (root.path / "v2").symlink_to(tmp_path)
    with pytest.raises(PayloadPathError, match="symlink"):
        root.payload_file("v2/secret")
    # without the per-file check only the string rules apply (the reader opens with O_NOFOLLOW)
    assert root.payload_file("v1/a.bin", follow_check=False).name == "a.bin"


def test_version_dirs_lists_only_real_version_directories(tmp_path, root):
    (root.path / "v1").mkdir()
    (root.path / "v10").mkdir()
    (root.path / "other").mkdir()
    (root.path / "v3").write_text("not a dir")
    (root.path / "v4").symlink_to(tmp_path)
    assert sorted(root.version_dirs()) == [1, 10]
    assert os.path.isdir(root.version_dirs()[10])


FILE_NAMES = [
    "v2/abc.bin",
    "v0/a",
    "v123456789012345678/x.bin",
    "{root}/v2/abc.bin",
    "{link}/v2/abc.bin",
    "{root}/v2/abc.bin/",
    "v2/abc.bin/",
    "{root}//v2/abc.bin",
    "{root}/v2//abc.bin",
    "{root}/v2/../../etc/passwd",
    "{root}/v2/./abc.bin",
    "{root}/v2/.hidden",
    "{root}/v2/-dash",
    "{root}/v02/abc.bin",
    "{root}/v1234567890123456789/x",
    "{root}/x/abc.bin",
    "{root}/abc.bin",
    "{root}x/v2/abc.bin",
    "{root}/v2/a/b.bin",
    "/etc/v1/passwd",
    "/v1/passwd",
    "v1",
    "v1/a%2Fb",
    "v1/a\x00",
    "v1/a\\b",
    "v1/" + "a" * 256,
    "v1/a\n",
    "",
    None,
    7,
]


@pytest.mark.parametrize("value", FILE_NAMES)
def test_payload_file_strs_accepts_and_refuses_what_payload_file_does(tmp_path, root, value):
    """The reader's one-pattern fast path is the full check's exact equal, paths included."""
    link = tmp_path / "mnt"
    link.symlink_to(root.path)
    for checker in (root, PayloadRoot(link)):
        if isinstance(value, str):
            value = value.format(root=root.path, link=link)
        try:
            checked = checker.payload_file(value, follow_check=False)
        except PayloadPathError as e:
            with pytest.raises(PayloadPathError) as info:
                checker.payload_file_strs(value)
            assert str(info.value) == str(e)
        else:
            assert checker.payload_file_strs(value) == (checked.dir_str, checked.path_str)


@pytest.mark.parametrize("value", FILE_NAMES)
@pytest.mark.parametrize(
    "others",
    [
        pytest.param([], id="alone"),
        pytest.param(["{root}/v2/ok.bin", "{root}/v2/ok2.bin"], id="after files of one dir"),
        pytest.param(["v2/ok.bin", "{root}/v3/ok.bin"], id="after files of two dirs"),
    ],
)
def test_payload_file_names_accepts_and_refuses_what_payload_file_does(
    tmp_path, root, value, others
):
    """The reader's check of a whole call: every way through it (one directory, several, the
    full check file by file) gives payload_file's verdict on each file, errors included."""
    link = tmp_path / "mnt"
    link.symlink_to(root.path)
    for checker in (root, PayloadRoot(link)):
        files = [f.format(root=root.path, link=link) for f in others]
        files.append(value.format(root=root.path, link=link) if isinstance(value, str) else value)
        for batch in (files, files[::-1]):
            try:
                checked = [checker.payload_file(f, follow_check=False) for f in batch]
            except PayloadPathError as e:
                with pytest.raises(PayloadPathError) as info:
                    checker.payload_file_names(batch)
                assert str(info.value) == str(e)
            else:
                assert checker.payload_file_names(batch) == (
                    [f"v{c.version}" for c in checked],
                    [c.name for c in checked],
                )


def test_payload_file_names_of_one_directory_check_every_line(root):
    """Files that share their first file's directory only in part, or hide a second line."""
    good = f"{root.path}/v2/a.bin"
    for bad in (f"x{good}", f"{good}\nv2/b", f"{root.path}/v2/a/b", f"{root.path}/v2/", "v2/a"):
        files = [good, bad]
        if bad == "v2/a":  # fine, under another spelling of the same directory
            assert root.payload_file_names(files) == (["v2", "v2"], ["a.bin", "a"])
            continue
        with pytest.raises(PayloadPathError):
            root.payload_file_names(files)
