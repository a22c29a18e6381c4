"""Results store -> tidy DataFrames -> seed-level statistics -> report (docs/notebook.md).

Reads only the store's files (never `orchestrator` or `jobs`), so it works from a notebook on a
copied store. The public API is small: `load` (and `load_runs`, `load_items`) reads a sweep,
`summarize` and `compare` compute the cells and comparisons tables from it, `analyse` computes
everything the report shows, `results_tables` gives its tidy tables, and `save_report` /
`write_report` write the report files. Everything else is imported from its module."""

from analysis.compute import Analysis, AnalysisOptions, analyse, results_tables
from analysis.load import load, load_items, load_runs
from analysis.report import save_report, write_report
from analysis.stats import compare, summarize

__all__ = ["Analysis", "AnalysisOptions", "analyse", "compare", "load", "load_items", "load_runs", "results_tables",
           "save_report", "summarize", "write_report"]
