"""Results store -> tidy DataFrames -> seed-level statistics -> report (design/statistics.md).

Reads only the store's files, so it works from a notebook on a copied store.
"""

from analysis.load import load, load_items, load_runs, load_sweep
from analysis.report import (Analysis, AnalysisOptions, analyse, read_results, render_markdown, render_summary,
                             results_table, save_report, write_report)
from analysis.stats import (SEEDS_MAX, adjust_pvalues, bootstrap_ci, cell_keys, compare, compare_seeds, holm, iqm,
                            is_reference, p_min_mannwhitney, p_min_signflip, pooled_std, seeds_needed, sigma_upper,
                            stable_rng, summarize, t_interval)

__all__ = [
    "Analysis", "AnalysisOptions", "SEEDS_MAX", "adjust_pvalues", "analyse", "bootstrap_ci", "cell_keys", "compare",
    "compare_seeds", "holm", "iqm", "is_reference", "load", "load_items", "load_runs", "load_sweep",
    "p_min_mannwhitney", "p_min_signflip", "pooled_std", "read_results", "render_markdown", "render_summary",
    "results_table", "save_report", "seeds_needed", "sigma_upper", "stable_rng", "summarize", "t_interval", "write_report",
]
