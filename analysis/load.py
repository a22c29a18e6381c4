"""Read a results store into tidy DataFrames.

Only the store is read, through the store package (its layout, records and format check; never
`orchestrator` or `jobs`), so this works from a notebook on a copied store, of any format this code
knows (1 without specs). What is read of each run: the resolved config (the sweep's configs file,
or the run's config file once a job ran: seed, family.name, model.name (the size), ...), its state
(status, error), its metrics (values, directions, curves and their specs, common/metrics.py), its
per-example evaluation outputs (item_id, metric, score, weight), its training log and the
environments its jobs ran in (environment.json: torch, CPU kernels or GPU, threads); of each
sweep, its manifest (name, run_ids, created_at) and the paper-scale FLOPs table the orchestrator
wrote.

Sweep membership: a run may be listed by several sweeps. With `sweep=None` the selection is every
run a sweep lists or that has a directory, and the `sweep` column holds the earliest-created sweep
that lists the run (ties broken by name), or None when no sweep lists it.
A run listed by a sweep but without a state file yet counts as "pending", one whose state file
cannot be parsed as "corrupt".

Seeds: the `seed` column is the unit of replication, what comparisons pair on. A run's config has
a `seed` and, since they were added, an `init_seed` and a `data_seed` (null: the seed; config/run.py).
Where no selected run sets those apart from its seed, `seed` is the run's seed, as before them.
Otherwise the selection's tables also have the columns `init_seed` and `data_seed` (the effective
seeds) and `config_seed` (the configured `seed`, which the evaluations' draws follow), and `seed`
numbers the distinct (config_seed, init_seed, data_seed) triples: a run whose three agree keeps its
seed, the other triples are numbered after the largest such seed in sorted order. Runs of two
families pair exactly when their triples agree. The init and data seeds are never cell keys.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from common.atomic import read_json
from common.metrics import CurveSpec, MetricSpec
from store.layout import RUN_JSON, Layout
from store.records import (Environment, SweepConfigs, SweepManifest, read_config, read_environment, read_manifest,
                           read_sweep_configs)
from store.store import format_of

STATE, METRICS = RUN_JSON
KEY_COLUMNS = ["run_id", "sweep", "family", "size", "seed"]
VALUE_COLUMNS = ["metric", "value", "higher_is_better"]
ITEM_COLUMNS = ["metric", "item_id", "score", "weight"]
RUN_KEYS = ["run_id", "family", "size", "seed"]
# The columns of a selection in which some run sets init_seed or data_seed apart from its seed (the
# effective seeds, and the configured seed): beside the key columns, never cell keys.
SEED_AXES = ["init_seed", "data_seed"]
SEED_COLUMNS = [*SEED_AXES, "config_seed"]
JOB_SECONDS = "seconds."  # prefix of the run table's columns of job durations: seconds.train, ...
NOT_RECORDED = "not recorded"  # the environment of a run of before environment.json (or whose file is unreadable)
# Config keys that become the key columns; every other varying key is reported as a dotted column.
_KEY_CONFIG = {"seed": "seed", "family.name": "family", "model.name": "size"}


def _check_store(root: Path) -> Layout:
    """The layout of the store at `root`, after the store's own check (store/store.py
    `format_of`: StoreError for anything that is not a store of ours)."""
    layout = Layout(root)
    if format_of(root) is None:
        raise FileNotFoundError(f"{root} is not a results store (no {os.path.basename(layout.marker)})")
    return layout


def load_sweep(store_root: str | Path, sweep: str) -> SweepManifest:
    """The sweep's record (name, overrides, run_ids, created_at), as the orchestrator wrote it."""
    layout = _check_store(Path(store_root))
    manifest = read_manifest(layout.sweep(sweep).manifest)
    if manifest is None:
        raise FileNotFoundError(f"no sweep named {sweep!r} in {layout.sweeps}")
    return manifest


def _sweep_membership(root: Path, sweep: str | None) -> dict[str, str | None]:
    """run_id -> sweep for the selection: the sweep's runs, or every run a sweep lists or that has
    a directory in the store."""
    if sweep is not None:
        return {run_id: sweep for run_id in load_sweep(root, sweep)["run_ids"]}
    layout = Layout(root)
    names = sorted(os.listdir(layout.sweeps)) if os.path.isdir(layout.sweeps) else []
    specs = [s for s in (read_manifest(layout.sweep(n).manifest) for n in names) if s is not None]
    membership: dict[str, str | None] = {}
    for spec in sorted(specs, key=lambda s: (str(s.get("created_at", "")), s["name"])):
        for run_id in spec["run_ids"]:
            membership.setdefault(run_id, spec["name"])
    run_dirs = os.listdir(layout.runs) if os.path.isdir(layout.runs) else []
    return {run_id: membership.get(run_id) for run_id in sorted({*run_dirs, *membership})}


def flat_config(config: dict) -> dict:
    """A config as {dotted key: value}; lists and mappings become JSON text, so they compare (the
    columns of `load`'s config keys; the dry run's planning keys a planned run's config the same way)."""
    flat = pd.json_normalize(config, sep=".").to_dict("records")[0] if config else {}
    return {k: json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v for k, v in flat.items()}


@dataclass
class _Configs:
    """The flattened configs of the selected runs: the runs of one group of seed variants share one
    (a sweep's configs file holds it once, store/records.py), so 100,000 seeds of a grid
    point are flattened once; a run no configs file lists has its own config file, its own group."""
    groups: list[dict] = field(default_factory=list)
    of_run: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # run id -> (group, seed)

    @classmethod
    def read(cls, root: Path, membership: dict[str, str | None]) -> _Configs:
        out = cls()
        for name in sorted({s for s in membership.values() if s is not None}):
            out._add_file(read_sweep_configs(Layout(root).sweep(name)), membership)
        for run_id in membership:
            if run_id not in out.of_run:
                config = read_config(Layout(root).run(run_id).config) or {}
                out.groups.append(flat_config({k: v for k, v in config.items() if k != "seed"}))
                out.of_run[run_id] = (len(out.groups) - 1, config.get("seed"))
        return out

    def _add_file(self, configs: SweepConfigs, membership: dict[str, str | None]) -> None:
        first = len(self.groups)
        self.groups += [flat_config({k: v for k, v in config.items() if k != "seed"}) for config in configs.configs]
        for run_id, (group, seed) in configs.runs.items():
            if run_id in membership:
                self.of_run.setdefault(run_id, (first + group, seed))


RunFileReader = Callable[[str, str], Any]
"""(run id, name of one of its JSON files) -> the file parsed; None when it is missing, ValueError
when it cannot be parsed (common/atomic.py `read_json`)."""


def _job_seconds(state: dict) -> dict[str, float]:
    """Seconds from start to end of each finished job of a run (its last attempt: a job resumed
    after an interruption counts from its resumption)."""
    taken = {}
    for job, entry in (state.get("jobs") or {}).items():
        started, ended = entry.get("started_at"), entry.get("ended_at")
        if entry.get("status") == "done" and started and ended:
            taken[job] = (dt.datetime.fromisoformat(ended) - dt.datetime.fromisoformat(started)).total_seconds()
    return taken


def _state(read: RunFileReader, run_id: str) -> dict:
    """The run's state; no file yet is "pending", an unreadable one "corrupt" (listed, not fatal)."""
    try:
        return read(run_id, STATE) or {"status": "pending"}
    except ValueError as error:
        return {"status": "corrupt", "error": f"unreadable {STATE}: {error}"}


@dataclass
class _Results:
    """What the finished runs' metrics files hold, read in one pass."""
    values: pd.DataFrame
    metric_specs: dict[str, MetricSpec]
    curve_specs: dict[str, CurveSpec]
    curves: dict[str, dict[str, dict]]  # curve -> run id -> its points (column -> values)


class Selection:
    """The runs of one sweep (or, with sweep=None, of the whole store), each of their files read
    at most once: the load_* functions below each read one, `analyse` reads one for all of them
    (a report of 100,000 runs would otherwise read every file several times). `read` reads a
    run's state and metrics files (store/layout.py `RUN_JSON`): a caller that has parsed them
    already (the orchestrator's report checks every run's files first) hands them over instead of
    having them read again."""

    def __init__(self, store_root: str | Path, sweep: str | None = None, read: RunFileReader | None = None):
        self.root = Path(store_root)
        self.layout = _check_store(self.root)
        self.read = read or (lambda run_id, name: read_json(self.layout.run(run_id).json(name)))
        membership = _sweep_membership(self.root, sweep)
        self.configs = _Configs.read(self.root, membership)
        self.table = self._run_table(membership)

    def _run_table(self, membership: dict[str, str | None]) -> pd.DataFrame:
        """One row per selected run: key columns, status, error, its config group, and the
        seconds each of its jobs took (`seconds.<job>`, NaN for a job not run)."""
        columns: dict[str, list] = {c: [] for c in [*KEY_COLUMNS, "status", "error", "group"]}
        seconds: list[dict[str, float]] = []
        for run_id, run_sweep in membership.items():
            state = _state(self.read, run_id)
            group, seed = self.configs.of_run[run_id]
            flat = self.configs.groups[group]
            for column, value in (("run_id", run_id), ("sweep", run_sweep), ("family", flat.get("family.name")),
                                  ("size", flat.get("model.name")), ("seed", seed), ("status", state.get("status")),
                                  ("error", state.get("error")), ("group", group)):
                columns[column].append(value)
            seconds.append(_job_seconds(state))
        table = _frame(columns)
        jobs = sorted({job for taken in seconds for job in taken})
        for job in jobs:
            table[f"{JOB_SECONDS}{job}"] = [taken.get(job, float("nan")) for taken in seconds]
        table = self._seed_units(table)
        table["seed"] = table["seed"].astype("Int64")
        return table.sort_values(["family", "size", "seed", "run_id"], ignore_index=True)

    def _seed_units(self, table: pd.DataFrame) -> pd.DataFrame:
        """`table` with `seed` the unit of replication (the module's docstring), and the SEED_COLUMNS
        where some run sets an init or data seed apart from its seed."""
        def effective(key: str) -> list:
            return [seed if pd.isna(seed) or self.configs.groups[g].get(key) is None
                    else int(self.configs.groups[g][key]) for g, seed in zip(table["group"], table["seed"])]
        init, data = effective("init_seed"), effective("data_seed")
        triples = list(zip(table["seed"], init, data))
        plain = [pd.isna(s) or s == i == d for s, i, d in triples]  # no seed: a run without a config yet
        if all(plain):
            return table
        first = 1 + max((int(s) for (s, _, _), p in zip(triples, plain) if p and not pd.isna(s)), default=-1)
        composite = sorted({t for t, p in zip(triples, plain) if not p}, key=lambda t: tuple(
            (1, 0) if pd.isna(v) else (0, int(v)) for v in t))
        number = {t: first + n for n, t in enumerate(composite)}
        table = table.assign(config_seed=table["seed"], init_seed=init, data_seed=data,
                             seed=[s if p else number[t] for t, p, s in zip(triples, plain, table["seed"])])
        return table.astype({c: "Int64" for c in SEED_COLUMNS})

    @cached_property
    def key_columns(self) -> list[str]:
        """KEY_COLUMNS, and the SEED_COLUMNS where the selection has them."""
        return [*KEY_COLUMNS, *(c for c in SEED_COLUMNS if c in self.table.columns)]

    def runs(self) -> pd.DataFrame:
        return self.table.drop(columns="group")

    @cached_property
    def done(self) -> pd.DataFrame:
        return self.table[self.table["status"] == "done"].reset_index(drop=True)

    def run_dir(self, run_id: str) -> str:
        return self.layout.run(run_id).dir

    def environments(self) -> pd.Series:
        """What produced each finished run's numbers, indexed by run_id: `environment_text` of
        every environment its jobs ran in (environment.json), joined by " + " where they differ
        (a run resumed on another machine); NOT_RECORDED for a run without the file."""
        return pd.Series([_run_environment(self.layout.run(run_id).environment) for run_id in self.done["run_id"]],
                         index=self.done["run_id"], name="environment", dtype=object)

    def varying_config(self) -> pd.DataFrame:
        """The config keys whose values differ across the finished runs, one dotted column each
        (sorted by name), indexed by run_id. Computed over their groups: a key varies across the
        runs exactly when it varies across the groups they use. A column mixing kinds of value
        (text and numbers) is turned into text so it stays one type."""
        used = sorted(set(self.done["group"]))
        flat = pd.DataFrame([{k: v for k, v in self.configs.groups[g].items()
                              if k not in _KEY_CONFIG and k not in SEED_AXES} for g in used], index=used)
        varying = sorted(c for c in flat.columns if flat[c].nunique(dropna=False) > 1)
        flat = flat[varying]
        for column in varying:
            kinds = {type(v) for v in flat[column].dropna()}
            if len(kinds) > 1 and not kinds <= {int, float}:
                flat[column] = flat[column].map(lambda v: v if pd.isna(v) else str(v))
        return flat.reindex(self.done["group"]).set_axis(self.done["run_id"], axis=0)

    def data_kinds(self) -> set[str]:
        return {self.configs.groups[g].get("data.kind", "regbench") for g in set(self.done["group"])}

    @cached_property
    def results(self) -> _Results:
        metrics: dict[str, MetricSpec] = {}
        curve_specs: dict[str, CurveSpec] = {}
        curves: dict[str, dict[str, dict]] = {}
        value_columns: dict[str, list] = {c: [] for c in ["run_id", *VALUE_COLUMNS]}
        for run_id in self.done["run_id"]:
            recorded = self.read(run_id, METRICS)
            if recorded is None:
                raise FileNotFoundError(f"{self.run_dir(run_id)}: run done without {METRICS}")
            directions = recorded.get("higher_is_better", {})
            references = {name for name, spec in recorded.get("specs", {}).items() if spec.get("reference")}
            for name, value in sorted(recorded.get("metrics", {}).items()):
                value_columns["run_id"].append(run_id)
                value_columns["metric"].append(name)
                value_columns["value"].append(float("nan") if value is None else float(value))
                value_columns["higher_is_better"].append(None if name in references else directions.get(name))
            for name, record in recorded.get("specs", {}).items():  # the first run's record of each, parsed once
                if name not in metrics:
                    metrics[name] = MetricSpec.from_record(record)
            for name, record in recorded.get("curve_specs", {}).items():
                if name not in curve_specs:
                    curve_specs[name] = CurveSpec.from_record(record)
            for name, higher in directions.items():
                metrics.setdefault(name, MetricSpec(name, higher))
            for name, points in recorded.get("curves", {}).items():
                if isinstance(points, dict):
                    curves.setdefault(name, {})[run_id] = points
        values = _frame(value_columns).astype({"value": float, "higher_is_better": "boolean"})
        return _Results(values, metrics, curve_specs, curves)

    def values(self) -> pd.DataFrame:
        keyed = self.done[self.key_columns].merge(self.results.values, on="run_id", how="inner")
        return keyed.merge(self.varying_config(), left_on="run_id", right_index=True, how="left")

    def done_runs(self) -> pd.DataFrame:
        """One row per finished run, whatever it recorded: its key columns and the config keys that
        vary (as in `values`), so a run lacking a metric can be named in its cell."""
        return self.done[self.key_columns].merge(self.varying_config(), left_on="run_id", right_index=True, how="left")

    def items(self) -> pd.DataFrame:
        keys = ["run_id", "family", "size", "seed"]
        frames = [pd.read_parquet(path).assign(run_id=run_id)
                  for run_id in self.done["run_id"] for path in _files(self.layout.run(run_id).items_dir)]
        if not frames:
            return pd.DataFrame(columns=[*keys, *ITEM_COLUMNS])
        items = self.done[keys].merge(pd.concat(frames, ignore_index=True), on="run_id", how="inner")
        extra = [c for c in items.columns if c not in keys and c not in ITEM_COLUMNS]
        return items[[*keys, *ITEM_COLUMNS, *extra]]

    def per_run(self, read: Callable[[str], pd.DataFrame | None]) -> pd.DataFrame:
        """`read(run_id)` for every finished run, stacked behind the run's key columns; runs for
        which it returns None (no such file or curve) are left out, so older stores still load."""
        read_frames = {run_id: read(run_id) for run_id in self.done["run_id"]}
        frames = {run_id: frame for run_id, frame in read_frames.items() if frame is not None}
        if not frames:
            return pd.DataFrame(columns=RUN_KEYS)
        stacked = pd.concat([frame.assign(run_id=run_id) for run_id, frame in frames.items()], ignore_index=True)
        table = self.done[RUN_KEYS].merge(stacked, on="run_id", how="inner")
        return table[[*RUN_KEYS, *[c for c in stacked.columns if c != "run_id"]]]

    def history(self) -> pd.DataFrame:
        """The training logs, with `curriculum_end`: the step at which a run's data curriculum
        (data.warmup) hands over to the regime, where its loss jumps (NaN without one)."""
        def read(run_id: str) -> pd.DataFrame | None:
            path = self.layout.run(run_id).history
            return pd.read_parquet(path) if os.path.isfile(path) else None
        ends = {run_id: self.configs.groups[group].get("data.warmup.steps")
                for run_id, group in zip(self.done["run_id"], self.done["group"])}
        table = self.per_run(read)
        return table.assign(curriculum_end=pd.to_numeric(table["run_id"].map(ends), errors="coerce"))

    def curves(self, curve: str) -> pd.DataFrame:
        points = self.results.curves.get(curve, {})
        return self.per_run(lambda run_id: pd.DataFrame(points[run_id]) if run_id in points else None)


def environment_text(env: Environment) -> str:
    """An environment as the fields that can change a run's numbers: the torch version, the
    device (CPU: ATen's kernel path; GPU: its name and compute capability), the threads and
    processes, and the settings that choose kernels (deterministic algorithms, TF32, MKL's path).
    The machine's name and model, python and numpy are left out: they do not change the numbers
    where these are the same."""
    if env.get("device") == "cuda":
        device = env.get("gpu") or "a CUDA GPU"
        device += f" (compute capability {env['gpu_capability']})" if env.get("gpu_capability") else ""
    else:
        device = f"CPU {env.get('cpu_capability', 'of unknown capability')}"
    threads = env.get("threads")
    parts = [f"torch {env.get('torch', '?')}", device,
             f"{threads} thread{'s' if threads != 1 else ''}" + (" per process" if env.get("processes", 1) > 1 else "")]
    if env.get("processes", 1) > 1:
        parts.append(f"{env['processes']} processes")
    if env.get("deterministic"):
        parts.append("deterministic algorithms")
    cudnn = env.get("cudnn") or {}
    if cudnn.get("deterministic"):
        parts.append("cudnn deterministic")
    if cudnn.get("matmul_allow_tf32"):
        parts.append("TF32 matmuls")
    parts += [f"{k}={v}" for k, v in sorted((env.get("kernel_env") or {}).items()) if k != "ATEN_CPU_CAPABILITY"]
    return ", ".join(parts)


def _run_environment(path: str) -> str:
    """`Selection.environments` of one run, from its environment.json at `path`."""
    try:
        record = read_environment(path)
    except ValueError:
        return NOT_RECORDED
    entries = record.get("environments") if isinstance(record, dict) else None
    texts = [environment_text(e["environment"]) for e in entries or []
             if isinstance(e, dict) and isinstance(e.get("environment"), dict)]
    return " + ".join(dict.fromkeys(texts)) or NOT_RECORDED


def _frame(columns: dict[str, list]) -> pd.DataFrame:
    """A frame of these column lists; without rows, of object columns (as from no records)."""
    return pd.DataFrame(columns) if any(columns.values()) else pd.DataFrame(columns=list(columns))


def _files(directory: str) -> list[str]:
    """The parquet files of a directory, by name (none when it does not exist)."""
    try:
        return [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if n.endswith(".parquet")]
    except FileNotFoundError:
        return []


def load_runs(store_root: str | Path, sweep: str | None = None) -> pd.DataFrame:
    """Every selected run, whatever its status, so failed and unfinished runs can be reported.

    Columns: run_id, sweep, family, size, seed, status, error, then `seconds.<job>` per job
    that any of them finished (how long it took; NaN where it did not).
    """
    return Selection(store_root, sweep).runs()


def load_data_kinds(store_root: str | Path, sweep: str | None = None) -> set[str]:
    """The data kinds (data.kind) of the finished runs: which headline and confirmatory metrics apply."""
    return Selection(store_root, sweep).data_kinds()


def load(store_root: str | Path, sweep: str | None = None) -> pd.DataFrame:
    """One row per finished run x metric: the long table every statistic is computed from.

    Columns: run_id, sweep, family, size, seed, metric, value, higher_is_better, then the dotted
    config keys whose values vary across the selected finished runs (other than seed, family, size),
    so runs that differ in more than family, size and seed are visible (`analysis.cell_keys` picks
    those that split cells). Only runs whose status is "done" are included; see `load_runs` for the
    others.
    """
    return Selection(store_root, sweep).values()


def load_items(store_root: str | Path, sweep: str | None = None) -> pd.DataFrame:
    """Per-example evaluation outputs of the finished runs, for item-level (hierarchical) resampling.

    Columns: run_id, family, size, seed, metric, item_id, score, weight, plus any extra columns the
    item files carry (such as cluster_id).
    """
    return Selection(store_root, sweep).items()


def load_history(store_root: str | Path, sweep: str | None = None) -> pd.DataFrame:
    """The training logs of the finished runs, one row per run x logged step: run_id,
    family, size, seed, then the log's columns (step, loss, lr, tokens, flops, n_layers), and
    curriculum_end (the step its data curriculum ended, NaN without one)."""
    return Selection(store_root, sweep).history()


def load_curves(store_root: str | Path, sweep: str | None = None, curve: str = "tvd_by_context") -> pd.DataFrame:
    """One curve of the metrics files' `curves` for the finished runs, one row per run x point: run_id,
    family, size, seed, then the curve's columns (for tvd_by_context: n_context_strings, n_positions,
    regbench_tvd and the ngram*_tvd references). Runs without the curve are left out."""
    return Selection(store_root, sweep).curves(curve)


def load_specs(store_root: str | Path, sweep: str | None = None) -> tuple[dict[str, MetricSpec], dict[str, CurveSpec]]:
    """What the finished runs' jobs declared about their metrics and curves (the metrics files' specs).
    A metric of a store without specs (format 1) gets its name as its label and no role."""
    results = Selection(store_root, sweep).results
    return results.metric_specs, results.curve_specs


def load_claims(store_root: str | Path, sweep: str) -> dict[str, MetricSpec]:
    """The metric specs of every claim the jobs can measure, as the orchestrator stored them with the
    sweep; empty when it has not written them."""
    path = Layout(store_root).sweep(sweep).claims
    records = (read_json(path) if os.path.isfile(path) else None) or {}
    return {metric: MetricSpec.from_record(record) for metric, record in records.items()}


def load_paper_flops(store_root: str | Path, sweep: str) -> pd.DataFrame:
    """The paper-scale FLOPs table the orchestrator stored with the sweep (size, layers, block,
    steps, ratio = LIDAS / dense training FLOPs); empty when it has not written one."""
    path = Layout(store_root).sweep(sweep).paper_flops
    columns = ["size", "layers", "block", "steps", "ratio"]
    return pd.DataFrame(read_json(path), columns=columns) if os.path.isfile(path) else pd.DataFrame(columns=columns)
