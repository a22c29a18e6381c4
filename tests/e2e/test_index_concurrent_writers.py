"""The store's index with writers in other (forked) processes: two drivers writing and compacting
at once, and a compaction beside a live writer. The store helpers are test_index's."""
import multiprocessing as mp
import os

from store import index
from store.store import Store
from test_index import _finish, _indexed, _store, _truth


def _driver(root: str, ids: list[str], rounds: int) -> None:
    """A second driver: runs jobs of its own runs and of shared ones, compacting as it goes."""
    store = Store(root)
    for i in range(rounds):
        for rid in ids:
            _finish(store, rid, error="ValueError: boom" if (i + len(rid)) % 3 == 0 else None)
        index.compact(root)


def test_two_drivers_writing_and_compacting_at_once_agree_with_the_run_directories(tmp_path):
    store = Store(tmp_path)
    store.create()
    mine, theirs, shared = ([f"{p}{i}" for i in range(15)] for p in ("a", "b", "c"))
    ctx = mp.get_context("fork")
    drivers = [ctx.Process(target=_driver, args=(str(tmp_path), ids + shared, 4)) for ids in (mine, theirs)]
    for d in drivers:
        d.start()
    for d in drivers:
        d.join(120)
        assert d.exitcode == 0
    assert len(_truth(store)) == 45
    assert _indexed(store) == _truth(store)
    assert index.compact(str(store.root))  # both writers are gone: their journals are folded and removed
    assert _indexed(store) == _truth(store)
    assert os.listdir(os.path.join(index.directory(str(store.root)), index.JOURNAL)) == []


def test_compaction_keeps_the_journal_of_a_live_writer(tmp_path):
    store = _store(tmp_path, runs=2)
    ctx = mp.get_context("fork")
    ready, finish = ctx.Event(), ctx.Event()

    def writer() -> None:
        _finish(Store(tmp_path), "late")
        ready.set()
        finish.wait(60)
        _finish(Store(tmp_path), "later")

    p = ctx.Process(target=writer)
    p.start()
    assert ready.wait(60)
    assert index.compact(str(store.root))
    finish.set()
    p.join(60)
    assert p.exitcode == 0
    assert _indexed(store) == _truth(store) and {"late", "later"} <= _indexed(store).keys()
