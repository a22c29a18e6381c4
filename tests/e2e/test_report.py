"""write_report on a fake store: numbers traced back to metrics.json, references, failures, determinism."""

import base64
import html
import importlib
import itertools
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from rich.console import Console
from scipy import stats
from test_analysis_load import new_store, write_run, write_sweep

from analysis import AnalysisOptions, analyse, write_report
from analysis.console import render_summary
from analysis.html import render_html
from analysis.markdown import render_markdown
from analysis.figures import draw
from analysis.text import EARLY_MEANING, IMPROVEMENT, RAW
from jobs.evals import EVALUATIONS
from jobs.registry import TRAIN, claims

DECIDED = "verdict (look, level, correction family)"  # the verdict column of the claims and comparison tables
NGRAMS = {"ngram1_tvd": 0.42, "ngram2_tvd": 0.20, "ngram3_tvd": 0.15}
# regbench_tvd per family, size and seed; looped at tiny is worse than the unigram estimator.
TVD = {("dense", "tiny"): [0.30, 0.28, 0.33], ("lidas", "tiny"): [0.25, 0.27, 0.26],
       ("looped", "tiny"): [0.45, 0.44, 0.47], ("dense", "small"): [0.22, 0.21, 0.25],
       ("lidas", "small"): [0.20, 0.19, 0.22], ("looped", "small"): [0.24, 0.23, 0.23]}
POSITION = ("Position between the reference estimators, (in-context unigram - model) / (in-context unigram"
            " - in-context bigram):")
CELL = re.compile(r"(-?[\d.]+(?:e[-+]?\d+)?) \[(-?[\d.]+(?:e[-+]?\d+)?), (-?[\d.]+(?:e[-+]?\d+)?)\] \(n=(\d+)\)")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = new_store(tmp_path / "store")
    run_ids = []
    for (family, size), values in TVD.items():
        for seed, tvd in enumerate(values):
            run_id = f"{family}-{size}-{seed}"
            write_run(root, run_id, family, size, seed,
                      {"regbench_tvd": tvd, "regbench_acc": 1 - tvd - 0.1 * seed, **NGRAMS, "train_flops": 1e12})
            run_ids.append(run_id)
    write_run(root, "looped-tiny-3", "looped", "tiny", 3, status="failed", error="CUDA error: out of memory")
    write_sweep(root, "demo", [*run_ids, "looped-tiny-3"], "2025-01-01T00:00:00", ["family=dense,lidas,looped"])
    return root


def metric_values(root: Path, family: str, size: str, metric: str) -> np.ndarray:
    """The values straight from the runs' metrics.json files, bypassing analysis.load."""
    return np.array([json.loads((root / "runs" / f"{family}-{size}-{seed}" / "metrics.json").read_text())
                     ["metrics"][metric] for seed in range(3)])


def markdown_table(report: str, heading: str) -> list[dict[str, str]]:
    """The first markdown table after `heading`, one {column: cell} per row."""
    lines = report.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = [[cell.strip() for cell in line.strip("|").split("|")]
             for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start:])]
    return [dict(zip(table[0], row)) for row in table[2:]]


def table_rows(report: str, heading: str) -> dict[str, dict[str, str]]:
    """The first markdown table after `heading`, as {first cell: {column: cell}} for the others."""
    rows = [list(row.items()) for row in markdown_table(report, heading)]
    return {row[0][1]: dict(row[1:]) for row in rows}


def test_report_numbers_come_from_metrics_json(store):
    report = write_report(store, "demo").read_text()
    rows = table_rows(report, "### RegBench TVD (`regbench_tvd`, lower is better)")
    for (family, size) in TVD:
        x = metric_values(store, family, size, "regbench_tvd")
        mean, low, high, n = CELL.fullmatch(rows[family][size]).groups()
        half = stats.t.ppf(0.975, 2) * stats.sem(x)
        assert float(mean) == pytest.approx(x.mean(), rel=1e-3)
        assert (float(low), float(high)) == (pytest.approx(x.mean() - half, rel=1e-3),
                                             pytest.approx(x.mean() + half, rel=1e-3))
        assert int(n) == 3


def test_comparison_sentences(store):
    report = write_report(store, "demo").read_text()
    for family in ("lidas", "looped"):
        for size in ("small", "tiny"):
            line = next(text for text in report.splitlines()
                        if text.startswith(f"- {family} vs dense, RegBench TVD, {size}:"))
            improvement = float(re.search(r": improvement ([-+][\d.]+(?:e[-+]?\d+)?), ", line).group(1))
            raw = float(re.search(r"raw difference ([-+][\d.]+(?:e[-+]?\d+)?), ", line).group(1))
            expected = (metric_values(store, family, size, "regbench_tvd")
                        - metric_values(store, "dense", size, "regbench_tvd")).mean()
            assert raw == pytest.approx(expected, rel=1e-3) and improvement == pytest.approx(-expected, rel=1e-3)
            assert ("better" if expected < 0 else "worse") in line.split(",")[3]
            assert "lower is better" in line and "(95%, Holm over m = 4 (confirmatory))" in line
            assert "paired t, 3 seeds, Holm p = " in line and "sign-flip p = " in line
    lidas_tiny = next(line for line in report.splitlines() if line.startswith("- lidas vs dense, RegBench TVD, tiny:"))
    assert "3/3 seeds better; sign-flip p = 0.25 (the smallest possible)" in lidas_tiny
    assert "**RegBench accuracy against dense** (exploratory, Benjamini-Hochberg):" in report
    assert not [line for line in report.splitlines() if line.startswith("**in-context")]  # references: not compared


def test_reference_rows_and_icl_position(store):
    report = write_report(store, "demo").read_text()
    rows = table_rows(report, "### RegBench TVD (`regbench_tvd`, lower is better)")
    for metric, name in (("ngram1_tvd", "unigram"), ("ngram2_tvd", "bigram"), ("ngram3_tvd", "trigram")):
        assert float(rows[f"*in-context {name} (reference)*"]["tiny"]) == pytest.approx(NGRAMS[metric])
    position = table_rows(report, POSITION)
    lidas = np.mean(TVD[("lidas", "tiny")])
    expected = (NGRAMS["ngram1_tvd"] - lidas) / (NGRAMS["ngram1_tvd"] - NGRAMS["ngram2_tvd"])
    assert float(position["lidas"]["tiny"]) == pytest.approx(expected, rel=1e-3)
    looped = np.mean(TVD[("looped", "tiny")])
    assert (f"> **Warning:** looped at tiny does not beat the in-context unigram estimator (RegBench TVD {looped:.4g}"
            f" vs {NGRAMS['ngram1_tvd']:.4g}): it learned no in-context learning; comparisons on it are meaningless."
            in report)
    assert "looped at small does not beat" not in report


def test_header_failed_runs_and_how_to_read(store):
    report = write_report(store, "demo").read_text()
    assert report.startswith("# Sweep `demo`: results")
    assert "- Runs: 18 done, 1 failed, 0 not finished (19 in the sweep)" in report
    assert "- Seeds per cell: 3" in report and "- Analysis seed: 0" in report
    failed = table_rows(report, "## Failed and unfinished runs")
    assert failed["looped-tiny-3"] == {"family": "looped", "size": "tiny", "seed": "3", "status": "failed",
                                       "error": "CUDA error: out of memory"}
    assert "## How to read this" in report and "2 / 2^n" in report


def test_report_is_byte_identical_on_a_second_call(store):
    path = write_report(store, "demo")
    first = path.read_bytes(), path.with_suffix(".html").read_bytes()
    assert write_report(store, "demo").read_bytes() == first[0]
    assert path.with_suffix(".html").read_bytes() == first[1]
    assert not list(path.parent.glob(".*"))  # no temporary files left behind


def test_results_tables_one_file_each(store):
    write_report(store, "demo")
    folder = store / "sweeps" / "demo" / "results"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{t}.{ext}" for t in ("runs", "cells", "comparisons")
                                                               for ext in ("parquet", "csv"))
    runs = pd.read_parquet(folder / "runs.parquet")
    assert set(runs["sweep"]) == {"demo"}
    assert len(runs) == 18 * 6 + 1 and runs.loc[runs["status"] == "failed", "run_id"].tolist() == ["looped-tiny-3"]
    cells = pd.read_parquet(folder / "cells.parquet")
    expected = analyse(store, "demo").cells
    merged = cells.merge(expected, on=["family", "size", "metric"], suffixes=("", "_expected"))
    assert len(merged) == len(expected) == 3 * 2 * 6
    np.testing.assert_allclose(merged["mean"], merged["mean_expected"])
    np.testing.assert_allclose(merged["boot_ci_low"], merged["boot_ci_low_expected"])
    comparisons = pd.read_parquet(folder / "comparisons.parquet")
    assert set(comparisons["verdict"]) <= {"better", "worse", "equivalent", "inconclusive"}
    assert comparisons["seeds_needed"].dtype == "Int64"
    assert list(comparisons.columns) == ["sweep", *analyse(store, "demo").comparisons.columns]
    assert cells["iqm"].isna().all()  # an all-empty column of a table is kept
    csv = pd.read_csv(folder / "comparisons.csv")
    assert list(csv.columns) == list(comparisons.columns) and len(csv) == len(comparisons)


def test_render_summary_prints(store):
    console = Console(width=200, record=True)
    console.print(render_summary(analyse(store, "demo")))
    text = console.export_text()
    assert "regbench_tvd" in text and "lidas" in text and "Holm" in text


def test_report_of_a_sweep_with_nothing_done(tmp_path):
    root = new_store(tmp_path / "store")
    write_run(root, "x", "dense", "tiny", 0, status="failed", error="boom")
    write_sweep(root, "broken", ["x", "y"], "2025-01-01T00:00:00", [])
    report = write_report(root, "broken").read_text()
    assert "- Runs: 0 done, 1 failed, 1 not finished (2 in the sweep)" in report
    assert "No confirmatory comparison: the baseline or a second family has no finished runs" in report
    failed = table_rows(report, "## Failed and unfinished runs")
    assert failed["x"]["error"] == "boom" and failed["y"] == {"family": "–", "size": "–", "seed": "–",
                                                              "status": "pending", "error": ""}
    assert set(pd.read_parquet(root / "sweeps" / "broken" / "results" / "runs.parquet")["run_id"]) == {"x", "y"}


# ---- a sweep over a hyper-parameter ------------------------------------------------------------

LRS = {0.001: 0.0, 0.003: -0.04}  # learning rate -> shift of every regbench_tvd


@pytest.fixture
def lr_store(tmp_path: Path) -> Path:
    """family=dense,lidas seed=0,1,2 train.lr=0.001,0.003 at tiny: 12 runs, two per (family, seed);
    only lidas has family.growth.alpha, as in a real store."""
    root = new_store(tmp_path / "store")
    run_ids = []
    for lr, shift in LRS.items():
        for family in ("dense", "lidas"):
            for seed, tvd in enumerate(TVD[(family, "tiny")]):
                run_id = f"{family}-{lr}-{seed}"
                config = {"train": {"lr": lr}, **({"family": {"growth": {"alpha": 1.0}}} if family == "lidas" else {})}
                tvd += shift * (1 + seed * (family == "lidas"))  # the gap to dense depends on lr
                write_run(root, run_id, family, "tiny", seed, {"regbench_tvd": tvd, **NGRAMS}, config=config)
                run_ids.append(run_id)
    write_sweep(root, "lr", run_ids, "2025-01-01T00:00:00", ["family=dense,lidas", "train.lr=0.001,0.003"])
    return root


def run_values(root: Path, run_ids: list[str], metric: str) -> np.ndarray:
    return np.array([json.loads((root / "runs" / run_id / "metrics.json").read_text())["metrics"][metric]
                     for run_id in run_ids])


def test_lr_sweep_report_has_a_cell_per_learning_rate(lr_store):
    report = write_report(lr_store, "lr").read_text()
    rows = markdown_table(report, "### RegBench TVD (`regbench_tvd`, lower is better)")
    assert list(rows[0]) == ["family", "train.lr", "tiny"]
    models = [(row["family"], row["train.lr"]) for row in rows if not row["family"].startswith("*")]
    assert models == [("dense", "0.001"), ("dense", "0.003"), ("lidas", "0.001"), ("lidas", "0.003")]
    for row in rows[:4]:
        x = run_values(lr_store, [f"{row['family']}-{row['train.lr']}-{seed}" for seed in range(3)], "regbench_tvd")
        mean, *_, n = CELL.fullmatch(row["tiny"]).groups()
        assert float(mean) == pytest.approx(x.mean(), rel=1e-3) and n == "3"
    unigram = next(row for row in rows if row["family"] == "*in-context unigram (reference)*")
    assert unigram == {"family": unigram["family"], "train.lr": "all", "tiny": "0.42"}


def test_lr_sweep_compares_within_each_learning_rate(lr_store):
    report = write_report(lr_store, "lr").read_text()
    for lr in LRS:
        start = f"- lidas vs dense, RegBench TVD, tiny, train.lr={lr}:"
        line = next(line for line in report.splitlines() if line.startswith(start))
        raw = float(re.search(r"raw difference ([-+][\d.]+(?:e[-+]?\d+)?), ", line).group(1))
        lidas, dense = ([run_values(lr_store, [f"{family}-{lr}-{seed}" for seed in range(3)], "regbench_tvd")
                         for family in ("lidas", "dense")])
        expected = (lidas - dense).mean()
        assert raw == pytest.approx(expected, rel=1e-3) and "paired t, 3 seeds" in line
    assert "- Cells: family x size x train.lr x metric, seeds as replicates; also varying, not split on:" \
           " family.growth.alpha" in report
    assert "(regbench_tvd x families x sizes x train.lr values, m = 2)" in report
    comparisons = analyse(lr_store, "lr").comparisons
    assert list(comparisons.columns[:5]) == ["family", "baseline", "size", "train.lr", "metric"]
    assert sorted(comparisons["train.lr"]) == sorted(LRS) and set(comparisons["correction"]) == {"holm"}


def test_lr_sweep_report_is_deterministic_and_summarised(lr_store):
    first = write_report(lr_store, "lr").read_bytes()
    assert write_report(lr_store, "lr").read_bytes() == first
    cells = pd.read_parquet(lr_store / "sweeps" / "lr" / "results" / "cells.parquet")
    assert list(cells.columns[:5]) == ["sweep", "family", "size", "train.lr", "metric"] and len(cells) == 2 * 2 * 4
    console = Console(width=200, record=True)
    console.print(render_summary(analyse(lr_store, "lr")))
    text = console.export_text()
    assert "train.lr" in text and "0.003" in text


def test_explicit_cell_keys_in_the_options(lr_store):
    assert analyse(lr_store, "lr", AnalysisOptions(by=("train.lr",))).keys == ("train.lr",)
    with pytest.raises(ValueError, match="differ in another config key"):
        analyse(lr_store, "lr", AnalysisOptions(by=()))


def test_reference_rows_per_evaluation_data(tmp_path):
    """When data.* varies, the in-context estimators differ per data set: one reference row each."""
    root = new_store(tmp_path / "store")
    run_ids = []
    for data, unigram in (("regbench", 0.5), ("regbench_easy", 0.42)):
        for family in ("dense", "lidas"):
            for seed, tvd in enumerate(TVD[(family, "tiny")]):
                run_ids.append(f"{family}-{data}-{seed}")
                write_run(root, run_ids[-1], family, "tiny", seed,
                          {"regbench_tvd": tvd, **NGRAMS, "ngram1_tvd": unigram}, config={"data": {"name": data}})
    write_sweep(root, "data", run_ids, "2025-01-01T00:00:00", ["data=regbench,regbench_easy"])
    report = write_report(root, "data").read_text()
    rows = markdown_table(report, "### RegBench TVD (`regbench_tvd`, lower is better)")
    unigram = {row["data.name"]: row["tiny"] for row in rows if row["family"] == "*in-context unigram (reference)*"}
    assert unigram == {"regbench": "0.5", "regbench_easy": "0.42"}
    position = markdown_table(report, POSITION)
    dense = {row["data.name"]: float(row["tiny"]) for row in position if row["family"] == "dense"}
    mean = np.mean(TVD[("dense", "tiny")])
    assert dense == {"regbench": pytest.approx((0.5 - mean) / (0.5 - 0.20), rel=1e-3),
                     "regbench_easy": pytest.approx((0.42 - mean) / (0.42 - 0.20), rel=1e-3)}


# ---- headline, how sure are we, report.html ----------------------------------------------------

HEADLINE = re.compile(r"- (\w+) (?:beats|is worse than) dense on RegBench TVD at (\w+): improvement"
                      r" (\S+ \[\S+, \S+\]) \(raw difference (\S+)\), (\d+) seeds, Holm p = ([^;]+?); (.+)\.$")


@pytest.fixture
def decisive_store(tmp_path: Path) -> Path:
    """5 seeds at tiny: lidas clearly better than dense, looped clearly worse."""
    root = new_store(tmp_path / "store")
    noise = [0.001, -0.002, 0.0, 0.002, -0.001]
    dense = [0.30, 0.28, 0.33, 0.31, 0.29]
    run_ids = []
    for family, shift in (("dense", 0.0), ("lidas", -0.05), ("looped", 0.04)):
        for seed, tvd in enumerate(dense):
            run_ids.append(f"{family}-{seed}")
            write_run(root, run_ids[-1], family, "tiny", seed,
                      {"regbench_tvd": tvd + shift + (noise[seed] if shift else 0), **NGRAMS})
    write_sweep(root, "demo", run_ids, "2025-01-01T00:00:00", [])
    return root


def section(report: str, heading: str) -> str:
    return report.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def headline_of(report: str) -> str:
    """The headline's lines, without the forest plot below them."""
    return section(report, "Headline").split("\n### ", 1)[0]


def test_headline_comes_first_and_matches_the_comparisons_table(store):
    report = write_report(store, "demo").read_text()
    order = ["## Headline", "### Differences against dense", "## Claims of the paper", "## Contents",
             "## RegBench: in-context language learning", "## How sure are we", "## Setup", "## How to read this"]
    assert [report.index(f"{heading}\n") for heading in order] == sorted(report.index(f"{h}\n") for h in order)
    # What was seen first: looped at tiny is worse than the unigram estimator, and no other model
    # beats the bigram estimator (0.20; the best, lidas at small, has 0.2033).
    caution, *bigram, decisive, undecided = headline_of(report).splitlines()[1:]
    assert bigram == [
        "- Caution: dense, lidas and looped at small do not beat the in-context bigram estimator on RegBench TVD, so"
        " there comparisons on it do not show in-context learning beyond what that estimator counts.",
        "- Caution: dense and lidas at tiny do not beat the in-context bigram estimator on RegBench TVD, so there"
        " comparisons on it do not show in-context learning beyond what that estimator counts."]
    assert HEADLINE.match(decisive).groups()[:2] == ("looped", "tiny") and " is worse than " in decisive
    assert undecided.startswith("- No decision yet: lidas and looped on RegBench TVD at small (95%, Holm over m = 4"
                                " (confirmatory)); lidas on RegBench TVD at tiny (95%, Holm over m = 4 (confirmatory))"
                                " (about ")
    assert caution == ("- Caution: looped at tiny does not beat the in-context unigram estimator on RegBench TVD, so"
                       " comparisons on it are meaningless there.")
    claims = markdown_table(report, "## Claims of the paper")
    rows = markdown_table(report, "**RegBench TVD against dense** (confirmatory, Holm)")
    comparisons = analyse(store, "demo").comparisons.set_index(["family", "size", "metric"])
    claims = claims[:4]  # then the training FLOPs
    assert len(rows) == 4 and all(row[DECIDED].startswith("exact") for row in markdown_table(
        report, "## Claims of the paper")[4:])
    assert claims[0]["claim"] == f"{EVALUATIONS['regbench'].metrics['regbench_tvd'].claim} (RegBench TVD)"
    for claim, row in zip(claims, rows):
        family, size = claim["comparison"].removesuffix(f", {row['size']}").split(" vs dense")[0], row["size"]
        assert claim["comparison"] == f"{row['family']} vs dense, {row['size']}"
        assert claim[f"{IMPROVEMENT}, seeds"] == f"{row[IMPROVEMENT]}, {row['seeds']}"
        assert claim[RAW] == row[RAW]
        assert claim[DECIDED] == f"{row[DECIDED]}, p = {row['adjusted p'].removesuffix(' (Holm)')}"
        expected = comparisons.loc[(family, size, "regbench_tvd")]
        assert float(row[IMPROVEMENT].split()[0]) == pytest.approx(expected["diff_mean"], rel=1e-3)
        assert float(row[RAW]) == pytest.approx(-expected["diff_mean"], rel=1e-3)
        assert float(row["adjusted p"].split()[0]) == pytest.approx(expected["p_holm"], rel=1e-2)
        paper = EVALUATIONS["regbench"].metrics["regbench_tvd"].paper_value
        assert claim["paper, one seed"].startswith(f"{paper(family):g} vs {paper('dense'):g}, ")


def test_headline_states_decisive_claims(decisive_store):
    report = write_report(decisive_store, "demo").read_text()
    lines = headline_of(report).splitlines()
    assert lines[1].startswith("- Caution: dense, lidas and looped at tiny do not beat the in-context bigram")
    del lines[1]  # what was seen comes first; then the claims
    comparisons = analyse(decisive_store, "demo").comparisons.set_index("family")
    assert lines[1].startswith("- lidas beats dense on RegBench TVD at tiny: improvement +0.05 [")
    assert lines[2].startswith("- looped is worse than dense on RegBench TVD at tiny: improvement -0.04 [")
    for line, family in zip(lines[1:3], ("lidas", "looped")):
        match = HEADLINE.match(line)
        assert match.group(5) == "5" and match.group(7) == "95%, Holm over m = 2 (confirmatory)"
        assert float(match.group(4)) == pytest.approx(-comparisons.loc[family, "diff_mean"], rel=1e-3)
        assert f"Holm p = {comparisons.loc[family, 'p_holm']:.3g};" in line
    assert "- **Seeds needed:** none; every confirmatory comparison has a verdict." in report


@pytest.mark.parametrize("scores, expected", [
    ({"dense": [0.10, 0.12, 0.60], "lidas": [0.70, 0.80, 0.20], "looped": [0.55, 0.60, 0.90]},
     "- lidas and looped formed induction heads at tiny but dense did not (median best induction-head score over"
     " seeds, 0.5 or more counts: dense 0.12, lidas 0.7 and looped 0.6); the mechanistic numbers of dense describe"
     " models without induction heads. Not every run agrees: 1 of 3 dense runs formed them (seed 2) and 1 of 3"
     " lidas runs did not form them (seed 2)."),
    ({"dense": [0.10, 0.12, 0.60], "lidas": [0.10, 0.09, 0.2], "looped": [0.15, 0.1, 0.9]},
     "- No family formed induction heads at tiny (median best induction-head score over seeds, 0.5 or more counts:"
     " dense 0.12, lidas 0.1 and looped 0.15), so their mechanistic numbers describe models without induction heads."
     " Not every run agrees: 1 of 3 dense runs formed them (seed 2) and 1 of 3 looped runs formed them (seed 2)."),
    ({"dense": [0.5, 0.6, 0.7], "lidas": [0.7, 0.8, 0.2], "looped": [0.55, 0.6, 0.9]},
     "- Every family formed induction heads at tiny (median best induction-head score over seeds, 0.5 or more"
     " counts: dense 0.6, lidas 0.7 and looped 0.6). Not every run agrees: 1 of 3 lidas runs did not form them"
     " (seed 2)."),
    ({"dense": [0.5, 0.6, 0.7], "lidas": [0.7, 0.8, 0.9], "looped": [0.55, 0.6, 0.9]},
     "- Every family formed induction heads at tiny (median best induction-head score over seeds, 0.5 or more"
     " counts: dense 0.6, lidas 0.8 and looped 0.6)."),
])
def test_the_headline_says_whether_the_models_formed_induction_heads(tmp_path, scores, expected):
    """One sentence on the declared mechanism (induction_max's median over seeds against 0.5), so
    nobody reads mechanistic numbers from models that have none."""
    root = new_store(tmp_path / "store")
    run_ids = []
    for family, values in scores.items():
        for seed, score in enumerate(values):
            run_ids.append(f"{family}-{seed}")
            write_run(root, run_ids[-1], family, "tiny", seed,
                      {"regbench_tvd": TVD[(family, "tiny")][seed], "induction_max": score, **NGRAMS})
    write_sweep(root, "demo", run_ids, "2025-01-01T00:00:00", [])
    headline = headline_of(write_report(root, "demo").read_text()).splitlines()
    assert [line for line in headline if "induction heads" in line] == [expected]


def test_claims_the_sweep_did_not_measure_are_named_with_what_they_take(tmp_path):
    """The orchestrator stores every claim the jobs can measure (claims.json); the report's claims
    section names each one no finished run recorded (GSM8K on RegBench data) with the paper's figure
    and what measuring it takes, and leaves out those it measured."""
    root = new_store(tmp_path / "store")
    run_ids = []
    for family in ("dense", "lidas"):
        for seed in range(3):
            run_ids.append(f"{family}-{seed}")
            write_run(root, run_ids[-1], family, "tiny", seed, {"regbench_tvd": 0.3 - 0.01 * seed, **NGRAMS})
    write_sweep(root, "demo", run_ids, "2025-01-01T00:00:00", [])
    (root / "sweeps" / "demo" / "claims.json").write_text(
        json.dumps({metric: spec.to_record() for metric, spec in claims().items()}))
    section = render_markdown(analyse(root, "demo"), figures=[]).split("Not measured by this sweep:", 1)[1]
    section = section.split("\n## ", 1)[0]
    gsm8k = claims()["gsm8k_em_strict"]
    assert (f"- {gsm8k.claim} ({gsm8k.label}; the paper, one seed: lidas 0.19, dense 0.12 at 3B): takes"
            f" {gsm8k.measured_with}.") in section.splitlines()
    assert "cannot test" in gsm8k.measured_with
    assert claims()["regbench_tvd"].claim not in section  # measured: in the table, not here


def test_missing_and_nan_values_are_counted_and_named(tmp_path):
    """Runs whose metric is NaN or not recorded are never dropped silently: each cell names them by run
    id (and seed, and which of the two) in its metric's section, and in the headline when the metric is
    confirmatory; the statistics use the seeds that have a value."""
    root = new_store(tmp_path / "store")
    run_ids = []
    for family in ("dense", "lidas"):
        for seed in range(4):
            run_ids.append(f"{family}-{seed}")
            lidas = family == "lidas"
            metrics = {"regbench_tvd": [0.30, 0.28, 0.33, 0.31][seed] - (0.04 + 0.005 * seed) * lidas,
                       "induction_max": [0.5, 0.6, 0.8, 0.7][seed] + 0.05 * lidas * seed,
                       "regbench_acc": [0.6, 0.62, 0.57, 0.61][seed] + 0.02 * lidas * seed, **NGRAMS}
            if family == "lidas" and seed == 1:
                metrics["induction_max"] = None  # recorded as NaN
            if family == "lidas" and seed == 3:
                del metrics["induction_max"]  # not recorded at all
            if family == "dense" and seed == 2:
                metrics["regbench_tvd"] = float("nan")
                metrics["regbench_acc"] = None
            if lidas:
                metrics["layer_divergence_weight"] = 0.1 + 0.01 * seed  # a grown model's metric only
            write_run(root, run_ids[-1], family, "tiny", seed, metrics)
    write_sweep(root, "gaps", run_ids, "2025-01-01T00:00:00", [])
    analysis = analyse(root, "gaps")
    report = render_markdown(analysis, figures=[])
    induction = ("- lidas at tiny: 2 of 4 seeds have no induction_max: run ids lidas-1 (seed 1, NaN), lidas-3"
                 " (seed 3, not recorded).")
    tvd = "- dense at tiny: 1 of 4 seeds has no regbench_tvd: run id dense-2 (seed 2, NaN)."
    acc = "- dense at tiny: 1 of 4 seeds has no regbench_acc: run id dense-2 (seed 2, NaN)."
    headline = headline_of(report)
    assert f"- Left out for a missing or NaN value: {induction[2:]}" in headline
    assert f"- Left out for a missing or NaN value: {tvd[2:]}" in headline
    assert "regbench_acc" not in headline  # exploratory: named in its own section only
    for line, metric in ((induction, "induction_max"), (tvd, "regbench_tvd"), (acc, "regbench_acc")):
        title = f"({'`' if metric != 'regbench_acc' else '<code>'}{metric}"
        block = report.split(title, 1)[1].split("against dense", 1)[0]  # the metric's cells, before its comparisons
        assert line in block.splitlines(), (metric, block)
    # a family that records none of a metric gets one line, not every run id
    assert ("- dense at tiny: none of its 4 seeds records layer_divergence_weight (not a metric of this family,"
            " or its evaluation did not run).") in report.splitlines()
    cells = analysis.cells.set_index(["family", "metric"])
    assert cells.loc[("lidas", "induction_max"), "n_seeds"] == 2
    assert cells.loc[("dense", "regbench_tvd"), "n_seeds"] == 3
    comparisons = analysis.comparisons.set_index("metric")
    assert comparisons.loc["induction_max", "n_pairs"] == 2 and comparisons.loc["regbench_tvd", "n_pairs"] == 3
    gaps = analysis.missing[analysis.missing["metric"] != "layer_divergence_weight"]
    assert gaps["n_missing"].sum() == 4  # and nothing else: every other value is finite


def test_no_missing_values_no_lines(store):
    assert analyse(store, "demo").missing.empty
    assert "missing or NaN" not in write_report(store, "demo").read_text()


def test_how_sure_are_we(store):
    report = write_report(store, "demo").read_text()
    sure = section(report, "How sure are we")
    assert "- **Single-seed cells:** none; every model cell has at least 2 seeds." in sure
    # 2 / 2^3 = 0.25; with m = 4, a sign-flip p can only reach 0.05 once 4 * 2 / 2^n < 0.05: n = 8
    assert "0.25 with 3 seeds, 1 after Holm over m = 4. It can reach alpha = 0.05 after Holm only from 8 seeds." in sure
    assert ("Holm over m = 4 confirmatory comparisons: metrics regbench_tvd; lidas, looped against dense;"
            " sizes small, tiny") in sure
    assert "The other 4 comparisons (regbench_acc) are exploratory" in sure
    comparisons = analyse(store, "demo").comparisons
    assert "train_flops" not in set(comparisons["metric"])  # a cost, declared without a direction: not compared
    undecided = comparisons[(comparisons["correction"] == "holm") & (comparisons["verdict"] == "inconclusive")]
    needed = {row["comparison"]: row["seeds at the observed noise"]
              for row in markdown_table(sure, "- **Seeds needed**")}
    assert needed == {f"{r.family} vs dense, RegBench TVD, {r.size}": str(r.seeds_needed)
                      for r in undecided.itertuples()}


def test_columns_of_the_hierarchical_bootstrap_are_used_when_present(store):
    analysis = analyse(store, "demo")
    comparisons = analysis.comparisons.assign(hb_low=analysis.comparisons["ci_low"] - 0.01,
                                              hb_high=analysis.comparisons["ci_high"] + 0.01)
    cells = analysis.cells.assign(n_items=200, item_se=0.004)
    report = render_markdown(replace(analysis, comparisons=comparisons, cells=cells))
    rows = markdown_table(report, "**RegBench TVD against dense** (confirmatory, Holm)")
    row = next(r for r in rows if (r["family"], r["size"]) == ("lidas", "tiny"))
    lidas = comparisons[(comparisons["family"] == "lidas") & (comparisons["size"] == "tiny")
                        & (comparisons["metric"] == "regbench_tvd")].iloc[0]
    low, high = (float(x) for x in row["hierarchical CI of the improvement"].strip("[]").split(", "))
    assert (low, high) == (pytest.approx(lidas["hb_low"], rel=1e-3), pytest.approx(lidas["hb_high"], rel=1e-3))
    assert "**Hierarchical interval.**" in report
    noise = markdown_table(report, "Evaluation noise against seed noise")
    assert noise[0] == {"family": "dense", "metric": "RegBench TVD", "where": "small", "items": "200",
                        "item SE": "0.004", "seed std": noise[0]["seed std"]}
    assert "hierarchical CI" not in render_markdown(analysis) and "Evaluation noise" not in render_markdown(analysis)


def without_images(page: str) -> str:
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)


def test_html_is_self_contained_with_every_plot_embedded(store):
    path = write_report(store, "demo")
    report, page = path.read_text(), path.with_suffix(".html").read_text()
    text = without_images(page)
    assert "http" not in text and "<link" not in text and "<script" not in text and "src=\"plots" not in text
    linked = re.findall(r"!\[[^\]]*\]\((plots/[^)]+\.png)\)", report)
    embedded = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="[^"]*" width="\d+" />', page)
    assert len(linked) == len(embedded) == 4  # no history.parquet in this store: no loss curves
    assert [base64.b64decode(data) for data in embedded] == [(path.parent / link).read_bytes() for link in linked]


def test_html_has_the_content_of_the_markdown(store):
    path = write_report(store, "demo")
    report, page = path.read_text(), without_images(path.with_suffix(".html").read_text())
    assert page.count("<table>") == report.count("\n|---")
    assert page.count("<li>") == sum(line.startswith("- ") for line in report.splitlines())
    assert page.count("<h3 id=") == sum(line.startswith("### ") for line in report.splitlines())
    for line in headline_of(report).strip().splitlines():
        assert f"<li>{html.escape(line[2:])}</li>" in page
    assert "**" not in page and "|---" not in page and "`" not in page
    assert "<blockquote>\n<p><strong>Warning:</strong> looped at tiny does not beat" in page


def test_render_html_converts_the_emitted_markdown():
    markdown = ("# Sweep `a`: results\n\n- **Runs:** 3 < 4\n- two\n\n| family | x |\n|---|---|\n"
                "| *ref* | a \\| b |\n\n> **Warning:** careful\n\nline one\nline two\n\n![plot](plots/p.png)\n")
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + (750).to_bytes(4, "big") + (300).to_bytes(4, "big")
    page = render_html(markdown, {"plots/p.png": png})
    assert "<title>Sweep a: results</title>" in page
    assert '<h1 id="sweep-a-results">Sweep <code>a</code>: results</h1>' in page
    assert "<ul>\n<li><strong>Runs:</strong> 3 &lt; 4</li>\n<li>two</li>\n</ul>" in page
    assert "<thead>\n<tr>\n<th>family</th>\n<th>x</th>\n</tr>\n</thead>" in page
    assert "<tr>\n<td><em>ref</em></td>\n<td>a | b</td>\n</tr>" in page
    assert "<blockquote>\n<p><strong>Warning:</strong> careful</p>\n</blockquote>" in page
    assert "<p>line one\nline two</p>" in page  # one paragraph: a single line break does not end it
    # shown at its drawn size: 750 px at 150 dpi is 5 inches, 500 CSS px
    assert f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="plot" width="500" />' in page
    with pytest.raises(ValueError, match="not embedded"):
        render_html("![plot](plots/missing.png)\n", {})


# ---- sections declared by the jobs (curves, p-values, costs) -----------------------------------

def test_sections_declared_by_the_jobs(tmp_path):
    """A ranking curve (induction heads), a table curve (ablation by fraction), a per-run p-value
    combined by Fisher's method (ancestry) and the cost with the stored paper-scale table, each
    from the specs the real jobs declare."""
    root = new_store(tmp_path / "store")
    run_ids, ancestry_p = [], [0.04, 0.2, 0.5]
    for family, flops in (("dense", 1e12), ("lidas", 0.75e12)):
        for seed in range(3):
            run_ids.append(f"{family}-{seed}")
            metrics = {"regbench_tvd": TVD[(family, "tiny")][seed], **NGRAMS, "train_flops": flops}
            if family == "lidas":
                metrics |= {"ancestry_p": ancestry_p[seed], "ancestry_top_in_best": 2 + seed, "ancestry_chance": 1.5}
            heads = {"label": ["L0.H0", "L1.H1", "L2.H0", "L3.H1"], "score": [0.2 * seed, 0.9 - seed / 10, 0.5, 0.3]}
            fractions = {"fraction": [0.1, 0.5], "heads": [1, 4], "drop_f1": [0.01 * (seed + 1), 0.1],
                         "tvd_rise": [0.0, 0.02 * seed]}
            write_run(root, run_ids[-1], family, "tiny", seed, metrics,
                      curves={"induction_heads": heads, "ablation_by_fraction": fractions})
    write_sweep(root, "jobs", run_ids, "2025-01-01T00:00:00", [])
    paper = [{"size": "3b", "layers": 36, "block": 4, "steps": 190000, "ratio": 0.7267}]
    (root / "sweeps" / "jobs" / "paper_flops.json").write_text(json.dumps(paper))
    report = render_markdown(analyse(root, "jobs"), figures=[])

    assert EVALUATIONS["induction"].curves["induction_heads"].caption in section(report, "Induction heads")
    ranking = {(r["family"], r["seed"]): r["top 3"]
               for r in markdown_table(report, "### Top induction heads per run\n")}
    assert ranking[("dense", "0")] == "L1.H1 0.9; L2.H0 0.5; L3.H1 0.3"
    assert ranking[("lidas", "2")] == "L1.H1 0.7; L2.H0 0.5; L0.H0 0.4"

    table = markdown_table(report, "### Drop by ablated fraction\n")
    assert list(table[0]) == ["family", "size", "fraction", "heads", "drop_f1", "tvd_rise"]
    assert table[0] == {"family": "dense", "size": "tiny", "fraction": "0.1", "heads": "1", "drop_f1": "0.02",
                        "tvd_rise": "0"}
    assert table[-1] == {"family": "lidas", "size": "tiny", "fraction": "0.5", "heads": "4", "drop_f1": "0.1",
                         "tvd_rise": "0.02"}

    ancestry = markdown_table(report, "### ancestry concentration p (grown models)\n")
    labels = [EVALUATIONS["induction"].metrics[m].label for m in ("ancestry_top_in_best", "ancestry_chance")]
    assert list(ancestry[0]) == ["family", "size", "seed", *labels, "p"]
    assert [(r["seed"], r["p"]) for r in ancestry[:3]] == [("0", "0.04"), ("1", "0.2"), ("2", "0.5")]
    fisher = stats.chi2.sf(-2 * np.log(ancestry_p).sum(), 2 * len(ancestry_p))
    assert ancestry[3] == {"family": "lidas", "size": "tiny", "seed": "all 3 seeds (Fisher)", labels[0]: "3",
                           labels[1]: "1.5", "p": f"{fisher:.3g}"}
    assert len(ancestry) == 4  # dense has no ancestry: only grown models

    flops = table_rows(report, "### Training FLOPs\n")
    assert flops["lidas"] == {"size": "tiny", "training FLOPs": "7.500e+11", "saving vs dense": "25.0%"}
    assert flops["dense"]["saving vs dense"] == "0.0%"
    assert table_rows(report, "The paper reports 26% fewer training FLOPs at 3B.")["3b"] == {
        "layers": "36", "block": "4", "steps": "190000", "LIDAS / dense FLOPs": "0.727", "saving": "27.3%"}
    assert "<summary>training FLOPs (<code>train_flops</code>, descriptive, not compared)</summary>" in report

    claims = markdown_table(report, "## Claims of the paper")
    cost = next(row for row in claims if row[DECIDED].startswith("exact"))
    assert cost["claim"] == f"{TRAIN.metrics['train_flops'].claim} (training FLOPs)"
    assert (cost["comparison"], cost[f"{IMPROVEMENT}, seeds"], cost["paper, one seed"]) == (
        "lidas vs dense, tiny", "25.0% fewer", "26% fewer (3B)")
    tvd = next(row for row in claims if row["claim"].startswith(EVALUATIONS["regbench"].metrics["regbench_tvd"].claim))
    assert tvd["paper, one seed"] == "0.119 vs 0.137, -0.018 (3B)"
    assert tvd[DECIDED].startswith("inconclusive (95%, Holm")
    ancestry_claim = next(row for row in claims if row["comparison"] == "lidas, tiny")
    assert ancestry_claim[DECIDED] == f"not shown (Fisher p = {fisher:.3g})"
    assert ancestry_claim[f"{IMPROVEMENT}, seeds"] == "3 vs 1.5 by chance, 3 seeds"
    assert ancestry_claim["paper, one seed"] == "10 (3B: of the top 12 heads, from 2 ancestors)"
    assert [heading for heading in ("## RegBench: in-context language learning", "## Induction heads",
                                     "## Head ablation", "## Training") if f"{heading}\n" in report] == [
        "## RegBench: in-context language learning", "## Induction heads", "## Head ablation", "## Training"]


def test_labels_for_skewed_seeds_one_sided_p_and_approximate_bootstrap(tmp_path):
    """A cell whose seeds are strongly skewed is marked (its t-interval's coverage promise fails),
    the hierarchical p says it is one-sided, and the BCa bootstrap says it is approximate."""
    root = new_store(tmp_path / "store")
    values = {"dense": [0.30, 0.31, 0.29, 0.30, 0.32, 0.28, 0.30, 0.31],
              "lidas": [0.25, 0.25, 0.26, 0.25, 0.24, 0.25, 0.26, 0.45]}  # one seed far out
    run_ids = []
    for family, tvds in values.items():
        for seed, tvd in enumerate(tvds):
            run_ids.append(f"{family}-{seed}")
            write_run(root, run_ids[-1], family, "tiny", seed, {"regbench_tvd": tvd, **NGRAMS})
    write_sweep(root, "skew", run_ids, "2025-01-01T00:00:00", [])
    analysis = analyse(root, "skew")
    cells = analysis.cells[analysis.cells["metric"] == "regbench_tvd"].set_index("family")
    assert bool(cells.loc["lidas", "skewed"]) and not bool(cells.loc["dense", "skewed"])
    report = render_markdown(analysis, figures=[])
    rows = table_rows(report, "### RegBench TVD (`regbench_tvd`, lower is better)")
    assert rows["lidas"]["tiny"].endswith("(n=8, skewed)") and rows["dense"]["tiny"].endswith("(n=8)")
    assert "(unreliable below 10 seeds, approximate below 20: its coverage is still under nominal there)" in report
    hierarchical = analysis.comparisons.assign(hb_low=-0.1, hb_high=0.1, hb_p=0.2)
    table = markdown_table(render_markdown(replace(analysis, comparisons=hierarchical), figures=[]),
                           "**RegBench TVD against dense** (confirmatory, Holm)")
    assert table[0]["hierarchical p (one-sided: improvement <= 0)"] == "0.2"


def test_the_confirmatory_family_follows_the_papers_claims_per_data_kind():
    """Declared with the evaluations: for RegBench data the TVD (headline first), the induction
    score, the ablation drop and the closed-book knowledge accuracy (recorded only where
    data.facts is set); for arithmetic data GSM8K."""
    from analysis.compute import confirmatory
    from jobs.registry import TRAIN

    specs = {name: spec for job in (TRAIN, *(ev for _, ev in EVALUATIONS.items()))
             for name, spec in job.metrics.items()}
    assert confirmatory(specs, {"regbench"}) == ("regbench_tvd", "ablation_drop_f1", "induction_max",
                                                      "knowledge_acc")
    assert confirmatory(specs, {"arith"}) == ("gsm8k_em_strict",)
    assert all(specs[m].claim for m in confirmatory(specs, {"regbench", "arith"}))  # each a claim of the paper


def rule_look(look: int, comparisons: list[dict], decision: str, keys: tuple[str, ...] = ()) -> dict:
    """A look of an adaptive sweep as the orchestrator records it in sweep.yaml (looks at 3 and 5
    seeds), with `comparisons` as the plan's records of family, verdict and settled_at_look."""
    records = [{"size": "tiny", "cell": {}, "metric": "regbench_tvd", "baseline": "dense", "n_pairs": 3,
                "diff_mean": 0.01, "ci_low": -0.02, "ci_high": 0.04, "p_value": 0.3, "p_holm": 0.6, **c}
               for c in comparisons]
    plan = {"look": look, "n_looks": 2, "n_seeds": 3 if look == 1 else 5, "level": 0.975, "decision": decision,
            "n_more": 0, "runs_saved": 0, "cell_keys": list(keys), "open_arms": [], "comparisons": records}
    return {**{k: plan[k] for k in ("look", "n_looks", "n_seeds", "level", "decision", "n_more", "runs_saved")},
            "verdicts": {f"{c['family']}/tiny": c["verdict"] for c in records}, "plan": plan,
            "rule": {"metric": "regbench_tvd", "alpha": 0.05, "delta_min": 0.02, "baseline": "dense",
                     "looks": [3, 5], "max_seeds": 5}}


def test_every_place_states_the_rules_verdict_with_its_look_level_and_family(decisive_store):
    """One decision procedure: where the adaptive rule decided (lidas futile at look 1 of 2, looped
    still open at look 1 and inconclusive at look 2), the headline, the claims table, the comparison
    table, the console, the forest plot and the results files all show the rule's verdict with the
    look, its level and the correction family, though all seeds at the end would give better / worse
    (the fixed-sample verdict, shown as a secondary column). An early stop is flagged beside its effect."""
    sweep_yaml = decisive_store / "sweeps" / "demo" / "sweep.yaml"
    spec = yaml.safe_load(sweep_yaml.read_text())
    spec["looks"] = [
        rule_look(1, [{"family": "lidas", "verdict": "futile", "settled_at_look": 1, "p_holm": 0.4},
                      {"family": "looped", "verdict": "continue", "settled_at_look": None}], "continue"),
        rule_look(2, [{"family": "lidas", "verdict": "futile", "settled_at_look": 1, "p_holm": None},
                      {"family": "looped", "verdict": "inconclusive", "settled_at_look": None, "n_pairs": 5,
                       "p_holm": 0.07}], "inconclusive")]
    sweep_yaml.write_text(yaml.safe_dump(spec))
    analysis = analyse(decisive_store, "demo")
    rows = analysis.comparisons.set_index("family")
    assert rows["verdict"].tolist() == ["futile", "inconclusive"]
    assert rows["fixed_verdict"].tolist() == ["better", "worse"]
    assert rows["look"].tolist() == [1, 2] and rows["level"].tolist() == [0.975, 0.975]
    assert rows["winners_curse"].tolist() == [True, False]
    assert rows.loc["lidas", "p_adj"] == 0.4 and rows.loc["looped", "n_pairs"] == 5
    family = "Holm over m = 2 (adaptive rule, each look)"
    assert set(rows["correction_family"]) == {family}
    report = write_report(decisive_store, "demo").read_text()
    lidas, looped = f"(look 1 of 2, 97.5%, {family})", f"(look 2 of 2, 97.5%, {family})"
    headline = headline_of(report)
    assert f"- Stopped for futility (the seeds that could decide are more than adaptive.max_seeds): lidas on" \
           f" RegBench TVD at tiny {lidas}." in headline
    assert f"- No decision yet: looped on RegBench TVD at tiny {looped}" in headline
    assert EARLY_MEANING in headline and "beats" not in headline and "worse than" not in headline
    claims = markdown_table(report, "## Claims of the paper")[:2]
    assert [c[DECIDED] for c in claims] == [f"futile {lidas}, p = 0.4", f"inconclusive {looped}, p = 0.07"]
    assert claims[0][f"{IMPROVEMENT}, seeds"].startswith("+0.01 [-0.02, +0.04] (early stop), 3 seeds")
    table = table_rows(report, "**RegBench TVD against dense** (confirmatory, Holm)")
    assert table["lidas"][DECIDED] == f"futile {lidas}"
    assert table["lidas"]["fixed-sample verdict (secondary)"] == "better"
    assert table["looped"][DECIDED] == f"inconclusive {looped}"
    assert "- alpha = 0.05 over the adaptive rule's K = 2 looks, so 0.025 per look (alpha / K), two-sided;" \
           " 97.5% intervals" in report
    console = Console(width=400, record=True)
    console.print(render_summary(analysis))
    printed = console.export_text()
    assert f"futile {lidas}" in printed and f"inconclusive {looped}" in printed and "better (" not in printed
    forest = next(plot for plot in draw(analysis) if plot.name == "forest")
    assert "early stop" in [t.get_text() for ax in forest.figure.axes for t in ax.texts]
    written = pd.read_csv(decisive_store / "sweeps" / "demo" / "results" / "comparisons.csv").set_index("family")
    assert written["verdict"].tolist() == ["futile", "inconclusive"] and written["look"].tolist() == [1, 2]
    assert written["level"].tolist() == [0.975, 0.975] and set(written["correction_family"]) == {family}


@pytest.mark.parametrize("fixture,name", [("store", "demo"), ("lr_store", "lr"), ("decisive_store", "demo")])
def test_report_is_the_one_written_before_the_store_index_and_the_summarised_tables(fixture, name, request):
    """report.md of each test sweep, byte for byte, as pinned in tests/data/report_before_scale: the
    store's index and its faster readers (the configs file, the loader's single pass, the summarised
    run tables) must not change a byte. The files were written again when the report began stating
    the decision procedure (look, level, correction family) and one sign (improvement > 0), and when
    "How to read this" began saying how the hierarchical p is computed (the studentised gap against
    Student's t with the seeds' df), and when the setup began listing the runs' environments (these
    fake stores have no environment.json: "not recorded")."""
    report = write_report(request.getfixturevalue(fixture), name).read_text()
    assert report == (Path(__file__).parent.parent / "data" / "report_before_scale" / f"{fixture}.md").read_text()


def test_run_files_handed_over_are_not_read_again_and_give_the_same_report(store, monkeypatch):
    """The orchestrator's report checks every run's files and hands them to the analysis
    (`analyse(read=...)`): the report is the one the analysis writes reading the store itself, and
    no run's state.json or metrics.json is opened a second time."""
    from store.store import Store, format_of

    load = importlib.import_module("analysis.load")  # the module (the package's `load` is its function)

    from_disk = render_markdown(analyse(store, "demo"))
    runs = Store(store)
    files = {rid: runs.inspect(rid)[1] for rid in runs.read_sweep("demo")["run_ids"]}
    opened, checked = [], []
    monkeypatch.setattr(load, "read_json", lambda path: opened.append(str(path)) or json.loads(Path(path).read_text()))
    monkeypatch.setattr(load, "format_of", lambda root: checked.append(root) or format_of(root))
    handed = analyse(store, "demo", read=lambda rid, name: files[rid][name])
    assert render_markdown(handed) == from_disk
    assert not [p for p in opened if "/runs/" in p] and checked  # the store's format was checked
