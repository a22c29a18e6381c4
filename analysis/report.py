"""A sweep's report: tidy results (results.parquet) and a plain-words summary (report.md).

Output layout, under <store>/sweeps/<sweep>/:
    results.parquet  one tidy table; column `table` says which of three tables a row belongs to:
                     runs (one row per finished run x metric, plus one row per run that is not done,
                     with status and error), cells (`summarize`) and comparisons (`compare`).
                     Read one back with `read_results(path, "cells")`.
    report.md        the same numbers in words.
Both are written atomically (temp file + os.replace). The same store gives the same report byte for
byte: nothing in it comes from the clock, only from the store.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Group
from rich.table import Table

from analysis.load import KEY_COLUMNS, VALUE_COLUMNS, load, load_runs, load_sweep
from analysis.stats import (BOOT_RELIABLE_N, N_BOOT, SEEDS_MAX, cell_keys, compare, is_reference,
                            p_min_mannwhitney, p_min_signflip, summarize)

METRIC_LABELS = {
    "regbench_tvd": "RegBench TVD",
    "regbench_l1_ref": "RegBench L1 (reference-code convention)",
    "regbench_acc": "RegBench accuracy",
    "final_loss": "final loss",
    "train_flops": "training FLOPs",
    "wall_time_s": "wall time (s)",
}
# In-context n-gram estimators shown as reference rows under the metric they are measured in.
REFERENCE_ROWS = {"ngram1_tvd": "in-context unigram", "ngram2_tvd": "in-context bigram",
                  "ngram3_tvd": "in-context trigram"}
REFERENCE_TARGET = "regbench_tvd"
DATA_PREFIX = "data."  # cell keys that change the evaluation data, and with it the reference estimators
UNIGRAM, BIGRAM = "ngram1_tvd", "ngram2_tvd"
CORRECTION_LABELS = {"holm": "Holm", "fdr_bh": "BH"}
TABLES = ("runs", "cells", "comparisons")


@dataclass(frozen=True)
class AnalysisOptions:
    """The pre-declared analysis choices (config group `analysis`), fixed before looking at results."""
    baseline: str = "dense"
    pairing: str = "paired"
    primary_metrics: tuple[str, ...] = ("regbench_tvd",)
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


def analyse(store_root: str | Path, sweep: str, options: AnalysisOptions | None = None) -> Analysis:
    """Load a sweep and compute its cells and comparisons, both keyed by the same cell keys."""
    options = options or AnalysisOptions()
    values = load(store_root, sweep)
    keys = cell_keys(values) if options.by is None else list(options.by)
    return Analysis(
        sweep=sweep, spec=load_sweep(store_root, sweep), runs=load_runs(store_root, sweep), values=values,
        cells=summarize(values, 1 - options.alpha, options.n_boot, options.seed, by=keys),
        comparisons=compare(values, options.baseline, options.pairing, options.primary_metrics,
                            options.alpha, options.delta_min, options.seed, by=keys),
        options=options, keys=tuple(keys))


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
    o, spec, comparisons = analysis.options, analysis.spec, analysis.comparisons
    status = analysis.runs["status"].value_counts()
    other = int(status.drop(["done", "failed"], errors="ignore").sum())
    model_cells = analysis.cells[~analysis.cells["metric"].map(is_reference).astype(bool)]
    n_seeds = sorted(set(model_cells["n_seeds"]))
    seeds = "–" if not n_seeds else str(n_seeds[0]) if len(n_seeds) == 1 else f"{n_seeds[0]} to {n_seeds[-1]}"
    m = int((comparisons["p_value"].notna() & (comparisons["correction"] == "holm")).sum())
    overrides = " ".join(f"`{x}`" for x in spec.get("overrides", [])) or "none"
    return [
        f"# Sweep `{analysis.sweep}`: results",
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
    better = "direction unknown" if pd.isna(direction) else "higher is better" if direction else "lower is better"
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
        return f": > {SEEDS_MAX} seeds would be needed for 80% power at {gap}: not resolvable by seeds alone{pooled}"
    conservative = f"{_seeds_text(row['seeds_needed_conservative'])} seeds if the seed noise is at its 80% upper bound"
    if row["seeds_more"] == 0:
        return (f": {_have(row)} seeds would already give 80% power for {gap} at the observed seed noise"
                f" ({conservative}{pooled})")
    return f": about {row['seeds_more']} more seeds give 80% power for {gap} ({conservative}{pooled})"


def _verdict_text(row: pd.Series, alpha: float) -> str:
    correction = CORRECTION_LABELS[row["correction"]]
    if row["verdict"] in ("better", "worse"):
        return f"{row['verdict']}: decisive at alpha = {alpha:g} after {correction} correction"
    if row["verdict"] == "equivalent":
        return f"equivalent: the {1 - 2 * alpha:.0%} CI lies inside +-{row['delta_min']:g}"
    untestable = ", fewer than 2 seeds to test" if row["single_seed"] else ""
    return f"inconclusive{untestable}{_plan_text(row)}"


def _sentence(row: pd.Series, analysis: Analysis, no_icl: set[tuple[str, str]]) -> str:
    """One comparison in words, with the difference in the metric's own direction."""
    sign = 1 if row["higher_is_better"] else -1
    low, high = sorted([sign * row["ci_low"], sign * row["ci_high"]])
    word = "better" if row["diff_mean"] > 0 else "worse" if row["diff_mean"] < 0 else "no different"
    paired = row["pairing"] == "paired"
    seeds = f"{row['n_pairs']} seeds" if paired else f"{row['n_candidate']} vs {row['n_baseline']} seeds"
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


def _comparison_section(analysis: Analysis) -> list[str]:
    comparisons = analysis.comparisons
    lines = [f"## Comparisons against {analysis.options.baseline}", ""]
    if comparisons.empty:
        return lines + ["No comparisons: the baseline or a second family has no finished runs."]
    no_icl = _no_icl(analysis)
    for metric in [m for m in _metrics(analysis) if m in set(comparisons["metric"])]:
        rows = comparisons[comparisons["metric"] == metric].sort_values(["size", *analysis.keys, "family"])
        kind = "confirmatory, Holm" if rows["correction"].iloc[0] == "holm" else "exploratory, Benjamini-Hochberg"
        lines += [f"### {_label(metric)} ({kind})", ""]
        lines += [f"- {_sentence(row, analysis, no_icl)}" for _, row in rows.iterrows()] + [""]
    return lines


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


def render_markdown(analysis: Analysis) -> str:
    """report.md's text. Deterministic: built only from the analysis, sorted throughout."""
    lines = [*_header(analysis), "", "## Results per metric", ""]
    for metric in _metrics(analysis):
        lines += [*_metric_section(analysis, metric), ""]
    lines += [*_comparison_section(analysis), *_failed_section(analysis), "", *_how_to_read(analysis)]
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same directory, so readers never see a partial file."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def write_report(store_root: str | Path, sweep: str, options: AnalysisOptions | None = None) -> Path:
    """Analyse a sweep and write results.parquet and report.md next to its sweep.yaml; returns the
    report's path."""
    return save_report(analyse(store_root, sweep, options), store_root)


def save_report(analysis: Analysis, store_root: str | Path) -> Path:
    """Write an analysis computed earlier (the CLI also prints it) as results.parquet and report.md."""
    directory = Path(store_root) / "sweeps" / analysis.sweep
    _write_atomic(directory / "results.parquet", results_table(analysis).to_parquet(index=False))
    report = directory / "report.md"
    _write_atomic(report, render_markdown(analysis).encode())
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
