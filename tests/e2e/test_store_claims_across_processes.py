"""The store's run claims between processes: exclusive, and freed when the holder dies."""
import multiprocessing as mp
import time

from store.store import Store


def _hold(root, seconds, ready):
    with Store(root).claim("r1"):
        ready.set()
        time.sleep(seconds)


def test_claim_is_exclusive_across_processes_and_freed_on_death(tmp_path):
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_hold, args=(str(tmp_path), 30, ready))
    p.start()
    assert ready.wait(30)
    s = Store(tmp_path)
    assert s.is_claimed("r1")
    with s.claim("r1", wait=False) as got:
        assert not got
    p.kill()  # the kernel releases the flock of a killed process
    p.join()
    assert not s.is_claimed("r1")
