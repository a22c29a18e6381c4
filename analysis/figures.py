"""The report's figures, chosen from the analysis: the forest plot of the confirmatory comparisons,
every seed of each primary metric, the training loss, score against training cost, and each
curve a job declares as a line (common/metrics.py). Drawing is analysis/plots.py's."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure

import analysis.plots as plots
from analysis.compute import Analysis, data_keys, families, in_report_order, primary, references
from analysis.text import EARLY_MEANING, has, level_text, where


@dataclass(frozen=True)
class Plot:
    """One figure of the report: its file stem under plots/, heading and legend in words, the
    figure, or None with the reason it was not drawn, and the report section it belongs to (the
    section of the metrics or curve it shows; "" = on its own)."""
    name: str
    title: str
    caption: str
    figure: Figure | None
    missing: str = ""
    section: str = ""


def grouped(analysis: Analysis, table: pd.DataFrame) -> pd.DataFrame:
    """`table` in report order with the `group` column the plots split on (size and cell keys),
    named once per group (a sweep of 100,000 seeds has 100,000 rows and one group)."""
    table = in_report_order(analysis, table)
    if table.empty:
        return table.assign(group=pd.Series(dtype=object))
    codes = table.groupby(["size", *analysis.keys], dropna=False, sort=False).ngroup()
    names = {code: where(table.loc[first], analysis.keys) for first, code in codes.drop_duplicates().items()}
    return table.assign(group=codes.map(names))


def _keyed(analysis: Analysis, runs: pd.DataFrame) -> pd.DataFrame:
    """Per-run rows (history, curves) with the run's cell-key values, from the loaded runs."""
    keys = analysis.values[["run_id", *analysis.keys]].drop_duplicates("run_id")
    return grouped(analysis, runs.merge(keys, on="run_id", how="inner"))


def _seed_plot(analysis: Analysis, metric: str) -> Plot:
    """Per-seed dots of one metric, with its declared reference estimators as lines."""
    values = grouped(analysis, analysis.values[analysis.values["metric"] == metric])
    cells = grouped(analysis, analysis.cells[analysis.cells["metric"] == metric])
    lines = pd.DataFrame(columns=["group", "name", "value"])
    refs = references(analysis, metric)
    if not refs.empty:
        groups = cells[["group", "size", *analysis.keys]].drop_duplicates("group")
        refs = refs.assign(name=refs["metric"].map(analysis.label), value=refs["mean"])
        lines = groups.merge(refs, on=["size", *data_keys(analysis)])[["group", "name", "value"]]
    level = level_text(1 - analysis.options.alpha)
    shown = (("the seeds", f"Per family a box: the seeds' quartiles, whiskers at the 5th and 95th percentile"
              f" (more than {plots.DOTS_MAX} seeds in a cell)") if plots.too_many_dots(values) else
             ("every seed", "One dot per seed; grey lines join the same seed across families (the pairing)"))
    return Plot(f"seeds_{metric}", f"{analysis.label(metric)}: {shown[0]}",
                f"{shown[1]}; black: mean and {level} t-interval over seeds"
                + ("; horizontal lines: the reference estimators." if not refs.empty else "."),
                plots.seed_dots(values, cells, lines, families(analysis), analysis.label(metric)),
                f"no finished run has {metric}", analysis.spec_of(metric).section)


def _line_plot(analysis: Analysis, name: str) -> Plot:
    spec = analysis.curve_specs[name]
    curves = analysis.curves.get(name, pd.DataFrame())
    return Plot(name, spec.title, spec.caption,
                plots.context_curves(_keyed(analysis, curves) if not curves.empty else curves, families(analysis),
                                     spec.x, spec.y, {r: analysis.label(r) for r in spec.references},
                                     analysis.label(spec.y), spec.x_label, spec.count),
                f"no finished run has curves.{name} in its metrics.json", spec.section)


def _cost_plot(analysis: Analysis) -> Plot:
    """The primary metrics against the (first) declared cost."""
    level = level_text(1 - analysis.options.alpha)
    costs = sorted(m for m in set(analysis.values["metric"]) if analysis.spec_of(m).cost)
    points = pd.DataFrame()
    if costs:
        cost = analysis.cells.loc[analysis.cells["metric"] == costs[0],
                                  ["family", "size", *analysis.keys, "mean", "ci_low", "ci_high"]]
        points = grouped(analysis, primary(analysis, analysis.cells).merge(
            cost.rename(columns={"mean": "flops", "ci_low": "flops_low", "ci_high": "flops_high"}),
            on=["family", "size", *analysis.keys]))
    what = costs[0] if costs else "train_flops"
    return Plot("score_vs_flops", "Final score against training FLOPs",
                f"Per family and size, the mean of each primary metric against mean {what}, bars: {level}"
                " t-intervals over seeds (none along FLOPs when every seed used the same compute); families"
                " are moved a few pixels sideways so equal-compute points stay visible.",
                plots.score_vs_flops(points, families(analysis)), f"no finished run has {what}",
                _cost_section(analysis))


def _cost_section(analysis: Analysis) -> str:
    """The section of the training job's figures: the one that records the cost (training FLOPs)."""
    return next((spec.section for spec in analysis.metric_specs.values() if spec.cost), "")


def _curriculum_text(history: pd.DataFrame) -> str:
    """The loss caption's words for the dotted line, where a run had a data curriculum."""
    if not plots.has_curriculum(history):
        return ""
    return ("; dotted line: where the data curriculum (data.warmup) hands over to the regime (on the"
            " FLOPs axis one per family), where the loss jumps because the data changes")


def draw(analysis: Analysis) -> list[Plot]:
    """The report's figures, in report order."""
    o = analysis.options
    level = level_text(1 - o.alpha)
    comparisons = grouped(analysis, primary(analysis, analysis.comparisons))
    hierarchical = ("; thin whisker: hierarchical bootstrap interval (seeds and items)"
                    if has(comparisons, "hb_low") else "")
    return [
        Plot("forest", f"Differences against {o.baseline}",
             f"Per family and size, the improvement over {o.baseline}: the mean paired difference with the"
             f" sign that makes > 0 better for every metric (the raw difference, candidate minus baseline, is"
             f" its negative for lower-is-better metrics), with its {level} t-interval (thick){hierarchical};"
             " filled marker: better or worse by the verdict the report states (the adaptive rule's where it"
             " decided); dashed line: no difference; grey band: +-delta_min."
             + (f" {EARLY_MEANING}" if comparisons["winners_curse"].astype(bool).any()
                else ""),
             plots.forest(comparisons, families(analysis), o.baseline), "no comparison of a primary metric"),
        *[_seed_plot(analysis, metric) for metric in analysis.primary_metrics],
        Plot("loss", "Training loss",
             f"Mean over seeds, band: {plots.BAND}; left against step, right against cumulative training"
             f" FLOPs; triangles: steps where lidas grew deeper{_curriculum_text(analysis.history)}."
             " The first steps are cut off at the top.",
             plots.loss_curves(_keyed(analysis, analysis.history), families(analysis)),
             "no finished run has a history.parquet", _cost_section(analysis)),
        _cost_plot(analysis),
        *[_line_plot(analysis, name) for name, spec in sorted(analysis.curve_specs.items()) if spec.kind == "line"],
    ]
