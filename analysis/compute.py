"""A sweep's analysis, computed once from the store: the tidy tables (values, cells, comparisons),
the curves and training logs, and what the runs' jobs declared about each metric and curve.
Everything the report writes (markdown.py, figures.py, console.py) reads an `Analysis`.

The report writes each table of `results_tables` to its own file, results/<table>.parquet and
results/<table>.csv: runs (one row per finished run x metric, plus one row per run that is not
done, with status and error), cells (`summarize`) and comparisons (`compare`, with the adaptive
rule's verdicts where it decided), and, for a sweep that crosses init and data seeds, seed_sources
(`seed_sources`); docs/store.md "Report outputs" gives their schemas."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.load import JOB_SECONDS, RunFileReader, Selection, load_claims, load_paper_flops, load_sweep
from analysis.sequential import DECIDING_COLUMNS, FINAL, comparison_key, rule_decisions
from analysis.stats import (BETTER, EQUIVALENT_VERDICTS, N_BOOT, NEGLIGIBLE, WORSE, cell_keys, compare, seed_sources,
                            summarize)
from analysis.text import where
from common.metrics import CurveSpec, MetricSpec
from store.records import SweepManifest

TABLES = ("runs", "cells", "comparisons")
HB_FINAL = 10_000  # seed x item bootstrap resamples for a written report (statistics.md (c))
DATA_PREFIX = "data."  # cell keys that change the evaluation data, and with it the reference estimators


@dataclass(frozen=True)
class AnalysisOptions:
    """The pre-declared analysis choices, fixed before looking at results."""
    baseline: str = "dense"
    pairing: str = "paired"
    primary_metrics: tuple[str, ...] | None = None  # None: the confirmatory metrics the runs declare
    alpha: float = 0.05
    delta_min: float | Mapping[str, float] = 0.02  # a mapping gives each metric its own margin
    seed: int = 0
    n_boot: int = N_BOOT
    by: tuple[str, ...] | None = None  # the cell keys; None: detected by `cell_keys`


@dataclass(frozen=True)
class Analysis:
    """Everything a report shows, computed once from the store."""
    sweep: str
    spec: SweepManifest  # sweep.yaml
    runs: pd.DataFrame  # load_runs' columns and `environment` (what produced a done run's numbers)
    values: pd.DataFrame
    cells: pd.DataFrame
    comparisons: pd.DataFrame
    options: AnalysisOptions
    keys: tuple[str, ...]  # the config keys that split cells, beside family and size
    history: pd.DataFrame  # training logs, for the loss curves (`load_history`)
    curves: dict[str, pd.DataFrame]  # each declared curve of the finished runs (`load_curves`)
    metric_specs: dict[str, MetricSpec]
    curve_specs: dict[str, CurveSpec]
    paper_flops: pd.DataFrame  # the paper-scale FLOPs table the orchestrator stored
    claims: dict[str, MetricSpec]  # every claim the jobs can measure (`load_claims`), measured here or not
    missing: pd.DataFrame  # finished runs without a finite value of a metric their cell records (`missing_values`)
    # Per cell whose runs cross init and data seeds, their variance split by source (`seed_sources`)
    seed_sources: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def primary_metrics(self) -> tuple[str, ...]:
        """The confirmatory metrics: `analyse` always resolves options.primary_metrics."""
        assert self.options.primary_metrics is not None, "options.primary_metrics is resolved by analyse()"
        return self.options.primary_metrics

    def label(self, metric: str) -> str:
        spec = self.metric_specs.get(metric)
        return spec.label if spec else metric

    def spec_of(self, metric: str) -> MetricSpec:
        return self.metric_specs.get(metric) or MetricSpec(metric)

    def is_reference(self, metric: str) -> bool:
        return self.spec_of(metric).reference


def options_for(spec: Mapping, metric_specs: Mapping[str, MetricSpec], kinds: set[str]) -> AnalysisOptions:
    """The defaults with the confirmatory metrics the runs declare for their data kinds, or for
    an adaptive sweep the rule it declared: every test at alpha / K for K looks (statistics.md
    (f)), so the report says what the stopping rule saw."""
    looks = spec.get("looks") or []
    if looks:
        rule = looks[-1]["rule"]
        return AnalysisOptions(baseline=rule["baseline"], primary_metrics=(rule["metric"],),
                               alpha=rule["alpha"] / looks[-1]["n_looks"], delta_min=rule["delta_min"])
    return AnalysisOptions(primary_metrics=confirmatory(metric_specs, kinds))


def confirmatory(metric_specs: Mapping[str, MetricSpec], kinds: set[str]) -> tuple[str, ...]:
    """The metrics of the confirmatory family for these data kinds, as the jobs declare it: the
    headline metric first, then by name."""
    return tuple(sorted((name for name, spec in metric_specs.items() if kinds & set(spec.confirmatory_for)),
                        key=lambda name: (not kinds & set(metric_specs[name].headline_for), name)))


def analyse(store_root: str | Path, sweep: str, options: AnalysisOptions | None = None,
            read: RunFileReader | None = None) -> Analysis:
    """Load a sweep (each of its files read once; `read`: the runs' JSON files as a caller parsed
    them, `Selection`) and compute its cells and comparisons, both keyed by the same cell keys."""
    spec = load_sweep(store_root, sweep)
    selection = Selection(store_root, sweep, read)
    metric_specs, curve_specs = selection.results.metric_specs, selection.results.curve_specs
    kinds = selection.data_kinds()
    options = options or options_for(spec, metric_specs, kinds)
    primary = confirmatory(metric_specs, kinds) if options.primary_metrics is None else options.primary_metrics
    options = replace(options, primary_metrics=primary)
    values = selection.values()
    items = selection.items()
    keys = cell_keys(values) if options.by is None else list(options.by)
    return Analysis(
        sweep=sweep, spec=spec, runs=selection.runs().join(selection.environments(), on="run_id"), values=values,
        cells=summarize(values, 1 - options.alpha, options.n_boot, options.seed, by=keys, items=items),
        comparisons=decided(compare(values, options.baseline, options.pairing, primary,
                                    options.alpha, options.delta_min, options.seed, by=keys, items=items,
                                    n_boot=HB_FINAL), spec.get("looks") or [], keys),
        options=options, keys=tuple(keys), history=selection.history(),
        curves={name: selection.curves(name) for name, c in curve_specs.items() if c.kind != "data"},
        metric_specs=metric_specs, curve_specs=curve_specs, paper_flops=load_paper_flops(store_root, sweep),
        claims=load_claims(store_root, sweep),
        missing=missing_values(selection.done_runs(), values, keys), seed_sources=seed_sources(values, keys))


MISSING_COLUMNS = ["family", "size", "metric", "n_runs", "n_missing", "run_ids", "seeds", "nan"]


def missing_values(done: pd.DataFrame, values: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The cells whose finished runs lack a finite value of a metric: per (family, size, cell keys,
    metric), n_runs (the cell's finished runs), n_missing, and the run_ids, seeds and nan (True:
    recorded as NaN; False: not recorded at all) of those lacking it, sorted by seed and run id.

    A metric is expected of every finished run at a (size, cell keys) where any run, of any family,
    recorded it (even as NaN), so a family whose evaluation recorded nothing there is counted too;
    statistics leave such runs out (`summarize` and `compare` take the finite values), and the
    report names them instead of dropping them silently."""
    setting = ["size", *keys]
    columns = [*MISSING_COLUMNS[:2], *keys, *MISSING_COLUMNS[2:]]
    finite = values[np.isfinite(values["value"].to_numpy(float))]
    rows = []
    for metric, recorded in values.groupby("metric", sort=True):
        expected = done.merge(recorded[setting].drop_duplicates(), on=setting, how="inner")
        have = set(finite.loc[finite["metric"] == metric, "run_id"])
        nan = set(recorded["run_id"]) - have
        for arm, runs in expected.groupby(["family", *setting], sort=True, dropna=False):
            lacking = runs[~runs["run_id"].isin(have)].sort_values(["seed", "run_id"])
            if lacking.empty:
                continue
            rows.append({**dict(zip(["family", *setting], arm)), "metric": metric, "n_runs": len(runs),
                         "n_missing": len(lacking), "run_ids": list(lacking["run_id"]),
                         "seeds": list(lacking["seed"]), "nan": [r in nan for r in lacking["run_id"]]})
    return pd.DataFrame(rows, columns=columns)


CORRECTIONS = {"holm": "Holm", "fdr_bh": "Benjamini-Hochberg"}
DECISION_COLUMNS = ["look", "n_looks", "level", "correction_family", "winners_curse", "fixed_verdict"]


def decided(comparisons: pd.DataFrame, looks: list[dict], keys: list[str]) -> pd.DataFrame:
    """The comparisons with one decision procedure: where an adaptive sweep's rule decided a
    comparison (its recorded `looks`, `rule_decisions`), the rule's verdict, the look that decided
    it, that look's level, its Holm family and the numbers the rule saw there (DECIDING_COLUMNS,
    p_adj / p_holm); elsewhere compare's fixed-sample verdict at the report's level. Adds look and
    n_looks (NA without looks), level, correction_family ("Holm over m = 4, per look" and the
    like), winners_curse (decided before the last look: the estimate is biased away from 0) and
    fixed_verdict, the fixed-sample re-analysis on all seeds at the end (secondary)."""
    table = comparisons.assign(fixed_verdict=comparisons["verdict"])
    m = table.groupby("correction")["p_value"].transform(lambda p: int(p.notna().sum()))
    kind = np.where(table["correction"] == "holm", "confirmatory", "exploratory")
    table["correction_family"] = [f"{CORRECTIONS[c]} over m = {n} ({k})"
                                  for c, n, k in zip(table["correction"], m, kind)]
    table["level"] = table["ci_level"]
    table["look"] = table["n_looks"] = pd.array([pd.NA] * len(table), dtype="Int64")
    table["winners_curse"] = False
    rule = rule_decisions(looks)
    for i, row in table.iterrows():
        decision = rule.get(comparison_key(row["family"], row["size"], {k: row[k] for k in keys}, row["metric"]))
        if decision is None:
            continue
        numbers = {c: decision[c] for c in DECIDING_COLUMNS if decision[c] is not None}
        table.loc[i, [*numbers, "p_adj", "p_holm", "verdict", "look", "n_looks", "level", "correction_family",
                      "winners_curse"]] = [
            *numbers.values(), decision["p_adj"], decision["p_adj"], decision["verdict"], decision["look"],
            decision["n_looks"], decision["level"], f"Holm over m = {decision['m']} (adaptive rule, each look)",
            decision["verdict"] in FINAL and decision["look"] < decision["n_looks"]]
    table["significant"] = table["verdict"].isin([BETTER, WORSE, NEGLIGIBLE])
    table["inside_margin"] = table["verdict"].isin(EQUIVALENT_VERDICTS)
    columns = [c for c in table.columns if c not in ("verdict", *DECISION_COLUMNS)]
    return table[[*columns, "verdict", *DECISION_COLUMNS]]


def results_tables(analysis: Analysis) -> dict[str, pd.DataFrame]:
    """The report's tidy tables by name (TABLES), each with the sweep's name first: the files
    results/<name>.parquet and results/<name>.csv hold them."""
    timing = ["run_id", *job_seconds_columns(analysis), "environment"]  # per run, on each of its rows
    done = analysis.values.assign(status="done").merge(analysis.runs[timing], on="run_id", how="left")
    not_done = analysis.runs[analysis.runs["status"] != "done"]
    tables = {"runs": pd.concat([done, not_done], ignore_index=True),
              "cells": analysis.cells, "comparisons": analysis.comparisons}
    if not analysis.seed_sources.empty:  # a sweep that crosses init and data seeds
        tables["seed_sources"] = analysis.seed_sources
    return {name: table.assign(sweep=analysis.sweep)[["sweep", *(c for c in table.columns if c != "sweep")]]
            for name, table in tables.items()}


# ---- derived tables the report's parts share ---------------------------------------------------

def job_seconds_columns(analysis: Analysis) -> list[str]:
    """The run table's columns of job durations (analysis/load.py JOB_SECONDS), train first."""
    columns = [c for c in analysis.runs.columns if c.startswith(JOB_SECONDS)]
    return sorted(columns, key=lambda c: (c != f"{JOB_SECONDS}train", c))


def families(analysis: Analysis) -> list[str]:
    """The baseline first, then the other families alphabetically."""
    baseline = analysis.options.baseline
    others = sorted(set(analysis.cells["family"]) - {baseline})
    return [baseline, *others] if baseline in set(analysis.cells["family"]) else others


def metrics(analysis: Analysis) -> list[str]:
    """Model metrics: primary ones in their declared order, then the rest alphabetically."""
    present = {m for m in analysis.cells["metric"] if not analysis.is_reference(m)}
    primary = [m for m in analysis.primary_metrics if m in present]
    return primary + sorted(present - set(primary))


def in_report_order(analysis: Analysis, table: pd.DataFrame) -> pd.DataFrame:
    """Rows in report order: metric (as `metrics`), size, cell keys, family (as `families`)."""
    ranks = {"metric": {m: i for i, m in enumerate(metrics(analysis))},
             "family": {f: i for i, f in enumerate(families(analysis))}}
    order = [c for c in ("metric", "size", *analysis.keys, "family") if c in table.columns]
    return table.sort_values(order, key=lambda c: c.map(ranks[c.name]) if c.name in ranks else c, kind="stable",
                             ignore_index=True)


def missing_rows(analysis: Analysis, metrics: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """The cells of these metrics with runs lacking a value (`missing_values`), in report order."""
    return in_report_order(analysis, analysis.missing[analysis.missing["metric"].isin(metrics)])


def confirmatory_rows(analysis: Analysis) -> pd.DataFrame:
    """The comparisons of the Holm family (primary metrics), in report order."""
    comparisons = analysis.comparisons
    return in_report_order(analysis, comparisons[comparisons["correction"] == "holm"])


def family_size(analysis: Analysis) -> int:
    """m of Holm: the testable confirmatory comparisons (fewer than 2 seeds cannot be tested)."""
    return int(confirmatory_rows(analysis)["p_value"].notna().sum())


def primary(analysis: Analysis, table: pd.DataFrame) -> pd.DataFrame:
    return table[table["metric"].isin(analysis.primary_metrics)].assign(
        label=lambda t: t["metric"].map(analysis.label))


def data_keys(analysis: Analysis) -> list[str]:
    return [k for k in analysis.keys if k.startswith(DATA_PREFIX)]


def references(analysis: Analysis, metric: str) -> pd.DataFrame:
    """The reference estimators of `metric` (declared by its spec), per (reference, size, data.*
    cell keys): mean, min and max over runs. The estimators see only the evaluation data, so other
    keys (train.lr) do not split them; min and max show whether runs agree, as they should when
    every run of a study evaluates the same held-out instances."""
    names = list(analysis.spec_of(metric).references)
    values = analysis.values[analysis.values["metric"].isin(names)]
    table = (values.groupby(["metric", "size", *data_keys(analysis)], dropna=False)["value"]
             .agg(["mean", "min", "max"]).reset_index())
    return table.assign(rank=table["metric"].map({n: i for i, n in enumerate(names)})).sort_values(
        ["rank", "size"], kind="stable").drop(columns="rank")


def position(analysis: Analysis, metric: str) -> pd.DataFrame:
    """Per model cell (family, size, cell keys) of a metric with two or more references,
    (ref1 - model) / (ref1 - ref2) with ref1, ref2 its first two (weakest first): 0 = no better
    than the first reference, 1 = as good as the second. `beats_first` (`beats_second`) is False
    when the model's mean is not better than the first (second) reference's."""
    columns = ["family", "size", *analysis.keys, "model", "first", "position", "beats_first", "beats_second"]
    names = analysis.spec_of(metric).references
    refs = references(analysis, metric)
    model = analysis.cells[analysis.cells["metric"] == metric].rename(columns={"mean": "model"})
    if len(names) < 2 or names[0] not in set(refs["metric"]) or model.empty:
        return pd.DataFrame(columns=columns)
    on = ["size", *data_keys(analysis)]
    for ref, name in zip(names[:2], ("first", "second")):
        reference = refs.loc[refs["metric"] == ref, [*on, "mean"]].rename(columns={"mean": name})
        model = model.merge(reference, on=on, how="left")
    span = (model["first"] - model["second"]).where(lambda s: s != 0)
    sign = 1 if analysis.spec_of(metric).higher_is_better else -1
    return model.assign(position=(model["first"] - model["model"]) / span,
                        beats_first=sign * (model["model"] - model["first"]) > 0,
                        beats_second=sign * (model["model"] - model["second"]) > 0)[columns]


def not_beating_references(analysis: Analysis, reference: str = "first") -> set[tuple[str, str, str]]:
    """(metric, family, cell text) of the cells whose model does not beat its first (or, with
    reference="second", its second) reference."""
    out = set()
    for metric in metrics(analysis):
        pos = position(analysis, metric)
        failing = pos[~pos[f"beats_{reference}"].astype(bool)]
        out |= {(metric, row["family"], where(row, analysis.keys)) for _, row in failing.iterrows()}
    return out


def seed_means(analysis: Analysis, names: list[str]) -> pd.DataFrame:
    """Per family and size, each metric's mean over the seeds that have it, and the seed count."""
    values = analysis.values[analysis.values["metric"].isin(names)]
    means = values.pivot_table(index=["family", "size"], columns="metric", values="value", aggfunc="mean")
    return means.assign(seeds=values.groupby(["family", "size"])["seed"].nunique()).reset_index()
