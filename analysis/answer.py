"""The report's first screen: the headline (the confirmatory comparisons, decisive ones as claims,
the rest grouped by what they lack) and the paper's claims that the sweep measured, each with the
sweep's verdict beside the paper's single-seed figure. The claims come from the metric specs
(`claim`, `paper`, `paper_at`), so this module names no metric."""
from __future__ import annotations

from typing import Callable

import pandas as pd
from scipy import stats

from analysis.compute import (Analysis, confirmatory_rows, families, in_report_order, metrics, missing_rows,
                              not_beating_references, seed_means)
from analysis.sequential import FUTILE
from analysis.stats import BETTER, DECIDED, EQUIVALENT_VERDICTS, WORSE
from analysis.text import (EARLY_MEANING, IMPROVEMENT, RAW, decided_by, decision_text, improvement_text, level_text,
                           listed, margins, md_table, missing_text, num, p_text, raw_text, seeds, seeds_text, signed,
                           where)
from common.metrics import MetricSpec


def _headline(row: pd.Series, analysis: Analysis) -> str:
    """A decisive confirmatory comparison as a claim, with its numbers."""
    what = f"{analysis.label(row['metric'])} at {where(row, analysis.keys)}"
    numbers = (f"improvement {improvement_text(row)} (raw difference {raw_text(row)}), {seeds(row)},"
               f" Holm p = {p_text(row['p_adj'])}; {decided_by(row)}")
    verb = "beats" if row["verdict"] == BETTER else "is worse than"
    return f"{row['family']} {verb} {row['baseline']} on {what}: {numbers}."


def _together(analysis: Analysis, rows: pd.DataFrame) -> str:
    """Comparisons named briefly, families joined per metric, place and what decided them: "lidas
    and looped on RegBench TVD at tiny (look 1 of 2, 97.5%, Holm over m = 2 (adaptive rule, each
    look)); lidas on ..."."""
    groups = rows.assign(at=[where(row, analysis.keys) for _, row in rows.iterrows()],
                         by=[decided_by(row) for _, row in rows.iterrows()])
    return "; ".join(f"{listed(list(group['family']))} on {analysis.label(metric)} at {at} ({by})"
                     for (metric, at, by), group in groups.groupby(["metric", "at", "by"], sort=False))


def headline_section(analysis: Analysis) -> list[str]:
    """What was seen first (models that do not beat a reference estimator on a confirmatory metric,
    runs left out for a missing value, which families formed the mechanism), so that nothing below
    is read as a finding about models that lack it; then the confirmatory comparisons: each
    decisive one as a claim with its numbers, the others grouped by what they lack (their numbers
    are in the claims table below)."""
    rows = confirmatory_rows(analysis)
    lines = ["## Headline", "", *mechanism_lines(analysis)]
    if rows.empty:
        return lines + ["- No confirmatory comparison: the baseline or a second family has no finished runs"
                        f" of {', '.join(analysis.primary_metrics)}.", *_missing_lines(analysis)]
    lines[2:2] = _reference_cautions(analysis) + _missing_lines(analysis)
    baseline, single = analysis.options.baseline, rows["single_seed"].astype(bool)
    lines += [f"- {_headline(row, analysis)}" for _, row in rows[rows["verdict"].isin([BETTER, WORSE])].iterrows()]
    equivalent = rows[rows["verdict"].isin(EQUIVALENT_VERDICTS)]
    if not equivalent.empty:
        lines.append(f"- Equivalent to {baseline} within the margin ({margins(analysis.options.delta_min)}):"
                     f" {_together(analysis, equivalent)}.")
    futile = rows[rows["verdict"] == FUTILE]
    if not futile.empty:
        lines.append(f"- Stopped for futility (the seeds that could decide are more than adaptive.max_seeds):"
                     f" {_together(analysis, futile)}.")
    open_ = rows[~rows["verdict"].isin([*DECIDED, FUTILE]) & ~single]
    if not open_.empty:
        more = open_["seeds_more"].dropna()
        more = more[more > 0]  # 0: the seeds at hand would already have the power
        counts = list(dict.fromkeys(seeds_text(int(n)) for n in (more.min(), more.max()))) if len(more) else []
        plan = f" (about {' to '.join(counts)} more seeds would give 80% power at the margin)" if counts else ""
        lines.append(f"- No decision yet: {_together(analysis, open_)}{plan}.")
    if single.any():
        lines.append(f"- No test possible, fewer than 2 seeds: {_together(analysis, rows[single])}.")
    if rows["winners_curse"].astype(bool).any():
        lines.append(f"- {EARLY_MEANING}")
    return lines


def _missing_lines(analysis: Analysis) -> list[str]:
    """The confirmatory metrics' cells with finished runs that have no value (NaN, or not recorded):
    the comparisons use the other seeds, and the headline names the runs left out."""
    return [f"- Left out for a missing or NaN value: {missing_text(row, analysis.keys)}."
            for _, row in missing_rows(analysis, analysis.primary_metrics).iterrows()]


def mechanism_lines(analysis: Analysis) -> list[str]:
    """Per metric that declares a mechanism (MetricSpec.mechanism) and per size, one sentence:
    which families formed it (median over their seeds at least `present_at`) and which did not,
    so that nobody reads mechanistic numbers from models that have none; then the runs that went
    the other way from their family's median, named by seed (a family whose seeds split is a
    finding, and its intervals carry that spread)."""
    lines = []
    for metric in sorted(m for m in set(analysis.values["metric"]) if analysis.spec_of(m).mechanism):
        spec = analysis.spec_of(metric)
        present_at = spec.present_at
        assert present_at is not None, f"{metric} declares a mechanism but not where it is present (present_at)"
        values = analysis.values[analysis.values["metric"] == metric]
        for size, group in values.groupby("size", sort=True):
            median = group.groupby("family")["value"].median()
            order = [f for f in families(analysis) if f in median.index]
            formed = [f for f in order if median[f] >= present_at]
            missing = [f for f in order if f not in formed]
            rule = (f"median {spec.label} over seeds, {num(present_at)} or more counts: "
                    + listed([f"{f} {num(median[f])}" for f in order]))
            if not missing:
                sentence = f"Every family formed {spec.mechanism} at {size} ({rule})."
            elif not formed:
                sentence = (f"No family formed {spec.mechanism} at {size} ({rule}), so their mechanistic numbers"
                            f" describe models without {spec.mechanism}.")
            else:
                sentence = (f"{listed(formed)} formed {spec.mechanism} at {size} but {listed(missing)} did not"
                            f" ({rule}); the mechanistic numbers of {listed(missing)} describe models without"
                            f" {spec.mechanism}.")
            odd = [_odd_runs(group[group["family"] == f], f, present_at, f in formed) for f in order]
            if any(odd):
                sentence += f" Not every run agrees: {listed([o for o in odd if o])}."
            lines.append(f"- {sentence}")
    return lines


def _odd_runs(runs: pd.DataFrame, family: str, present_at: float, formed: bool, named: int = 6) -> str:
    """The clause 'k of n <family> runs did not form them (seeds ...)': the runs on the other side
    of `present_at` from their family's median ('' when none); at most `named` seeds named."""
    runs = runs.dropna(subset=["value"])
    odd = runs[(runs["value"] >= present_at) != formed]
    if odd.empty:
        return ""
    seeds = [str(seed) for seed in sorted(set(odd["seed"]))]
    shown = seeds if len(seeds) <= named else [*seeds[:named], f"{len(seeds) - named} more"]
    return (f"{len(odd)} of {len(runs)} {family} runs {'did not form them' if formed else 'formed them'}"
            f" (seed{'s' if len(seeds) > 1 else ''} {listed(shown)})")


def _reference_cautions(analysis: Analysis) -> list[str]:
    """Confirmatory metrics on which a model does not beat its first reference estimator (there
    its comparisons say nothing about the claim), or beats it but not the second (there it
    predicts no better than that estimator's counting, so its comparisons are not about
    in-context learning beyond it)."""
    first = set(not_beating_references(analysis, "first"))
    second = set(not_beating_references(analysis, "second")) - first
    lines = []
    for failing, rank, meaning in ((first, 0, "so comparisons on it are meaningless there"),
                                   (second, 1, "so there comparisons on it do not show in-context learning beyond"
                                               " what that estimator counts")):
        table = pd.DataFrame(sorted(failing), columns=["metric", "family", "at"])
        table = table[table["metric"].isin(analysis.primary_metrics)]
        lines += [f"- Caution: {listed(list(group['family']))} at {at} {'does' if len(group) == 1 else 'do'} not beat"
                  f" the {analysis.label(analysis.spec_of(metric).references[rank])} estimator on"
                  f" {analysis.label(metric)}, {meaning}."
                  for (metric, at), group in table.groupby(["metric", "at"], sort=True)]
    return lines


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
             f"{decision_text(row)}, p = {p_text(row['p_adj'])}",
             f"{improvement_text(row)}, {seeds(row)}", raw_text(row), _paper_text(spec, row["family"], row["baseline"])]
            for _, row in rows.iterrows()]


def _cost_claim_rows(analysis: Analysis, metric: str) -> list[list[str]]:
    """A cost is counted, not sampled: the saving of each family against the baseline is exact."""
    spec, baseline = analysis.spec_of(metric), analysis.options.baseline
    table = seed_means(analysis, [metric])
    base = table[table["family"] == baseline].set_index("size")[metric]
    return [[f"{r['family']} vs {baseline}, {r['size']}", "exact (counted from the stage schedule)",
             _saving_text(1 - r[metric] / base[r["size"]]), signed(r[metric] - base[r["size"]]),
             _paper_text(spec, r["family"], baseline)]
            for _, r in table.iterrows() if r["family"] != baseline and r["size"] in base.index]


def _saving_text(saving: float) -> str:
    """A counted saving in words: "13.2% fewer", "4.0% more", or "the same" when the schedules
    cost exactly as much (a looped model runs its full depth every step, like dense)."""
    if saving == 0:
        return "the same"
    return f"{abs(saving):.1%} {'fewer' if saving > 0 else 'more'}"


def _p_value_claim_rows(analysis: Analysis, metric: str) -> list[list[str]]:
    """A per-run p-value claim: the seeds' p-values combined by Fisher's method, beside the mean of
    the statistic and of its chance value (the declared companions)."""
    spec, alpha = analysis.spec_of(metric), analysis.options.alpha
    values = analysis.values.pivot_table(index=["family", "size", "seed"], columns="metric", values="value")
    if metric not in values.columns:  # NaN in every run (the pivot drops it): nothing to combine
        return []
    beside = [m for m in spec.companions[:2] if m in values.columns]
    rows = []
    for (family, size), group in values.dropna(subset=[metric]).groupby(["family", "size"]):
        p = stats.combine_pvalues(group[metric], method="fisher").pvalue
        shown = " vs ".join(num(group[m].mean()) for m in beside) + (" by chance" if len(beside) == 2 else "")
        rows.append([f"{family}, {size}", f"{'shown' if p < alpha else 'not shown'} (Fisher p = {p_text(p)})",
                     f"{shown}, {seeds_text(len(group))} seeds", "–",
                     _paper_text(spec, family, analysis.options.baseline)])
    return rows


def claims_section(analysis: Analysis) -> list[str]:
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
        return lines + ["None of the paper's claims was measured: no finished run recorded a metric that declares one.",
                        *_unmeasured_claims(analysis)]
    compared = analysis.comparisons[analysis.comparisons["metric"].isin([m for m in analysis.metric_specs
                                                                          if analysis.spec_of(m).claim])]
    early = [EARLY_MEANING] if compared["winners_curse"].astype(bool).any() else []
    return lines + [f"The sweep's verdict on each claim it measured ({level_text(1 - analysis.options.alpha)} intervals"
                    " unless the verdict names another level), with the look, level and correction family that"
                    " decided it, beside the paper's single-seed figure. The improvement is > 0 when the candidate"
                    " is better, for every metric; the raw difference beside it is candidate minus baseline in"
                    " the metric's own units.", "",
                    *md_table(["claim", "comparison", "verdict (look, level, correction family)",
                               f"{IMPROVEMENT}, seeds", RAW, "paper, one seed"], table),
                    *(["", *early] if early else []), *_unmeasured_claims(analysis)]


def _unmeasured_claims(analysis: Analysis) -> list[str]:
    """The claims the jobs can measure (`Analysis.claims`) that no finished run of the sweep
    recorded, each with the paper's figure and what measuring it takes."""
    measured = set(analysis.values["metric"])
    lines = []
    for metric, spec in sorted(analysis.claims.items()):
        if metric in measured:
            continue
        at = f" at {spec.paper_at}" if spec.paper_at else ""
        paper = f"; the paper, one seed: {', '.join(f'{f} {num(v)}' for f, v in spec.paper)}{at}" if spec.paper else ""
        takes = spec.measured_with or f"an evaluation that records {metric}"
        lines.append(f"- {spec.claim} ({spec.label}{paper}): takes {takes}.")
    return ["", "Not measured by this sweep:", "", *lines] if lines else []


def _metric_rank(analysis: Analysis) -> Callable[[str], tuple[int, str]]:
    """Sort key: the report order of model metrics (`metrics`), then the rest by name."""
    order = {m: i for i, m in enumerate(metrics(analysis))}
    return lambda metric: (order.get(metric, len(order)), metric)
