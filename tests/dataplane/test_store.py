import errno
import os
from pathlib import Path

import numpy as np
import pytest

from payloadrun.codec import PositionedRows, mask_rows, routing_rows
from payloadrun.failures import failure_reason
from payloadrun.paths import PayloadPathError, PayloadRoot
from payloadrun.store import PayloadStore, PayloadWriteError, layout_segments
from payloadrun_devkit.mounts import tmpfs


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "payloads"
    root.mkdir()
    return PayloadStore(root)


def test_write_one_file_arrays_back_to_back(store):
    experts = np.random.default_rng(0).integers(0, 128, size=(19, 4, 2))
    routing = routing_rows(experts, prompt_len=12, completion_len=8)
    mask = mask_rows(np.array([1, 2, 3]), np.array([2, 0, 1, 0, 0, 0, 0, 0]), prompt_len=12)
    segments = store.write(f"{store.root.path}/v3", [routing, mask])

    assert len(segments) == 2
    r, m = segments
    assert r.file == m.file
    path = r.file
    assert path.startswith(f"{store.root.path}/v3/") and path.endswith(".bin")
    assert (r.field, r.offset, r.pos, r.rows, r.dtype, r.shape) == (
        "routed_experts",
        0,
        0,
        19,
        "uint8",
        (4, 2),
    )
    assert (m.field, m.offset, m.pos, m.rows, m.dtype, m.shape) == (
        "sampling_mask",
        19 * 8,
        12,
        8,
        "int32",
        (2,),
    )
    raw = Path(path).read_bytes()
    assert len(raw) == r.nbytes + m.nbytes
    assert raw[: r.nbytes] == experts.astype(np.uint8).tobytes()
    assert raw[r.nbytes :] == mask.rows.tobytes()


def test_each_write_makes_a_new_file(store):
    part = PositionedRows("routed_experts", np.zeros((2, 1, 1), np.uint8), 0)
    a = store.write("v1", [part])[0].file
    b = store.write("v1", [part])[0].file
    assert a != b
    assert sorted(os.listdir(store.root.path / "v1")) == sorted(
        [os.path.basename(a), os.path.basename(b)]
    )


def test_write_refuses_paths_outside_the_root_and_writes_nothing(store, tmp_path):
    part = PositionedRows("routed_experts", np.zeros((1, 1, 1), np.uint8), 0)
    for bad in (str(tmp_path / "v1"), f"{store.root.path}/../v1", "x7", f"{store.root.path}/v1/.."):
        with pytest.raises(PayloadPathError):
            store.write(bad, [part])
    assert os.listdir(store.root.path) == []
    assert sorted(os.listdir(tmp_path)) == ["payloads"]


def test_empty_arrays_make_an_empty_file(store):
    part = PositionedRows("sampling_mask", np.zeros((0, 1), np.int32), 4)
    (seg,) = store.write("v0", [part])
    assert seg.rows == 0 and os.path.getsize(seg.file) == 0


def test_layout_segments_offsets():
    parts = [
        PositionedRows("a", np.zeros((3, 2), np.uint16), 5),
        PositionedRows("b", np.zeros((4,), np.int32), 1),
    ]
    a, b = layout_segments("f", parts)
    assert (a.offset, b.offset, b.shape) == (0, 12, ())


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.ENOSPC, "no_space"),
        (errno.EDQUOT, "no_space"),
        (errno.EACCES, "permission"),
        (errno.EROFS, "permission"),
        (errno.ESTALE, "volume_gone"),
        (errno.ENOENT, "volume_gone"),
        (errno.EINTR, "io_error"),
    ],
)
def test_failure_reason(code, reason):
    assert failure_reason(OSError(code, os.strerror(code))) == reason


def test_disk_full_raises_no_space_and_removes_the_partial_file(tmp_path):
    with tmpfs(tmp_path / "small", "size=256k") as mnt:
        store = PayloadStore(PayloadRoot(mnt))
        big = PositionedRows("routed_experts", np.ones((4096, 48, 8), np.uint8), 0)
        with pytest.raises(PayloadWriteError) as info:
            store.write("v1", [big])
        assert info.value.reason == "no_space"
        assert "no_space" in str(info.value) and str(mnt) in str(info.value)
        assert os.listdir(mnt / "v1") == []


def test_read_only_volume_raises_permission_and_writes_nothing(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=64k") as mnt:
        store = PayloadStore(PayloadRoot(mnt))
        part = PositionedRows("routed_experts", np.zeros((1, 1, 1), np.uint8), 0)
        with pytest.raises(PayloadWriteError) as info:
            store.write("v1", [part])
        assert info.value.reason == "permission"
        assert os.listdir(mnt) == []
