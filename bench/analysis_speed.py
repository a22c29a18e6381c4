"""Speed of the hierarchical seed x item bootstrap (analysis.multibootstrap, docs/statistics.md c).

Times whole calls, from the tidy item table of analysis.load_items to the outputs, for 1,000 runs
(500 seeds x 2 families) x 1,000 weighted items and 10,000 resamples, paired and unpaired. Target:
under 5 s each. Prints one table; the exit code is 1 when a call misses the target.

    python bench/analysis_speed.py [--seeds 500] [--items 1000] [--resamples 10000] [--repeats 3] [--markdown PATH]

`--markdown PATH` also writes the table as markdown (bench/report.py; `make bench` writes
docs/performance/analysis_speed.md, which docs/performance.md includes).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.bootstrap import multibootstrap  # noqa: E402
from bench.report import Report, markdown_argument  # noqa: E402

TARGET_S = 5.0


def item_table(n_seeds: int, n_items: int) -> pd.DataFrame:
    """RegBench-like items for dense and lidas: per-instance TVD with positions as weights."""
    rng = np.random.default_rng(0)
    weight = np.tile(rng.integers(1, 64, n_items).astype(float), 2 * n_seeds)
    seeds = np.tile(np.repeat(np.arange(n_seeds), n_items), 2)
    return pd.DataFrame({
        "run_id": np.char.add(np.repeat(["dense-", "lidas-"], n_seeds * n_items), seeds.astype(str)),
        "family": np.repeat(["dense", "lidas"], n_seeds * n_items), "size": "tiny", "seed": seeds,
        "metric": "regbench_tvd", "item_id": np.tile(np.arange(n_items), 2 * n_seeds),
        "score": rng.beta(2, 5, 2 * n_seeds * n_items) - np.repeat([0.0, 0.01], n_seeds * n_items),
        "weight": weight})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=500, help="seeds per family")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    markdown_argument(parser)
    args = parser.parse_args()
    report = Report(args.markdown, Console(width=120))
    report.arguments(parser, args)
    items = item_table(args.seeds, args.items)
    table = Table(title=f"multibootstrap, {2 * args.seeds} runs x {args.items} items, {args.resamples} resamples,"
                        f" {os.cpu_count()} cores, best and median of {args.repeats}")
    for column in ("pairing", "item rows", "best", "median", f"< {TARGET_S:g} s", "hb_se", "hb_se_seeds",
                   "hb_se_items"):
        table.add_column(column, justify="right")
    ok = True
    for pairing in ("paired", "unpaired"):
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            hb = multibootstrap(items, "lidas", higher_is_better=False, pairing=pairing, n_boot=args.resamples)
            times.append(time.perf_counter() - start)
        ok &= min(times) < TARGET_S
        table.add_row(pairing, f"{len(items):,}", f"{min(times):.2f} s", f"{statistics.median(times):.2f} s",
                      "yes" if min(times) < TARGET_S else "NO", f"{hb['hb_se']:.5f}", f"{hb['hb_se_seeds']:.5f}",
                      f"{hb['hb_se_items']:.5f}")
    report.table(table)
    report.write()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
