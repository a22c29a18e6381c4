"""The checks a sweep passes before anything starts or is written, the same for `--dry-run` and
the real run, so that a dry run that exits 0 is a sweep that starts (and one that exits 2 is the
real run's refusal, word for word). Each config is valid on its own by then (common/settings.py);
these are the rules across the sweep, its cluster and its store:

    the report        runs that evaluate nothing leave nothing to report
    adaptive seeding  the baseline family and another one in the grid, more than one look, and
                      no init_seed or data_seed (the looks add seeds only)
    the cluster       a job that no node of the chosen cluster can ever hold (Executor.check)
    the name          `--name` of a recorded sweep whose grid was another
    estimates         training far beyond its resources (CPU time, memory): a warning with the
                      estimate, not a refusal (the estimate is rough; the run may be meant)"""
from __future__ import annotations

from typing import Any

from common.settings import ConfigError, require
from orchestrator import grid
from orchestrator.executors import Executor
from orchestrator.identity import outside_run_id
from orchestrator.plan import PlannedRun, cpu_hours, training_memory_gb
from store.store import Store

CPU_HOURS_WARNED = 24.0  # a CPU training job estimated to take longer than this is warned about


def check(name: str, overrides: list[str], configs: list[Any], runs: list[PlannedRun], executor: Executor,
          store: Store) -> list[str]:
    """Raise ConfigError (one line) for a sweep that must not start; else the warnings to print."""
    empty = next((c for c in configs if not c.eval.jobs), None)
    require(empty is None, "eval.jobs=[]: the runs would evaluate nothing, so the sweep's report would be "
            "empty; list at least one evaluation (eval.jobs=[regbench], see --help)")
    _check_adaptive(configs)
    _check_name(name, overrides, store)
    executor.check(runs, name, store)
    return _estimates([r for r in runs if r.todo])


def _check_adaptive(configs: list[Any]) -> None:
    a = configs[0].adaptive
    if not a.metric:
        return
    families = sorted({c.family.name for c in configs})
    require(a.baseline in families and len(families) > 1,
            f"adaptive.baseline={a.baseline}: the sweep's families are {families}; include the baseline and "
            f"at least one other family (family={a.baseline},lidas)")
    split = next((c for c in configs if c.init_seed is not None or c.data_seed is not None), None)
    require(split is None, f"adaptive.metric={a.metric}: adaptive seeding adds seeds (the `seed` key) to the"
            f" arms; it does not add init or data seeds (init_seed={getattr(split, 'init_seed', None)},"
            f" data_seed={getattr(split, 'data_seed', None)} here); leave them null, or run a fixed sweep"
            " (adaptive.metric=null) to cross them")
    looks = a.schedule
    require(len(looks) > 1, f"adaptive.max_seeds={a.max_seeds}: a single look at {looks[0]} seeds adds no seeds "
            f"and decides nothing adaptively; raise adaptive.max_seeds above the first of adaptive.looks="
            f"{a.looks}, or run a fixed sweep (adaptive.metric=null seed=range(0,{looks[0]}))")


def _check_name(name: str, overrides: list[str], store: Store) -> None:
    """A recorded sweep is extended only by its own grid: `--name` reused for another grid would
    mix two experiments in one report. Keys outside the run id (identity.py's `outside_run_id`:
    where it runs, the evaluations listed, a newer evaluation's settings, ...) and the seeds may
    differ."""
    if name not in store.sweeps():
        return
    try:
        recorded = grid.named_axes_of(store.read_sweep(name).get("overrides", []))
    except ConfigError:  # recorded by an earlier version in words this one refuses: not comparable
        return
    now = grid.named_axes_of(overrides)
    differ = [key for key in sorted(recorded.keys() | now.keys())
              if recorded.get(key) != now.get(key) and not outside_run_id(key)]
    if differ:
        def values(axes: dict[str, list[str]], key: str) -> str:
            return ",".join(axes[key]) if key in axes else "(default)"
        raise ConfigError(f"--name {name}: the recorded sweep {name} has another grid ("
                          + "; ".join(f"{key}={values(now, key)} here, {values(recorded, key)} recorded"
                                      for key in differ)
                          + "); choose another --name, or give the recorded overrides (other seeds extend it)")


def _estimates(todo: list[PlannedRun]) -> list[str]:
    """One warning per kind of excess, naming the worst run and how many share it."""
    warnings = []
    slow = sorted((r for r in todo if cpu_hours(r.config) > CPU_HOURS_WARNED), key=lambda r: -cpu_hours(r.config))
    if slow:
        c = slow[0].config
        warnings.append(f"{_runs(slow)} on CPUs for more than {CPU_HOURS_WARNED:g} hours each, e.g. "
                        f"{slow[0].label}: {slow[0].cost:.2e} FLOPs, about {cpu_hours(c):,.0f} hours on "
                        f"resources.cpus={c.resources.cpus}; choose a smaller size, fewer train.steps or GPUs")
    big = sorted((r for r in todo if r.config.resources.gpus <= 0  # GPU jobs train in the GPU's memory
                  and training_memory_gb(r.config) > r.config.resources.memory_gb),
                 key=lambda r: -training_memory_gb(r.config))
    if big:
        c = big[0].config
        warnings.append(f"{_runs(big)} in more memory than resources.memory_gb, e.g. {big[0].label}: "
                        f"about {training_memory_gb(c):,.1f} GB (weights, gradients and Adam's moments) against "
                        f"resources.memory_gb={c.resources.memory_gb:g}; raise it or choose a smaller size")
    return warnings


def _runs(runs: list[PlannedRun]) -> str:
    return "1 run trains" if len(runs) == 1 else f"{len(runs)} runs train"
