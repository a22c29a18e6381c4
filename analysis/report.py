"""A sweep's report: tidy results (results.parquet), a plain-words summary (report.md and
report.html) and its figures (plots/).

Output layout, under <store>/sweeps/<sweep>/:
    results.parquet  one tidy table; column `table` says which of three tables a row belongs to:
                     runs (one row per finished run x metric, plus one row per run that is not done,
                     with status and error), cells (`summarize`) and comparisons (`compare`).
                     Read one back with `read_results(path, "cells")`.
    report.md        the same numbers in words: headline, tables, figures, how sure we are.
    report.html      report.md converted (`render_html`), figures embedded: one self-contained file.
    plots/           each figure (`analysis.plots`) as <name>.png and <name>.svg.
Every file is written atomically (temp file + os.replace). The same store gives the same files byte
for byte: nothing in them comes from the clock, only from the store.
"""

from __future__ import annotations

import base64
import functools
import html
import itertools
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from rich.console import Group
from rich.table import Table
from scipy import stats

from analysis import plots
from analysis.load import (KEY_COLUMNS, VALUE_COLUMNS, load, load_curves, load_history, load_items, load_runs,
                           load_sweep)
from analysis.stats import (BOOT_RELIABLE_N, N_BOOT, SEEDS_MAX, cell_keys, compare, is_reference,
                            p_min_mannwhitney, p_min_signflip, summarize)

METRIC_LABELS = {
    "regbench_tvd": "RegBench TVD",
    "regbench_l1_ref": "RegBench L1 (reference-code convention)",
    "regbench_acc": "RegBench accuracy",
    "final_loss": "final loss",
    "train_flops": "training FLOPs",
    "wall_time_s": "wall time (s)",
    "induction_max": "best induction-head score",
    "induction_topk_mean": "mean score of the top induction heads",
    "ancestry_top_in_best": "top induction heads from the best ancestors (lidas)",
    "ancestry_p": "ancestry concentration p (lidas)",
    "fewshot_f1": "few-shot score, clean",
    "ablation_drop_f1": "few-shot drop, top heads mean-ablated",
    "ablation_drop_f1_zero": "few-shot drop, top heads zero-ablated (control)",
    "ablation_drop_f1_random": "few-shot drop, random heads mean-ablated (control)",
    "ablation_tvd_rise": "held-out TVD rise, top heads mean-ablated",
}
# In-context n-gram estimators shown as reference rows under the metric they are measured in.
REFERENCE_ROWS = {"ngram1_tvd": "in-context unigram", "ngram2_tvd": "in-context bigram",
                  "ngram3_tvd": "in-context trigram"}
REFERENCE_TARGET = "regbench_tvd"
DATA_PREFIX = "data."  # cell keys that change the evaluation data, and with it the reference estimators
UNIGRAM, BIGRAM = "ngram1_tvd", "ngram2_tvd"
CORRECTION_LABELS = {"holm": "Holm", "fdr_bh": "BH"}
TABLES = ("runs", "cells", "comparisons")
DECIDED = ("better", "worse", "equivalent")
CONTEXT_CURVE, CONTEXT_X, CONTEXT_COUNT = "tvd_by_context", "n_context_strings", "n_positions"
CONTEXT_X_LABEL = "strings of the instance's language already in the context"
FLOPS = "train_flops"
HEADS_CURVE, TOP_HEADS = "induction_heads", 3
ABLATION_CURVE = "ablation_by_fraction"
ABLATION_CONDITIONS = {"": "mean-ablated top heads", "_zero": "zero-ablated top heads",
                       "_random": "mean-ablated random heads"}
# Metrics measuring an effect rather than a quality, by name prefix: what "higher" (compared as better) means.
EFFECT_DIRECTIONS = {"ablation": "higher = relies more on the ablated heads; compared as higher"}
PAPER_SIZES = ("360m", "1b7", "3b")  # conf/size: the paper-scale configs of the FLOPs table


HB_FINAL = 10_000  # seed x item bootstrap resamples for a written report (statistics.md (c))


@dataclass(frozen=True)
class AnalysisOptions:
    """The pre-declared analysis choices (config group `analysis`), fixed before looking at results."""
    baseline: str = "dense"
    pairing: str = "paired"
    primary_metrics: tuple[str, ...] | None = None  # None: the headline metrics the runs report
    alpha: float = 0.05
    delta_min: float | Mapping[str, float] = 0.02  # a mapping gives each metric its own margin
    seed: int = 0
    n_boot: int = N_BOOT
    by: tuple[str, ...] | None = None  # the cell keys; None: detected by `cell_keys`


@dataclass(frozen=True)
class Analysis:
    """Everything a report shows, computed once from the store."""
    sweep: str
    spec: dict
    runs: pd.DataFrame
    values: pd.DataFrame
    cells: pd.DataFrame
    comparisons: pd.DataFrame
    options: AnalysisOptions
    keys: tuple[str, ...]  # the config keys that split cells, beside family and size
    history: pd.DataFrame  # training logs, for the loss curves (`load_history`)
    curves: pd.DataFrame  # TVD by number of in-context strings (`load_curves`)
    heads: pd.DataFrame = field(default_factory=pd.DataFrame)  # per-head induction scores (HEADS_CURVE)
    ablation: pd.DataFrame = field(default_factory=pd.DataFrame)  # drop by ablated fraction (ABLATION_CURVE)


def options_for(spec: Mapping) -> AnalysisOptions:
    """The defaults, or for an adaptive sweep the rule it declared: every test at alpha / K for K
    looks (statistics.md (f)), so the report says what the stopping rule saw."""
    looks = spec.get("looks") or []
    if not looks:
        return AnalysisOptions()
    rule = looks[-1]["rule"]
    return AnalysisOptions(baseline=rule["baseline"], primary_metrics=(rule["metric"],),
                           alpha=rule["alpha"] / looks[-1]["n_looks"], delta_min=rule["delta_min"])


def analyse(store_root: str | Path, sweep: str, options: AnalysisOptions | None = None) -> Analysis:
    """Load a sweep and compute its cells and comparisons, both keyed by the same cell keys."""
    spec = load_sweep(store_root, sweep)
    options = options or options_for(spec)
    values = load(store_root, sweep)
    if options.primary_metrics is None:  # the headline metric of each data kind the sweep ran on
        from jobs.registry import HEADLINE_METRICS
        present = set(values["metric"])
        options = replace(options, primary_metrics=tuple(m for m in HEADLINE_METRICS.values() if m in present)
                          or (HEADLINE_METRICS["regbench"],))
    items = load_items(store_root, sweep)
    keys = cell_keys(values) if options.by is None else list(options.by)
    return Analysis(
        sweep=sweep, spec=spec, runs=load_runs(store_root, sweep), values=values,
        cells=summarize(values, 1 - options.alpha, options.n_boot, options.seed, by=keys, items=items),
        comparisons=compare(values, options.baseline, options.pairing, options.primary_metrics,
                            options.alpha, options.delta_min, options.seed, by=keys, items=items,
                            n_boot=HB_FINAL),
        options=options, keys=tuple(keys), history=load_history(store_root, sweep),
        curves=load_curves(store_root, sweep, CONTEXT_CURVE), heads=load_curves(store_root, sweep, HEADS_CURVE),
        ablation=load_curves(store_root, sweep, ABLATION_CURVE))


def _nullable(table: pd.DataFrame) -> pd.DataFrame:
    """Integer and boolean columns as nullable dtypes, so they keep their type next to other tables."""
    return table.astype({**{c: "Int64" for c in table.select_dtypes("integer").columns},
                         **{c: "boolean" for c in table.select_dtypes("bool").columns}})


def results_table(analysis: Analysis) -> pd.DataFrame:
    """The three tidy tables stacked into one, told apart by the `table` column. Each table's own
    columns, in order, are kept in attrs["tables"] (stored in the parquet file) for `read_results`."""
    not_done = analysis.runs[analysis.runs["status"] != "done"]
    tables = {"runs": pd.concat([analysis.values.assign(status="done"), not_done], ignore_index=True),
              "cells": analysis.cells, "comparisons": analysis.comparisons}
    tables = {name: _nullable(t).assign(sweep=analysis.sweep) for name, t in tables.items()}
    stacked = pd.concat([t.assign(table=name) for name, t in tables.items()], ignore_index=True)
    stacked = stacked[["table", "sweep", *[c for c in stacked.columns if c not in ("table", "sweep")]]]
    stacked.attrs["tables"] = {name: ["sweep", *[c for c in t.columns if c != "sweep"]]
                               for name, t in tables.items()}
    return stacked


def read_results(path: str | Path, table: str) -> pd.DataFrame:
    """One table of a results.parquet, with its own columns only, in their original order."""
    if table not in TABLES:
        raise ValueError(f"table must be one of {TABLES}, got {table!r}")
    results = pd.read_parquet(path)
    rows = results[results["table"] == table]
    return rows[results.attrs["tables"][table]].reset_index(drop=True)


# ---- formatting -------------------------------------------------------------------------------

def _num(x: float) -> str:
    return "–" if pd.isna(x) else f"{x + 0.0:.4g}"  # + 0.0 turns -0.0 into 0.0


def _signed(x: float) -> str:
    return "–" if pd.isna(x) else f"{x + 0.0:+.4g}"


def _text(value: object) -> str:
    return "–" if pd.isna(value) else str(value)


def _p(p: float) -> str:
    return "–" if pd.isna(p) else f"{p:.3g}"


def _margins(delta_min: float | Mapping[str, float]) -> str:
    if isinstance(delta_min, Mapping):
        return ", ".join(f"{metric} {margin:g}" for metric, margin in sorted(delta_min.items())) or "none"
    return f"{delta_min:g}"


def _label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def _one_line(text: object, limit: int = 300) -> str:
    """Text safe inside a markdown table cell: one line, pipes escaped, at most `limit` characters."""
    return " ".join(str(text).split())[:limit].replace("|", "\\|")


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ([f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"]
            + [f"| {' | '.join(_one_line(c) for c in row)} |" for row in rows])


def _families(analysis: Analysis) -> list[str]:
    """The baseline first, then the other families alphabetically."""
    baseline = analysis.options.baseline
    others = sorted(set(analysis.cells["family"]) - {baseline})
    return [baseline, *others] if baseline in set(analysis.cells["family"]) else others


def _metrics(analysis: Analysis) -> list[str]:
    """Model metrics: primary ones in their declared order, then the rest alphabetically."""
    present = {m for m in analysis.cells["metric"] if not is_reference(m)}
    primary = [m for m in analysis.options.primary_metrics if m in present]
    return primary + sorted(present - set(primary))


def _sorted(analysis: Analysis, table: pd.DataFrame) -> pd.DataFrame:
    """Rows in report order: metric (as `_metrics`), size, cell keys, family (as `_families`)."""
    ranks = {"metric": {m: i for i, m in enumerate(_metrics(analysis))},
             "family": {f: i for i, f in enumerate(_families(analysis))}}
    order = [c for c in ("metric", "size", *analysis.keys, "family") if c in table.columns]
    return table.sort_values(order, key=lambda c: c.map(ranks[c.name]) if c.name in ranks else c, kind="stable",
                             ignore_index=True)


def _confirmatory(analysis: Analysis) -> pd.DataFrame:
    """The comparisons of the Holm family (primary metrics), in report order."""
    comparisons = analysis.comparisons
    return _sorted(analysis, comparisons[comparisons["correction"] == "holm"])


def _family_size(analysis: Analysis) -> int:
    """m of Holm: the testable confirmatory comparisons (fewer than 2 seeds cannot be tested)."""
    return int(_confirmatory(analysis)["p_value"].notna().sum())


def _key_texts(row: pd.Series, keys: tuple[str, ...]) -> list[str]:
    """The row's cell-key values as text; "all" for a key the row does not depend on (reference rows)."""
    return [_text(row[k]) if k in row.index else "all" for k in keys]


def _where(row: pd.Series, keys: tuple[str, ...]) -> str:
    """The size and cell-key values of a row, as in "tiny, train.lr=0.003"."""
    return ", ".join([row["size"], *(f"{k}={v}" for k, v in zip(keys, _key_texts(row, keys)))])


def _grid(analysis: Analysis, table: pd.DataFrame, sizes: list[str],
          text: Callable[[pd.Series], str]) -> list[list[str]]:
    """Rows of a family x size table: one per family and cell-key values (baseline first, then
    families alphabetically, each by key value), then `text(row)` per size, "–" where none."""
    keys = analysis.keys
    rank = {family: i for i, family in enumerate(_families(analysis))}
    order = [c for c in ("family", *keys) if c in table.columns]
    table = table.sort_values(order, key=lambda c: c.map(rank) if c.name == "family" else c)
    texts = {(row["family"], *_key_texts(row, keys), row["size"]): text(row) for _, row in table.iterrows()}
    labels = dict.fromkeys(name[:-1] for name in texts)
    return [[*name, *[texts.get((*name, size), "–") for size in sizes]] for name in labels]


def _cell_text(cell: pd.Series) -> str:
    if cell["single_seed"]:
        return f"{_num(cell['mean'])} (n=1, single seed)"
    return f"{_num(cell['mean'])} [{_num(cell['ci_low'])}, {_num(cell['ci_high'])}] (n={cell['n_seeds']})"


def _data_keys(analysis: Analysis) -> list[str]:
    return [k for k in analysis.keys if k.startswith(DATA_PREFIX)]


def _references(analysis: Analysis) -> pd.DataFrame:
    """Reference estimator value per (metric, size, data.* cell keys): the estimators see only the
    evaluation data, so other keys (train.lr) do not split them. min and max show whether runs agree,
    as they should when every run of a study evaluates the same held-out instances."""
    values = analysis.values[analysis.values["metric"].isin(REFERENCE_ROWS)]
    return (values.groupby(["metric", "size", *_data_keys(analysis)], dropna=False)["value"]
            .agg(["mean", "min", "max"]).reset_index())


def _icl_position(analysis: Analysis) -> pd.DataFrame:
    """Per model cell (family, size, cell keys), (ngram1 - model) / (ngram1 - ngram2): 0 = no better
    than the in-context unigram estimator, 1 = as good as the bigram one. `beats_unigram` is False
    when the model's mean TVD is not below the unigram's."""
    refs = _references(analysis)
    model = analysis.cells[analysis.cells["metric"] == REFERENCE_TARGET].rename(columns={"mean": "model"})
    columns = ["family", "size", *analysis.keys, "model", "unigram", "position", "beats_unigram"]
    if UNIGRAM not in set(refs["metric"]) or model.empty:
        return pd.DataFrame(columns=columns)
    on = ["size", *_data_keys(analysis)]
    for metric, name in ((UNIGRAM, "unigram"), (BIGRAM, "bigram")):
        reference = refs.loc[refs["metric"] == metric, [*on, "mean"]].rename(columns={"mean": name})
        model = model.merge(reference, on=on, how="left")
    span = (model["unigram"] - model["bigram"]).where(lambda s: s != 0)
    return model.assign(position=(model["unigram"] - model["model"]) / span,
                        beats_unigram=model["model"] < model["unigram"])[columns]


def _no_icl(analysis: Analysis) -> set[tuple[str, str]]:
    """(family, `_where`) of the cells whose model does not beat the in-context unigram estimator."""
    position = _icl_position(analysis)
    failing = position[~position["beats_unigram"].astype(bool)]
    return {(row["family"], _where(row, analysis.keys)) for _, row in failing.iterrows()}


# ---- sections ---------------------------------------------------------------------------------

def _header(analysis: Analysis) -> list[str]:
    o, spec = analysis.options, analysis.spec
    status = analysis.runs["status"].value_counts()
    other = int(status.drop(["done", "failed"], errors="ignore").sum())
    model_cells = analysis.cells[~analysis.cells["metric"].map(is_reference).astype(bool)]
    n_seeds = sorted(set(model_cells["n_seeds"]))
    seeds = "–" if not n_seeds else str(n_seeds[0]) if len(n_seeds) == 1 else f"{n_seeds[0]} to {n_seeds[-1]}"
    m = _family_size(analysis)
    overrides = " ".join(f"`{x}`" for x in spec.get("overrides", [])) or "none"
    return [
        "## Setup",
        "",
        f"- Sweep created: {spec.get('created_at', 'unknown')}; overrides: {overrides}",
        f"- Runs: {status.get('done', 0)} done, {status.get('failed', 0)} failed, {other} not finished"
        f" ({len(analysis.runs)} in the sweep)",
        f"- Seeds per cell: {seeds}",
        f"- Baseline: {o.baseline}; pairing: {o.pairing}"
        + (" (seed s of a family against seed s of the baseline)" if o.pairing == "paired" else ""),
        f"- alpha = {o.alpha:g}, two-sided; {1 - o.alpha:.0%} intervals",
        _cells_line(analysis),
        f"- Correction: Holm over the confirmatory family ({', '.join(o.primary_metrics)} x families x sizes"
        + "".join(f" x {k} values" for k in analysis.keys)
        + f", m = {m}); Benjamini-Hochberg over the other metrics (exploratory)",
        f"- Bootstrap: BCa over seeds, {o.n_boot} resamples, in results.parquet only"
        f" (reliable from {BOOT_RELIABLE_N} seeds)",
        f"- Equivalence margin and planning gap: delta_min = {_margins(o.delta_min)}",
        f"- Analysis seed: {o.seed}",
    ]


def _cells_line(analysis: Analysis) -> str:
    """How cells are keyed, and which varying config keys were deliberately not split on."""
    standard = {*KEY_COLUMNS, *VALUE_COLUMNS, *analysis.keys}
    unsplit = sorted(c for c in analysis.values.columns if c not in standard)
    return (f"- Cells: {' x '.join(['family', 'size', *analysis.keys, 'metric'])}, seeds as replicates"
            + (f"; also varying, not split on: {', '.join(unsplit)}" if unsplit else ""))


def _metric_section(analysis: Analysis, metric: str) -> list[str]:
    cells = analysis.cells[analysis.cells["metric"] == metric]
    sizes = sorted(set(cells["size"]))
    direction = cells["higher_is_better"].iloc[0]
    better = ("descriptive, not compared" if pd.isna(direction)
              else EFFECT_DIRECTIONS.get(metric.split("_")[0], "higher is better") if direction else "lower is better")
    rows = _grid(analysis, cells, sizes, _cell_text)
    lines = [f"### {_label(metric)} (`{metric}`, {better})", "",
             f"Mean [{1 - analysis.options.alpha:.0%} t-interval] (n seeds).", ""]
    if metric == REFERENCE_TARGET:
        rows += _reference_rows(analysis, sizes)
    lines += _md_table(["family", *analysis.keys, *sizes], rows)
    if metric == REFERENCE_TARGET:
        lines += _position_lines(analysis, sizes)
    return lines


def _reference_text(ref: pd.Series) -> str:
    return _num(ref["mean"]) + (" (varies across runs)" if ref["max"] > ref["min"] else "")


def _reference_rows(analysis: Analysis, sizes: list[str]) -> list[list[str]]:
    """One row per reference estimator (and data.* cell-key values); "all" under the other cell keys."""
    refs = _references(analysis)
    return [row for metric, name in REFERENCE_ROWS.items()
            for row in _grid(analysis, refs[refs["metric"] == metric].assign(family=f"*{name} (reference)*"),
                             sizes, _reference_text)]


def _position_lines(analysis: Analysis, sizes: list[str]) -> list[str]:
    position = _icl_position(analysis)
    if position.empty:
        return []
    rows = _grid(analysis, position, sizes, lambda row: _num(row["position"]))
    lines = ["", "Position between the in-context estimators, (unigram - model) / (unigram - bigram):"
             " 0 = no better than unigram, 1 = as good as bigram.", "",
             *_md_table(["family", *analysis.keys, *sizes], rows)]
    failing = position[~position["beats_unigram"].astype(bool)].sort_values(["family", "size", *analysis.keys])
    for _, row in failing.iterrows():
        lines += ["", f"> **Warning:** {row['family']} at {_where(row, analysis.keys)} does not beat the in-context"
                      f" unigram estimator (TVD {_num(row['model'])} vs {_num(row['unigram'])}): it learned no"
                      " in-context learning; comparisons on it are meaningless."]
    return lines


def _have(row: pd.Series) -> int:
    return row["n_pairs"] if row["pairing"] == "paired" else min(row["n_candidate"], row["n_baseline"])


def _seeds_text(n: object) -> str:
    return f"> {SEEDS_MAX}" if n > SEEDS_MAX else str(n)


def _plan_text(row: pd.Series) -> str:
    """Seeds needed for 80% power at delta_min: a planning figure, never evidence."""
    if pd.isna(row["seeds_needed"]):
        return ""
    gap = f"a {row['delta_min']:g} gap"
    pooled = "; seed noise pooled over sizes" if row["sigma_pooled"] else ""
    if row["seeds_unresolvable"]:
        return f"> {SEEDS_MAX} seeds would be needed for 80% power at {gap}: not resolvable by seeds alone{pooled}"
    conservative = f"{_seeds_text(row['seeds_needed_conservative'])} seeds if the seed noise is at its 80% upper bound"
    if row["seeds_more"] == 0:
        return (f"{_have(row)} seeds would already give 80% power for {gap} at the observed seed noise"
                f" ({conservative}{pooled})")
    return f"about {row['seeds_more']} more seeds give 80% power for {gap} ({conservative}{pooled})"


def _verdict_text(row: pd.Series, alpha: float) -> str:
    correction = CORRECTION_LABELS[row["correction"]]
    if row["verdict"] in ("better", "worse"):
        return f"{row['verdict']}: decisive at alpha = {alpha:g} after {correction} correction"
    if row["verdict"] == "equivalent":
        return f"equivalent: the {1 - 2 * alpha:.0%} CI lies inside +-{row['delta_min']:g}"
    untestable = ", fewer than 2 seeds to test" if row["single_seed"] else ""
    plan = _plan_text(row)
    return f"{row['verdict']}{untestable}" + (f": {plan}" if plan else "")


def _sign(row: pd.Series) -> int:
    return 1 if row["higher_is_better"] else -1


def _raw_interval(row: pd.Series, low: str = "ci_low", high: str = "ci_high") -> tuple[float, float]:
    """An interval of delta (> 0 = better) turned back into the metric's own units, candidate minus
    baseline, as readers compare it with the tables."""
    return tuple(sorted([_sign(row) * row[low], _sign(row) * row[high]]))


def _interval_text(bounds: tuple[float, float]) -> str:
    return f"[{_signed(bounds[0])}, {_signed(bounds[1])}]"


def _difference(row: pd.Series) -> str:
    """Candidate minus baseline with its CI, as in "-0.007207 [-0.0339, +0.01949]"."""
    return f"{_signed(_sign(row) * row['diff_mean'])} {_interval_text(_raw_interval(row))}"


def _has(table: pd.DataFrame, column: str) -> bool:
    """Whether `table` has `column` with a value: columns another analysis step may not add yet."""
    return column in table.columns and bool(table[column].notna().any())


def _seeds(row: pd.Series) -> str:
    if row["pairing"] == "paired":
        return f"{row['n_pairs']} seed{'' if row['n_pairs'] == 1 else 's'}"
    return f"{row['n_candidate']} vs {row['n_baseline']} seeds"


def _sentence(row: pd.Series, analysis: Analysis, no_icl: set[tuple[str, str]]) -> str:
    """One comparison in words, with the difference in the metric's own direction."""
    sign = _sign(row)
    low, high = _raw_interval(row)
    word = ("on average better" if row["diff_mean"] > 0 else "on average worse" if row["diff_mean"] < 0
            else "no different on average")
    paired = row["pairing"] == "paired"
    seeds = _seeds(row)
    if row["seeds_dropped"]:
        seeds += f"; seeds {row['seeds_dropped']} dropped for lack of a partner"
    rank_name, rank_p = ("sign-flip", row["signflip_p"]) if paired else ("Mann-Whitney", row["mannwhitney_p"])
    floor = " (the smallest possible)" if rank_p <= row["p_min_attainable"] * (1 + 1e-9) else ""
    where = _where(row, analysis.keys)
    text = (f"{row['family']} vs {row['baseline']}, {_label(row['metric'])}, {where}:"
            f" {_signed(sign * row['diff_mean'])}, {word} ({'higher' if sign > 0 else 'lower'} is better;"
            f" {row['ci_level']:.0%} CI {_signed(low)} to {_signed(high)}, {'paired t' if paired else 'Welch t'},"
            f" {seeds}, {CORRECTION_LABELS[row['correction']]} p = {_p(row['p_adj'])})")
    if row["n_pairs"]:
        text += f"; {row['seed_wins']}/{row['n_pairs']} seeds better"
    if pd.notna(rank_p):
        text += f"; {rank_name} p = {_p(rank_p)}{floor}"
    text += f"; {_verdict_text(row, analysis.options.alpha)}."
    caution = [f for f in (row["family"], row["baseline"]) if (f, where) in no_icl]
    if caution and row["metric"].startswith("regbench"):
        text += (f" Caution: {' and '.join(caution)} does not beat the in-context unigram estimator here,"
                 " so this comparison is meaningless.")
    return text


def _seeds_needed_text(n: object) -> str:
    return "–" if pd.isna(n) else _seeds_text(n)


def _comparison_table(analysis: Analysis, rows: pd.DataFrame) -> list[str]:
    """One metric's comparisons, differences in the metric's own units (candidate - baseline)."""
    hierarchical = _has(rows, "hb_low")
    header = ["family", "size", *analysis.keys, f"difference [{rows['ci_level'].iloc[0]:.0%} CI]",
              *(["hierarchical CI"] if hierarchical else []), "seeds", "p", "adjusted p", "seeds better",
              "verdict", "seeds for 80% power"]
    table = [[row["family"], row["size"], *_key_texts(row, analysis.keys), _difference(row),
              *([_interval_text(_raw_interval(row, "hb_low", "hb_high"))] if hierarchical else []),
              _seeds(row), _p(row["p_value"]), f"{_p(row['p_adj'])} ({CORRECTION_LABELS[row['correction']]})",
              f"{row['seed_wins']}/{row['n_pairs']}" if row["n_pairs"] else "–", row["verdict"],
              _seeds_needed_text(row["seeds_needed"])]
             for _, row in rows.iterrows()]
    return _md_table(header, table)


def _comparison_section(analysis: Analysis) -> list[str]:
    comparisons = analysis.comparisons
    lines = [f"## Comparisons against {analysis.options.baseline}", ""]
    if comparisons.empty:
        return lines + ["No comparisons: the baseline or a second family has no finished runs."]
    no_icl = _no_icl(analysis)
    for metric, rows in _sorted(analysis, comparisons).groupby("metric", sort=False):
        kind = "confirmatory, Holm" if rows["correction"].iloc[0] == "holm" else "exploratory, Benjamini-Hochberg"
        lines += [f"### {_label(metric)} ({kind})", "", *_comparison_table(analysis, rows), ""]
        lines += [f"- {_sentence(row, analysis, no_icl)}" for _, row in rows.iterrows()] + [""]
    return lines


def _headline(row: pd.Series, analysis: Analysis) -> str:
    """One confirmatory comparison as a claim, or as the reason it is not one yet."""
    what = f"{_label(row['metric'])} at {_where(row, analysis.keys)}"
    numbers = f"{_difference(row)}, {_seeds(row)}, Holm p = {_p(row['p_adj'])}"
    family, baseline = row["family"], row["baseline"]
    if row["verdict"] == "better":
        return f"{family} beats {baseline} on {what}: {numbers}."
    if row["verdict"] == "worse":
        return f"{family} is worse than {baseline} on {what}: {numbers}."
    if row["verdict"] == "equivalent":
        return f"{family} matches {baseline} within +-{row['delta_min']:g} on {what}: {numbers}."
    if row["single_seed"]:
        return f"No test possible: {family} vs {baseline} on {what} has {_seeds(row)}; a test needs 2."
    opening = "Stopped for futility" if row["verdict"] == "futile" else "No decision yet"
    plan = _plan_text(row)
    return f"{opening}: {family} vs {baseline} on {what}, {numbers}" + (f"; {plan}" if plan else "") + "."


def _headline_section(analysis: Analysis) -> list[str]:
    rows = _confirmatory(analysis)
    lines = ["## Headline", ""]
    if rows.empty:
        return lines + ["No confirmatory comparison: the baseline or a second family has no finished runs"
                        f" of {', '.join(analysis.options.primary_metrics)}."]
    return lines + [f"- {_headline(row, analysis)}" for _, row in rows.iterrows()]


def _induction_section(analysis: Analysis) -> list[str]:
    """The top induction heads of every run and, for LIDAS, the ancestry concentration per run with
    Fisher's combination of the per-run p-values across seeds (conservative for discrete p)."""
    heads = analysis.heads
    if heads.empty or "score" not in heads.columns:
        return []
    rows = []
    for (family, size, seed), run in heads.groupby(["family", "size", "seed"], sort=True):
        top = run.sort_values("score", ascending=False, kind="stable").head(TOP_HEADS)
        rows.append([family, size, str(seed), "; ".join(
            f"L{r.layer}.H{r.head}" + (f" it{r.iteration}" if family == "looped" else "")
            + (f" (from L{r.ancestor})" if family == "lidas" else "") + f" {_num(r.score)}"
            for r in top.itertuples())])
    lines = ["## Induction heads", "", f"Top {TOP_HEADS} heads per run by prefix-matching score (attention"
             " mass from the second copy of a repeated random sequence onto the token after the earlier"
             " occurrence; 1 = a perfect induction head). Looped heads are scored per iteration (it).", "",
             *_md_table(["family", "size", "seed", "top heads"], rows)]
    values = analysis.values.pivot_table(index=["family", "size", "seed"], columns="metric", values="value")
    if "ancestry_p" not in values.columns:
        return lines
    anc = values.dropna(subset=["ancestry_p"]).reset_index()
    table = [[r["size"], str(r["seed"]), _num(r["ancestry_top_in_best"]), _num(r["ancestry_chance"]),
              _p(r["ancestry_p"])] for _, r in anc.iterrows()]
    for size, group in anc.groupby("size"):
        fisher = stats.chi2.sf(-2 * np.log(group["ancestry_p"].clip(lower=1e-300)).sum(), 2 * len(group))
        table.append([size, f"all {len(group)} seeds (Fisher)", _num(group["ancestry_top_in_best"].mean()),
                      _num(group["ancestry_chance"].mean()), _p(fisher)])
    return lines + ["", "Ancestry (lidas): of the top-k heads, how many descend from their m most common"
                    " ancestor heads of the initial network, against top-k sets drawn uniformly from all heads"
                    " (exact p).", "", *_md_table(["size", "seed", "top-k heads from the best m ancestors",
                                                    "chance mean", "p"], table)]


def _seed_means(analysis: Analysis, metrics: list[str]) -> pd.DataFrame:
    """Per family and size, each metric's mean over the seeds that have it, and the seed count."""
    values = analysis.values[analysis.values["metric"].isin(metrics)]
    means = values.pivot_table(index=["family", "size"], columns="metric", values="value", aggfunc="mean")
    return means.assign(seeds=values.groupby(["family", "size"])["seed"].nunique()).reset_index()


def _ablation_section(analysis: Analysis) -> list[str]:
    """Few-shot F1 drop and held-out TVD rise when the top induction heads are ablated, with the
    zero-ablation and random-heads controls, then the drop at every ablated fraction."""
    names = [f"ablation_{kind}{suffix}" for kind in ("drop_f1", "tvd_rise") for suffix in ABLATION_CONDITIONS]
    if not analysis.values["metric"].eq("ablation_drop_f1").any():
        return []
    table = _seed_means(analysis, [*names, "fewshot_f1", "ablation_heads"])
    rows = [[r["family"], r["size"], str(r["seeds"]), _num(r["ablation_heads"]), _num(r["fewshot_f1"]),
             *[_signed(r[name]) if name in r and pd.notna(r[name]) else "-" for name in names]]
            for _, r in table.iterrows()]
    header = ["family", "size", "seeds", "heads ablated", "clean few-shot score",
              *[f"F1 drop, {label}" for label in ABLATION_CONDITIONS.values()],
              *[f"TVD rise, {label}" for label in ABLATION_CONDITIONS.values()]]
    lines = ["## Head ablation", "", "Mean over seeds. The top fraction of head applications by induction score"
             " (eval.ablation.fraction) has its per-head output replaced by its mean over a reference batch;"
             " controls: replaced by zero, and as many random heads mean-ablated. Few-shot score: mean over the"
             " tasks of jobs/data/fewshot.py (token F1) and held-out next-symbol accuracy; drop = clean -"
             " ablated (> 0: the model relies on those heads). TVD rise: ablated - clean held-out RegBench TVD.",
             "", *_md_table(header, rows)]
    curve = analysis.ablation
    if curve.empty:
        return lines
    by = curve.groupby(["family", "size", "fraction"], sort=True)[["heads", "drop_f1", "tvd_rise"]].mean()
    rows = [[family, size, _num(fraction), _num(r["heads"]), _signed(r["drop_f1"]), _signed(r["tvd_rise"])]
            for (family, size, fraction), r in by.iterrows()]
    return lines + ["", "Drop by ablated fraction (mean-ablation of the top heads, mean over seeds;"
                    " eval.ablation.fractions):", "",
                    *_md_table(["family", "size", "fraction", "heads", "F1 drop", "TVD rise"], rows)]


@functools.lru_cache(maxsize=1)
def paper_scale_flops() -> tuple[tuple[str, int, int, int, float], ...]:
    """(size, layers, block, steps, LIDAS/dense FLOP ratio) of the paper-scale configs, composed
    through Hydra as a sweep would compose them (schedule_flops over the LIDAS stage schedule)."""
    from jobs.flops import lidas_flop_ratio
    from orchestrator.config import compose_run, hydra_session
    with hydra_session():
        configs = [compose_run([f"size={size}", "family=lidas"]) for size in PAPER_SIZES]
    return tuple((size, c["model"]["n_layers"], c["model"]["block_size"], c["train"]["steps"], lidas_flop_ratio(c))
                 for size, c in zip(PAPER_SIZES, configs))


def _flops_section(analysis: Analysis) -> list[str]:
    """Training FLOPs per family and size from the runs' schedules, LIDAS's saving against dense, and
    the same accounting for the paper-scale configs (the paper reports a 26% saving at 3B)."""
    lines = ["## Training FLOPs", "", "Counted from each run's stage schedule (jobs/flops.py): per token at"
             " effective depth L, `F(L) = 6 (L P_layer + V d) + 6 L n_ctx d` with `P_layer = d H hd + 2 d K hd +"
             " H hd d + 3 d d_ff`; a run's FLOPs are `tokens_per_step * sum_s steps_s F(L_s)` over its stages."
             " Saving = 1 - family / dense at the same size.", ""]
    table = _seed_means(analysis, [FLOPS])
    if FLOPS in table.columns:
        dense = table[table["family"] == analysis.options.baseline].set_index("size")[FLOPS]
        rows = [[r["family"], r["size"], f"{r[FLOPS]:.3e}",
                 f"{1 - r[FLOPS] / dense[r['size']]:.1%}" if r["size"] in dense.index else "-"]
                for _, r in table.iterrows()]
        lines += _md_table(["family", "size", "training FLOPs", f"saving vs {analysis.options.baseline}"], rows)
    rows = [[size, str(layers), str(block), str(steps), f"{ratio:.3f}", f"{1 - ratio:.1%}"]
            for size, layers, block, steps, ratio in paper_scale_flops()]
    return lines + ["", "Paper-scale configs (conf/size, composed with family=lidas; dense = the same final"
                    " depth for all steps, n_ctx = model.max_seq_len). The paper reports 26% fewer training"
                    " FLOPs at 3B.", "", *_md_table(["size", "layers", "block", "steps", "LIDAS / dense FLOPs",
                                                      "saving"], rows)]


# ---- figures ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plot:
    """One figure of the report: its file stem under plots/, heading and legend in words, and the
    figure, or None with the reason it was not drawn."""
    name: str
    title: str
    caption: str
    figure: Figure | None
    missing: str = ""


def _grouped(analysis: Analysis, table: pd.DataFrame) -> pd.DataFrame:
    """`table` in report order with the `group` column the plots split on (size and cell keys)."""
    table = _sorted(analysis, table)
    return table.assign(group=[_where(row, analysis.keys) for _, row in table.iterrows()])


def _keyed(analysis: Analysis, runs: pd.DataFrame) -> pd.DataFrame:
    """Per-run rows (history, curves) with the run's cell-key values, from the loaded runs."""
    keys = analysis.values[["run_id", *analysis.keys]].drop_duplicates("run_id")
    return _grouped(analysis, runs.merge(keys, on="run_id", how="inner"))


def _primary(analysis: Analysis, table: pd.DataFrame) -> pd.DataFrame:
    return table[table["metric"].isin(analysis.options.primary_metrics)].assign(
        label=lambda t: t["metric"].map(_label))


def _seed_plot(analysis: Analysis, metric: str) -> Plot:
    """Per-seed dots of one metric, with the in-context estimators as reference lines under TVD."""
    values = _grouped(analysis, analysis.values[analysis.values["metric"] == metric])
    cells = _grouped(analysis, analysis.cells[analysis.cells["metric"] == metric])
    references = pd.DataFrame(columns=["group", "name", "value"])
    if metric == REFERENCE_TARGET:
        groups = cells[["group", "size", *analysis.keys]].drop_duplicates("group")
        refs = _references(analysis).assign(name=lambda r: r["metric"].map(REFERENCE_ROWS), value=lambda r: r["mean"])
        references = groups.merge(refs, on=["size", *_data_keys(analysis)])[["group", "name", "value"]]
    level = f"{1 - analysis.options.alpha:.0%}"
    return Plot(f"seeds_{metric}", f"{_label(metric)}: every seed",
                f"One dot per seed; grey lines join the same seed across families (the pairing); black: mean"
                f" and {level} t-interval over seeds"
                + ("; horizontal lines: the in-context n-gram estimators." if metric == REFERENCE_TARGET else "."),
                plots.seed_dots(values, cells, references, _families(analysis), _label(metric)),
                f"no finished run has {metric}")


def _plots(analysis: Analysis) -> list[Plot]:
    """The report's figures, in report order."""
    o, families = analysis.options, _families(analysis)
    level = f"{1 - o.alpha:.0%}"
    comparisons = _grouped(analysis, _primary(analysis, analysis.comparisons))
    hierarchical = ("; thin whisker: hierarchical bootstrap interval (seeds and items)"
                    if _has(comparisons, "hb_low") else "")
    cells = _primary(analysis, analysis.cells)
    flops = analysis.cells.loc[analysis.cells["metric"] == FLOPS, ["family", "size", *analysis.keys, "mean",
                                                                    "ci_low", "ci_high"]]
    points = _grouped(analysis, cells.merge(
        flops.rename(columns={"mean": "flops", "ci_low": "flops_low", "ci_high": "flops_high"}),
        on=["family", "size", *analysis.keys]))
    return [
        Plot("forest", f"Differences against {o.baseline}",
             f"Per family and size, the mean paired difference (> 0 = better than {o.baseline}; for"
             f" lower-is-better metrics the sign is flipped) with its {level} t-interval (thick){hierarchical};"
             " filled marker: decisive after Holm; dashed line: no difference; grey band: +-delta_min.",
             plots.forest(comparisons, families, o.baseline), "no comparison of a primary metric"),
        *[_seed_plot(analysis, metric) for metric in o.primary_metrics],
        Plot("loss", "Training loss",
             f"Mean over seeds, band: {plots.BAND}; left against step, right against cumulative training"
             " FLOPs; triangles: steps where lidas grew deeper. The first steps are cut off at the top.",
             plots.loss_curves(_keyed(analysis, analysis.history), families),
             "no finished run has a history.parquet"),
        Plot("score_vs_flops", "Final score against training FLOPs",
             f"Per family and size, the mean of each primary metric against mean {FLOPS}, bars: {level}"
             " t-intervals over seeds (none along FLOPs when every seed used the same compute); families"
             " are moved a few pixels sideways so equal-compute points stay visible.",
             plots.score_vs_flops(points, families), f"no finished run has {FLOPS}"),
        Plot(CONTEXT_CURVE, f"{_label(REFERENCE_TARGET)} by number of in-context strings",
             f"Per family, mean over seeds with band: {plots.BAND}; dashed and dotted: the in-context n-gram"
             " estimators on the same positions; below: positions evaluated per point (few at the right end,"
             " which is therefore noisy).",
             plots.context_curves(_keyed(analysis, analysis.curves), families, CONTEXT_X, REFERENCE_TARGET,
                                  REFERENCE_ROWS, _label(REFERENCE_TARGET), CONTEXT_X_LABEL, CONTEXT_COUNT),
             f"no finished run has curves.{CONTEXT_CURVE} in its metrics.json"),
    ]


def _figures_section(figures: list[Plot]) -> list[str]:
    lines = ["## Figures", "", "Each figure is also in plots/ as SVG."]
    for plot in figures:
        lines += ["", f"### {plot.title}", ""]
        lines += ([f"![{plot.title}](plots/{plot.name}.png)", "", plot.caption] if plot.figure
                  else [f"Not drawn: {plot.missing}."])
    return lines


# ---- how sure are we --------------------------------------------------------------------------

def _rank_test_seeds(m: int, alpha: float, paired: bool) -> int:
    """Fewest seeds (per family when unpaired) with which the exact rank test could reach alpha after
    Holm over m comparisons; SEEDS_MAX + 1 when not within SEEDS_MAX."""
    floor = p_min_signflip if paired else lambda n: p_min_mannwhitney(n, n)
    return next((n for n in range(2, SEEDS_MAX + 1) if m * floor(n) < alpha), SEEDS_MAX + 1)


def _single_seed_lines(analysis: Analysis) -> list[str]:
    cells = analysis.cells[~analysis.cells["metric"].map(is_reference).astype(bool)]
    single = _sorted(analysis, cells[cells["single_seed"].astype(bool)])
    names = list(dict.fromkeys(f"{row['family']} at {_where(row, analysis.keys)}" for _, row in single.iterrows()))
    if not names:
        return ["- **Single-seed cells:** none; every model cell has at least 2 seeds."]
    return [f"- **Single-seed cells** (no interval, no test, marked 'single seed' in the tables): {'; '.join(names)}."]


def _floor_lines(analysis: Analysis, rows: pd.DataFrame) -> list[str]:
    """The smallest p the exact rank test can give with the seeds at hand, before and after Holm."""
    testable = rows[rows["p_value"].notna()]
    if testable.empty:
        return []
    o, m = analysis.options, _family_size(analysis)
    paired = o.pairing == "paired"
    test, rule = ("sign-flip", "2 / 2^n") if paired else ("Mann-Whitney", "2 / C(n_x + n_y, n_x)")
    floors = testable.assign(have=testable.apply(_have, axis=1)).groupby("have")["p_min_attainable"].first()
    texts = "; ".join(f"{p:.3g} with {n} seeds, {min(1.0, m * p):.3g} after Holm over m = {m}"
                      for n, p in floors.items())
    needed = _seeds_text(_rank_test_seeds(m, o.alpha, paired))
    return [f"- **Smallest attainable p.** The exact {test} test cannot give p below {rule}: {texts}."
            f" It can reach alpha = {o.alpha:g} after Holm only from {needed} seeds"
            f"{' per family' if not paired else ''}. The {'paired' if paired else 'Welch'} t-test behind the"
            " verdicts has no such floor: it uses the sizes of the differences, not only their signs."]


def _family_lines(analysis: Analysis, rows: pd.DataFrame) -> list[str]:
    o, m = analysis.options, _family_size(analysis)
    others = analysis.comparisons[analysis.comparisons["correction"] != "holm"]
    parts = [f"metrics {', '.join(sorted(set(rows['metric'])))}",
             f"{', '.join(sorted(set(rows['family'])))} against {o.baseline}",
             f"sizes {', '.join(sorted(set(rows['size'])))}",
             *(f"{k} values {', '.join(sorted({_text(v) for v in rows[k]}))}" for k in analysis.keys)]
    exploratory = (f" The other {len(others)} comparisons ({', '.join(sorted(set(others['metric'])))}) are"
                   " exploratory: Benjamini-Hochberg adjusted, not claims." if len(others) else "")
    return [f"- **Multiple-comparison family.** Holm over m = {m} confirmatory comparisons: {'; '.join(parts)}"
            f" (comparisons with fewer than 2 seeds cannot be tested and do not count).{exploratory}"]


def _undecided_lines(analysis: Analysis, rows: pd.DataFrame) -> list[str]:
    """Seeds needed for each confirmatory comparison without a verdict: planning figures only."""
    undecided = rows[~rows["verdict"].isin(DECIDED)]
    if undecided.empty:
        return ["- **Seeds needed:** none; every confirmatory comparison has a verdict."]
    table = [[f"{row['family']} vs {row['baseline']}, {_label(row['metric'])}, {_where(row, analysis.keys)}",
              str(_have(row)), f"{row['delta_min']:g}", _seeds_needed_text(row["seeds_needed"]),
              _seeds_needed_text(row["seeds_needed_conservative"]), _seeds_needed_text(row["seeds_needed_observed"])]
             for _, row in undecided.iterrows()]
    return ["- **Seeds needed** for 80% power, per undecided confirmatory comparison (planning estimates, not"
            " evidence):", "",
            *_md_table(["comparison", "seeds now", "gap (delta_min)", "seeds at the observed noise",
                        "seeds if the noise is at its 80% upper bound", "seeds for the observed gap"], table)]


def _item_noise_lines(analysis: Analysis) -> list[str]:
    """Evaluation noise (standard error over items) against seed noise, when the cells carry it."""
    cells = _sorted(analysis, _primary(analysis, analysis.cells))
    if not (_has(cells, "item_se") and _has(cells, "n_items")):
        return []
    table = [[row["family"], _label(row["metric"]), _where(row, analysis.keys), _text(row["n_items"]),
              _num(row["item_se"]), _num(row["std"])] for _, row in cells.iterrows()]
    return ["", "Evaluation noise against seed noise: where the item standard error is well below the seed"
            " std, more seeds, not more evaluation items, narrow the intervals.", "",
            *_md_table(["family", "metric", "where", "items", "item SE", "seed std"], table)]


def _looks_section(analysis: Analysis) -> list[str]:
    """The looks of an adaptive sweep, as recorded by the orchestrator: the count is the honest one."""
    looks = analysis.spec.get("looks") or []
    if not looks:
        return []
    rows = [[str(look["look"]), str(look["n_looks"]), str(look["n_seeds"]), f"{look['level']:.4f}",
             look["decision"], ", ".join(f"{k}: {v}" for k, v in sorted(look["verdicts"].items()))]
            for look in looks]
    lines = ["## Looks (adaptive seeding)", "",
             "Seeds were added in the declared schedule of looks; every interval of a look is at level"
             " 1 - alpha/K (K looks), with Holm across cells.", "",
             *_md_table(["look", "of", "seeds", "level", "decision", "verdicts"], rows)]
    if looks[-1]["decision"] != "continue" and looks[-1]["look"] < looks[-1]["n_looks"]:
        lines += ["", "Stopped early: estimates from an early stop are biased away from 0 (winner's curse)."]
    return lines + [""]


def _how_sure(analysis: Analysis) -> list[str]:
    rows = _confirmatory(analysis)
    lines = ["## How sure are we", "", *_single_seed_lines(analysis)]
    if _has(analysis.comparisons, "hb_low"):
        lines += [f"- **Hierarchical interval.** The hierarchical CI resamples seeds and evaluation items together."
                  f" Below {BOOT_RELIABLE_N} seeds it is too narrow (resampling few seeds understates their spread),"
                  " so the t-interval decides; where the hierarchical CI is the wider one, noise from the"
                  " evaluation items matters."]
    if not rows.empty:
        lines += [*_floor_lines(analysis, rows), *_family_lines(analysis, rows), *_undecided_lines(analysis, rows)]
    return lines + _item_noise_lines(analysis)


def _failed_section(analysis: Analysis) -> list[str]:
    runs = analysis.runs[analysis.runs["status"] != "done"]
    lines = ["## Failed and unfinished runs", ""]
    if runs.empty:
        return lines + ["None: every run of the sweep is done."]
    rows = [[r.run_id, _text(r.family), _text(r.size), _text(r.seed), r.status, "" if pd.isna(r.error) else r.error]
            for r in runs.sort_values(["status", "run_id"]).itertuples()]
    return lines + _md_table(["run", "family", "size", "seed", "status", "error"], rows)


def _how_to_read(analysis: Analysis) -> list[str]:
    o = analysis.options
    ns = sorted({int(n) for n in analysis.comparisons["n_pairs"] if n >= 2} | {3, 5})
    floors = ", ".join(f"{p_min_signflip(n):.3g} with {n}" for n in ns)
    return [
        "## How to read this", "",
        f"- **Interval.** The {1 - o.alpha:.0%} CI is a t-interval over seeds: repeated with new seeds,"
        f" {1 - o.alpha:.0%} of intervals built this way would contain the true mean. With 3 seeds it is wide"
        " because the seed-to-seed spread is itself barely known.",
        "- **Differences** are candidate minus baseline in the metric's own units, paired by seed when pairing"
        " is paired; 'better' and 'worse' already account for whether higher or lower is better.",
        "- **Cells.** Each value of a swept config key (such as train.lr) is its own cell, and a family is"
        " compared with the baseline at the same values only. Keys that only restate the family or the size"
        " (family.*, a family's own model.n_layers) or cannot change results (store, cluster, resources,"
        " retries, checkpointing) do not split cells.",
        f"- **Holm.** With m confirmatory comparisons, Holm multiplies the smallest p by m, the next by m - 1,"
        f" and so on, so the chance of any false 'better' or 'worse' among them stays below {o.alpha:g}."
        " Other metrics are exploratory: Benjamini-Hochberg keeps the expected share of false findings"
        " among them below alpha.",
        f"- **Verdicts.** better / worse: adjusted p < {o.alpha:g} and the CI on one side of 0. equivalent: the"
        f" {1 - 2 * o.alpha:.0%} CI inside +-delta_min. inconclusive: neither. 'More seeds' figures are"
        " planning estimates (80% power at the stated gap), not evidence about the observed gap.",
        f"- **Why few seeds cannot make a rank test significant.** An exact sign-flip test with n seeds cannot"
        f" give p below 2 / 2^n ({floors} seeds), and Mann-Whitney with 3 vs 3 seeds cannot go below"
        f" {p_min_mannwhitney(3, 3):.2f}. A sign-flip p of 0.25 with 3 seeds is therefore no evidence either"
        " way: the test could not have been significant. The t-test can, because it uses the sizes of the"
        " differences, not only their signs.",
    ]


def render_markdown(analysis: Analysis, figures: list[Plot] | None = None) -> str:
    """report.md's text: headline, setup, tables, figures (drawn here unless given), how sure we are,
    failed runs, how to read it. Deterministic: built only from the analysis, sorted throughout."""
    figures = _plots(analysis) if figures is None else figures
    lines = [f"# Sweep `{analysis.sweep}`: results", "", *_headline_section(analysis), "", *_looks_section(analysis),
             *_header(analysis),
             "", "## Results per metric", ""]
    for metric in _metrics(analysis):
        lines += [*_metric_section(analysis, metric), ""]
    lines += [*_induction_section(analysis), "", *_ablation_section(analysis), "", *_flops_section(analysis), "",
              *_comparison_section(analysis), *_figures_section(figures), "", *_how_sure(analysis), "",
              *_failed_section(analysis), "", *_how_to_read(analysis)]
    return "\n".join(lines) + "\n"


# ---- html -------------------------------------------------------------------------------------
# report.html is report.md converted, so the two cannot drift apart. The converter knows exactly the
# markdown emitted above: #-headings, "- " lists, "| " tables, "> " quotes, paragraphs, and inline
# `code`, **bold**, *italic* and ![alt](src) images (embedded from `images`).

HTML_STYLE = """body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;line-height:1.45}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:left}th{background:#f2f2f2}
code{background:#f4f4f4;padding:0 .2rem}img{max-width:100%;height:auto}h1,h2{border-bottom:1px solid #ddd}
blockquote{border-left:4px solid #c33;margin:.5rem 0;padding:.1rem .8rem;background:#fff5f5}"""
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
_BOLD, _ITALIC = re.compile(r"\*\*(.+?)\*\*"), re.compile(r"\*(.+?)\*")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _inline(text: str, images: Mapping[str, bytes]) -> str:
    """Inline markdown as HTML; text between backticks is code, left as written."""
    def image(match: re.Match) -> str:
        if match[2] not in images:
            raise ValueError(f"report.html would reference {match[2]!r}, which is not embedded")
        return f'<img alt="{match[1]}" src="data:image/png;base64,{base64.b64encode(images[match[2]]).decode()}">'
    parts = html.escape(text).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = _ITALIC.sub(r"<em>\1</em>", _BOLD.sub(r"<strong>\1</strong>", _IMAGE.sub(image, parts[i])))
    for i in range(1, len(parts), 2):
        parts[i] = f"<code>{parts[i]}</code>"
    return "".join(parts)


def _kind(line: str) -> str:
    if not line.strip():
        return "blank"
    return next((kind for prefix, kind in (("#", "heading"), ("- ", "list"), ("|", "table"), ("> ", "quote"))
                 if line.startswith(prefix)), "paragraph")


def _html_block(kind: str, lines: list[str], images: Mapping[str, bytes]) -> str:
    inline = functools.partial(_inline, images=images)
    if kind == "heading":
        levels = [len(l) - len(l.lstrip("#")) for l in lines]
        return "\n".join(f"<h{n}>{inline(l[n:].strip())}</h{n}>" for n, l in zip(levels, lines))
    if kind == "list":
        return "<ul>\n" + "\n".join(f"<li>{inline(l[2:])}</li>" for l in lines) + "\n</ul>"
    if kind == "quote":
        return f"<blockquote><p>{' '.join(inline(l[2:]) for l in lines)}</p></blockquote>"
    if kind == "table":
        rows = [[inline(c.strip().replace("\\|", "|")) for c in _CELL_SPLIT.split(l.strip()[1:-1])] for l in lines]
        head = "".join(f"<th>{c}</th>" for c in rows[0])
        body = "\n".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows[2:])
        return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"
    return f"<p>{' '.join(inline(l) for l in lines)}</p>"


def render_html(markdown: str, images: Mapping[str, bytes]) -> str:
    """report.html: `markdown` (report.md) as one self-contained page, the images it links to (path
    -> PNG bytes) embedded as data URIs, styled inline: no file or network reference is left."""
    lines = markdown.splitlines()
    blocks = [(kind, list(group)) for kind, group in itertools.groupby(lines, _kind) if kind != "blank"]
    title = html.escape(next((l.lstrip("#").strip() for l in lines if l.startswith("# ")), "report").replace("`", ""))
    body = "\n".join(_html_block(kind, block, images) for kind, block in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
            f"<style>\n{HTML_STYLE}\n</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def _write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same directory, so readers never see a partial file."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)  # mkstemp makes 0600; reports are meant to be shared
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _save_plots(figures: list[Plot], directory: Path) -> dict[str, bytes]:
    """Write each drawn figure as PNG and SVG and remove the files of figures no longer drawn, so no
    stale figure outlives its data; returns the PNGs by their path relative to the report."""
    files = {f"{plot.name}.{fmt}": plots.render(plot.figure, fmt)
             for plot in figures if plot.figure is not None for fmt in ("png", "svg")}
    directory.mkdir(exist_ok=True)
    for path in directory.iterdir():
        if path.suffix in (".png", ".svg") and path.name not in files:
            path.unlink()
    for name, data in files.items():
        _write_atomic(directory / name, data)
    return {f"{directory.name}/{name}": data for name, data in files.items() if name.endswith(".png")}


def write_report(store_root: str | Path, sweep: str, options: AnalysisOptions | None = None) -> Path:
    """Analyse a sweep and write results.parquet, report.md, report.html and plots/ next to its
    sweep.yaml; returns report.md's path."""
    return save_report(analyse(store_root, sweep, options), store_root)


def save_report(analysis: Analysis, store_root: str | Path) -> Path:
    """Write an analysis computed earlier (the CLI also prints it): results.parquet (and .csv),
    plots/, report.md and report.html; returns report.md's path."""
    directory = Path(store_root) / "sweeps" / analysis.sweep
    results = results_table(analysis)
    _write_atomic(directory / "results.parquet", results.to_parquet(index=False))
    _write_atomic(directory / "results.csv", results.to_csv(index=False).encode())  # for spreadsheets
    figures = _plots(analysis)
    images = _save_plots(figures, directory / "plots")
    markdown = render_markdown(analysis, figures)
    report = directory / "report.md"
    _write_atomic(report, markdown.encode())
    _write_atomic(directory / "report.html", render_html(markdown, images).encode())
    return report


def render_summary(analysis: Analysis) -> Group:
    """The key tables as a rich renderable for the CLI: primary-metric cells, references, verdicts."""
    keys = analysis.keys
    cells = Table(title=f"{analysis.sweep}: primary metrics, mean [{1 - analysis.options.alpha:.0%} CI] (n)")
    for column in ("metric", "family", "size", *keys, "mean [CI] (n)"):
        cells.add_column(column)
    primary = analysis.cells[analysis.cells["metric"].isin(analysis.options.primary_metrics)]
    for _, cell in primary.sort_values(["metric", "size", *keys, "family"]).iterrows():
        cells.add_row(cell["metric"], cell["family"], cell["size"], *_key_texts(cell, keys), _cell_text(cell))
    if REFERENCE_TARGET in analysis.options.primary_metrics:
        for _, ref in _references(analysis).iterrows():
            cells.add_row(REFERENCE_TARGET, f"{REFERENCE_ROWS[ref['metric']]} (reference)", ref["size"],
                          *_key_texts(ref, keys), _num(ref["mean"]))
        for _, row in _icl_position(analysis).iterrows():
            cells.add_row("ICL position", row["family"], row["size"], *_key_texts(row, keys),
                          f"{_num(row['position'])}  (0 = unigram, 1 = bigram estimator)")
    verdicts = Table(title=f"primary metrics against {analysis.options.baseline} (delta > 0: better; "
                     f"all metrics in report.md)")
    for column in ("metric", "size", *keys, "family", "delta", "CI", "adjusted p", "verdict", "seeds needed"):
        verdicts.add_column(column)
    primary_rows = analysis.comparisons[analysis.comparisons["metric"].isin(analysis.options.primary_metrics)]
    for _, row in primary_rows.iterrows():
        verdicts.add_row(row["metric"], row["size"], *_key_texts(row, keys), row["family"], _signed(row["diff_mean"]),
                         f"{_signed(row['ci_low'])} to {_signed(row['ci_high'])}",
                         f"{_p(row['p_adj'])} ({CORRECTION_LABELS[row['correction']]})", row["verdict"],
                         "–" if pd.isna(row["seeds_needed"]) else _seeds_text(row["seeds_needed"]))
    return Group(cells, verdicts)
