"""Results store -> tidy DataFrames -> seed-level statistics -> report (design/statistics.md).

Reads only the store's files, so it works from a notebook on a copied store.
"""

from analysis.bootstrap import item_noise, multibootstrap
from analysis.load import load, load_curves, load_history, load_items, load_runs, load_sweep
from analysis.report import (Analysis, AnalysisOptions, analyse, read_results, render_html, render_markdown,
                             render_summary, results_table, save_report, write_report)
from analysis.stats import (SEEDS_MAX, adjust_pvalues, bootstrap_ci, cell_keys, compare, compare_seeds, holm, iqm,
                            is_reference, p_min_mannwhitney, p_min_signflip, pooled_std, seeds_needed, sigma_upper,
                            stable_rng, summarize, t_interval)
from analysis.sequential import SeedPlan, next_seeds

__all__ = [
    "Analysis", "AnalysisOptions", "SEEDS_MAX", "SeedPlan", "adjust_pvalues", "analyse", "bootstrap_ci",
    "cell_keys", "compare", "compare_seeds", "holm", "iqm", "is_reference", "item_noise", "load", "load_curves",
    "load_history", "load_items", "load_runs", "load_sweep", "multibootstrap", "next_seeds", "p_min_mannwhitney",
    "p_min_signflip", "pooled_std", "read_results", "render_html", "render_markdown", "render_summary",
    "results_table", "save_report", "seeds_needed", "sigma_upper", "stable_rng", "summarize", "t_interval",
    "write_report",
]
