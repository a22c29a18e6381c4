"""Read a results store into tidy DataFrames.

Only the store's files are read (never `orchestrator` or `jobs`), so this works from a notebook on a
copied store. Layout (format_version 2; 1 reads too, without specs):

    store.json                         {"format_version": 2}
    runs/<run_id>/config.yaml          resolved config: seed, family.name, model.name (the size), ...
    runs/<run_id>/state.json           {"status": ..., "error": ...}
    runs/<run_id>/metrics.json         {"metrics": {...}, "higher_is_better": {...}, "curves": {...},
                                        "specs": {...}, "curve_specs": {...}} (common/metrics.py)
    runs/<run_id>/items/<eval>.parquet item_id, metric, score, weight (per-example outputs)
    sweeps/<name>/sweep.yaml           {name, overrides, run_ids, created_at}
    sweeps/<name>/paper_flops.json     the paper-scale FLOPs table, written by the orchestrator

Sweep membership: a run may be listed by several sweeps. With `sweep=None` the `sweep` column holds
the earliest-created sweep that lists the run (ties broken by name), or None when no sweep lists it.
A run listed by a sweep but without a state file yet counts as "pending", one whose state file
cannot be parsed as "corrupt".
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from common.metrics import CurveSpec, MetricSpec

FORMAT_VERSIONS = (1, 2)
KEY_COLUMNS = ["run_id", "sweep", "family", "size", "seed"]
VALUE_COLUMNS = ["metric", "value", "higher_is_better"]
ITEM_COLUMNS = ["metric", "item_id", "score", "weight"]
# Config keys that become the key columns; every other varying key is reported as a dotted column.
_KEY_CONFIG = {"seed": "seed", "family.name": "family", "model.name": "size"}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def _check_store(root: Path) -> None:
    marker = root / "store.json"
    if not marker.is_file():
        raise FileNotFoundError(f"{root} is not a results store (no store.json)")
    version = _read_json(marker).get("format_version")
    if version not in FORMAT_VERSIONS:
        raise ValueError(f"{marker}: format_version {version!r}, this reader knows {FORMAT_VERSIONS}")


def load_sweep(store_root: str | Path, sweep: str) -> dict:
    """The sweep's record (name, overrides, run_ids, created_at), as the orchestrator wrote it."""
    root = Path(store_root)
    _check_store(root)
    path = root / "sweeps" / sweep / "sweep.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no sweep named {sweep!r} in {root / 'sweeps'}")
    return yaml.safe_load(path.read_text())


def _sweep_membership(root: Path, sweep: str | None) -> dict[str, str | None]:
    """run_id -> sweep for the selection: the sweep's runs, or every run directory in the store."""
    if sweep is not None:
        return {run_id: sweep for run_id in load_sweep(root, sweep)["run_ids"]}
    specs = [yaml.safe_load(p.read_text()) for p in sorted((root / "sweeps").glob("*/sweep.yaml"))]
    membership: dict[str, str | None] = {}
    for spec in sorted(specs, key=lambda s: (str(s.get("created_at", "")), s["name"])):
        for run_id in spec["run_ids"]:
            membership.setdefault(run_id, spec["name"])
    run_dirs = (root / "runs").glob("*/") if (root / "runs").is_dir() else []
    return {run_dir.name: membership.get(run_dir.name) for run_dir in sorted(run_dirs)}


def _flat_config(run_dir: Path) -> dict:
    """The run's config as {dotted key: value}; lists and mappings become JSON text, so they compare."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    flat = pd.json_normalize(yaml.safe_load(path.read_text()) or {}, sep=".").to_dict("records")[0]
    return {k: json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v for k, v in flat.items()}


def _state(run_dir: Path) -> dict:
    """The run's state; no file yet is "pending", an unreadable one "corrupt" (listed, not fatal)."""
    path = run_dir / "state.json"
    try:
        return _read_json(path) if path.is_file() else {"status": "pending"}
    except ValueError as error:
        return {"status": "corrupt", "error": f"unreadable state.json: {error}"}


def _run_table(store_root: str | Path, sweep: str | None) -> pd.DataFrame:
    """One row per selected run: key columns, status, error and the flattened config."""
    root = Path(store_root)
    _check_store(root)
    rows = []
    for run_id, run_sweep in _sweep_membership(root, sweep).items():
        run_dir = root / "runs" / run_id
        state = _state(run_dir)
        config = _flat_config(run_dir)
        keys = {column: config.pop(key, None) for key, column in _KEY_CONFIG.items()}
        rows.append({"run_id": run_id, "sweep": run_sweep, **keys,
                     "status": state.get("status"), "error": state.get("error"), "config": config})
    table = pd.DataFrame(rows, columns=[*KEY_COLUMNS, "status", "error", "config"])
    table["seed"] = table["seed"].astype("Int64")
    return table.sort_values(["family", "size", "seed", "run_id"], ignore_index=True)


def _varying_config(configs: pd.Series) -> pd.DataFrame:
    """The config keys whose values differ across the runs, one dotted column each (sorted by name).

    A column mixing kinds of value (text and numbers) is turned into text so it stays one type.
    """
    flat = pd.DataFrame(list(configs), index=configs.index)
    varying = sorted(c for c in flat.columns if flat[c].nunique(dropna=False) > 1)
    flat = flat[varying]
    for column in varying:
        kinds = {type(v) for v in flat[column].dropna()}
        if len(kinds) > 1 and not kinds <= {int, float}:
            flat[column] = flat[column].map(lambda v: v if pd.isna(v) else str(v))
    return flat


def load_runs(store_root: str | Path, sweep: str | None = None) -> pd.DataFrame:
    """Every selected run, whatever its status, so failed and unfinished runs can be reported.

    Columns: run_id, sweep, family, size, seed, status, error.
    """
    return _run_table(store_root, sweep).drop(columns="config")


def _done(store_root: str | Path, sweep: str | None) -> pd.DataFrame:
    runs = _run_table(store_root, sweep)
    return runs[runs["status"] == "done"].reset_index(drop=True)


def load_data_kinds(store_root: str | Path, sweep: str | None = None) -> set[str]:
    """The data kinds (data.kind) of the finished runs: which headline and confirmatory metrics apply."""
    return {c.get("data.kind", "regbench") for c in _done(store_root, sweep)["config"]}


def load(store_root: str | Path, sweep: str | None = None) -> pd.DataFrame:
    """One row per finished run x metric: the long table every statistic is computed from.

    Columns: run_id, sweep, family, size, seed, metric, value, higher_is_better, then the dotted
    config keys whose values vary across the selected finished runs (other than seed, family, size),
    so runs that differ in more than family, size and seed are visible (`analysis.cell_keys` picks
    those that split cells). Only runs whose status is "done" are included; see `load_runs` for the
    others.
    """
    runs = _done(store_root, sweep)
    root = Path(store_root)
    rows = []
    for run in runs.itertuples():
        metrics = _read_json(root / "runs" / run.run_id / "metrics.json")
        directions = metrics.get("higher_is_better", {})
        references = {name for name, spec in metrics.get("specs", {}).items() if spec.get("reference")}
        rows += [{"run_id": run.run_id, "metric": name,
                  "value": float("nan") if value is None else float(value),
                  "higher_is_better": None if name in references else directions.get(name)}
                 for name, value in sorted(metrics.get("metrics", {}).items())]
    values = pd.DataFrame(rows, columns=["run_id", *VALUE_COLUMNS])
    values = values.astype({"value": float, "higher_is_better": "boolean"})
    config = _varying_config(runs.set_index("run_id")["config"])
    keyed = runs[KEY_COLUMNS].merge(values, on="run_id", how="inner")
    return keyed.merge(config, left_on="run_id", right_index=True, how="left")


def load_items(store_root: str | Path, sweep: str | None = None) -> pd.DataFrame:
    """Per-example evaluation outputs of the finished runs, for item-level (hierarchical) resampling.

    Columns: run_id, family, size, seed, metric, item_id, score, weight, plus any extra columns the
    item files carry (such as cluster_id).
    """
    runs = _done(store_root, sweep)
    root = Path(store_root)
    keys = ["run_id", "family", "size", "seed"]
    frames = [pd.read_parquet(path).assign(run_id=run.run_id)
              for run in runs.itertuples()
              for path in sorted((root / "runs" / run.run_id / "items").glob("*.parquet"))]
    if not frames:
        return pd.DataFrame(columns=[*keys, *ITEM_COLUMNS])
    items = runs[keys].merge(pd.concat(frames, ignore_index=True), on="run_id", how="inner")
    extra = [c for c in items.columns if c not in keys and c not in ITEM_COLUMNS]
    return items[[*keys, *ITEM_COLUMNS, *extra]]


RUN_KEYS = ["run_id", "family", "size", "seed"]


def _per_run(store_root: str | Path, sweep: str | None, read) -> pd.DataFrame:
    """`read(run_dir)` for every finished run, stacked behind the run's key columns; runs for which it
    returns None (the file is missing) are left out, so older stores without the file still load."""
    runs = _done(store_root, sweep)
    root = Path(store_root)
    frames = {run.run_id: read(root / "runs" / run.run_id) for run in runs.itertuples()}
    frames = {run_id: frame for run_id, frame in frames.items() if frame is not None}
    if not frames:
        return pd.DataFrame(columns=RUN_KEYS)
    stacked = pd.concat([frame.assign(run_id=run_id) for run_id, frame in frames.items()], ignore_index=True)
    table = runs[RUN_KEYS].merge(stacked, on="run_id", how="inner")
    return table[[*RUN_KEYS, *[c for c in stacked.columns if c != "run_id"]]]


def load_history(store_root: str | Path, sweep: str | None = None) -> pd.DataFrame:
    """The training logs (history.parquet) of the finished runs, one row per run x logged step: run_id,
    family, size, seed, then the log's columns (step, loss, lr, tokens, flops, n_layers)."""
    def read(run_dir: Path) -> pd.DataFrame | None:
        path = run_dir / "history.parquet"
        return pd.read_parquet(path) if path.is_file() else None
    return _per_run(store_root, sweep, read)


def load_curves(store_root: str | Path, sweep: str | None = None, curve: str = "tvd_by_context") -> pd.DataFrame:
    """One curve of metrics.json's `curves` for the finished runs, one row per run x point: run_id,
    family, size, seed, then the curve's columns (for tvd_by_context: n_context_strings, n_positions,
    regbench_tvd and the ngram*_tvd references). Runs without the curve are left out."""
    def read(run_dir: Path) -> pd.DataFrame | None:
        points = _read_json(run_dir / "metrics.json").get("curves", {}).get(curve)
        return pd.DataFrame(points) if isinstance(points, dict) else None
    return _per_run(store_root, sweep, read)


def load_specs(store_root: str | Path, sweep: str | None = None) -> tuple[dict[str, MetricSpec], dict[str, CurveSpec]]:
    """What the finished runs' jobs declared about their metrics and curves (metrics.json's specs).
    A metric of a store without specs (format 1) gets its name as its label and no role."""
    runs, root = _done(store_root, sweep), Path(store_root)
    metrics: dict[str, MetricSpec] = {}
    curves: dict[str, CurveSpec] = {}
    for run in runs.itertuples():
        recorded = _read_json(root / "runs" / run.run_id / "metrics.json")
        for name, record in recorded.get("specs", {}).items():
            metrics.setdefault(name, MetricSpec.from_record(record))
        for name, record in recorded.get("curve_specs", {}).items():
            curves.setdefault(name, CurveSpec.from_record(record))
        for name, higher in recorded.get("higher_is_better", {}).items():
            metrics.setdefault(name, MetricSpec(name, higher))
    return metrics, curves


def load_paper_flops(store_root: str | Path, sweep: str) -> pd.DataFrame:
    """The paper-scale FLOPs table the orchestrator stored with the sweep (size, layers, block,
    steps, ratio = LIDAS / dense training FLOPs); empty when it has not written one."""
    path = Path(store_root) / "sweeps" / sweep / "paper_flops.json"
    columns = ["size", "layers", "block", "steps", "ratio"]
    return pd.DataFrame(_read_json(path), columns=columns) if path.is_file() else pd.DataFrame(columns=columns)
