"""Short runs go several to a Ray task (orchestrator/executors/ray_driver.py `Feed`): in a sweep of
more than `LISTED` runs, once the first runs of a kind show that its jobs take milliseconds. Each
run ends as it would with a task per job, and a run that fails in a batch fails alone."""
import io

import pytest
from rich.console import Console

from jobs.contract import JobResult
from orchestrator import worker
from orchestrator.executors import ray_driver
from orchestrator.identity import config_yaml, configs_record
from orchestrator.plan import PlannedRun, plan
from orchestrator.progress import Tally
from orchestrator.sweep import Sweep
from store import index
from store.store import DONE, FAILED, Store

QUIET = Console(file=io.StringIO())


def _noop_runs(n: int, root) -> tuple[list[PlannedRun], Store, object]:
    """n runs of the no-op evaluation alone (their train job left out), recorded as sweep `s`."""
    sweep = Sweep.compose(["family=dense", "size=micro", f"seed=range(0,{n})", "eval.jobs=[noop]",
                           "tracker=none", f"store.root={root}"], "s", QUIET)
    runs = plan(sweep.configs, sweep.store)
    for r in runs:
        r.todo = ["noop"]
    sweep.store.create()
    ids = [r.run_id for r in runs]
    sweep.store.record_sweep("s", [], ids, configs_record(ids, [r.config for r in runs]))
    return runs, sweep.store, sweep.executor


def test_a_large_sweep_of_short_runs_is_batched_and_every_run_ends_done(tmp_path, monkeypatch):
    runs, store, executor = _noop_runs(ray_driver.LISTED + 100, tmp_path)
    # A no-op job takes a few ms on a quiet machine and more on a loaded one: the thresholds are
    # raised so that batching follows from the timing logic, not from the machine's load.
    monkeypatch.setattr(ray_driver, "SHORT_S", 5.0)
    monkeypatch.setattr(ray_driver, "BATCH_S", 25.0)
    feeds = []

    class Watched(ray_driver.Feed):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            feeds.append(self)
    monkeypatch.setattr(ray_driver, "Feed", Watched)
    outcome = executor.run(runs, "s", [], store, QUIET)
    assert outcome.statuses == {r.run_id: DONE for r in runs}
    (feed,) = feeds
    assert ray_driver.TIMED <= len(runs) - feed.batched_runs  # the first runs were timed, a task each
    assert feed.batched_runs >= len(runs) // 2
    for r in runs:  # the run's train job was left out: its noop job is done, the run itself pending
        assert store.read_state(r.run_id)["jobs"]["noop"] == {**store.read_state(r.run_id)["jobs"]["noop"],
                                                              "status": DONE, "attempts": 1}
        assert store.read_metrics(r.run_id)["metrics"] == {"noop": 1.0}
    assert {rec["jobs"]["noop"][0] for rec in index.read(str(store.root)).runs.values()} == {DONE}


def test_a_small_sweep_runs_a_task_per_job(tmp_path, monkeypatch):
    """At most `LISTED` runs to do: each finished job gets its line, so each is its own task."""
    runs, store, executor = _noop_runs(12, tmp_path)
    submitted = []
    monkeypatch.setattr(ray_driver.Feed, "_submit_batch", lambda self, batch: submitted.append(batch))
    out = io.StringIO()
    outcome = executor.run(runs, "s", [], store, Console(file=out, width=200))
    assert outcome.statuses == {r.run_id: DONE for r in runs} and not submitted
    assert out.getvalue().count("done dense-micro") == len(runs)


def _failing_noop(bad: str):
    real = worker.get_job

    def get_job(name: str):
        spec = real(name)

        def fn(cfg, run_dir, progress):
            if run_dir.name == bad:
                raise ValueError("boom")
            return JobResult(metrics={"noop": 1.0})
        return spec.__class__(**{**spec.__dict__, "fn": fn})
    return get_job


def test_a_run_that_fails_in_a_batch_fails_alone_and_a_retry_reruns_only_it(tmp_path, monkeypatch):
    runs, store, _ = _noop_runs(3, tmp_path)
    bad = runs[1].run_id
    monkeypatch.setattr(worker, "get_job", _failing_noop(bad))
    batch = [(r.run_id, r.config, r.todo, config_yaml(r.config)) for r in runs]
    with pytest.raises(RuntimeError, match=f"1 of 3 runs of a batch failed; the first, {bad}: ValueError: boom"):
        worker.execute_runs(str(store.root), batch)
    assert [store.read_state(r.run_id)["jobs"]["noop"]["status"] for r in runs] == [DONE, FAILED, DONE]
    with pytest.raises(RuntimeError):  # Ray's retry of the task: the runs done are cached
        worker.execute_runs(str(store.root), batch)
    assert [store.read_state(r.run_id)["jobs"]["noop"]["attempts"] for r in runs] == [1, 2, 1]

    # The driver, told the batch failed after its retries: the failed run fails, the others are done.
    tally = Tally(runs=3, cached=0)
    lines = ray_driver._failed(ray_driver.Task(runs, None), RuntimeError("batch"), tally, store)
    assert tally.ended == {runs[0].run_id: DONE, bad: FAILED, runs[2].run_id: DONE}
    assert len(lines) == 1 and bad in lines[0] and "ValueError: boom" in lines[0]


def test_a_batch_whose_worker_died_fails_the_runs_it_did_not_finish(tmp_path):
    runs, store, _ = _noop_runs(2, tmp_path)
    worker.execute("noop", runs[0].run_id, str(store.root), runs[0].config)  # the first run was done
    tally = Tally(runs=2, cached=0)
    lines = ray_driver._failed(ray_driver.Task(runs, None), RuntimeError("worker died"), tally, store)
    assert tally.ended == {runs[0].run_id: DONE, runs[1].run_id: FAILED}
    assert store.read_state(runs[1].run_id)["jobs"]["noop"]["status"] == FAILED
    assert "worker died" in lines[0] and store.read_state(runs[0].run_id)["jobs"]["noop"]["status"] == DONE
