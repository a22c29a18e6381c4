"""report.md: the analysis in words and tables. Sections come from what the runs' jobs declare
about their metrics and curves (labels, directions, references, curves, p-values, costs), so an
evaluation added later is reported without a change here. Deterministic: built only from the
analysis, sorted throughout."""
from __future__ import annotations

import html
from typing import Callable

import pandas as pd
from scipy import stats

from analysis.compute import (Analysis, confirmatory_rows, families, family_size, in_report_order, metrics,
                              not_beating_references, position, primary, references, seed_means)
from analysis.figures import Plot, draw
from analysis.load import KEY_COLUMNS, VALUE_COLUMNS
from analysis.sequential import FUTILE
from analysis.stats import (BETTER, BOOT_NOMINAL_N, BOOT_RELIABLE_N, DECIDED, EQUIVALENT_VERDICTS, SEEDS_MAX, WORSE,
                            p_min_mannwhitney, p_min_signflip)
from analysis.text import (CORRECTION_LABELS, cell_text, difference, flag, has, have, interval_text, key_texts, listed,
                           margins, md_table, num, p_text, raw_interval, seeds, seeds_needed_text,
                           seeds_text, sign, signed, slugs, text, verdict_text, where)
from common.metrics import MetricSpec


def _grid(analysis: Analysis, table: pd.DataFrame, sizes: list[str],
          text: Callable[[pd.Series], str]) -> list[list[str]]:
    """Rows of a family x size table: one per family and cell-key values (baseline first, then
    families alphabetically, each by key value), then `text(row)` per size, "–" where none."""
    keys = analysis.keys
    rank = {family: i for i, family in enumerate(families(analysis))}
    order = [c for c in ("family", *keys) if c in table.columns]
    table = table.sort_values(order, key=lambda c: c.map(rank) if c.name == "family" else c)
    texts = {(row["family"], *key_texts(row, keys), row["size"]): text(row) for _, row in table.iterrows()}
    labels = dict.fromkeys(name[:-1] for name in texts)
    return [[*name, *[texts.get((*name, size), "–") for size in sizes]] for name in labels]


def _header(analysis: Analysis) -> list[str]:
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
        f"- alpha = {o.alpha:g}, two-sided; {1 - o.alpha:.0%} intervals",
        _cells_line(analysis),
        f"- Correction: Holm over the confirmatory family ({', '.join(o.primary_metrics)} x families x sizes"
        + "".join(f" x {k} values" for k in analysis.keys)
        + f", m = {m}); Benjamini-Hochberg over the other metrics (exploratory)",
        f"- Bootstrap: BCa over seeds, {o.n_boot} resamples, in results.parquet only"
        f" (unreliable below {BOOT_RELIABLE_N} seeds, approximate below {BOOT_NOMINAL_N}: its coverage is"
        " still under nominal there)",
        f"- Equivalence margin and planning gap: delta_min = {margins(o.delta_min)}",
        f"- Analysis seed: {o.seed}",
    ]


def _cells_line(analysis: Analysis) -> str:
    """How cells are keyed, and which varying config keys were deliberately not split on."""
    standard = {*KEY_COLUMNS, *VALUE_COLUMNS, *analysis.keys}
    unsplit = sorted(c for c in analysis.values.columns if c not in standard)
    return (f"- Cells: {' x '.join(['family', 'size', *analysis.keys, 'metric'])}, seeds as replicates"
            + (f"; also varying, not split on: {', '.join(unsplit)}" if unsplit else ""))


def _metric_title(analysis: Analysis, metric: str) -> str:
    """The metric's label, name and direction, as in "RegBench TVD (`regbench_tvd`, lower is better)"."""
    direction = analysis.cells.loc[analysis.cells["metric"] == metric, "higher_is_better"].iloc[0]
    better = ("descriptive, not compared" if pd.isna(direction)
              else analysis.spec_of(metric).effect or "higher is better" if direction else "lower is better")
    return f"{analysis.label(metric)} (`{metric}`, {better})"


def _metric_section(analysis: Analysis, metric: str) -> list[str]:
    """The metric's cells: per family and size, the mean and interval over seeds, with the reference
    estimators beside them and the models' position between those."""
    cells = analysis.cells[analysis.cells["metric"] == metric]
    sizes = sorted(set(cells["size"]))
    rows = _grid(analysis, cells, sizes, cell_text) + _reference_rows(analysis, metric, sizes)
    return [f"Mean [{1 - analysis.options.alpha:.0%} t-interval] (n seeds).", "",
            *md_table(["family", *analysis.keys, *sizes], rows), *_position_lines(analysis, metric, sizes)]


def _reference_text(ref: pd.Series) -> str:
    return num(ref["mean"]) + (" (varies across runs)" if ref["max"] > ref["min"] else "")


def _reference_rows(analysis: Analysis, metric: str, sizes: list[str]) -> list[list[str]]:
    """One row per reference estimator the metric declares (and data.* cell-key values); "all"
    under the other cell keys."""
    refs = references(analysis, metric)
    return [row for name in analysis.spec_of(metric).references
            for row in _grid(analysis, refs[refs["metric"] == name].assign(
                family=f"*{analysis.label(name)} (reference)*"), sizes, _reference_text)]


def _position_lines(analysis: Analysis, metric: str, sizes: list[str]) -> list[str]:
    table = position(analysis, metric)
    if table.empty:
        return []
    spec = analysis.spec_of(metric)
    first, second = (analysis.label(name) for name in spec.references[:2])
    rows = _grid(analysis, table, sizes, lambda row: num(row["position"]))
    lines = ["", f"Position between the reference estimators, ({first} - model) / ({first} - {second}):"
             f" 0 = no better than the {first}, 1 = as good as the {second}.", "",
             *md_table(["family", *analysis.keys, *sizes], rows)]
    failing = table[~table["beats_first"].astype(bool)].sort_values(["family", "size", *analysis.keys])
    meaning = f": {spec.below_first}" if spec.below_first else ""
    for _, row in failing.iterrows():
        lines += ["", f"> **Warning:** {row['family']} at {where(row, analysis.keys)} does not beat the {first}"
                      f" estimator ({analysis.label(metric)} {num(row['model'])} vs {num(row['first'])}){meaning};"
                      f" comparisons on it are meaningless."]
    return lines


def _sentence(row: pd.Series, analysis: Analysis, failing: set[tuple[str, str, str]]) -> str:
    """One comparison in words, with the difference in the metric's own direction."""
    direction = sign(row)
    low, high = raw_interval(row)
    word = ("on average better" if row["diff_mean"] > 0 else "on average worse" if row["diff_mean"] < 0
            else "no different on average")
    paired = row["pairing"] == "paired"
    n_seeds = seeds(row)
    if row["seeds_dropped"]:
        n_seeds += f"; seeds {row['seeds_dropped']} dropped for lack of a partner"
    rank_name, rank_p = ("sign-flip", row["signflip_p"]) if paired else ("Mann-Whitney", row["mannwhitney_p"])
    floor = " (the smallest possible)" if rank_p <= row["p_min_attainable"] * (1 + 1e-9) else ""
    at = where(row, analysis.keys)
    sentence = (f"{row['family']} vs {row['baseline']}, {analysis.label(row['metric'])}, {at}:"
                f" {signed(direction * row['diff_mean'])}, {word} ({'higher' if direction > 0 else 'lower'} is"
                f" better; {row['ci_level']:.0%} CI {signed(low)} to {signed(high)},"
                f" {'paired t' if paired else 'Welch t'}, {n_seeds}, {CORRECTION_LABELS[row['correction']]} p ="
                f" {p_text(row['p_adj'])})")
    if row["n_pairs"]:
        sentence += f"; {row['seed_wins']}/{row['n_pairs']} seeds better"
    if pd.notna(rank_p):
        sentence += f"; {rank_name} p = {p_text(rank_p)}{floor}"
    sentence += f"; {verdict_text(row, analysis.options.alpha)}."
    caution = [f for f in (row["family"], row["baseline"]) if (row["metric"], f, at) in failing]
    if caution:
        first = analysis.label(analysis.spec_of(row["metric"]).references[0])
        sentence += (f" Caution: {' and '.join(caution)} does not beat the {first} estimator here,"
                     " so this comparison is meaningless.")
    return sentence


def _comparison_table(analysis: Analysis, rows: pd.DataFrame) -> list[str]:
    """One metric's comparisons, differences in the metric's own units (candidate - baseline)."""
    hierarchical = has(rows, "hb_low")
    header = ["family", "size", *analysis.keys, f"difference [{rows['ci_level'].iloc[0]:.0%} CI]",
              *(["hierarchical CI", "hierarchical p (one-sided)"] if hierarchical else []), "seeds", "p",
              "adjusted p", "seeds better", "verdict", "seeds for 80% power"]
    table = [[row["family"], row["size"], *key_texts(row, analysis.keys),
              difference(row) + (" (skewed)" if flag(row, "diff_skewed") else ""),
              *([interval_text(raw_interval(row, "hb_low", "hb_high")), p_text(row["hb_p"])] if hierarchical else []),
              seeds(row), p_text(row["p_value"]), f"{p_text(row['p_adj'])} ({CORRECTION_LABELS[row['correction']]})",
              f"{row['seed_wins']}/{row['n_pairs']}" if row["n_pairs"] else "–", row["verdict"],
              seeds_needed_text(row["seeds_needed"])]
             for _, row in rows.iterrows()]
    return md_table(header, table)


def _headline(row: pd.Series, analysis: Analysis) -> str:
    """A decisive confirmatory comparison as a claim, with its numbers."""
    what = f"{analysis.label(row['metric'])} at {where(row, analysis.keys)}"
    numbers = f"{difference(row)}, {seeds(row)}, Holm p = {p_text(row['p_adj'])}"
    verb = "beats" if row["verdict"] == BETTER else "is worse than"
    return f"{row['family']} {verb} {row['baseline']} on {what}: {numbers}."


def _together(analysis: Analysis, rows: pd.DataFrame) -> str:
    """Comparisons named briefly, families joined per metric and place: "lidas and looped on
    RegBench TVD at tiny; lidas on ..."."""
    groups = rows.assign(at=[where(row, analysis.keys) for _, row in rows.iterrows()])
    return "; ".join(f"{listed(list(group['family']))} on {analysis.label(metric)} at {at}"
                     for (metric, at), group in groups.groupby(["metric", "at"], sort=False))


def _headline_section(analysis: Analysis) -> list[str]:
    """The confirmatory comparisons: each decisive one as a claim with its numbers, the others
    grouped by what they lack (their numbers are in the claims table below)."""
    rows = confirmatory_rows(analysis)
    lines = ["## Headline", ""]
    if rows.empty:
        return lines + ["No confirmatory comparison: the baseline or a second family has no finished runs"
                        f" of {', '.join(analysis.options.primary_metrics)}."]
    baseline, single = analysis.options.baseline, rows["single_seed"].astype(bool)
    lines += [f"- {_headline(row, analysis)}" for _, row in rows[rows["verdict"].isin([BETTER, WORSE])].iterrows()]
    equivalent = rows[rows["verdict"].isin(EQUIVALENT_VERDICTS)]
    if not equivalent.empty:
        lines.append(f"- Equivalent to {baseline} within the margin ({margins(analysis.options.delta_min)}):"
                     f" {_together(analysis, equivalent)}.")
    futile = rows[rows["verdict"] == FUTILE]
    if not futile.empty:
        lines.append(f"- Stopped for futility: {_together(analysis, futile)}.")
    open_ = rows[~rows["verdict"].isin([*DECIDED, FUTILE]) & ~single]
    if not open_.empty:
        more = open_["seeds_more"].dropna()
        more = more[more > 0]  # 0: the seeds at hand would already have the power
        counts = list(dict.fromkeys([seeds_text(int(more.min())), seeds_text(int(more.max()))]))
        plan = (f" (about {' to '.join(counts)} more seeds would give 80% power at the margin)" if len(more) else "")
        lines.append(f"- No decision yet: {_together(analysis, open_)}{plan}.")
    if single.any():
        lines.append(f"- No test possible, fewer than 2 seeds: {_together(analysis, rows[single])}.")
    return lines + _reference_cautions(analysis)


def _reference_cautions(analysis: Analysis) -> list[str]:
    """Confirmatory metrics on which a model does not beat its first reference estimator: there
    its comparisons say nothing about the claim."""
    failing = pd.DataFrame(sorted(not_beating_references(analysis)), columns=["metric", "family", "at"])
    failing = failing[failing["metric"].isin(analysis.options.primary_metrics)]
    return [f"- Caution: {listed(list(group['family']))} at {at} {'does' if len(group) == 1 else 'do'} not beat the"
            f" {analysis.label(analysis.spec_of(metric).references[0])} estimator on {analysis.label(metric)},"
            " so comparisons on it are meaningless there."
            for (metric, at), group in failing.groupby(["metric", "at"], sort=True)]


def _curve_sections(analysis: Analysis, names: set[str]) -> list[str]:
    """Each of the curves `names` shown as a table: the top rows of each run ("ranking"), or the
    mean over seeds at each x ("table"); "line" curves are figures."""
    lines: list[str] = []
    for name, spec in sorted(analysis.curve_specs.items()):
        frame = analysis.curves.get(name, pd.DataFrame())
        if name not in names or frame.empty or spec.kind not in ("ranking", "table"):
            continue
        lines += [f"### {spec.title}", "", spec.caption, ""]
        if spec.kind == "ranking":
            rows = [[family, size, str(seed), "; ".join(spec.row.format(**r._asdict()) for r in run.sort_values(
                        spec.y, ascending=False, kind="stable").head(spec.top).itertuples(index=False))]
                    for (family, size, seed), run in frame.groupby(["family", "size", "seed"], sort=True)]
            lines += md_table(["family", "size", "seed", f"top {spec.top}"], rows)
        else:
            means = frame.groupby(["family", "size", spec.x], sort=True)[list(spec.columns)].mean()
            rows = [[family, size, num(x), *(num(r[c]) for c in spec.columns)]
                    for (family, size, x), r in means.iterrows()]
            lines += md_table(["family", "size", spec.x, *spec.columns], rows)
        lines.append("")
    return lines


def _p_value_section(analysis: Analysis, section: str) -> list[str]:
    """The section's per-run p-values (declared `p_value`) with the metrics declared beside them, and
    their combination across the seeds of a size by Fisher's method (conservative for discrete p)."""
    lines: list[str] = []
    values = analysis.values.pivot_table(index=["family", "size", "seed"], columns="metric", values="value")
    for metric in sorted(m for m in values.columns if analysis.spec_of(m).p_value
                         and (analysis.spec_of(m).section or OTHER_SECTION) == section):
        beside = [m for m in analysis.spec_of(metric).companions if m in values.columns]
        runs = values.dropna(subset=[metric]).reset_index()
        table = [[r["family"], r["size"], str(r["seed"]), *(num(r[m]) for m in beside), p_text(r[metric])]
                 for _, r in runs.head(LISTED_RUNS).iterrows()]
        for (family, size), group in runs.groupby(["family", "size"]):
            fisher = stats.combine_pvalues(group[metric], method="fisher").pvalue
            table.append([family, size, f"all {len(group)} seeds (Fisher)", *(num(group[m].mean()) for m in beside),
                          p_text(fisher)])
        lines += [f"### {analysis.label(metric)}", "", *md_table(
            ["family", "size", "seed", *(analysis.label(m) for m in beside), "p"], table), *_unlisted(len(runs)), ""]
    return lines


def _cost_section(analysis: Analysis) -> list[str]:
    """Each declared cost (training FLOPs) per family and size with the saving against the
    baseline, then the paper-scale table the orchestrator stored (the paper: 26% at 3B)."""
    lines = ["### Training FLOPs", "", "Counted from each run's stage schedule (jobs/flops.py): per token at"
             " effective depth L, `F(L) = 6 (L P_layer + V d) + 6 L n_ctx d` with `P_layer = d H hd + 2 d K hd +"
             " H hd d + 3 d d_ff`; a run's FLOPs are `tokens_per_step * sum_s steps_s F(L_s)` over its stages."
             f" Saving = 1 - family / {analysis.options.baseline} at the same size.", ""]
    for cost in sorted(m for m in set(analysis.values["metric"]) if analysis.spec_of(m).cost):
        table = seed_means(analysis, [cost])
        base = table[table["family"] == analysis.options.baseline].set_index("size")[cost]
        rows = [[r["family"], r["size"], f"{r[cost]:.3e}",
                 f"{1 - r[cost] / base[r['size']]:.1%}" if r["size"] in base.index else "-"]
                for _, r in table.iterrows()]
        lines += md_table(["family", "size", analysis.label(cost), f"saving vs {analysis.options.baseline}"], rows)
    paper = analysis.paper_flops
    if paper.empty:
        return lines
    rows = [[r.size, str(r.layers), str(r.block), str(r.steps), f"{r.ratio:.3f}", f"{1 - r.ratio:.1%}"]
            for r in paper.itertuples()]
    return lines + ["", "Paper-scale configs (conf/size, composed with family=lidas; dense = the same final"
                    " depth for all steps, n_ctx = model.max_seq_len). The paper reports 26% fewer training"
                    " FLOPs at 3B.", "", *md_table(["size", "layers", "block", "steps", "LIDAS / dense FLOPs",
                                                     "saving"], rows)]


def _figure_lines(figures: list[Plot]) -> list[str]:
    """Each figure under its title (also in plots/ as SVG), or why it was not drawn."""
    lines: list[str] = []
    for plot in figures:
        lines += [f"### {plot.title}", ""]
        lines += ([f"![{plot.title}](plots/{plot.name}.png)", "", plot.caption] if plot.figure
                  else [f"Not drawn: {plot.missing}."])
        lines.append("")
    return lines


# ---- how sure are we --------------------------------------------------------------------------


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
              str(have(row)), f"{row['delta_min']:g}", seeds_needed_text(row["seeds_needed"]),
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


def _look_verdicts(look: dict) -> str:
    """A look's verdicts, each with the look that settled it (a settled verdict stays settled)."""
    settled = {f"{c['family']}/{c['size']}": c.get("settled_at_look")
               for c in (look.get("plan") or {}).get("comparisons", [])}
    return ", ".join(f"{k}: {v}" + (f" (settled at look {settled[k]})" if settled.get(k) is not None else "")
                     for k, v in sorted(look["verdicts"].items()))


def _looks_section(analysis: Analysis) -> list[str]:
    """The looks of an adaptive sweep, as recorded by the orchestrator: the count is the honest one."""
    looks = analysis.spec.get("looks") or []
    if not looks:
        return []
    rows = [[str(look["look"]), str(look["n_looks"]), str(look["n_seeds"]), f"{look['level']:.4f}",
             look["decision"], _look_verdicts(look), str(look.get("runs_saved", 0))] for look in looks]
    saved = sum(look.get("runs_saved", 0) for look in looks)
    lines = ["## Looks (adaptive seeding)", "",
             "Seeds were added in the declared schedule of looks; every interval of a look is at level"
             " 1 - alpha/K (K looks), with Holm across cells. A comparison the rule settles keeps its verdict"
             " at later looks, and only the arms of comparisons still open (with their baseline) get the"
             f" next seeds: {saved} runs were not started because their arm was settled.", "",
             *md_table(["look", "of", "seeds", "level", "decision", "verdicts", "runs saved"], rows)]
    if looks[-1]["decision"] != "continue" and looks[-1]["look"] < looks[-1]["n_looks"]:
        lines += ["", "Stopped early: estimates from an early stop are biased away from 0 (winner's curse)."]
    return lines + [""]


def _how_sure(analysis: Analysis) -> list[str]:
    rows = confirmatory_rows(analysis)
    lines = ["## How sure are we", "", *_single_seed_lines(analysis)]
    if has(analysis.comparisons, "hb_low"):
        lines += [f"- **Hierarchical interval.** The hierarchical CI resamples seeds and evaluation items together."
                  f" Below {BOOT_RELIABLE_N} seeds it is too narrow (resampling few seeds understates their spread),"
                  " so the t-interval decides; where the hierarchical CI is the wider one, noise from the"
                  " evaluation items matters."]
    if not rows.empty:
        lines += [*_floor_lines(analysis, rows), *_family_lines(analysis, rows), *_undecided_lines(analysis, rows)]
    return lines + _item_noise_lines(analysis)


def _failed_section(analysis: Analysis) -> list[str]:
    runs = analysis.runs[analysis.runs["status"] != "done"]
    lines = ["## Failed and unfinished runs", ""]
    if runs.empty:
        return lines + ["None: every run of the sweep is done."]
    rows = [[r.run_id, text(r.family), text(r.size), text(r.seed), r.status, "" if pd.isna(r.error) else r.error]
            for r in runs.sort_values(["status", "run_id"]).head(LISTED_RUNS).itertuples()]
    return lines + md_table(["run", "family", "size", "seed", "status", "error"], rows) + _unlisted(len(runs))


LISTED_RUNS = 200  # rows of one run each, at most, in a table of the report


def _unlisted(rows: int) -> list[str]:
    """The line under a table cut at LISTED_RUNS rows."""
    return ([f"The first {LISTED_RUNS} of {rows} rows; results.parquet (table `runs`) has every run."]
            if rows > LISTED_RUNS else [])


def _how_to_read(analysis: Analysis) -> list[str]:
    o = analysis.options
    ns = sorted({int(n) for n in analysis.comparisons["n_pairs"] if n >= 2} | {3, 5})
    floors = ", ".join(f"{p_min_signflip(n):.3g} with {n}" for n in ns)
    return [
        "## How to read this", "",
        f"- **Interval.** The {1 - o.alpha:.0%} CI is a t-interval over seeds: repeated with new seeds,"
        f" {1 - o.alpha:.0%} of intervals built this way would contain the true mean, if the seeds' values are"
        " near-normal. With 3 seeds it is wide because the seed-to-seed spread is itself barely known. Where"
        " the seeds are strongly skewed (marked 'skewed', judged from 5 seeds) the promise fails: coverage"
        " drops to about 82-92%.",
        "- **Hierarchical p** is one-sided (the share of resamples with no improvement), unlike the two-sided"
        " p-values beside it; halve a two-sided p before comparing the two.",
        "- **Differences** are candidate minus baseline in the metric's own units, paired by seed when pairing"
        " is paired; 'better' and 'worse' already account for whether higher or lower is better.",
        "- **Cells.** Each value of a swept config key (such as train.lr) is its own cell, and a family is"
        " compared with the baseline at the same values only. Keys that only restate the family or the size"
        " (family.*, a family's own model.n_layers) or cannot change results (store, cluster, resources,"
        " retries, checkpointing) do not split cells.",
        f"- **Holm.** With m confirmatory comparisons, Holm multiplies the smallest p by m, the next by m - 1,"
        f" and so on, so the chance of any false 'better' or 'worse' among them stays below {o.alpha:g}."
        " Other metrics are exploratory: Benjamini-Hochberg keeps the expected share of false findings"
        " among them below alpha.",
        f"- **Verdicts.** equivalent: the {1 - 2 * o.alpha:.0%} CI inside +-delta_min; 'equivalent (negligible"
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


def _paper_text(spec: MetricSpec, family: str, baseline: str) -> str:
    """The paper's single-seed figure beside a comparison: both families' values and their
    difference, or what the paper reports for the family alone."""
    at = f" ({spec.paper_at})" if spec.paper_at else ""
    mine, theirs = spec.paper_value(family), spec.paper_value(baseline)
    if mine is None:
        return "not reported"
    if spec.cost:
        return f"{mine:.0%} fewer{at}"
    if theirs is None or spec.p_value:
        return f"{num(mine)}{at}"
    return f"{num(mine)} vs {num(theirs)}, {signed(mine - theirs)}{at}"


def _compared_claim_rows(analysis: Analysis, metric: str) -> list[list[str]]:
    spec = analysis.spec_of(metric)
    rows = in_report_order(analysis, analysis.comparisons[analysis.comparisons["metric"] == metric])
    return [[f"{row['family']} vs {row['baseline']}, {where(row, analysis.keys)}",
             f"{row['verdict']} ({CORRECTION_LABELS[row['correction']]} p = {p_text(row['p_adj'])})",
             f"{difference(row)}, {seeds(row)}", _paper_text(spec, row["family"], row["baseline"])]
            for _, row in rows.iterrows()]


def _cost_claim_rows(analysis: Analysis, metric: str) -> list[list[str]]:
    """A cost is counted, not sampled: the saving of each family against the baseline is exact."""
    spec, baseline = analysis.spec_of(metric), analysis.options.baseline
    table = seed_means(analysis, [metric])
    base = table[table["family"] == baseline].set_index("size")[metric]
    return [[f"{r['family']} vs {baseline}, {r['size']}", "exact (counted from the stage schedule)",
             f"{1 - r[metric] / base[r['size']]:.1%} fewer", _paper_text(spec, r["family"], baseline)]
            for _, r in table.iterrows() if r["family"] != baseline and r["size"] in base.index]


def _p_value_claim_rows(analysis: Analysis, metric: str) -> list[list[str]]:
    """A per-run p-value claim: the seeds' p-values combined by Fisher's method, beside the mean of
    the statistic and of its chance value (the declared companions)."""
    spec, alpha = analysis.spec_of(metric), analysis.options.alpha
    values = analysis.values.pivot_table(index=["family", "size", "seed"], columns="metric", values="value")
    beside = [m for m in spec.companions[:2] if m in values.columns]
    rows = []
    for (family, size), group in values.dropna(subset=[metric]).groupby(["family", "size"]):
        p = stats.combine_pvalues(group[metric], method="fisher").pvalue
        shown = " vs ".join(num(group[m].mean()) for m in beside) + (" by chance" if len(beside) == 2 else "")
        rows.append([f"{family}, {size}", f"{'shown' if p < alpha else 'not shown'} (Fisher p = {p_text(p)})",
                     f"{shown}, {seeds_text(len(group))} seeds", _paper_text(spec, family, analysis.options.baseline)])
    return rows


def _claims_section(analysis: Analysis) -> list[str]:
    """Each claim of the paper that the sweep measured: the sweep's verdict with its interval, and
    the paper's single-seed number beside it. The claims are declared with the metrics."""
    table: list[list[str]] = []
    for metric in sorted(analysis.metric_specs, key=_metric_rank(analysis)):
        spec = analysis.spec_of(metric)
        if not spec.claim or metric not in set(analysis.values["metric"]):
            continue
        rows = (_cost_claim_rows(analysis, metric) if spec.cost
                else _p_value_claim_rows(analysis, metric) if spec.p_value
                else _compared_claim_rows(analysis, metric))
        table += [[f"{spec.claim} ({spec.label})" if i == 0 else "", *row] for i, row in enumerate(rows)]
    lines = ["## Claims of the paper", ""]
    if not table:
        return lines + ["None of the paper's claims was measured: no finished run recorded a metric that declares one."]
    return lines + [f"The sweep's verdict on each claim it measured ({1 - analysis.options.alpha:.0%} intervals,"
                    " differences as candidate minus baseline) beside the paper's single-seed figure.", "",
                    *md_table(["claim", "comparison", "verdict", "difference [CI], seeds", "paper, one seed"], table)]


def _metric_rank(analysis: Analysis) -> Callable[[str], tuple[int, str]]:
    """Sort key: the report order of model metrics (`metrics`), then the rest by name."""
    order = {m: i for i, m in enumerate(metrics(analysis))}
    return lambda metric: (order.get(metric, len(order)), metric)


OTHER_SECTION = "Other metrics"  # for metrics whose runs were recorded without a section


def _sections(analysis: Analysis) -> list[str]:
    """The report sections (one per job that recorded metrics or curves), those holding the
    confirmatory metrics first, in their order, then the others alphabetically."""
    named = [analysis.spec_of(m).section or OTHER_SECTION for m in metrics(analysis)]
    named += [spec.section or OTHER_SECTION for name, spec in analysis.curve_specs.items()
              if spec.kind != "data" and not analysis.curves.get(name, pd.DataFrame()).empty]
    primary = [analysis.spec_of(m).section or OTHER_SECTION for m in metrics(analysis)
               if m in analysis.options.primary_metrics]
    return list(dict.fromkeys([*primary, *sorted(set(named))]))


def _comparison_block(analysis: Analysis, metric: str, failing: set[tuple[str, str, str]]) -> list[str]:
    rows = in_report_order(analysis, analysis.comparisons[analysis.comparisons["metric"] == metric])
    if rows.empty:
        return []
    kind = "confirmatory, Holm" if rows["correction"].iloc[0] == "holm" else "exploratory, Benjamini-Hochberg"
    return ["", f"**{analysis.label(metric)} against {analysis.options.baseline}** ({kind}):", "",
            *_comparison_table(analysis, rows), "",
            *_details("Each comparison in words", [f"- {_sentence(row, analysis, failing)}" for _, row in rows.iterrows()])]


def _details(summary: str, lines: list[str]) -> list[str]:
    """Lines folded away in the HTML (a <details> element; markdown inside it still renders)."""
    return ["<details>", f"<summary>{summary}</summary>", "", *lines, "", "</details>", ""]


def _section(analysis: Analysis, title: str, figures: list[Plot]) -> list[str]:
    """One job's results: each metric's cells and comparisons (the exploratory ones folded), its
    tables of curves, per-run p-values and costs, and its figures."""
    failing = not_beating_references(analysis)
    lines = [f"## {title}", ""]
    for metric in metrics(analysis):
        spec = analysis.spec_of(metric)
        if (spec.section or OTHER_SECTION) != title or spec.p_value:  # p-values: their own table below
            continue
        block = [*_metric_section(analysis, metric), *_comparison_block(analysis, metric, failing)]
        heading = _metric_title(analysis, metric)
        if metric in analysis.options.primary_metrics:
            lines += [f"### {heading}", "", *block, ""]
        else:
            lines += _details(html.escape(heading).replace("`", "<code>", 1).replace("`", "</code>", 1), block)
    in_section = {name for name, spec in analysis.curve_specs.items() if (spec.section or OTHER_SECTION) == title}
    costs = [m for m in set(analysis.values["metric"]) if analysis.spec_of(m).cost
             and (analysis.spec_of(m).section or OTHER_SECTION) == title]
    lines += [*_curve_sections(analysis, in_section), *_p_value_section(analysis, title),
              *(_cost_section(analysis) if costs else [])]
    return lines + _figure_lines([plot for plot in figures if plot.section == title])


def _toc(before: list[str], titles: list[str], after: list[str]) -> list[str]:
    """The contents: a link to each of the sections `titles`, which start in `after`; anchors are
    numbered over every heading of the report, as GitHub and report.html number them."""
    headings = [line.lstrip("#").strip() for line in (*before, "## Contents", *after) if line.startswith("#")]
    levels = [len(line) - len(line.lstrip("#")) for line in (*before, "## Contents", *after) if line.startswith("#")]
    anchors: dict[str, str] = {}
    for title, level, slug in zip(headings, levels, slugs(headings)):
        if level == 2:
            anchors.setdefault(title, slug)
    return ["## Contents", "", *[f"- [{title}](#{anchors[title]})" for title in titles], ""]


def render_markdown(analysis: Analysis, figures: list[Plot] | None = None) -> str:
    """report.md's text. First screen: the headline, the paper's claims with their verdicts and
    the forest plot; then a table of contents, one section per job (cells, comparisons, curves,
    figures), how sure we are, failed runs, and the setup and how to read it at the end.
    Deterministic: built only from the analysis, sorted throughout."""
    figures = draw(analysis) if figures is None else figures
    forest = [plot for plot in figures if plot.name == "forest"]
    sections = _sections(analysis)
    unplaced = [plot for plot in figures if plot not in forest and plot.section not in sections]
    rest = {**({"Looks (adaptive seeding)": _looks_section(analysis)} if analysis.spec.get("looks") else {}),
            **{title: _section(analysis, title, figures) for title in sections},
            **({"Figures": ["## Figures", "", *_figure_lines(unplaced)]} if unplaced else {}),
            "How sure are we": _how_sure(analysis), "Failed and unfinished runs": _failed_section(analysis),
            "Setup": _header(analysis), "How to read this": _how_to_read(analysis)}
    first = [f"# Sweep `{analysis.sweep}`: results", "", *_headline_section(analysis), "", *_claims_section(analysis),
             "", *_figure_lines(forest)]
    body = [line for block in rest.values() for line in (*block, "")]
    return "\n".join([*first, *_toc(first, list(rest), body), *body]).rstrip("\n") + "\n"
