"""The store's index (store/index.py): what `status` of a large sweep reads instead of every
run's files. It must say what the run directories say, whatever happened to it: a torn write,
damage, loss (a second driver writing and compacting at the same time:
tests/e2e/test_index_concurrent_writers.py)."""
import io
import json
import os

from rich.console import Console

from orchestrator.status import status
from store import index
from store.store import DONE, FAILED, RUNNING, Store

JOBS = ["train", "noop"]


def _finish(store: Store, run_id: str, error: str | None = None) -> None:
    with store.claim(run_id):
        for job in JOBS:
            store.start_job(run_id, job, JOBS)
            store.end_job(run_id, job, JOBS, error=error if job == "noop" else None, durable=False)


def _truth(store: Store) -> dict[str, str]:
    return {rid: store.read_state(rid)["status"] for rid in store.run_ids()}


def _indexed(store: Store) -> dict[str, str]:
    return {rid: rec["status"] for rid, rec in index.read(str(store.root)).runs.items()}


def _status_text(store: Store, names: list[str]) -> str:
    out = io.StringIO()
    status(store, names, Console(file=out, width=200), check=False)
    return out.getvalue()


def _store(tmp_path, runs: int = 6) -> Store:
    store = Store(tmp_path)
    store.create()
    ids = [f"r{i:03d}" for i in range(runs)]
    store.record_sweep("s", [], ids)
    for rid in ids:
        _finish(store, rid, error="ValueError: boom" if rid == "r001" else None)
    return store


def test_the_index_says_what_the_run_directories_say(tmp_path):
    store = _store(tmp_path)
    assert _indexed(store) == _truth(store)
    assert _truth(store)["r001"] == FAILED and _truth(store)["r000"] == DONE
    assert index.compact(str(store.root))  # folded into a snapshot: the same, journals gone
    assert _indexed(store) == _truth(store)


def test_a_torn_journal_line_is_skipped_and_the_rest_read(tmp_path):
    """A writer killed half-way through a line leaves it without its newline: readers skip it,
    and compaction folds the whole lines before it and removes the journal (its writer is gone)."""
    store = _store(tmp_path)
    journal = os.path.join(index.directory(str(store.root)), index.JOURNAL)
    whole = open(os.path.join(journal, os.listdir(journal)[0]), "rb").read().splitlines(keepends=True)[-1]
    dead = os.path.join(journal, "elsewhere-1-1.jsonl")
    with open(dead, "wb") as f:
        f.write(whole + b'{"run":"r000","v":99999999999999,"status":"fail')
    assert _indexed(store) == _truth(store)
    assert index.compact(str(store.root))
    assert not os.path.exists(dead)
    assert _indexed(store) == _truth(store)
    store.start_job("r000", "train", JOBS)  # later records of the run still win
    assert _indexed(store)["r000"] == RUNNING


def test_a_damaged_snapshot_is_rebuilt_from_the_run_directories_and_status_says_so(tmp_path):
    store = _store(tmp_path)
    assert index.compact(str(store.root))
    directory = index.directory(str(store.root))
    snapshot = next(n for n in os.listdir(directory) if index.SNAPSHOT.fullmatch(n))
    path = os.path.join(directory, snapshot)
    with open(path, "r+b") as f:  # damaged from outside: the index's own writes are never partial
        f.truncate(os.path.getsize(path) // 2)
    text = _status_text(store, ["s"])
    assert "index damaged" in text and "rebuilt from the run directories" in text
    assert "done 5" in text and "failed 1" in text
    assert _indexed(store) == _truth(store)  # the rebuilt snapshot reads again


def test_a_lost_index_is_rebuilt_and_status_says_so(tmp_path):
    store = _store(tmp_path)
    for root, dirs, files in os.walk(index.directory(str(store.root)), topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    text = _status_text(store, ["s"])
    assert "index missing: rebuilt from the run directories" in text
    assert "done 5" in text and "failed 1" in text
    assert _indexed(store) == _truth(store)


def test_snapshots_are_created_whole_under_new_names(tmp_path):
    """Two compactors race for one generation: exactly one creates it, never a mix of both."""
    store = _store(tmp_path, runs=3)
    root = str(store.root)
    found = index.read(root)
    assert index.compact(root, found)
    assert not index.compact(root, found)  # the same generation again: refused, not overwritten
    names = [n for n in os.listdir(index.directory(root)) if index.SNAPSHOT.fullmatch(n)]
    assert len(names) == 1
    with open(os.path.join(index.directory(root), names[0])) as f:
        assert json.load(f)["generation"] == found.generation + 1


def test_status_of_a_large_sweep_prints_counts_and_the_runs_that_need_a_look(tmp_path):
    """Beyond 200 runs a line each only for the runs neither done nor pending; `--all` every run."""
    store = Store(tmp_path)
    store.create()
    ids = [f"r{i:03d}" for i in range(260)]
    store.record_sweep("s", [], ids)
    for rid in ids[:250]:
        _finish(store, rid, error="ValueError: boom" if rid in ("r007", "r100") else None)
    text = _status_text(store, ["s"])
    assert "done 248" in text and "failed 2" in text and "pending 10" in text
    assert "r007" in text and "r100" in text and "r000" not in text
    assert "2 of 260 runs listed" in text
    out = io.StringIO()
    status(store, ["s"], Console(file=out, width=200), check=False, every=True)
    assert all(rid in out.getvalue() for rid in ids)


def test_a_snapshot_of_format_1_is_read_and_one_with_broken_columns_is_rebuilt(tmp_path):
    """A store indexed by the earlier format (a record per run) reads as it is; a snapshot whose
    columns disagree in length is damage, rebuilt like any other."""
    store = _store(tmp_path)
    root, truth = str(store.root), _truth(store)
    runs = index.read(root).runs
    assert index.compact(root)
    directory = index.directory(root)
    (name,) = [n for n in os.listdir(directory) if index.SNAPSHOT.fullmatch(n)]
    generation = int(index.SNAPSHOT.fullmatch(name).group(1))
    with open(os.path.join(directory, name), "w") as f:
        json.dump({"format": 1, "generation": generation, "runs": runs, "folded": {}}, f)
    assert _indexed(store) == truth
    with open(os.path.join(directory, name)) as f:
        assert json.load(f)["format"] == 1
    with open(os.path.join(directory, name), "w") as f:
        json.dump({"format": index.FORMAT, "generation": generation, "folded": {}, "runs": list(truth),
                   "v": [1], "status": [DONE], "error": {}, "jobs": [0], "job_tables": [{}]}, f)
    assert "index damaged" in _status_text(store, ["s"])
    assert _indexed(store) == truth


def test_the_snapshot_holds_each_distinct_jobs_table_once(tmp_path):
    store = _store(tmp_path, runs=20)
    assert index.compact(str(store.root))
    directory = index.directory(str(store.root))
    (name,) = [n for n in os.listdir(directory) if index.SNAPSHOT.fullmatch(n)]
    with open(os.path.join(directory, name)) as f:
        snapshot = json.load(f)
    assert len(snapshot["runs"]) == 20 and len(snapshot["job_tables"]) == 2  # done, and r001's failed noop
    assert snapshot["error"] == {"r001": "ValueError: boom"}
    assert index.read(str(store.root)).runs["r001"]["jobs"] == {"train": [DONE, 1], "noop": [FAILED, 1]}


def test_a_sweep_folds_its_journals_so_status_reads_one_snapshot(tmp_path):
    """What a sweep does once its jobs are done (index.fold): the journals' lines in a new
    snapshot, the journals of writers that are gone deleted; nothing to fold, nothing written."""
    store = _store(tmp_path)
    root = str(store.root)
    assert index.read(root).unfolded == 6 * 2 * 2 and index.read(root).generation == -1
    index.fold(root)
    folded = index.read(root)
    assert folded.unfolded == 0 and folded.generation == 0
    journals = os.listdir(os.path.join(index.directory(root), index.JOURNAL))
    assert journals == [os.path.basename(index.journal(root).path)]
    index.fold(root)  # the journals hold nothing new: no new generation
    assert index.read(root).generation == 0
    assert {rid: rec["status"] for rid, rec in folded.runs.items()} == _truth(store)
