"""What runs inside a Ray task (or a Slurm array task): claim the run, execute one job from the
registry, record it.

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
from typing import Any, Callable, Optional

from common.atomic import write_parquet
from config.run import RunConfig, job_dict
from jobs import environment, launch
from jobs.backends import backend_of
from jobs.checkpoint import keep_final_weights
from jobs.contract import JobResult, Progress
from jobs.registry import get_job
from orchestrator import tracking
from orchestrator.identity import config_yaml, settings_digest
from orchestrator.plan import bundle_of, done, jobs_of, processes_of, resources_of
from store.records import Environment, RunState, now
from store.store import DONE, WAITING, Store

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DURABLE_AFTER_S = 1.0  # jobs that ran this long have their results fsync'ed
WAITING_AFTER_S = 5.0  # a multi-node job's nodes not free after this long: its state says it waits
RunBatch = list[tuple[str, RunConfig, list[str], Optional[str]]]  # runs of one task (`execute_runs`)


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


def execute(job: str, run_id: str, store_root: str, cfg: RunConfig, *after: Any,
            rendezvous: Optional[dict] = None, config_text: Optional[str] = None,
            sweep: Optional[str] = None) -> tuple[str, RunState]:
    """Run `job` of run `run_id` unless it is already done; returns `done` or `cached`, and the
    run's state after it (so the driver need not read it).

    `after` are the results of the jobs this one depends on: passing them makes Ray wait.
    `rendezvous` (from `execute_nodes`) makes this the task of one node of a multi-node job:
    node_rank, master_addr, master_port and the nodes' Ray ids. `config_text` is the run's
    config.yaml as the driver rendered it (rendered here otherwise); `sweep` the sweep that runs
    it (its W&B group)."""
    store, jobs = Store(store_root), jobs_of(cfg)
    if rendezvous and rendezvous["node_rank"] > 0:
        _multi_process(job, cfg, store.run_dir(run_id), run_id, rendezvous, progress=None, sweep=sweep)
        return DONE, {}
    if processes_of(cfg, job) == (1, 1):
        import torch

        torch.set_num_threads(resources_of(cfg, job).cpus)  # CPU results depend on the thread count
    with store.claim(run_id):
        # Damaged files (store.problems) are moved aside and their jobs redone. Only this
        # process writes the state until the claim ends, so it is kept, not read again.
        state = store.recover(run_id, jobs)
        if done(state, job, cfg):
            return "cached", state
        environment.check_capability(cfg.train.cpu_capability)  # before anything is written: a job that cannot run
        store.write_config(run_id, lambda: config_text or config_yaml(cfg))
        state = store.start_job(run_id, job, jobs, state, environment=_environment(cfg, job),
                                node_id=_node_id(),  # where it runs (Ray node ids)
                                **({"node_ids": rendezvous["node_ids"]} if rendezvous else {}))
        run_dir = store.run_dir(run_id)
        tracker = tracking.open_run(cfg, run_id, job, store_root, sweep)  # W&B; never raises
        progress = tracker.progress(
            _throttled(lambda p: store.write_progress(run_id, {"job": job, **p})))
        started = time.monotonic()
        spec = get_job(job)
        result: Optional[JobResult]
        try:
            if processes_of(cfg, job) == (1, 1) and not (job == "train" and cfg.backend.launches_ranks):
                result = spec.fn(cfg, run_dir, progress)
            else:
                result = _multi_process(job, cfg, run_dir, run_id, rendezvous, progress, sweep)
            assert result is not None, "node rank 0 (this process: it holds the claim) gets the job's result"
            specs, curve_specs = spec.specs_of(result)
            # A job shorter than a second is cheaper to redo after a power cut than two fsyncs
            # (a lost write reads as a stale or unreadable file, and the job reruns).
            durable = time.monotonic() - started >= DURABLE_AFTER_S
            metrics = store.merge_metrics(run_id, result.metrics, specs, result.curves, curve_specs, durable)
            if result.items is not None:
                write_parquet(store.run(run_id).items(job), result.items, durable=durable)
            if result.history is not None:
                write_parquet(store.run(run_id).history, result.history, durable=durable)
        except BaseException as e:
            last = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
            where = f" at {last.filename.rsplit('/', 1)[-1]}:{last.lineno}" if last else ""
            store.end_job(run_id, job, jobs, error=f"{type(e).__name__}: {e}{where}", state=state)
            tracker.finish(failed=True)
            raise
        tracker.record(metrics)
        state = store.end_job(run_id, job, jobs, durable=durable, state=state,
                              **({"settings": digest} if (digest := settings_digest(cfg, job)) else {}))
        if state["status"] == DONE and cfg.store.keep_checkpoints == "final_weights":
            keep_final_weights(run_dir)  # under the claim: no job of the run reads them meanwhile
        tracker.finish()
    return DONE, state


def _environment(cfg: RunConfig, job: str) -> tuple[str, Environment]:
    """The environment the job computes in, with its id: this process's, with the thread count
    and processes of its ranks when it runs several (`_multi_process`)."""
    nodes, per_node = processes_of(cfg, job)
    single = (nodes, per_node) == (1, 1) and not (job == "train" and cfg.backend.launches_ranks)
    threads = None if single else max(1, resources_of(cfg, job).cpus // per_node)
    gpu = resources_of(cfg, job).gpus > 0 and cfg.backend.device != "cpu"
    return environment.recorded(threads, nodes * per_node, gpu)


def execute_runs(store_root: str, runs: RunBatch, sweep: Optional[str] = None) -> list[RunState]:
    """Several short runs in one task, each run's jobs in turn by `execute`: the driver batches
    runs whose jobs take milliseconds, for which a Ray task per job costs more than the job
    (ray_driver.py `Feed`). `runs`: (run id, config, jobs to do, config.yaml text) each.

    Returns each run's state. A run that fails does not stop the others: its error is in its
    state (`execute` wrote it), and the task raises once every run was tried, so that the driver
    marks the runs not done failed, as it would a job of their own."""
    states, failed = [], []
    for run_id, cfg, todo, text in runs:
        try:
            for job in todo:
                _, state = execute(job, run_id, store_root, cfg, config_text=text, sweep=sweep)
            states.append(state)
        except Exception as e:  # noqa: BLE001  recorded in the run's state; raised below
            failed.append(f"{run_id}: {type(e).__name__}: {e}")
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(runs)} runs of a batch failed; the first, {failed[0]}")
    return states


def _multi_process(job: str, cfg: RunConfig, run_dir: Path, run_id: str, rendezvous: Optional[dict],
                   progress: Optional[Progress], sweep: Optional[str] = None) -> Optional[JobResult]:
    """This node's share of a job of several processes; node rank 0 returns the job's result.
    A backend that launches its own ranks (nanotron) is handed the rendezvous; otherwise every
    rank runs the job under torchrun (`python -m jobs.rank`)."""
    rdv = rendezvous or {"node_rank": 0, "master_addr": "127.0.0.1", "master_port": launch.free_port()}
    if job == "train" and cfg.backend.launches_ranks:
        with tracking.job_environment(cfg, run_id, sweep):
            return backend_of(cfg).train(cfg, run_dir, progress, rdv)
    nodes, per_node = processes_of(cfg, job)
    threads = max(1, resources_of(cfg, job).cpus // per_node)

    def relay(line: str) -> None:
        record = launch.parse_progress(line)
        if record is not None and progress is not None:
            progress(record)

    with tempfile.TemporaryDirectory(prefix=f"launch-{job}-") as tmp:
        config, result = Path(tmp) / "config.json", Path(tmp) / "result.json"
        config.write_text(json.dumps(job_dict(cfg)))
        launch.run_torchrun(
            ["-m", "jobs.rank", "--job", job, "--config", str(config), "--run-dir", str(run_dir),
             "--result", str(result), "--threads", str(threads)],
            nproc_per_node=per_node, nnodes=nodes, node_rank=rdv["node_rank"],
            master_addr=rdv["master_addr"], master_port=rdv["master_port"],
            threads_per_proc=threads, on_line=relay, cwd=str(PROJECT_ROOT))
        return launch.load_result(result) if rdv["node_rank"] == 0 else None


def process_options(cfg: RunConfig) -> dict:
    """Ray options of a job's task for the environment variables its process must start with
    (`train.cpu_capability`): a runtime_env, whose tasks Ray runs in worker processes started
    with them (merged with the session's runtime_env, such as a shipped working_dir)."""
    variables = environment.capability_env(cfg.train.cpu_capability)
    return {"runtime_env": {"env_vars": variables}} if variables else {}


def _rendezvous_point() -> dict:
    """Runs on node rank 0's bundle: that node's IP and a port free there."""
    import ray

    return {"master_addr": ray.util.get_node_ip_address(), "master_port": launch.free_port()}


def _bundle_text(bundle: dict[str, float]) -> str:
    return " ".join(f"{k}={v / 2**30:g}G" if k == "memory" else f"{k}={v:g}" for k, v in bundle.items())


def _record_waiting(store: Store, run_id: str, job: str, cfg: Any, needs: str) -> None:
    """Say in the run's state that the job waits for nodes the cluster cannot give now (a node
    was lost, or others hold them), so `status` shows why it is not running rather than a stale
    claim. Only when no other process holds the run (a driver of another sweep may be running it)."""
    with store.claim(run_id, wait=False) as mine:
        if mine:
            store.update_job(run_id, job, jobs_of(cfg), status=WAITING, waiting_for=needs, waiting_since=now(),
                             error=None)


def execute_nodes(job: str, run_id: str, store_root: str, cfg: RunConfig, *after: Any,
                  config_text: Optional[str] = None, sweep: Optional[str] = None) -> tuple[str, RunState]:
    """A multi-node job: a STRICT_SPREAD placement group of one bundle per node, one `execute`
    task per bundle with torchrun's rendezvous at bundle 0; the group is removed afterwards.

    Runs as a resource-free Ray task; a failure on any node cancels the others and is raised."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    state = Store(store_root).read_state(run_id)
    if done(state, job, cfg):
        return "cached", state
    nodes, _ = processes_of(cfg, job)
    bundle = bundle_of(cfg, job)
    group = placement_group([dict(bundle)] * nodes, strategy="STRICT_SPREAD",
                            name=f"{run_id}:{job}")
    try:
        ready, _ = ray.wait([group.ready()], timeout=WAITING_AFTER_S)
        if not ready:
            _record_waiting(Store(store_root), run_id, job, cfg, f"{nodes} nodes with {_bundle_text(bundle)} each")
        ray.get(group.ready())
        node_ids = [placement_group_table(group)["bundles_to_node_id"][i] for i in range(nodes)]

        def on(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)

        point = ray.get(ray.remote(_rendezvous_point).options(
            num_cpus=0, scheduling_strategy=on(0)).remote())
        task = ray.remote(execute)
        refs = [task.options(num_cpus=bundle["CPU"], num_gpus=bundle["GPU"], memory=bundle["memory"],
                             scheduling_strategy=on(i), max_retries=0, **process_options(cfg),
                             name=f"{run_id}:{job}:node{i}").remote(
                    job, run_id, store_root, cfg, config_text=config_text, sweep=sweep,
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
