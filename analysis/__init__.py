"""Results store -> tidy DataFrames -> seed-level statistics -> report (docs: analysis and statistics).

Reads only the store's files (never `orchestrator` or `jobs`), so it works from a notebook on a
copied store: `analyse(store, sweep)` computes everything, `save_report` writes it."""

from analysis.bootstrap import item_noise, multibootstrap
from analysis.compute import Analysis, AnalysisOptions, analyse, read_results, results_table
from analysis.console import render_summary
from analysis.html import render_html
from analysis.load import load, load_curves, load_history, load_items, load_runs, load_specs, load_sweep
from analysis.markdown import render_markdown
from analysis.report import save_report, write_report
from analysis.sequential import SeedPlan, next_seeds, settled_verdicts
from analysis.stats import (SEEDS_MAX, adjust_pvalues, bootstrap_ci, cell_keys, compare, compare_seeds, holm, iqm,
                            p_min_mannwhitney, p_min_signflip, pooled_std, seeds_needed, sigma_upper, summarize,
                            t_interval)

__all__ = [
    "Analysis", "AnalysisOptions", "SEEDS_MAX", "SeedPlan", "adjust_pvalues", "analyse", "bootstrap_ci",
    "cell_keys", "compare", "compare_seeds", "holm", "iqm", "item_noise", "load", "load_curves", "load_history",
    "load_items", "load_runs", "load_specs", "load_sweep", "multibootstrap", "next_seeds", "p_min_mannwhitney",
    "p_min_signflip", "pooled_std", "read_results", "render_html", "render_markdown", "render_summary",
    "results_table", "save_report", "seeds_needed", "settled_verdicts", "sigma_upper", "summarize", "t_interval",
    "write_report",
]
