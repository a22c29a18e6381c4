"""Planning: a run's job graph, the resources of each job, and what is still to do.

A run is `train`, then each evaluation of `eval.jobs` on its final checkpoint. Training is sized
by the size's `resources` (nodes x processes per node), each evaluation by `eval.resources` (one
process). Planning only reads the store; executors run what it says."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.settings import ConfigError
from config.resources import Resources
from jobs.flops import flops_per_token, schedule_flops
from orchestrator.identity import PerSiblings, run_ids, run_label, settings_digest
from store.records import RunState
from store.store import DONE, Store


@dataclass
class PlannedRun:
    run_id: str
    label: str
    config: Any  # RunConfig
    todo: list[str]
    cost: float

    @property
    def cached(self) -> bool:
        return not self.todo


def jobs_of(cfg: Any) -> list[str]:
    """The job graph of a run: train, then each listed evaluation on the final checkpoint."""
    return ["train", *cfg.eval.jobs]


def resources_of(cfg: Any, job: str) -> Resources:
    """The resources section that sizes `job`: the size's for training, eval's for evaluations."""
    return cfg.resources if job == "train" else cfg.eval.resources


def processes_of(cfg: Any, job: str) -> tuple[int, int]:
    """(nodes, processes per node) of a job; evaluations always run as one process."""
    return (cfg.resources.nodes, cfg.resources.procs_per_node) if job == "train" else (1, 1)


def bundle_of(cfg: Any, job: str) -> dict[str, float]:
    """What the job needs on each of its nodes, in Ray's resource names."""
    r = resources_of(cfg, job)
    return {"CPU": r.cpus, "GPU": r.gpus, "memory": int(r.memory_gb * 2**30)}


def estimated_flops(cfg: Any) -> float:
    seq = cfg.data.seq_len
    return schedule_flops(cfg.family, cfg.model, cfg.train.steps, cfg.train.batch_size * seq, seq)


def gpu_hours(cfg: Any) -> float:
    """Estimated GPU hours of training: FLOPs / (peak FLOP/s per GPU x MFU) / 3600; 0 on CPU."""
    if cfg.resources.gpus <= 0:
        return 0.0
    c = cfg.cluster
    return estimated_flops(cfg) / (c.gpu_peak_flops_per_s * c.gpu_mfu) / 3600


# Training FLOP/s one CPU core sustains: docs/performance.md measures 6.2 GFLOP/s on 2 cores at
# size=small; the smaller sizes do less (their matrices are small), the larger ones not much more.
CPU_FLOPS_PER_CORE = 3e9
BYTES_PER_PARAMETER = 16  # fp32 weights, gradients and Adam's two moments


def cpu_hours(cfg: Any) -> float:
    """Estimated wall-clock hours of training on the run's resources.cpus cores; 0 on GPUs."""
    if cfg.resources.gpus > 0:
        return 0.0
    return estimated_flops(cfg) / (CPU_FLOPS_PER_CORE * cfg.resources.cpus) / 3600


def training_memory_gb(cfg: Any) -> float:
    """The memory training needs before activations: BYTES_PER_PARAMETER for each parameter of a
    dense model of the final depth (a looped model, sharing its block's weights, needs less)."""
    parameters = flops_per_token(cfg.model, cfg.model.n_layers, 0) / 6  # 6 FLOPs per weight per token
    return parameters * BYTES_PER_PARAMETER / 2**30


def resources_text(cfg: Any) -> str:
    r = cfg.resources
    return f"cpu={r.cpus:g} gpu={r.gpus:g} mem={r.memory_gb:g}G nodes={r.nodes}"


def done(state: RunState, job: str, cfg: Any) -> bool:
    """Whether `job` is done for this config: done, and for an evaluation with the settings and
    the revision it has now (recorded with its result, orchestrator/identity.py): one whose
    settings are not part of the run id reruns when they change, and every evaluation reruns
    when its revision changes (a result recorded without a digest is of the first revision)."""
    entry = state.get("jobs", {}).get(job, {})
    return entry.get("status") == DONE and entry.get("settings") == settings_digest(cfg, job)


def plan(configs: list[Any], store: Store) -> list[PlannedRun]:
    """One PlannedRun per distinct run id, with the jobs not yet done (read-only). A run's
    directory is made by its first job, so only the runs that have one are read."""
    planned: dict[str, PlannedRun] = {}
    started = store.started_runs()
    cost = PerSiblings(estimated_flops)
    for cfg, rid in zip(configs, run_ids(configs)):
        if rid in planned:
            continue
        todo = jobs_of(cfg)
        # damaged files: every job reruns (worker.execute recovers them)
        if rid in started and not store.problems(rid):
            state = store.read_state(rid)
            todo = [j for j in todo if not done(state, j, cfg)]
        planned[rid] = PlannedRun(rid, run_label(cfg), cfg, todo, cost(cfg))
    return list(planned.values())


def _text(resources: dict[str, float], keys: list[str]) -> str:
    return " ".join(f"{k}={resources.get(k, 0) / 2**30:.3g}G" if k == "memory"
                    else f"{k}={resources.get(k, 0):g}" for k in keys)


def check_fit(runs: list[PlannedRun], nodes: list[dict[str, float]]) -> None:
    """Refuse, in one line, a job that no node (or not enough distinct nodes) can hold: Ray never
    fails such a request, it waits for ever."""
    for run in runs:
        for job in run.todo:
            want, count = bundle_of(run.config, job), processes_of(run.config, job)[0]
            fitting = [n for n in nodes if all(want[k] <= n.get(k, 0) for k in want if want[k] > 0)]
            if len(fitting) >= count:
                continue
            biggest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)), default={})
            raise ConfigError(
                f"{run.label} ({run.run_id}) job {job} needs {count} node(s) with "
                f"{_text(want, list(want))} each, but only {len(fitting)} of the cluster's "
                f"{len(nodes)} nodes can hold that (largest: {_text(biggest, list(want))}); lower "
                f"resources.* (or eval.resources.*) or use a larger cluster")
