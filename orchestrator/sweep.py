"""A sweep from start to report: compose the grid, plan its runs, record them, have the
cluster's executor run them (in the declared looks of an adaptive sweep), then write the report.

    Sweep.compose(overrides)  Hydra grid -> validated run configs (nothing written)
    sweep.dry_run()           what would run, and where
    sweep.run()               record, execute, decide (adaptive looks), report
    report / status / cancel  an existing sweep, from the store

The control path reads in one direction: cli -> Sweep -> Executor -> worker -> job, and back only
through the store."""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import sys
from collections import Counter
from typing import Any, Iterable, Optional

import pandas as pd
from rich.console import Console
from rich.markup import escape

import analysis
from analysis.compute import confirmatory
from analysis.console import render_summary
from analysis.load import flat_config
from analysis.planning import SeedSd, detectable_lines, pilot_sd, planned_comparisons
from analysis.sequential import next_seeds, plan_comparisons, settled_verdicts
from common.settings import ConfigError, from_dict, known_part, to_dict
from config.tracker import TrackerConfig
from jobs.backends import backend_of
from jobs.environment import capability_env, restart_with
from jobs.evals import EVALUATIONS
from jobs.flops import flop_ratio
from jobs.registry import claims, recording_jobs
from orchestrator import grid, preflight, tracking
from orchestrator.config import RunConfig, compose_run, hydra_session, load_run_config
from orchestrator.executors import Executor, executor_of, recorded_executor
from orchestrator.identity import SEED_AXES, configs_record, run_id, settings_digest
from orchestrator.plan import PlannedRun, gpu_hours, jobs_of, plan, resources_text
from orchestrator.status import LISTED
from orchestrator.upgrade import upgrade
from orchestrator.worker import execute
from store import index
from store.layout import STATE
from store.store import DONE, FAILED, Store, StoreError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PAPER_SIZES = ("360m", "1b7", "3b")  # conf/size: the paper-scale configs of the report's FLOPs table


class Sweep:
    def __init__(self, name: str, overrides: list[str], configs: list[RunConfig], store: Store,
                 console: Console):
        self.name, self.overrides, self.configs, self.store, self.console = name, overrides, configs, store, console
        self.executor: Executor = executor_of(configs[0].cluster)

    @classmethod
    def compose(cls, overrides: list[str], name: Optional[str], console: Console) -> Sweep:
        """The sweep of the command line: its grid composed and validated, its store checked."""
        points, default_name = grid.expand(overrides)
        configs = [p.config for p in points]
        roots = {c.store.root for c in configs}
        if len(roots) != 1:
            raise ConfigError(f"store.root: one sweep must use one store, got {sorted(roots)}")
        if len({c.cluster.name for c in configs}) != 1:
            raise ConfigError("cluster: one sweep runs on one cluster; sweep the cluster in separate sweeps")
        store = Store(roots.pop())
        store.check()
        name = name or default_name
        if not NAME.fullmatch(name) or len(name) > grid.MAX_NAME:
            raise ConfigError(f"--name {name!r}: it names a directory under sweeps/; use up to {grid.MAX_NAME} "
                              f"letters, digits, '.', '_' and '-' (starting with a letter or digit)")
        return cls(name, overrides, configs, store, console)

    # -- planning ------------------------------------------------------------------------------
    @property
    def adaptive(self) -> Any:
        return self.configs[0].adaptive

    def first_configs(self) -> list[RunConfig]:
        """The configs of the first pass: the grid, or an adaptive sweep's first look."""
        return self._with_seeds(range(self.adaptive.schedule[0])) if self.adaptive.metric else self.configs

    def _with_seeds(self, seeds: range) -> list[RunConfig]:
        """Every distinct non-seed config of the grid (by run identity), once per seed."""
        distinct = {run_id(dataclasses.replace(c, seed=0)): c for c in self.configs}
        return [dataclasses.replace(copy.deepcopy(c), seed=s) for c in distinct.values() for s in seeds]

    def _planned(self) -> list[PlannedRun]:
        """The first pass's runs, once the sweep passed its preflight (refused in one line
        otherwise, before anything is written; its warnings printed)."""
        runs = plan(self.first_configs(), self.store)
        for warning in preflight.check(self.name, self.overrides, self.configs, runs, self.executor, self.store):
            self.console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
        return runs

    def dry_run(self) -> int:
        """One line per run with its training FLOPs and GPU hours, then what the executor would
        submit; nothing is written."""
        runs = self._planned()
        if self.adaptive.metric:
            a = self.adaptive
            self.console.print(f"adaptive sweep on {a.metric}: looks at {a.schedule} seeds, level "
                               f"{1 - a.alpha / len(a.schedule):.4f} per look; first look:")
        for r in runs[:LISTED]:
            c = r.config
            hours = f"{gpu_hours(c):,.0f} GPU h" if c.resources.gpus > 0 else "CPU"
            seeds = "".join(f"{key}={getattr(c, key)} " for key in SEED_AXES if getattr(c, key) is not None)
            self.console.print(f"{r.run_id}  {c.family.name:<7} {c.model.name:<6} seed={c.seed:<3} {seeds}"
                               f"{resources_text(c)}  {r.cost:.2e} FLOPs {hours}  "
                               f"{'cached' if r.cached else 'new'}")
        new = [r for r in runs if not r.cached]
        if len(runs) > LISTED:  # nobody reads 100,000 lines: the rest by family and size
            groups = Counter((r.config.family.name, r.config.model.name, r.cached) for r in runs[LISTED:])
            self.console.print(f"... and {len(runs) - LISTED} more runs: " + ", ".join(
                f"{family} {size} {n} {'cached' if cached else 'new'}"
                for (family, size, cached), n in sorted(groups.items())),
                markup=False, soft_wrap=True)
        cluster = self.configs[0].cluster
        if any(r.config.resources.gpus > 0 for r in new):
            self.console.print(f"estimate: {sum(gpu_hours(r.config) for r in new):,.0f} GPU hours for the "
                               f"{len(new)} runs to do (training FLOPs / (cluster.gpu_peak_flops_per_s="
                               f"{cluster.gpu_peak_flops_per_s:.3g} x cluster.gpu_mfu={cluster.gpu_mfu:g}))")
        for line in self.detectable():
            self.console.print(line, markup=False, soft_wrap=True)
        for r in runs:  # a backend that renders its own configs (nanotron) shows them
            text = backend_of(r.config).dry_run_text(r.config, r.run_id, self.store.run_dir(r.run_id))
            if text is not None:
                self.console.print(text, markup=False, soft_wrap=True)
        self.executor.describe(runs, self.name, self.overrides, self.store, self.console)
        self.console.print(f"sweep {self.name}: {len(runs)} runs, {len(new)} to do; dry run, nothing "
                           f"{'submitted or ' if not self.executor.synchronous else ''}written",
                           markup=False, soft_wrap=True)
        return 0

    def detectable(self) -> list[str]:
        """What the planned seeds can detect (analysis/planning.py, statistics.md "Before a sweep"): per
        confirmatory metric, the smallest difference each comparison with the baseline detects at 80%
        power at Holm's first-step level, with the grid's seeds (adaptive: S_max, at alpha / K per look),
        and the seed sd of a pilot (this sweep's finished runs) or of adaptive.seed_sd."""
        a, options = self.adaptive, analysis.AnalysisOptions()
        if a.metric:
            metrics: tuple[str, ...] = (a.metric,)
            baseline, alpha, n_looks = a.baseline, a.alpha, len(a.schedule)
            note = " (adaptive.max_seeds, the last look)"
        else:
            specs = {name: spec for c in _distinct(self.configs) for job in recording_jobs(c)
                     for name, spec in job.metrics.items()}
            metrics = confirmatory(specs, {c.data.kind for c in _distinct(self.configs)})
            baseline, alpha, n_looks, note = options.baseline, options.alpha, 1, ""
        seeds = range(a.max_seeds) if a.metric else None
        comparisons = planned_comparisons(_arms(self.configs, seeds), baseline)
        return detectable_lines(comparisons, metrics, self._seed_sds(metrics, baseline), alpha, n_looks,
                                seeds_note=note)

    def _seed_sds(self, metrics: tuple[str, ...], baseline: str) -> dict[str, SeedSd]:
        """Per metric, the pilot's seed sd (this sweep's finished runs in the store), else the declared
        adaptive.seed_sd, else NaN with why."""
        pilot: dict[str, tuple[float, int, int]] = {}
        why = "no pilot"
        if self.name in self.store.sweeps():
            try:
                values = analysis.load(self.store.root, self.name)
                pilot = pilot_sd(values, metrics, baseline) if len(values) else {}
                why = f"no pilot sd: sweep {self.name} has no finished runs" if values.empty else ""
            except (StoreError, OSError, ValueError) as e:
                why = f"no pilot sd: sweep {self.name} cannot be analysed ({e})"
        out = {}
        for metric in metrics:
            sd, df, k = pilot.get(metric, (math.nan, 0, 0))
            if math.isfinite(sd):
                out[metric] = SeedSd(sd, f"from the pilot (sweep {self.name}: {k} comparison{'s' if k > 1 else ''}"
                                         f" with {baseline}, {df} df)")
            elif metric in self.adaptive.seed_sd:
                out[metric] = SeedSd(float(self.adaptive.seed_sd[metric]), "declared in adaptive.seed_sd")
            else:
                reason = why or f"no pilot sd: sweep {self.name} has no 2 paired seeds of {metric} with {baseline}"
                out[metric] = SeedSd(math.nan, f"{reason}, adaptive.seed_sd.{metric} unset")
        return out

    # -- running -------------------------------------------------------------------------------
    def run(self) -> int:
        """Record and execute the sweep (adaptive: look after look), then report. Exit code 0, or
        1 when a run failed or nothing finished."""
        runs = self._planned()
        if self.adaptive.metric and self.executor.synchronous:
            return self._looks(runs)
        outcome = self._execute(runs)
        if not outcome.finished:  # submitted: the allocation (or the array's report job) reports
            return 0
        return self.report() or (1 if FAILED in outcome.statuses.values() else 0)

    def _execute(self, runs: list[PlannedRun]):
        self.store.create()
        upgrade(self.store)
        ids = [r.run_id for r in runs]
        self.store.record_sweep(self.name, self.overrides, ids, configs_record(ids, [r.config for r in runs]))
        if self.executor.synchronous:
            self.console.print(f"sweep [bold]{self.name}[/]: {len(runs)} runs, {sum(r.cached for r in runs)} "
                               f"cached, store {self.store.root}")
        outcome = self.executor.run(runs, self.name, self.overrides, self.store, self.console)
        if outcome.finished:
            index.fold(self.store.layout.root)
        return outcome

    def _looks(self, runs: list[PlannedRun]) -> int:
        """The declared looks (statistics.md (f)): each arm (family, size, cell) runs seeds 0..n-1;
        after each look the rule decides, a comparison it settles stays settled (its verdict and
        look are recorded in sweep.yaml), and only the arms still open get the next seeds."""
        a = self.adaptive
        arms = {run_id(dataclasses.replace(c, seed=0)): c for c in self.configs}  # distinct non-seed configs
        seeds = dict.fromkeys(arms, a.schedule[0])
        plans: list[dict] = []  # this invocation's looks: a restart replays them on the same seeds
        failed = False
        with self.executor.session():
            while True:
                if FAILED in self._execute(runs).statuses.values():
                    # a look decides on all of its seeds: with some failed it is not taken, and
                    # the same command, once they can run, takes it on the same seeds
                    failed = True
                    self.console.print(f"look {len(plans) + 1} not taken: runs of its seeds failed (their errors:"
                                       f" `status {self.name}`); the same command runs them again and takes it",
                                       markup=False, soft_wrap=True)
                    break
                decision = next_seeds(
                    analysis.load(self.store.root, self.name), looks=a.schedule, alpha=a.alpha,
                    delta_min=a.delta_min, baseline=a.baseline, primary_metrics=(a.metric,),
                    settled=settled_verdicts(plans))
                plans.append(decision.to_record())
                self._record_look(decision, plans[-1])
                if decision.decision != "continue" or decision.n_more <= 0 or not decision.open_arms:
                    break
                for key, c in arms.items():
                    if decision.needs_seeds(c.family.name, c.model.name, _cell(c, decision.cell_keys)):
                        seeds[key] += decision.n_more
                runs = plan([dataclasses.replace(copy.deepcopy(c), seed=s) for key, c in arms.items()
                             for s in range(seeds[key])], self.store)
        return self.report() or (1 if failed else 0)

    def _record_look(self, decision: Any, record: dict) -> None:
        a = self.adaptive
        comparisons = plan_comparisons(record)  # keyed by the full cell: family, size and every swept key
        verdicts = {name: c["verdict"] for name, c in comparisons.items()}
        self.store.record_look(self.name, {
            "look": decision.look, "n_looks": decision.n_looks, "n_seeds": decision.n_seeds,
            "level": decision.level, "decision": decision.decision, "n_more": decision.n_more,
            "runs_saved": decision.runs_saved, "verdicts": verdicts, "plan": record,
            "rule": {k: getattr(a, k) for k in ("metric", "alpha", "delta_min", "baseline", "looks", "max_seeds")}})
        settled = {name: c["settled_at_look"] for name, c in comparisons.items() if c["settled_at_look"] is not None}
        self.console.print(f"look {decision.look}/{decision.n_looks} at {decision.n_seeds} seeds "
                           f"(level {decision.level:.4f}): {decision.decision}"
                           + (f", adding {decision.n_more} seeds to {len(decision.open_arms)} arms"
                              if decision.decision == "continue" else "")
                           + "; " + ", ".join(f"{k} {v}" + (f" (settled at look {settled[k]})" if k in settled else "")
                                              for k, v in verdicts.items()))

    def report(self) -> int:
        return report(self.store, self.name, self.console, self.configs[0].tracker)


def _distinct(configs: list[RunConfig]) -> list[RunConfig]:
    """One config per group of seed variants: points that differ only in their seed share every
    section object (orchestrator/config.py `compose_runs`), so a grid of 100,000 seeds is a few."""
    groups: dict[tuple, RunConfig] = {}
    for c in configs:
        groups.setdefault(_sections(c), c)
    return list(groups.values())


def _sections(c: RunConfig) -> tuple:
    return tuple(id(getattr(c, f.name)) for f in dataclasses.fields(c) if f.name not in ("seed", *SEED_AXES))


def _unit(c: RunConfig) -> int | tuple[int, int, int]:
    """What a run pairs on (analysis/load.py): its seed, or its seed, init seed and data seed where
    either of these is set apart from the seed."""
    init, data = c.effective_init_seed, c.effective_data_seed
    return c.seed if init == data == c.seed else (c.seed, init, data)


def _arms(configs: list[RunConfig], seeds: Optional[Iterable[int]] = None) -> pd.DataFrame:
    """The planned run configs apart from their seeds, for analysis.planning: family, size, the
    config's dotted keys as the analysis reads them, and the seeds planned with each (`seeds`, when
    given, for every one: an adaptive sweep's S_max); a seed is a `_unit`, as the analysis pairs."""
    planned: dict[tuple, set[int | tuple[int, int, int]]] = {}
    for c in configs:
        planned.setdefault(_sections(c), set()).add(_unit(c))
    rows = []
    for c in _distinct(configs):
        flat = {k: v for k, v in flat_config(to_dict(c)).items()
                if k not in ("seed", *SEED_AXES, "family.name", "model.name")}
        rows.append({"family": c.family.name, "size": c.model.name, **flat,
                     "seeds": frozenset(planned[_sections(c)] if seeds is None else seeds)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# An existing sweep, from the store

def _cell(cfg: RunConfig, keys: tuple[str, ...]) -> dict[str, Any]:
    """The values of the cell keys (dotted config keys) of a run config, as the analysis reads them
    from config.yaml (lists and mappings as JSON text)."""
    out, plain = {}, to_dict(cfg)
    for key in keys:
        value: Any = plain
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        out[key] = json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value
    return out


def report(store: Store, name: str, console: Console, tracker: Optional[TrackerConfig] = None) -> int:
    """Analyse the sweep's finished runs: report files, the console summary, W&B's summary run."""
    sweep = store.read_sweep(name)
    inspected = {r: store.inspect(r) for r in sweep["run_ids"]}  # one read of each run's files
    damaged = [(r, p) for r, (problems, _) in inspected.items() for p in problems]
    if damaged:
        raise StoreError(f"sweep {name}: run {damaged[0][0]}: {damaged[0][1]} ({len(damaged)} "
                         f"problems, see `status`); run the sweep again to repair them")
    states = {r: files[STATE] or {} for r, (_, files) in inspected.items()}
    if not any(state.get("status") == DONE for state in states.values()):
        console.print(f"sweep {name}: no finished runs yet; nothing to report")
        return 1
    upgraded = upgrade(store)  # rewrites metrics.json of format 1: the analysis reads them anew
    if outdated := _outdated(store, name, states):
        outdated_jobs = ', '.join(f'{job} ({n} runs)' for job, n in outdated.items())
        console.print(f"warning: sweep {name}: results of {outdated_jobs} "
                      f"were recorded by an earlier revision of the evaluation or with other settings, and are "
                      f"reported as recorded; run the sweep again (the same command) to evaluate them anew on "
                      f"the existing checkpoints (nothing retrains)", markup=False, soft_wrap=True)
    _write_paper_flops(store, name)
    store.write_claims(name, {metric: spec.to_record() for metric, spec in claims().items()})
    result = analysis.analyse(store.root, name,
                              read=None if upgraded else lambda rid, file: inspected[rid][1][file])
    path = analysis.save_report(result, store.root)
    console.print(render_summary(result))
    console.print(f"report: {path}")
    tracker = tracker or latest_tracker(store, name)
    if logged := tracking.log_sweep(store, name, result, tracker):  # never raises
        console.print(f"W&B: sweep summary logged as run {logged} under {store.root / tracking.WANDB_DIR}")
    return 0


def _outdated(store: Store, name: str, states: dict[str, dict]) -> Counter:
    """Evaluation -> number of runs whose recorded result is not what the evaluation would record
    now (its revision or settings changed since, orchestrator/identity.py): a sweep reruns those.
    The digests are computed once per config of the sweep's configs file (seeds do not change
    them), so 100,000 seeds of a grid point type one config."""
    configs = store.sweep_configs(name)
    digests: dict[Any, dict[str, Optional[str]]] = {}  # config (group index, or run id) -> job -> digest
    counts: Counter = Counter()
    for rid, state in states.items():
        key = configs.runs[rid][0] if rid in configs.runs else rid
        if key not in digests:
            try:
                cfg = load_run_config(configs.config(rid) if rid in configs.runs else store.read_config(rid))
                digests[key] = {job: settings_digest(cfg, job) for job in cfg.eval.jobs if job in EVALUATIONS.names()}
            except Exception:  # noqa: BLE001  a config.yaml this code cannot read: not for this warning to judge
                digests[key] = {}
        for job, entry in state.get("jobs", {}).items():
            if entry.get("status") == DONE and job in digests[key] and entry.get("settings") != digests[key][job]:
                counts[job] += 1
    return counts


def latest_tracker(store: Store, name: str) -> TrackerConfig:
    """The tracker section the sweep's latest invocation planned with, as recorded: the last
    config of its configs files (a sweep recorded before those: its last run's config.yaml)."""
    configs = store.sweep_configs(name).configs
    raw = configs[-1] if configs else store.read_config(store.read_sweep(name)["run_ids"][-1])
    return from_dict(TrackerConfig, known_part(TrackerConfig, raw["tracker"]))


def _write_paper_flops(store: Store, name: str) -> None:
    """The LIDAS/dense training-FLOP ratio of the paper-scale configs (the paper reports a 26%
    saving at 3B), composed as a sweep would compose them, for the report's FLOPs section."""
    with hydra_session():
        configs = [compose_run([f"size={size}", "family=lidas"]) for size in PAPER_SIZES]
    rows = [{"size": size, "layers": c.model.n_layers, "block": c.model.block_size, "steps": c.train.steps,
             "ratio": flop_ratio(c.family, c.model, c.train.steps)} for size, c in zip(PAPER_SIZES, configs)]
    store.write_paper_flops(name, rows)


def latest(store: Store) -> str:
    sweeps = store.sweeps()
    if not sweeps:
        raise StoreError(f"no sweeps in {store.root} yet; run `python -m orchestrator sweep` first")
    return max(sweeps, key=lambda s: store.read_sweep(s)["invocations"][-1]["at"])


def cancel(store: Store, name: str, console: Console) -> int:
    """Cancel a sweep's cluster jobs; the same `sweep` command resubmits and resumes it."""
    sweep = store.read_sweep(name)
    executor = recorded_executor(sweep)
    if executor is None:
        console.print(f"sweep {name}: no Slurm jobs recorded (it ran locally); nothing to cancel", markup=False)
        return 0
    return executor.cancel(sweep, console)


def run_one(store_root: str, run_id: str) -> int:
    """One run's jobs in order, in this process, from its stored config: a cluster=slurm_array
    task (`python -m orchestrator run-one`)."""
    store = Store(store_root)
    try:
        cfg = load_run_config(store.read_config(run_id))
    except FileNotFoundError:
        raise ConfigError(f"run {run_id}: no config.yaml in {store.run_dir(run_id)}; "
                          f"was it planned by a sweep of this store?") from None
    restart_with(capability_env(cfg.train.cpu_capability))  # torch reads it before it computes anything
    for job in jobs_of(cfg):
        print(f"{run_id} {job}: {execute(job, run_id, store_root, cfg)[0]}", file=sys.stderr, flush=True)
    return 0
