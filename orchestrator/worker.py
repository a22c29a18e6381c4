"""What runs inside a Ray task: claim the run, execute one job from the registry, record it.

The job's outputs are written before its state says `done`, so `done` always means complete."""
from __future__ import annotations

import time
import traceback
from typing import Callable

from jobs.registry import get_job

from . import tracking
from .store import DONE, Store, write_parquet


def jobs_of(cfg: dict) -> list[str]:
    """The job graph of a run: train, then each listed evaluation on the final checkpoint."""
    return ["train", *cfg["eval"]["jobs"]]


def resources_of(cfg: dict, job: str) -> dict:
    """The resources section that sizes `job`: the size's for training, eval's for evaluations."""
    return cfg["resources"] if job == "train" else cfg["eval"]["resources"]


def _throttled(write: Callable[[dict], None], every_s: float = 0.5) -> Callable[[dict], None]:
    last = [0.0]

    def report(progress: dict) -> None:
        t = time.monotonic()
        if t - last[0] >= every_s or progress.get("step") == progress.get("total_steps"):
            last[0] = t
            write(progress)
    return report


def execute(job: str, run_id: str, store_root: str, cfg: dict, *after: str) -> str:
    """Run `job` of run `run_id` unless it is already done; returns `done` or `cached`.

    `after` are the results of the jobs this one depends on: passing them makes Ray wait."""
    import torch

    torch.set_num_threads(resources_of(cfg, job)["cpus"])  # CPU results depend on the thread count
    store, jobs = Store(store_root), jobs_of(cfg)
    with store.claim(run_id):
        if store.job_state(run_id, job).get("status") == DONE:
            return "cached"
        store.write_config(run_id, cfg)
        store.start_job(run_id, job, jobs)
        run_dir = store.run_dir(run_id)
        tracker = tracking.open_run(cfg, run_id, job, store_root)  # W&B; never raises
        progress = tracker.progress(
            _throttled(lambda p: store.write_progress(run_id, {"job": job, **p})))
        try:
            result = get_job(job)(cfg, run_dir, progress)
            store.merge_metrics(run_id, result.metrics, result.higher_is_better, result.curves)
            if result.items is not None:
                write_parquet(run_dir / "items" / f"{job}.parquet", result.items)
            if result.history is not None:
                write_parquet(run_dir / "history.parquet", result.history)
        except BaseException as e:
            last = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
            where = f" at {last.filename.rsplit('/', 1)[-1]}:{last.lineno}" if last else ""
            store.end_job(run_id, job, jobs, error=f"{type(e).__name__}: {e}{where}")
            tracker.finish(failed=True)
            raise
        tracker.record(store.read_metrics(run_id))
        store.end_job(run_id, job, jobs)
        tracker.finish()
    return DONE
