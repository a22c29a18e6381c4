"""What runs inside a Ray task: claim the run, execute one job from the registry, record it.

The job's outputs are written before its state says `done`, so `done` always means complete.
A training job of one process runs inside the task (the fast path); one of several processes
runs `torchrun` (jobs/launch.py) from the task, and one of several nodes gets a placement
group with one bundle per node and one task per bundle (`execute_nodes`). The task of node
rank 0 holds the run's claim and writes its state; the others only run their node's ranks."""
from __future__ import annotations

import json
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

import jobs
from jobs import launch
from jobs.registry import JobResult, Progress, get_job

from . import tracking
from .config import procs_per_node
from .store import DONE, Store, write_parquet

PROJECT_ROOT = Path(jobs.__file__).resolve().parent.parent
DURABLE_AFTER_S = 1.0  # jobs that ran this long have their results fsync'ed


def jobs_of(cfg: dict) -> list[str]:
    """The job graph of a run: train, then each listed evaluation on the final checkpoint."""
    return ["train", *cfg["eval"]["jobs"]]


def resources_of(cfg: dict, job: str) -> dict:
    """The resources section that sizes `job`: the size's for training, eval's for evaluations."""
    return cfg["resources"] if job == "train" else cfg["eval"]["resources"]


def processes_of(cfg: dict, job: str) -> tuple[int, int]:
    """(nodes, processes per node) of a job; evaluations always run as one process."""
    r = resources_of(cfg, job)
    return (r["nodes"], procs_per_node(r)) if job == "train" else (1, 1)


def bundle_of(cfg: dict, job: str) -> dict[str, float]:
    """What the job needs on each of its nodes, in Ray's resource names."""
    r = resources_of(cfg, job)
    return {"CPU": r["cpus"], "GPU": r["gpus"], "memory": int(r["memory_gb"] * 2**30)}


def _node_id() -> Optional[str]:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _throttled(write: Callable[[dict], None], every_s: float = 0.5) -> Callable[[dict], None]:
    last = [0.0]

    def report(progress: dict) -> None:
        t = time.monotonic()
        if t - last[0] >= every_s or progress.get("step") == progress.get("total_steps"):
            last[0] = t
            write(progress)
    return report


def execute(job: str, run_id: str, store_root: str, cfg: dict, *after: str,
            rendezvous: Optional[dict] = None) -> str:
    """Run `job` of run `run_id` unless it is already done; returns `done` or `cached`.

    `after` are the results of the jobs this one depends on: passing them makes Ray wait.
    `rendezvous` (from `execute_nodes`) makes this the task of one node of a multi-node job:
    node_rank, master_addr, master_port and the nodes' Ray ids."""
    store, jobs = Store(store_root), jobs_of(cfg)
    if rendezvous and rendezvous["node_rank"] > 0:
        _torchrun(job, cfg, store.run_dir(run_id), rendezvous, progress=None)
        return DONE
    if processes_of(cfg, job) == (1, 1):
        import torch

        torch.set_num_threads(resources_of(cfg, job)["cpus"])  # CPU results depend on the thread count
    with store.claim(run_id):
        # Damaged files (store.problems) are moved aside and their jobs redone. Only this
        # process writes the state until the claim ends, so it is kept, not read again.
        state = store.recover(run_id, jobs)
        if state.get("jobs", {}).get(job, {}).get("status") == DONE:
            return "cached"
        store.write_config(run_id, cfg)
        state = store.start_job(run_id, job, jobs, state, node_id=_node_id(),  # where it runs (Ray node ids)
                                **({"node_ids": rendezvous["node_ids"]} if rendezvous else {}))
        run_dir = store.run_dir(run_id)
        tracker = tracking.open_run(cfg, run_id, job, store_root)  # W&B; never raises
        progress = tracker.progress(
            _throttled(lambda p: store.write_progress(run_id, {"job": job, **p})))
        started = time.monotonic()
        try:
            if processes_of(cfg, job) == (1, 1):
                result = get_job(job)(cfg, run_dir, progress)
            else:
                result = _torchrun(job, cfg, run_dir, rendezvous, progress)
            # A job shorter than a second is cheaper to redo after a power cut than two fsyncs
            # (a lost write reads as a stale or unreadable file, and the job reruns).
            durable = time.monotonic() - started >= DURABLE_AFTER_S
            metrics = store.merge_metrics(run_id, result.metrics, result.higher_is_better,
                                          result.curves, durable)
            if result.items is not None:
                write_parquet(run_dir / "items" / f"{job}.parquet", result.items)
            if result.history is not None:
                write_parquet(run_dir / "history.parquet", result.history)
        except BaseException as e:
            last = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
            where = f" at {last.filename.rsplit('/', 1)[-1]}:{last.lineno}" if last else ""
            store.end_job(run_id, job, jobs, error=f"{type(e).__name__}: {e}{where}", state=state)
            tracker.finish(failed=True)
            raise
        tracker.record(metrics)
        store.end_job(run_id, job, jobs, durable=durable, state=state)
        tracker.finish()
    return DONE


def _torchrun(job: str, cfg: dict, run_dir: Path, rendezvous: Optional[dict],
              progress: Optional[Progress]) -> Optional[JobResult]:
    """This node's share of a multi-process job; node rank 0 returns the job's result."""
    if job == "train" and cfg["backend"]["name"] == "nanotron":  # runs torchrun per stage itself
        from jobs.nanotron.train import train_job
        return train_job(cfg, run_dir, progress, rendezvous)
    nodes, per_node = processes_of(cfg, job)
    rdv = rendezvous or {"node_rank": 0, "master_addr": "127.0.0.1", "master_port": launch.free_port()}
    threads = max(1, int(resources_of(cfg, job)["cpus"]) // per_node)

    def relay(line: str) -> None:
        record = launch.parse_progress(line)
        if record is not None and progress is not None:
            progress(record)

    with tempfile.TemporaryDirectory(prefix=f"launch-{job}-") as tmp:
        config, result = Path(tmp) / "config.json", Path(tmp) / "result.json"
        config.write_text(json.dumps(cfg))
        launch.run_torchrun(
            ["-m", "jobs.launch", "--job", job, "--config", str(config), "--run-dir", str(run_dir),
             "--result", str(result), "--threads", str(threads)],
            nproc_per_node=per_node, nnodes=nodes, node_rank=rdv["node_rank"],
            master_addr=rdv["master_addr"], master_port=rdv["master_port"],
            threads_per_proc=threads, on_line=relay, cwd=str(PROJECT_ROOT))
        return launch.load_result(result) if rdv["node_rank"] == 0 else None


def _rendezvous_point() -> dict:
    """Runs on node rank 0's bundle: that node's IP and a port free there."""
    import ray

    return {"master_addr": ray.util.get_node_ip_address(), "master_port": launch.free_port()}


def execute_nodes(job: str, run_id: str, store_root: str, cfg: dict, *after: str) -> str:
    """A multi-node job: a STRICT_SPREAD placement group of one bundle per node, one `execute`
    task per bundle with torchrun's rendezvous at bundle 0; the group is removed afterwards.

    Runs as a resource-free Ray task; a failure on any node cancels the others and is raised."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if Store(store_root).job_state(run_id, job).get("status") == DONE:
        return "cached"
    nodes, _ = processes_of(cfg, job)
    bundle = bundle_of(cfg, job)
    group = placement_group([dict(bundle)] * nodes, strategy="STRICT_SPREAD",
                            name=f"{run_id}:{job}")
    try:
        ray.get(group.ready())
        node_ids = [placement_group_table(group)["bundles_to_node_id"][i] for i in range(nodes)]

        def on(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)

        point = ray.get(ray.remote(_rendezvous_point).options(
            num_cpus=0, scheduling_strategy=on(0)).remote())
        task = ray.remote(execute)
        refs = [task.options(num_cpus=bundle["CPU"], num_gpus=bundle["GPU"], memory=bundle["memory"],
                             scheduling_strategy=on(i), max_retries=0,
                             name=f"{run_id}:{job}:node{i}").remote(
                    job, run_id, store_root, cfg,
                    rendezvous={**point, "node_rank": i, "node_ids": node_ids})
                for i in range(nodes)]
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except BaseException:
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise
        return ray.get(refs[0])
    finally:
        remove_placement_group(group)
