"""How the report writes numbers, intervals, verdicts and table rows: the formatting that the
markdown report (markdown.py) and the console summary (console.py) share."""
from __future__ import annotations

import re
from collections.abc import Mapping

import pandas as pd

from analysis.stats import EQUIVALENT_VERDICTS, NEGLIGIBLE, SEEDS_MAX

CORRECTION_LABELS = {"holm": "Holm", "fdr_bh": "BH"}


def num(x: float) -> str:
    return "–" if pd.isna(x) else f"{x + 0.0:.4g}"  # + 0.0 turns -0.0 into 0.0

def signed(x: float) -> str:
    return "–" if pd.isna(x) else f"{x + 0.0:+.4g}"

def text(value: object) -> str:
    return "–" if pd.isna(value) else str(value)

def p_text(p: float) -> str:
    return "–" if pd.isna(p) else f"{p:.3g}"

def margins(delta_min: float | Mapping[str, float]) -> str:
    if isinstance(delta_min, Mapping):
        return ", ".join(f"{metric} {margin:g}" for metric, margin in sorted(delta_min.items())) or "none"
    return f"{delta_min:g}"

def one_line(text: object, limit: int = 300) -> str:
    """Text safe inside a markdown table cell: one line, pipes escaped, no raw HTML (report.md may
    hold <details>), at most `limit` characters."""
    return " ".join(str(text).split())[:limit].replace("|", "\\|").replace("<", "&lt;")

def listed(names: list[str]) -> str:
    """Names in a sentence: "a", "a and b", "a, b and c"."""
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 2 else names)

def slugs(titles: list[str]) -> list[str]:
    """Anchors of headings as GitHub makes them (lower case, punctuation dropped, spaces as
    hyphens, repeats numbered), so report.md's links work there and in report.html."""
    seen: dict[str, int] = {}
    out = []
    for title in titles:
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        out.append(f"{slug}-{seen[slug]}" if seen.get(slug) else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return out

def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ([f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"]
            + [f"| {' | '.join(one_line(c) for c in row)} |" for row in rows])

LISTED_RUNS = 200  # rows of one run each, at most, in a table of the report: a cell of 100,000 seeds stays readable

def unlisted(rows: int) -> list[str]:
    """The line under a table of one run a row, cut at LISTED_RUNS rows."""
    return ([f"The first {LISTED_RUNS} of {rows} rows; results/runs.parquet has every run."]
            if rows > LISTED_RUNS else [])

def key_texts(row: pd.Series, keys: tuple[str, ...]) -> list[str]:
    """The row's cell-key values as text; "all" for a key the row does not depend on (reference rows)."""
    return [text(row[k]) if k in row.index else "all" for k in keys]

def where(row: pd.Series, keys: tuple[str, ...]) -> str:
    """The size and cell-key values of a row, as in "tiny, train.lr=0.003"."""
    return ", ".join([row["size"], *(f"{k}={v}" for k, v in zip(keys, key_texts(row, keys)))])

def flag(row: pd.Series, column: str) -> bool:
    """A boolean column's value; False where the column or its value is missing."""
    value = row.get(column)
    return bool(pd.notna(value) and value)

def cell_text(cell: pd.Series) -> str:
    """Mean [t-interval] (n), "skewed" where the seeds are strongly skewed: there the interval's
    coverage promise does not hold (analysis/stats.py `is_skewed`)."""
    if cell["single_seed"]:
        return f"{num(cell['mean'])} (n=1, single seed)"
    skewed = ", skewed" if flag(cell, "skewed") else ""
    return f"{num(cell['mean'])} [{num(cell['ci_low'])}, {num(cell['ci_high'])}] (n={cell['n_seeds']}{skewed})"

def have(row: pd.Series) -> int:
    return row["n_pairs"] if row["pairing"] == "paired" else min(row["n_candidate"], row["n_baseline"])

def seeds_text(n: float) -> str:
    return f"> {SEEDS_MAX}" if n > SEEDS_MAX else str(n)

def unknown_plan(row: pd.Series) -> str:
    """Why a comparison's seeds for 80% power are unknown (NA): no seed noise to plan with (fewer
    than 2 seeds here and at the other sizes), or no margin declared for its metric."""
    reasons = ([] if pd.notna(row["sigma"]) else ["no estimate of the seed noise"]) + (
        [] if pd.notna(row["delta_min"]) else ["no delta_min declared for this metric"])
    return f"unknown ({' and '.join(reasons or ['no planning inputs'])})"

def plan_text(row: pd.Series) -> str:
    """Seeds needed for 80% power at delta_min: a planning figure, never evidence; "unknown" (and
    why) where the seed noise or the margin is unknown, never a number made from them."""
    if pd.isna(row["seeds_needed"]):
        return f"seeds for 80% power {unknown_plan(row)}"
    gap = f"a {row['delta_min']:g} gap"
    pooled = "; seed noise pooled over sizes" if row["sigma_pooled"] else ""
    if row["seeds_unresolvable"]:
        return f"> {SEEDS_MAX} seeds would be needed for 80% power at {gap}: not resolvable by seeds alone{pooled}"
    conservative = f"{seeds_text(row['seeds_needed_conservative'])} seeds if the seed noise is at its 80% upper bound"
    if row["seeds_more"] == 0:
        return (f"{have(row)} seeds would already give 80% power for {gap} at the observed seed noise"
                f" ({conservative}{pooled})")
    return f"about {row['seeds_more']} more seeds give 80% power for {gap} ({conservative}{pooled})"

def verdict_text(row: pd.Series, alpha: float) -> str:
    correction = CORRECTION_LABELS[row["correction"]]
    if row["verdict"] in ("better", "worse"):
        return f"{row['verdict']}: decisive at alpha = {alpha:g} after {correction} correction"
    if row["verdict"] in EQUIVALENT_VERDICTS:
        real = ("; the difference is significant but smaller than the margin" if row["verdict"] == NEGLIGIBLE
                else "")
        return f"{row['verdict']}: the {level_text(1 - 2 * alpha)} CI lies inside +-{row['delta_min']:g}{real}"
    untestable = ", fewer than 2 seeds to test" if row["single_seed"] else ""
    plan = plan_text(row)
    return f"{row['verdict']}{untestable}" + (f": {plan}" if plan else "")

def sign(row: pd.Series) -> int:
    return 1 if row["higher_is_better"] else -1

def level_text(level: float) -> str:
    """A level exactly, as a percentage with up to two decimals: 95%, 97.5%, 99.17%."""
    return f"{100 * level:.2f}".rstrip("0").rstrip(".") + "%"

def raw_interval(row: pd.Series, low: str = "ci_low", high: str = "ci_high") -> tuple[float, float]:
    """An interval of the improvement turned back into the metric's own units, candidate minus
    baseline."""
    return tuple(sorted([sign(row) * row[low], sign(row) * row[high]]))

def interval_text(bounds: tuple[float, float]) -> str:
    return f"[{signed(bounds[0])}, {signed(bounds[1])}]"

IMPROVEMENT = "improvement (> 0 = better) [CI]"  # the header of every column of improvement_text
RAW = "raw difference (candidate - baseline)"  # the header of every column of raw_text
EARLY = "early stop"
EARLY_MEANING = ("Early stop: decided before the last look, so the estimate is biased away from 0 (winner's curse);"
                 " more seeds would likely show a smaller gap.")

def improvement_text(row: pd.Series) -> str:
    """The improvement over the baseline (> 0 = better for every metric) with its CI, as in
    "+0.007207 [-0.01949, +0.0339]", flagged where an early stop biases it (`EARLY_MEANING`)."""
    curse = f" ({EARLY})" if flag(row, "winners_curse") else ""
    return f"{signed(row['diff_mean'])} {interval_text((row['ci_low'], row['ci_high']))}{curse}"

def raw_text(row: pd.Series) -> str:
    """Candidate minus baseline in the metric's own units, as measured."""
    return signed(sign(row) * row["diff_mean"])

def decided_by(row: pd.Series) -> str:
    """What decided a comparison: "look 1 of 3, 98.33%, Holm over m = 4 (adaptive rule, each look)",
    or without looks "95%, Holm over m = 4 (confirmatory)"."""
    look = f"look {row['look']} of {row['n_looks']}, " if pd.notna(row.get("look")) else ""
    return f"{look}{level_text(row['level'])}, {row['correction_family']}"

def decision_text(row: pd.Series) -> str:
    """The verdict with what decided it (`decided_by`)."""
    return f"{row['verdict']} ({decided_by(row)})"

def has(table: pd.DataFrame, column: str) -> bool:
    """Whether `table` has `column` with a value: columns another analysis step may not add yet."""
    return column in table.columns and bool(table[column].notna().any())

def seeds(row: pd.Series) -> str:
    if row["pairing"] == "paired":
        return f"{row['n_pairs']} seed{'' if row['n_pairs'] == 1 else 's'}"
    return f"{row['n_candidate']} vs {row['n_baseline']} seeds"

def seeds_needed_text(n: float) -> str:
    """A planned seed count; "unknown" where its inputs (seed noise, gap) are unknown."""
    return "unknown" if pd.isna(n) else seeds_text(n)

MISSING_LISTED = 20  # run ids named per cell in the report's lines on missing values

def missing_text(row: pd.Series, keys: tuple[str, ...]) -> str:
    """A cell's runs without a value of its metric (a row of `analysis.compute.missing_values`), as in
    "lidas at tiny: 2 of 8 seeds have no induction_max: run ids abc123 (seed 3, NaN), def456 (seed 5,
    not recorded)"; the first MISSING_LISTED are named. A family none of whose runs recorded it
    (metrics of grown models, say, in a dense family) gets one short line without the run ids."""
    if row["n_missing"] == row["n_runs"] and not any(row["nan"]):
        return (f"{row['family']} at {where(row, keys)}: none of its {row['n_runs']} seeds records"
                f" {row['metric']} (not a metric of this family, or its evaluation did not run)")
    named = [f"{run} (seed {text(seed)}, {'NaN' if nan else 'not recorded'})"
             for run, seed, nan in list(zip(row["run_ids"], row["seeds"], row["nan"]))[:MISSING_LISTED]]
    more = row["n_missing"] - len(named)
    verb = "has" if row["n_missing"] == 1 else "have"
    return (f"{row['family']} at {where(row, keys)}: {row['n_missing']} of {row['n_runs']} seeds {verb} no"
            f" {row['metric']}: run id{'s' if row['n_missing'] > 1 else ''} {', '.join(named)}"
            + (f" and {more} more" if more > 0 else ""))
