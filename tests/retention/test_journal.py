import errno
import json

import pytest

from payloadrun.retention import journal
from payloadrun.retention.journal import Journal, JournalError, header, read_records
from payloadrun_devkit.mounts import fill, tmpfs


def test_append_is_read_back_in_order(tmp_path):
    j = Journal(tmp_path / "j.jsonl")
    j.open()
    j.append({"op": "run", "run_id": "r"})
    j.append({"op": "policy", "step": 1})
    j.close()
    assert list(read_records(j.path)) == [{"op": "run", "run_id": "r"}, {"op": "policy", "step": 1}]
    assert header(j.path) == {"op": "run", "run_id": "r"}
    assert j.size == j.path.stat().st_size


def test_torn_last_line_is_dropped_and_cut_before_appending(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"op":"run","run_id":"r"}\n{"op":"policy","st')  # crash mid-append
    assert list(read_records(path)) == [{"op": "run", "run_id": "r"}]
    j = Journal(path)
    j.open()
    j.append({"op": "policy", "step": 2})
    j.close()
    assert [r["op"] for r in read_records(path)] == ["run", "policy"]
    assert path.read_bytes().endswith(b'{"op":"policy","step":2}\n')


def test_a_damaged_middle_line_is_an_error_not_a_guess(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"op":"run"}\nnot json\n{"op":"policy","step":1}\n')
    with pytest.raises(JournalError, match="line 2 is not JSON"):
        list(read_records(path))
    path.write_bytes(b'{"op":"run"}\n[1, 2]\n')
    with pytest.raises(JournalError, match="line 2 is not a record"):
        list(read_records(path))


def test_missing_journal_reads_as_empty(tmp_path):
    assert list(read_records(tmp_path / "absent")) == []
    assert header(tmp_path / "absent") is None


def test_rewrite_replaces_atomically_and_appends_continue(tmp_path):
    j = Journal(tmp_path / "j.jsonl")
    j.open()
    for step in range(50):
        j.append({"op": "policy", "step": step})
    big = j.size
    j.rewrite([{"op": "run", "run_id": "r"}, {"op": "policy", "step": 49}])
    assert j.size < big
    j.append({"op": "policy", "step": 50})
    j.close()
    assert [r.get("step") for r in read_records(j.path)] == [None, 49, 50]
    assert not (tmp_path / "j.jsonl.tmp").exists()
    assert all(json.loads(line) for line in j.path.read_text().splitlines())


def test_a_failed_append_is_cut_off_so_the_next_starts_a_clean_line(tmp_path):
    """On a real full volume: the record's first bytes fill the journal's last page, the rest
    meets ENOSPC, and the part that reached the file is cut off again."""
    with tmpfs(tmp_path / "small", "size=64k") as volume:
        j = Journal(volume / "j.jsonl")
        j.open()
        j.append({"op": "run", "run_id": "r"})  # the journal's first page, mostly free
        fill(volume)  # every other page taken
        with pytest.raises(OSError, match="No space") as info:
            j.append({"op": "policy", "step": 1, "pad": "x" * 8192})  # more than the page holds
        assert info.value.errno == errno.ENOSPC
        j.append({"op": "policy", "step": 2})  # fits in the page left free by the cut
        j.close()
        assert [r.get("step") for r in read_records(j.path)] == [None, 2]
        assert j.size == j.path.stat().st_size


def test_a_rewrite_whose_directory_fsync_fails_appends_to_the_new_file(tmp_path, monkeypatch):
    """After the rename the path names the new journal: appends must not go to the old inode,
    which is unlinked and would lose every acknowledged event at the next start."""
    j = Journal(tmp_path / "j.jsonl")
    j.open()
    for step in range(5):
        j.append({"op": "policy", "step": step})

    def fsync_fails(path):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(journal, "fsync_dir", fsync_fails)
    opens = []
    real_open = Journal.open

    def open_fails_once(self):
        opens.append(self.path)
        if len(opens) == 1:
            raise OSError(errno.ESTALE, "Stale file handle")
        real_open(self)

    monkeypatch.setattr(Journal, "open", open_fails_once)
    with pytest.raises(OSError, match="Stale"):
        j.rewrite([{"op": "run", "run_id": "r"}, {"op": "policy", "step": 4}])
    j.append({"op": "policy", "step": 5})  # reopens the new file
    j.close()
    assert [r.get("step") for r in read_records(j.path)] == [None, 4, 5]
    assert len(opens) == 2
