"""The results store: atomic files, run states, sweeps as growing sets."""
import json
import os

import pytest

from common.atomic import write_json
from store.layout import FORMAT_VERSION, OWNER
from store.store import CORRUPT, DONE, FAILED, RUNNING, Store, StoreError, run_status


def test_state_round_trip_and_run_status(tmp_path):
    s = Store(tmp_path)
    s.create()
    jobs = ["train", "regbench"]
    s.start_job("r1", "train", jobs)
    st = s.read_state("r1")
    assert st["status"] == RUNNING and st["jobs"]["train"]["attempts"] == 1
    s.end_job("r1", "train", jobs)
    assert s.read_state("r1")["status"] == "pending"  # regbench still to do
    s.start_job("r1", "regbench", jobs)
    s.end_job("r1", "regbench", jobs, error="ValueError: boom")
    st = s.read_state("r1")
    assert st["status"] == FAILED and st["error"] == "ValueError: boom"
    s.start_job("r1", "regbench", jobs)
    s.end_job("r1", "regbench", jobs)
    st = s.read_state("r1")
    assert st["status"] == DONE and st["error"] is None and st["jobs"]["regbench"]["attempts"] == 2


def test_truncated_state_reads_as_corrupt_and_is_recovered(tmp_path):
    s = Store(tmp_path)
    s.create()
    s.start_job("r1", "train", ["train"])
    path = s.run_dir("r1") / "state.json"
    path.write_text(path.read_text()[:20])
    assert s.read_state("r1")["status"] == CORRUPT
    path.write_bytes(b"\xff\xfe{")  # not even UTF-8 (a disk error, a binary copied over it)
    assert s.read_state("r1")["status"] == CORRUPT
    s.start_job("r1", "train", ["train"])
    assert s.read_state("r1")["status"] == RUNNING


def test_atomic_write_leaves_no_temp_files(tmp_path):
    write_json(tmp_path / "a.json", {"x": 1})
    write_json(tmp_path / "a.json", {"x": 2})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_sweep_is_a_growing_set_of_runs(tmp_path):
    s = Store(tmp_path)
    s.create()
    s.record_sweep("demo", ["seed=0,1"], ["a", "b"])
    sw = s.record_sweep("demo", ["seed=1,2"], ["b", "c"])
    assert sw["run_ids"] == ["a", "b", "c"] and len(sw["invocations"]) == 2
    with pytest.raises(StoreError, match="known sweeps: demo"):
        s.read_sweep("nope")


def test_future_format_version_is_refused(tmp_path):
    write_json(tmp_path / "store.json", {"format_version": 99})
    with pytest.raises(StoreError, match="format version 99, newer"):
        Store(tmp_path).check()


def test_a_new_store_gets_the_marker_and_an_old_one_keeps_its_store_json_until_upgraded(tmp_path):
    new = Store(tmp_path / "new")
    assert new.check() is None
    new.create()
    marker = json.loads((tmp_path / "new" / "store.json").read_text())
    assert marker == {"store": OWNER, "format_version": FORMAT_VERSION}
    assert new.check() == FORMAT_VERSION
    old = tmp_path / "old"
    (old / "runs").mkdir(parents=True)
    write_json(old / "store.json", {"format_version": 3})
    Store(old).create()
    assert Store(old).check() == 3  # store/upgrade.py writes the marker, last
    half = tmp_path / "half"  # being created by another sweep: our directories, the marker's temporary file
    (half / "runs").mkdir(parents=True)
    (half / ".store.json.123.456.tmp").write_text("")
    assert Store(half).check() is None


@pytest.mark.parametrize("content, needle", [
    ('{"format_version": 3}', "not this orchestrator's marker"),  # ours only beside our directories
    ('{"format_version": 3, "owner": "them"}', "not this orchestrator's marker"),
    ('{"store": "another-tool", "format_version": 4}', "not this orchestrator's marker"),
    ('{"format_version": true}', "not this orchestrator's marker"),
    ("[1, 2]", r"holds \[1, 2\], not this orchestrator's marker"),
    ("version 3", "is not JSON"),
])
def test_a_store_json_not_ours_is_refused_and_left_as_it_is(tmp_path, content, needle):
    (tmp_path / "store.json").write_text(content)
    with pytest.raises(StoreError, match=needle):
        Store(tmp_path).create()
    assert (tmp_path / "store.json").read_text() == content and os.listdir(tmp_path) == ["store.json"]


def test_a_file_or_a_directory_of_unrelated_files_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file, not a results store"):
        Store(tmp_path / "file").create()
    for name in ("a", "b", "c", "d"):
        (tmp_path / "mine" / name).mkdir(parents=True)
    with pytest.raises(StoreError, match=r"not a results store \(a, b, c, \.\.\.\) and no store.json"):
        Store(tmp_path / "mine").create()
    assert sorted(os.listdir(tmp_path / "mine")) == ["a", "b", "c", "d"]


def test_run_status_precedence():
    assert run_status(["done", "done"]) == DONE
    assert run_status(["done", "pending"]) == "pending"
    assert run_status(["failed", "running"]) == FAILED
    assert run_status([]) == "pending"


def test_damaged_files_are_found_moved_aside_and_the_jobs_set_to_rerun(tmp_path):
    from store import integrity

    s = Store(tmp_path)
    s.create()
    jobs = ["train", "regbench"]
    for job in jobs:
        s.start_job("r1", job, jobs)
        s.end_job("r1", job, jobs)
    s.merge_metrics("r1", {"final_loss": 1.0}, {"final_loss": {"label": "final loss", "higher_is_better": False}},
                    {}, {})
    ckpt = s.run_dir("r1") / "checkpoints" / "step_0000010.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"x" * 100)
    integrity.write_digest(ckpt)
    assert s.problems("r1") == []
    ckpt.write_bytes(b"x" * 60)
    (s.run_dir("r1") / "metrics.json").write_text('{"metrics": {"fin')
    found = s.problems("r1")
    assert [p.split(" ")[0] for p in found] == ["metrics.json", "checkpoint"]
    assert "60 bytes, its digest says 100" in found[1]
    state = s.recover("r1", jobs)
    assert state == s.read_state("r1")
    assert {j: (e["status"], e["attempts"]) for j, e in state["jobs"].items()} == {
        "train": ("pending", 1), "regbench": ("pending", 1)}
    assert [r["problem"] for r in state["recovered"]] == found
    assert (s.run_dir("r1") / "metrics.json.corrupt").exists() and not ckpt.exists()
    assert s.problems("r1") == [] and len(s.recovered("r1")) == 3  # two notes, one quarantine


def test_the_live_view_parses_a_state_again_only_when_it_changed(tmp_path):
    from orchestrator.progress import States

    s = Store(tmp_path)
    s.create()
    states = States(s)
    assert states("r1")["status"] == "pending"  # no state.json yet
    s.start_job("r1", "train", ["train"])
    first = states("r1")
    assert first["status"] == RUNNING
    assert states("r1") is first  # unchanged file: the parsed state is reused
    s.end_job("r1", "train", ["train"])
    assert states("r1")["status"] == DONE  # an atomic write is a new file, seen at once
    (s.run_dir("r1") / "state.json").write_text('{"status": "do')
    assert states("r1")["status"] == CORRUPT
