"""The report's closing sections: the looks of an adaptive sweep, how sure we are (single-seed
cells, the smallest attainable p, the Holm family, seeds needed, evaluation noise, init against
data seeds), failed runs,
the setup, and how to read it all."""
from __future__ import annotations

import pandas as pd

from analysis.compute import Analysis, confirmatory_rows, family_size, in_report_order, job_seconds_columns, primary
from analysis.sequential import plan_comparisons
from analysis.load import JOB_SECONDS, KEY_COLUMNS, NOT_RECORDED, SEED_COLUMNS, VALUE_COLUMNS
from analysis.stats import BOOT_NOMINAL_N, BOOT_RELIABLE_N, DECIDED, SEEDS_MAX, p_min_mannwhitney, p_min_signflip
from analysis.text import (EARLY_MEANING, LISTED_RUNS, has, have, level_text, margins, md_table, num, seeds_needed_text,
                           seeds_text, text,
                           unlisted, where)


def setup_section(analysis: Analysis) -> list[str]:
    """What the sweep was and how it was analysed: runs, seeds, baseline, cells, corrections."""
    o, spec = analysis.options, analysis.spec
    status = analysis.runs["status"].value_counts()
    other = int(status.drop(["done", "failed"], errors="ignore").sum())
    model_cells = analysis.cells[~analysis.cells["metric"].map(analysis.is_reference).astype(bool)]
    n_seeds = sorted(set(model_cells["n_seeds"]))
    seeds = "–" if not n_seeds else str(n_seeds[0]) if len(n_seeds) == 1 else f"{n_seeds[0]} to {n_seeds[-1]}"
    m = family_size(analysis)
    overrides = " ".join(f"`{x}`" for x in spec.get("overrides", [])) or "none"
    return [
        "## Setup",
        "",
        f"- Sweep created: {spec.get('created_at', 'unknown')}; overrides: {overrides}",
        f"- Runs: {status.get('done', 0)} done, {status.get('failed', 0)} failed, {other} not finished"
        f" ({len(analysis.runs)} in the sweep)",
        f"- Seeds per cell: {seeds}",
        f"- Baseline: {o.baseline}; pairing: {o.pairing}"
        + (" (seed s of a family against seed s of the baseline)" if o.pairing == "paired" else ""),
        _alpha_line(analysis),
        _cells_line(analysis),
        f"- Correction: Holm over the confirmatory family ({', '.join(analysis.primary_metrics)} x families x sizes"
        + "".join(f" x {k} values" for k in analysis.keys)
        + f", m = {m}); Benjamini-Hochberg over the other metrics (exploratory)",
        f"- Bootstrap: BCa over seeds, {o.n_boot} resamples, in results/cells.parquet only"
        f" (unreliable below {BOOT_RELIABLE_N} seeds, approximate below {BOOT_NOMINAL_N}: its coverage is"
        " still under nominal there)",
        f"- Equivalence margin and planning gap: delta_min = {margins(o.delta_min)}",
        f"- Analysis seed: {o.seed}",
        *_time_lines(analysis),
        _environments_line(analysis),
    ]


def _environments_line(analysis: Analysis) -> str:
    """What produced the done runs' numbers (analysis/load.py `environment_text`), grouped by the
    fields that can change them, the most common first: the same run gives the same numbers
    within a group, and differs in its last bits between groups (docs/reliability.md)."""
    done = analysis.runs.loc[analysis.runs["status"] == "done", "environment"]
    if done.empty:
        return "- Environments: no run is done"
    counts = done.fillna(NOT_RECORDED).value_counts()
    groups = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return "- Environments: " + "; ".join(f"{text} ({n} run{'s' if n != 1 else ''})" for text, n in groups)


EVAL_SHARE_NOTED = 0.25  # an evaluation taking more of a run than this is pointed out


def _time_lines(analysis: Analysis) -> list[str]:
    """How long a run's jobs took: the median over the done runs of each job's seconds, and each
    evaluation's share of the run (its jobs' sum), so that an evaluation that costs as much as
    training is seen. Nothing for a store that recorded no job times."""
    columns = job_seconds_columns(analysis)
    done = analysis.runs[analysis.runs["status"] == "done"]
    if not columns or done.empty:
        return []
    median = done[columns].median()
    share = (done[columns].div(done[columns].sum(axis=1), axis=0)).median()
    parts = []
    for column in columns:
        job = column.removeprefix(JOB_SECONDS)
        if pd.isna(median[column]):
            continue
        part = f"{job} {median[column]:.3g} s"
        if job != "train":
            part += f" ({share[column]:.0%} of the run" + (", more than a quarter" if share[column] > EVAL_SHARE_NOTED
                                                          else "") + ")"
        parts.append(part)
    return [f"- Time per run (median over the {len(done)} done runs; a resumed job counts from its last start):"
            f" {'; '.join(parts)}"]


def _alpha_line(analysis: Analysis) -> str:
    """alpha and the level of the intervals; for an adaptive sweep, that alpha is per look: the
    rule's alpha split over its K looks (Bonferroni)."""
    o, looks = analysis.options, analysis.spec.get("looks") or []
    if not looks:
        return f"- alpha = {o.alpha:g}, two-sided; {level_text(1 - o.alpha)} intervals"
    rule, k = looks[-1]["rule"], looks[-1]["n_looks"]
    return (f"- alpha = {rule['alpha']:g} over the adaptive rule's K = {k} looks, so {o.alpha:g} per look"
            f" (alpha / K), two-sided; {level_text(1 - o.alpha)} intervals at every look and in this report")


def _cells_line(analysis: Analysis) -> str:
    """How cells are keyed, and which varying config keys were deliberately not split on."""
    standard = {*KEY_COLUMNS, *SEED_COLUMNS, *VALUE_COLUMNS, *analysis.keys}
    unsplit = sorted(c for c in analysis.values.columns if c not in standard)
    replicates = ("seeds as replicates" if "init_seed" not in analysis.values.columns else
                  "seeds as replicates (a seed is a distinct seed, init_seed and data_seed; runs pair on all three)")
    return (f"- Cells: {' x '.join(['family', 'size', *analysis.keys, 'metric'])}, {replicates}"
            + (f"; also varying, not split on: {', '.join(unsplit)}" if unsplit else ""))


def _rank_test_seeds(m: int, alpha: float, paired: bool) -> int:
    """Fewest seeds (per family when unpaired) with which the exact rank test could reach alpha after
    Holm over m comparisons; SEEDS_MAX + 1 when not within SEEDS_MAX."""
    floor = p_min_signflip if paired else lambda n: p_min_mannwhitney(n, n)
    return next((n for n in range(2, SEEDS_MAX + 1) if m * floor(n) < alpha), SEEDS_MAX + 1)


def _single_seed_lines(analysis: Analysis) -> list[str]:
    cells = analysis.cells[~analysis.cells["metric"].map(analysis.is_reference).astype(bool)]
    single = in_report_order(analysis, cells[cells["single_seed"].astype(bool)])
    names = list(dict.fromkeys(f"{row['family']} at {where(row, analysis.keys)}" for _, row in single.iterrows()))
    if not names:
        return ["- **Single-seed cells:** none; every model cell has at least 2 seeds."]
    return [f"- **Single-seed cells** (no interval, no test, marked 'single seed' in the tables): {'; '.join(names)}."]


def _floor_lines(analysis: Analysis, rows: pd.DataFrame) -> list[str]:
    """The smallest p the exact rank test can give with the seeds at hand, before and after Holm."""
    testable = rows[rows["p_value"].notna()]
    if testable.empty:
        return []
    o, m = analysis.options, family_size(analysis)
    paired = o.pairing == "paired"
    test, rule = ("sign-flip", "2 / 2^n") if paired else ("Mann-Whitney", "2 / C(n_x + n_y, n_x)")
    floors = testable.assign(have=testable.apply(have, axis=1)).groupby("have")["p_min_attainable"].first()
    texts = "; ".join(f"{p:.3g} with {n} seeds, {min(1.0, m * p):.3g} after Holm over m = {m}"
                      for n, p in floors.items())
    needed = seeds_text(_rank_test_seeds(m, o.alpha, paired))
    return [f"- **Smallest attainable p.** The exact {test} test cannot give p below {rule}: {texts}."
            f" It can reach alpha = {o.alpha:g} after Holm only from {needed} seeds"
            f"{' per family' if not paired else ''}. The {'paired' if paired else 'Welch'} t-test behind the"
            " verdicts has no such floor: it uses the sizes of the differences, not only their signs."]


def _family_lines(analysis: Analysis, rows: pd.DataFrame) -> list[str]:
    o, m = analysis.options, family_size(analysis)
    others = analysis.comparisons[analysis.comparisons["correction"] != "holm"]
    parts = [f"metrics {', '.join(sorted(set(rows['metric'])))}",
             f"{', '.join(sorted(set(rows['family'])))} against {o.baseline}",
             f"sizes {', '.join(sorted(set(rows['size'])))}",
             *(f"{k} values {', '.join(sorted({text(v) for v in rows[k]}))}" for k in analysis.keys)]
    exploratory = (f" The other {len(others)} comparisons ({', '.join(sorted(set(others['metric'])))}) are"
                   " exploratory: Benjamini-Hochberg adjusted, not claims." if len(others) else "")
    return [f"- **Multiple-comparison family.** Holm over m = {m} confirmatory comparisons: {'; '.join(parts)}"
            f" (comparisons with fewer than 2 seeds cannot be tested and do not count).{exploratory}"]


def _undecided_lines(analysis: Analysis, rows: pd.DataFrame) -> list[str]:
    """Seeds needed for each confirmatory comparison without a verdict: planning figures only."""
    undecided = rows[~rows["verdict"].isin(DECIDED)]
    if undecided.empty:
        return ["- **Seeds needed:** none; every confirmatory comparison has a verdict."]
    table = [[f"{row['family']} vs {row['baseline']}, {analysis.label(row['metric'])}, {where(row, analysis.keys)}",
              str(have(row)), "none declared" if pd.isna(row["delta_min"]) else f"{row['delta_min']:g}",
              seeds_needed_text(row["seeds_needed"]),
              seeds_needed_text(row["seeds_needed_conservative"]), seeds_needed_text(row["seeds_needed_observed"])]
             for _, row in undecided.iterrows()]
    return ["- **Seeds needed** for 80% power, per undecided confirmatory comparison (planning estimates, not"
            " evidence):", "",
            *md_table(["comparison", "seeds now", "gap (delta_min)", "seeds at the observed noise",
                        "seeds if the noise is at its 80% upper bound", "seeds for the observed gap"], table)]


def _item_noise_lines(analysis: Analysis) -> list[str]:
    """Evaluation noise (standard error over items) against seed noise, when the cells carry it."""
    cells = in_report_order(analysis, primary(analysis, analysis.cells))
    if not (has(cells, "item_se") and has(cells, "n_items")):
        return []
    table = [[row["family"], analysis.label(row["metric"]), where(row, analysis.keys), text(row["n_items"]),
              num(row["item_se"]), num(row["std"])] for _, row in cells.iterrows()]
    return ["", "Evaluation noise against seed noise: where the item standard error is well below the seed"
            " std, more seeds, not more evaluation items, narrow the intervals.", "",
            *md_table(["family", "metric", "where", "items", "item SE", "seed std"], table)]


def _share(row: pd.Series, part: str) -> str:
    """A variance component with its share of the total, "0 (truncated)" for a negative estimate."""
    if row.get(f"{part}_truncated", False):
        return "0 (truncated)"
    share = row[f"share_{part}"]
    return num(row[f"var_{part}"]) + ("" if pd.isna(share) else f" ({100 * share:.0f}%)")


def _seed_source_lines(analysis: Analysis) -> list[str]:
    """Where the seed spread comes from, for cells whose runs cross init and data seeds."""
    sources = in_report_order(analysis, primary(analysis, analysis.seed_sources)) if not analysis.seed_sources.empty \
        else analysis.seed_sources
    if sources.empty:
        return []
    table = [[row["family"], analysis.label(row["metric"]), where(row, analysis.keys),
              f"{row['n_init']} x {row['n_data']}", num(row["total_var"]), _share(row, "init"), _share(row, "data"),
              _share(row, "residual")] for _, row in sources.iterrows()]
    few = int(min(sources["n_init"].min(), sources["n_data"].min()))
    truncated = bool((sources["init_truncated"] | sources["data_truncated"]).any())
    return ["", "Where the seed spread comes from: each cell's runs cross init seeds (the model's"
            " initialisation) with data seeds (the training data's order), one run per pair, and a two-way"
            " random-effects ANOVA splits their variance into an init part, a data part and a residual (the"
            " interaction and everything else). Variances with their share of the sum of the three."
            + (" A negative estimate is set to 0, marked 'truncated': that source's spread is below what the"
               " residual lets us see." if truncated else "")
            + (f" With {few} seeds on an axis its part rests on {few - 1} degree{'s' if few > 2 else ''} of"
               " freedom: read it as an order of magnitude." if few < 5 else ""), "",
            *md_table(["family", "metric", "where", "init x data", "variance", "init", "data", "residual"], table)]


def _look_verdicts(look: dict) -> str:
    """A look's verdicts per comparison (family, size and cell), each with the look that settled it
    (a settled verdict stays settled)."""
    return ", ".join(f"{arm}: {c['verdict']}"
                     + (f" (settled at look {c['settled_at_look']})" if c.get("settled_at_look") is not None else "")
                     for arm, c in sorted(plan_comparisons(look["plan"]).items()))


def looks_section(analysis: Analysis) -> list[str]:
    """The looks of an adaptive sweep, as recorded by the orchestrator: the count is the honest one."""
    looks = analysis.spec.get("looks") or []
    if not looks:
        return []
    rows = [[str(look["look"]), str(look["n_looks"]), str(look["n_seeds"]), level_text(look["level"]),
             look["decision"], _look_verdicts(look), str(look.get("runs_saved", 0))] for look in looks]
    saved = sum(look.get("runs_saved", 0) for look in looks)
    lines = ["## Looks (adaptive seeding)", "",
             "Seeds were added in the declared schedule of looks; every interval of a look is at level"
             " 1 - alpha/K (K looks), with Holm across cells. A comparison the rule settles keeps its verdict"
             " at later looks, and only the arms of comparisons still open (with their baseline) get the"
             f" next seeds: {saved} runs were not started because their arm was settled.", "",
             *md_table(["look", "of", "seeds", "level", "decision", "verdicts", "runs saved"], rows)]
    if looks[-1]["decision"] != "continue" and looks[-1]["look"] < looks[-1]["n_looks"]:
        lines += ["", f"Stopped early. {EARLY_MEANING}"]
    return lines + [""]


def how_sure_section(analysis: Analysis) -> list[str]:
    rows = confirmatory_rows(analysis)
    lines = ["## How sure are we", "", *_single_seed_lines(analysis)]
    if has(analysis.comparisons, "hb_low"):
        lines += [f"- **Hierarchical interval.** The hierarchical CI resamples seeds and evaluation items together."
                  f" Below {BOOT_RELIABLE_N} seeds it is too narrow (resampling few seeds understates their spread),"
                  " so the t-interval decides; where the hierarchical CI is the wider one, noise from the"
                  " evaluation items matters."]
    if not rows.empty:
        lines += [*_floor_lines(analysis, rows), *_family_lines(analysis, rows), *_undecided_lines(analysis, rows)]
    return lines + _item_noise_lines(analysis) + _seed_source_lines(analysis)


def failed_section(analysis: Analysis) -> list[str]:
    runs = analysis.runs[analysis.runs["status"] != "done"]
    lines = ["## Failed and unfinished runs", ""]
    if runs.empty:
        return lines + ["None: every run of the sweep is done."]
    rows = [[r.run_id, text(r.family), text(r.size), text(r.seed), r.status, "" if pd.isna(r.error) else r.error]
            for r in runs.sort_values(["status", "run_id"]).head(LISTED_RUNS).itertuples()]
    return lines + md_table(["run", "family", "size", "seed", "status", "error"], rows) + unlisted(len(runs))


def how_to_read_section(analysis: Analysis) -> list[str]:
    o = analysis.options
    ns = sorted({int(n) for n in analysis.comparisons["n_pairs"] if n >= 2} | {3, 5})
    floors = ", ".join(f"{p_min_signflip(n):.3g} with {n}" for n in ns)
    return [
        "## How to read this", "",
        f"- **Interval.** The {level_text(1 - o.alpha)} CI is a t-interval over seeds: repeated with new seeds,"
        f" {level_text(1 - o.alpha)} of intervals built this way would contain the true mean, if the seeds' values are"
        " near-normal. With 3 seeds it is wide because the seed-to-seed spread is itself barely known. Where"
        " the seeds are strongly skewed (marked 'skewed', judged from 5 seeds) the promise fails: coverage"
        " drops to about 82-92%.",
        "- **Hierarchical p** is one-sided: it tests 'no improvement' (improvement <= 0) against 'an"
        " improvement', unlike the two-sided p-values beside it. The gap is divided by its seed and item"
        " standard errors together (the item part from the hierarchical bootstrap) and read against"
        " Student's t with the seeds' degrees of freedom, so it is never below the one-sided paired t's p.",
        "- **Improvement** is > 0 when the candidate is better, for every metric (the difference signed by the"
        " metric's direction); the raw difference beside it is candidate minus baseline in the metric's own"
        " units, paired by seed when pairing is paired.",
        "- **Cells.** Each value of a swept config key (such as train.lr) is its own cell, and a family is"
        " compared with the baseline at the same values only. Keys that only restate the family or the size"
        " (family.*, a family's own model.n_layers) or cannot change results (store, cluster, resources,"
        " retries, checkpointing) do not split cells.",
        f"- **Holm.** With m confirmatory comparisons, Holm multiplies the smallest p by m, the next by m - 1,"
        f" and so on, so the chance of any false 'better' or 'worse' among them stays below {o.alpha:g}."
        " Other metrics are exploratory: Benjamini-Hochberg keeps the expected share of false findings"
        " among them below alpha.",
        f"- **Verdicts.** equivalent: the {level_text(1 - 2 * o.alpha)} CI inside +-delta_min; 'equivalent (negligible"
        f" difference)' when the difference is also significant (adjusted p < {o.alpha:g}) but smaller than"
        f" the margin. better / worse: adjusted p < {o.alpha:g}, the CI on one side of 0, and not inside the"
        " margin. inconclusive: none of these. 'More seeds' figures are"
        " planning estimates (80% power at the stated gap), not evidence about the observed gap.",
        f"- **Why few seeds cannot make a rank test significant.** An exact sign-flip test with n seeds cannot"
        f" give p below 2 / 2^n ({floors} seeds), and Mann-Whitney with 3 vs 3 seeds cannot go below"
        f" {p_min_mannwhitney(3, 3):.2f}. A sign-flip p of 0.25 with 3 seeds is therefore no evidence either"
        " way: the test could not have been significant. The t-test can, because it uses the sizes of the"
        " differences, not only their signs.",
    ]
