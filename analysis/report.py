"""A sweep's report files, under <store>/sweeps/<sweep>/:

    results/         the tidy tables, one file each: runs, cells, comparisons (.parquet and .csv;
                     analysis/compute.py `results_tables`, schemas in docs/store.md)
    report.md        the numbers in words (analysis/markdown.py, with answer.py and certainty.py)
    report.html      report.md converted, figures embedded: one self-contained file (analysis/html.py)
    plots/           each figure (analysis/figures.py) as <name>.png and <name>.svg

Every file is written atomically (common/atomic.py). The same store gives the same files byte for
byte: nothing in them comes from the clock, only from the store."""
from __future__ import annotations

import os
from pathlib import Path
from typing import IO

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv

from analysis.compute import Analysis, AnalysisOptions, analyse, results_tables
from analysis.figures import Plot, draw
from analysis.html import render_html
from analysis.markdown import render_markdown
import analysis.plots as plots
from common.atomic import write_atomic
from store.layout import Layout


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
        write_atomic(directory / name, data)
    return {f"{directory.name}/{name}": data for name, data in files.items() if name.endswith(".png")}


def write_report(store_root: str | Path, sweep: str, options: AnalysisOptions | None = None) -> Path:
    """Analyse a sweep and write its report files next to its sweep.yaml; returns report.md's path."""
    return save_report(analyse(store_root, sweep, options), store_root)


def _write_csv(table: pd.DataFrame, file: IO[bytes]) -> None:
    """`table` as CSV by Arrow's writer: the values pandas' writer gives, six times faster (a sweep of
    100,000 runs has half a million rows); strings quoted where they need it."""
    pa_csv.write_csv(pa.Table.from_pandas(table, preserve_index=False), file,
                     pa_csv.WriteOptions(quoting_style="needed"))


def save_report(analysis: Analysis, store_root: str | Path) -> Path:
    """Write an analysis computed earlier (the CLI also prints it); returns report.md's path."""
    paths = Layout(store_root).sweep(analysis.sweep)
    os.makedirs(paths.results, exist_ok=True)
    for name, table in results_tables(analysis).items():
        write_atomic(paths.results_table(name, "parquet"), table.to_parquet(index=False))
        write_atomic(paths.results_table(name, "csv"), lambda file: _write_csv(table, file))  # noqa: B023 (called at once)
    figures = draw(analysis)
    images = _save_plots(figures, Path(paths.plots))
    markdown = render_markdown(analysis, figures)
    write_atomic(paths.report, markdown.encode())
    write_atomic(paths.report_html, render_html(markdown, images).encode())
    return Path(paths.report)
