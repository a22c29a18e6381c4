"""report.md: the analysis in words and tables, assembled. The first screen is analysis/answer.py's,
the closing sections analysis/certainty.py's; here are the sections per job: each metric's cells
and comparisons, curves, per-run p-values and costs, and the figures. Sections come from what the
runs' jobs declare about their metrics and curves, so an evaluation added later is reported
without a change here. Deterministic: built only from the analysis, sorted throughout."""
from __future__ import annotations

import html
from typing import Callable

import pandas as pd
from scipy import stats

from analysis.answer import claims_section, headline_section
from analysis.certainty import failed_section, how_sure_section, how_to_read_section, looks_section, setup_section
from analysis.compute import (Analysis, families, in_report_order, metrics, missing_rows, not_beating_references,
                              position, references, seed_means)
from analysis.figures import Plot, draw
from analysis.text import (CORRECTION_LABELS, EARLY_MEANING, IMPROVEMENT, LISTED_RUNS, RAW, cell_text, decided_by,
                           decision_text, flag, has, improvement_text, interval_text, key_texts, level_text, md_table,
                           missing_text, num, p_text, raw_text, seeds, seeds_needed_text, sign, signed, slugs, unlisted,
                           verdict_text, where)


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
    return [f"Mean [{level_text(1 - analysis.options.alpha)} t-interval] (n seeds).", "",
            *md_table(["family", *analysis.keys, *sizes], rows), *_position_lines(analysis, metric, sizes)]


def _missing_lines(analysis: Analysis, metric: str) -> list[str]:
    """The metric's cells whose finished runs have no value of it (NaN, or not recorded), by run id:
    the statistics use the seeds that have one, and say so here instead of dropping the others silently."""
    rows = missing_rows(analysis, [metric])
    if rows.empty:
        return []
    return ["", "Left out for a missing or NaN value (the cells and comparisons use the seeds that have one):", "",
            *[f"- {missing_text(row, analysis.keys)}." for _, row in rows.iterrows()]]


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
    """One comparison in words: the improvement (> 0 = better) with its interval, the raw difference
    in the metric's own direction beside it, and what decided the verdict."""
    word = ("on average better" if row["diff_mean"] > 0 else "on average worse" if row["diff_mean"] < 0
            else "no different on average")
    paired = row["pairing"] == "paired"
    n_seeds = seeds(row)
    if row["seeds_dropped"]:
        n_seeds += f"; seeds {row['seeds_dropped']} dropped for lack of a partner"
    rank_name, rank_p = ("sign-flip", row["signflip_p"]) if paired else ("Mann-Whitney", row["mannwhitney_p"])
    floor = " (the smallest possible)" if rank_p <= row["p_min_attainable"] * (1 + 1e-9) else ""
    at = where(row, analysis.keys)
    sentence = (f"{row['family']} vs {row['baseline']}, {analysis.label(row['metric'])}, {at}: improvement"
                f" {signed(row['diff_mean'])}, {word} ({level_text(row['ci_level'])} CI {signed(row['ci_low'])} to"
                f" {signed(row['ci_high'])}; raw difference {raw_text(row)}, {'higher' if sign(row) > 0 else 'lower'}"
                f" is better; {'paired t' if paired else 'Welch t'}, {n_seeds}, {CORRECTION_LABELS[row['correction']]}"
                f" p = {p_text(row['p_adj'])})")
    if row["n_pairs"]:
        sentence += f"; {row['seed_wins']}/{row['n_pairs']} seeds better"
    if pd.notna(rank_p):
        sentence += f"; {rank_name} p = {p_text(rank_p)}{floor}"
    sentence += f"; {verdict_text(row, analysis.options.alpha)} ({decided_by(row)})."
    if flag(row, "winners_curse"):
        sentence += f" {EARLY_MEANING}"
    caution = [f for f in (row["family"], row["baseline"]) if (row["metric"], f, at) in failing]
    if caution:
        first = analysis.label(analysis.spec_of(row["metric"]).references[0])
        sentence += (f" Caution: {' and '.join(caution)} does not beat the {first} estimator here,"
                     " so this comparison is meaningless.")
    return sentence


def _comparison_table(analysis: Analysis, rows: pd.DataFrame) -> list[str]:
    """One metric's comparisons: the improvement (> 0 = better) with its interval at the level of
    its verdict, the raw difference beside it, and the verdict with what decided it."""
    hierarchical = has(rows, "hb_low")
    header = ["family", "size", *analysis.keys, IMPROVEMENT, RAW,
              *(["hierarchical CI of the improvement", "hierarchical p (one-sided: improvement <= 0)"]
                if hierarchical else []), "seeds", "p", "adjusted p", "seeds better",
              "verdict (look, level, correction family)", "fixed-sample verdict (secondary)", "seeds for 80% power"]
    table = [[row["family"], row["size"], *key_texts(row, analysis.keys),
              improvement_text(row) + (" (skewed)" if flag(row, "diff_skewed") else ""), raw_text(row),
              *([interval_text((row["hb_low"], row["hb_high"])), p_text(row["hb_p"])] if hierarchical else []),
              seeds(row), p_text(row["p_value"]), f"{p_text(row['p_adj'])} ({CORRECTION_LABELS[row['correction']]})",
              f"{row['seed_wins']}/{row['n_pairs']}" if row["n_pairs"] else "–", decision_text(row),
              row["fixed_verdict"], seeds_needed_text(row["seeds_needed"])]
             for _, row in rows.iterrows()]
    early = ["", EARLY_MEANING] if rows["winners_curse"].astype(bool).any() else []
    return md_table(header, table) + early


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
            ["family", "size", "seed", *(analysis.label(m) for m in beside), "p"], table), *unlisted(len(runs)),
            *_missing_lines(analysis, metric), ""]
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


OTHER_SECTION = "Other metrics"  # for metrics whose runs were recorded without a section


def _sections(analysis: Analysis) -> list[str]:
    """The report sections (one per job that recorded metrics or curves), those holding the
    confirmatory metrics first, in their order, then the others alphabetically."""
    named = [analysis.spec_of(m).section or OTHER_SECTION for m in metrics(analysis)]
    named += [spec.section or OTHER_SECTION for name, spec in analysis.curve_specs.items()
              if spec.kind != "data" and not analysis.curves.get(name, pd.DataFrame()).empty]
    primary = [analysis.spec_of(m).section or OTHER_SECTION for m in metrics(analysis)
               if m in analysis.primary_metrics]
    return list(dict.fromkeys([*primary, *sorted(set(named))]))


def _comparison_block(analysis: Analysis, metric: str, failing: set[tuple[str, str, str]]) -> list[str]:
    rows = in_report_order(analysis, analysis.comparisons[analysis.comparisons["metric"] == metric])
    if rows.empty:
        return []
    kind = "confirmatory, Holm" if rows["correction"].iloc[0] == "holm" else "exploratory, Benjamini-Hochberg"
    return ["", f"**{analysis.label(metric)} against {analysis.options.baseline}** ({kind}):", "",
            *_comparison_table(analysis, rows), "",
            *_details("Each comparison in words",
                      [f"- {_sentence(row, analysis, failing)}" for _, row in rows.iterrows()])]


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
        if spec.step is not None:  # one of a per-step metric's values: the section's curves show them
            continue
        block = [*_metric_section(analysis, metric), *_missing_lines(analysis, metric),
                 *_comparison_block(analysis, metric, failing)]
        heading = _metric_title(analysis, metric)
        if metric in analysis.primary_metrics:
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
    """report.md's text. First screen: the headline, the forest plot and the paper's claims with
    their verdicts (the plot before the claims table, which is long enough to push it off the
    screen); then a table of contents, one section per job (cells, comparisons, curves,
    figures), how sure we are, failed runs, and the setup and how to read it at the end.
    Deterministic: built only from the analysis, sorted throughout."""
    figures = draw(analysis) if figures is None else figures
    forest = [plot for plot in figures if plot.name == "forest"]
    sections = _sections(analysis)
    unplaced = [plot for plot in figures if plot not in forest and plot.section not in sections]
    rest = {**({"Looks (adaptive seeding)": looks_section(analysis)} if analysis.spec.get("looks") else {}),
            **{title: _section(analysis, title, figures) for title in sections},
            **({"Figures": ["## Figures", "", *_figure_lines(unplaced)]} if unplaced else {}),
            "How sure are we": how_sure_section(analysis), "Failed and unfinished runs": failed_section(analysis),
            "Setup": setup_section(analysis), "How to read this": how_to_read_section(analysis)}
    first = [f"# Sweep `{analysis.sweep}`: results", "", *headline_section(analysis), "", *_figure_lines(forest),
             *claims_section(analysis), ""]
    body = [line for block in rest.values() for line in (*block, "")]
    return "\n".join([*first, *_toc(first, list(rest), body), *body]).rstrip("\n") + "\n"
