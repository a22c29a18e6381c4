"""The summary the CLI prints after a sweep: the primary metrics' cells with their reference
estimators, and their verdicts against the baseline."""
from __future__ import annotations

from rich.console import Group
from rich.table import Table

from analysis.compute import Analysis, position, references
from analysis.text import (CORRECTION_LABELS, EARLY, EARLY_MEANING, cell_text, decision_text, flag, key_texts,
                           level_text, num, p_text, raw_text, seeds_needed_text, signed)


def render_summary(analysis: Analysis) -> Group:
    """The key tables as a rich renderable: primary-metric cells, references, verdicts."""
    keys = analysis.keys
    cells = Table(title=f"{analysis.sweep}: primary metrics, mean [{level_text(1 - analysis.options.alpha)} CI] (n)")
    for column in ("metric", "family", "size", *keys, "mean [CI] (n)"):
        cells.add_column(column)
    primary = analysis.cells[analysis.cells["metric"].isin(analysis.primary_metrics)]
    for _, cell in primary.sort_values(["metric", "size", *keys, "family"]).iterrows():
        cells.add_row(cell["metric"], cell["family"], cell["size"], *key_texts(cell, keys), cell_text(cell))
    for metric in analysis.primary_metrics:
        for _, ref in references(analysis, metric).iterrows():
            cells.add_row(metric, f"{analysis.label(ref['metric'])} (reference)", ref["size"],
                          *key_texts(ref, keys), num(ref["mean"]))
        spec = analysis.spec_of(metric)
        for _, row in position(analysis, metric).iterrows():
            first, second = (analysis.label(name) for name in spec.references[:2])
            cells.add_row("position", row["family"], row["size"], *key_texts(row, keys),
                          f"{num(row['position'])}  (0 = {first}, 1 = {second})")
    primary_rows = analysis.comparisons[analysis.comparisons["metric"].isin(analysis.primary_metrics)]
    early = primary_rows["winners_curse"].astype(bool).any()
    verdicts = Table(title=f"primary metrics against {analysis.options.baseline} (improvement > 0 is better for every"
                     f" metric; all metrics in report.md)", caption=EARLY_MEANING if early else None)
    for column in ("metric", "size", *keys, "family", "improvement (> 0 = better)", "CI",
                   "raw difference (candidate - baseline)", "adjusted p", "verdict (look, level, correction family)",
                   "seeds needed"):
        verdicts.add_column(column)
    for _, row in primary_rows.iterrows():
        verdicts.add_row(row["metric"], row["size"], *key_texts(row, keys), row["family"],
                         signed(row["diff_mean"]) + (f" ({EARLY})" if flag(row, "winners_curse") else ""),
                         f"{signed(row['ci_low'])} to {signed(row['ci_high'])}", raw_text(row),
                         f"{p_text(row['p_adj'])} ({CORRECTION_LABELS[row['correction']]})", decision_text(row),
                         seeds_needed_text(row["seeds_needed"]))
    return Group(cells, verdicts)
