"""Worked examples of docs/statistics.md (tolerance 1e-4) and the behaviour of summarize/compare."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis import compare, summarize
from analysis.bootstrap import multibootstrap, stable_rng
from analysis.stats import (SEEDS_MAX, adjust_pvalues, bootstrap_ci, cell_keys, holm, p_min_mannwhitney,
                            p_min_signflip, seeds_needed, sigma_upper)

TOL = 1e-4
EXAMPLE_A = {"lidas": [0.18, 0.20, 0.19], "dense": [0.12, 0.11, 0.13]}
EXAMPLE_B = {"dense": [0.30, 0.28, 0.33], "lidas": [0.25, 0.27, 0.26]}
LR = "train.lr"
AT_HIGH_LR = {"lidas": [0.25, 0.21, 0.24], "dense": [0.20, 0.22, 0.18]}  # another experiment at lr 0.003


def frame(values: dict, metric: str = "gsm8k", higher_is_better: bool = True, size: str = "tiny",
          seeds: dict | None = None) -> pd.DataFrame:
    """The long table of analysis.load for {family: [value per seed]} (seeds 0.. unless given)."""
    seeds = seeds or {}
    return pd.DataFrame([
        {"family": family, "size": size, "seed": seed, "metric": metric, "value": value,
         "higher_is_better": higher_is_better}
        for family, vs in values.items() for seed, value in zip(seeds.get(family, range(len(vs))), vs)])


def one(table: pd.DataFrame, **where) -> pd.Series:
    rows = table
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1, rows
    return rows.iloc[0]


def approx(x, tol=TOL):
    return pytest.approx(x, abs=tol)


def lr_sweep(**kw) -> pd.DataFrame:
    """A two-learning-rate sweep: Example A at lr 0.001, AT_HIGH_LR at 0.003, same seeds 0-2."""
    return pd.concat([frame(EXAMPLE_A, **kw).assign(**{LR: 0.001}), frame(AT_HIGH_LR, **kw).assign(**{LR: 0.003})],
                     ignore_index=True)


# ---- (a) summaries -----------------------------------------------------------------------------

def test_example_a_cells():
    cells = summarize(frame(EXAMPLE_A))
    lidas, dense = one(cells, family="lidas"), one(cells, family="dense")
    assert lidas["mean"] == approx(0.19) and lidas["std"] == approx(0.01)
    assert (lidas["ci_low"], lidas["ci_high"]) == (approx(0.16516), approx(0.21484))
    assert dense["mean"] == approx(0.12)
    assert (dense["ci_low"], dense["ci_high"]) == (approx(0.09516), approx(0.14484))
    assert lidas["sem"] == approx(0.01 / math.sqrt(3))
    assert lidas["n_seeds"] == 3 and lidas["seeds"] == "0,1,2" and lidas["ci_level"] == 0.95
    assert lidas["boot_method"] == "BCa" and lidas["n_boot"] == 9_999
    assert not lidas["boot_reliable"] and not lidas["single_seed"]
    assert math.isnan(lidas["iqm"])  # with 3 seeds the IQM is the mean: not reported


@pytest.mark.parametrize("n, t", [(2, 12.706), (3, 4.303), (4, 3.182), (5, 2.776), (10, 2.262)])
def test_t_interval_quantiles(n, t):
    values = np.linspace(0.1, 0.2, n)
    cell = one(summarize(frame({"dense": list(values)})))
    assert (cell["ci_high"] - cell["mean"]) / cell["sem"] == pytest.approx(t, abs=1e-3)


def test_iqm_and_reliability_from_enough_seeds():
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 10.0]
    cell = one(summarize(frame({"dense": values})))
    assert cell["iqm"] == approx(np.mean(values[2:8]))  # 25% trimmed: the outlier does not count
    assert cell["boot_reliable"]


def test_single_seed_cell():
    cell = one(summarize(frame({"dense": [0.3]})))
    assert cell["single_seed"] and cell["n_seeds"] == 1 and cell["mean"] == 0.3
    for column in ("std", "sem", "ci_low", "ci_high", "boot_ci_low", "boot_ci_high"):
        assert math.isnan(cell[column])


def test_bootstrap_of_example_a_delta_is_too_narrow():
    low, high = bootstrap_ci(np.array([0.06, 0.09, 0.06]), stable_rng(0, "delta"))
    assert (low, high) == (approx(0.06), approx(0.09))


def test_bootstrap_columns_are_deterministic():
    df = frame({"dense": [0.31, 0.28, 0.35, 0.30, 0.27], "lidas": [0.25, 0.27, 0.22, 0.26, 0.30]})
    columns = ["boot_ci_low", "boot_ci_high"]
    first, second = summarize(df)[columns], summarize(df)[columns]
    pd.testing.assert_frame_equal(first, second)
    assert first.notna().all().all()
    assert not summarize(df, seed=1)[columns].equals(first)  # the analysis seed is part of the key


def test_stable_rng_is_independent_of_python_hash():
    assert stable_rng(0, "tiny", "cell").integers(1 << 30) == stable_rng(0, "tiny", "cell").integers(1 << 30)
    assert stable_rng(0, "tiny", "cell").integers(1 << 30) != stable_rng(0, "tiny", "other").integers(1 << 30)


def test_duplicate_seed_rows_are_refused():
    df = pd.concat([frame({"dense": [0.3, 0.4]}), frame({"dense": [0.5]})])
    with pytest.raises(ValueError, match="differ in another config key"):
        summarize(df)


# ---- cells keyed by the varying config keys ----------------------------------------------------

def test_two_learning_rates_make_two_cells_per_family():
    cells = summarize(lr_sweep())
    assert len(cells) == 2 * 2
    assert list(cells.columns[:4]) == ["family", "size", LR, "metric"]
    lidas = one(cells, family="lidas", **{LR: 0.001})
    assert lidas["mean"] == approx(0.19) and (lidas["ci_low"], lidas["ci_high"]) == (approx(0.16516), approx(0.21484))
    assert lidas["n_seeds"] == 3 and lidas["seeds"] == "0,1,2"
    assert one(cells, family="dense", **{LR: 0.003})["mean"] == approx(0.20)


def test_comparisons_pair_within_the_same_learning_rate():
    table = compare(lr_sweep(), primary_metrics=("gsm8k",))
    assert list(table.columns[:5]) == ["family", "baseline", "size", LR, "metric"]
    low = one(table, **{LR: 0.001})
    assert low["n_pairs"] == 3 and low["diff_mean"] == approx(0.07) and low["p_value"] == approx(0.0198)
    high = one(table, **{LR: 0.003})
    alone = one(compare(frame(AT_HIGH_LR), primary_metrics=("gsm8k",)))
    for column in ("n_pairs", "diff_mean", "diff_std", "p_value", "ci_low", "ci_high", "welch_p", "seed_wins"):
        assert high[column] == approx(alone[column])


def test_a_setting_without_its_baseline_is_not_compared():
    df = lr_sweep()
    df = df[(df["family"] == "lidas") | (df[LR] == 0.003)]  # dense ran at lr 0.003 only
    assert cell_keys(df) == [LR]  # lr still varies within lidas
    row = one(compare(df, primary_metrics=("gsm8k",)))
    assert row[LR] == 0.003 and row["diff_mean"] == approx(one(compare(frame(AT_HIGH_LR)))["diff_mean"])


def test_holm_family_counts_every_family_size_and_setting():
    looped = {"looped": [0.15, 0.16, 0.12]}
    df = pd.concat([lr_sweep().assign(metric="regbench_tvd", higher_is_better=False),
                    frame(looped, metric="regbench_tvd", higher_is_better=False).assign(**{LR: 0.001}),
                    frame(looped, metric="regbench_tvd", higher_is_better=False).assign(**{LR: 0.003}),
                    lr_sweep(metric="regbench_acc")], ignore_index=True)
    table = compare(df)
    primary = table[table["correction"] == "holm"]
    assert len(primary) == 2 * 2 and set(primary["metric"]) == {"regbench_tvd"}  # {lidas, looped} x 2 lr
    np.testing.assert_allclose(primary["p_adj"], holm(primary["p_value"]), atol=1e-12)
    other = table[table["correction"] == "fdr_bh"]
    assert len(other) == 2 and set(other["metric"]) == {"regbench_acc"}


def test_keys_that_restate_the_family_or_cannot_change_results_do_not_split_cells():
    df = frame({**EXAMPLE_A, "looped": [0.15, 0.16, 0.12]})
    df["family.growth.alpha"] = np.where(df["family"] == "lidas", 1.0, np.nan)  # exists for lidas only
    df["model.n_layers"] = np.where(df["family"] == "looped", 2, 4)  # constant within each family
    df["cluster.num_cpus"] = df["seed"] + 1  # varies run by run, but only says where a run ran
    df["train.max_retries"] = df["seed"]
    assert cell_keys(df) == []
    assert list(summarize(df).columns[:3]) == ["family", "size", "metric"] and len(summarize(df)) == 3
    table = compare(df, primary_metrics=("gsm8k",))
    assert list(table["family"]) == ["lidas", "looped"] and set(table["n_pairs"]) == {3}
    assert one(table, family="lidas")["diff_mean"] == approx(0.07)


def test_a_family_key_varying_within_its_family_is_named_in_the_error():
    df = pd.concat([frame(EXAMPLE_A).assign(**{"family.growth.alpha": 1.0}),
                    frame({"lidas": [0.2, 0.2, 0.2]}).assign(**{"family.growth.alpha": 0.5})], ignore_index=True)
    df.loc[df["family"] == "dense", "family.growth.alpha"] = np.nan
    with pytest.raises(ValueError, match=r"differ in another config key \(family.growth.alpha\)"):
        compare(df)


def test_explicit_by_overrides_the_detection():
    df = lr_sweep()
    pd.testing.assert_frame_equal(summarize(df, by=[LR]), summarize(df))
    pd.testing.assert_frame_equal(compare(df, by=[LR]), compare(df))
    with pytest.raises(ValueError, match=r"seed=0 metric=gsm8k: the runs differ in another config key \(train.lr\)"):
        summarize(df, by=[])
    with pytest.raises(ValueError, match="does not have"):
        compare(df, by=["train.steps"])


# ---- (b) paired comparison ---------------------------------------------------------------------

def test_example_a_paired():
    row = one(compare(frame(EXAMPLE_A), primary_metrics=("gsm8k",)))
    assert row["family"] == "lidas" and row["baseline"] == "dense" and row["n_pairs"] == 3
    assert row["diff_mean"] == approx(0.07) and row["diff_std"] == approx(0.017321)
    assert row["p_value"] == approx(0.0198)
    assert (row["ci_low"], row["ci_high"]) == (approx(0.02697), approx(0.11303))
    assert row["dz"] == pytest.approx(4.04, abs=5e-3)
    assert row["welch_p"] == approx(0.00102) and row["welch_df"] == approx(4.0)
    assert (row["welch_low"], row["welch_high"]) == (approx(0.04733), approx(0.09267))
    assert row["signflip_p"] == approx(0.25) and row["p_min_attainable"] == approx(0.25)
    assert row["prob_improvement"] == 1.0 and row["mannwhitney_p"] == approx(0.10)
    assert row["seed_wins"] == 3
    assert (row["wins_low"], row["wins_high"]) == (pytest.approx(0.292, abs=1e-3), approx(1.0))
    assert row["seeds_dropped"] == "" and not row["single_seed"]


def test_example_a_seeds_needed():
    row = one(compare(frame(EXAMPLE_A), primary_metrics=("gsm8k",)))
    assert row["seeds_needed"] == 9 and row["seeds_more"] == 6
    assert row["seeds_needed_conservative"] == 29
    assert row["seeds_needed_observed"] == 3
    assert not row["sigma_pooled"] and row["sigma_df"] == 2


def test_example_b_lower_is_better():
    row = one(compare(frame(EXAMPLE_B, metric="regbench_tvd", higher_is_better=False)))
    assert row["diff_mean"] == approx(0.04333) and row["diff_std"] == approx(0.030551)
    assert row["p_value"] == approx(0.1333)
    assert (row["ci_low"], row["ci_high"]) == (approx(-0.03256), approx(0.11922))
    assert row["verdict"] == "inconclusive" and row["correction"] == "holm"
    assert row["seeds_needed_observed"] == 7


def test_direction_lower_is_better_candidate_higher_is_negative():
    worse = {"dense": [0.25, 0.27, 0.26], "lidas": [0.30, 0.28, 0.33]}
    row = one(compare(frame(worse, metric="regbench_tvd", higher_is_better=False)))
    assert row["diff_mean"] == approx(-0.04333) and row["seed_wins"] == 0


@pytest.mark.parametrize("swap, verdict", [(False, "better"), (True, "worse")])
def test_decisive_verdicts(swap, verdict):
    values = {"lidas": EXAMPLE_A["dense"], "dense": EXAMPLE_A["lidas"]} if swap else EXAMPLE_A
    assert one(compare(frame(values), primary_metrics=("gsm8k",)))["verdict"] == verdict


def test_equivalent_when_the_90_percent_ci_is_inside_the_margin():
    dense = [0.30, 0.28, 0.33]
    lidas = [d + e for d, e in zip(dense, [0.004, -0.003, 0.001])]
    row = one(compare(frame({"dense": dense, "lidas": lidas}, metric="regbench_tvd", higher_is_better=False)))
    assert -0.02 < row["tost_low"] < row["tost_high"] < 0.02
    assert row["verdict"] == "equivalent"


def test_unpaired_mode_uses_welch_and_pooled_std():
    row = one(compare(frame(EXAMPLE_A), pairing="unpaired", primary_metrics=("gsm8k",)))
    assert row["pairing"] == "unpaired"
    assert row["p_value"] == approx(0.00102) and row["p_value"] == row["welch_p"]
    assert (row["ci_low"], row["ci_high"]) == (approx(0.04733), approx(0.09267))
    assert row["diff_std"] == approx(0.01)  # pooled seed std of the two families
    assert row["seeds_needed"] == 6  # Example A, unpaired: 6 per family
    assert row["p_min_attainable"] == approx(0.10)  # Mann-Whitney, 3 vs 3


def test_seeds_without_a_partner_are_dropped():
    values = {"lidas": [*EXAMPLE_A["lidas"], 0.5], "dense": [*EXAMPLE_A["dense"], 0.0]}
    df = frame(values, seeds={"lidas": [0, 1, 2, 3], "dense": [0, 1, 2, 4]})
    row = one(compare(df, primary_metrics=("gsm8k",)))
    assert row["n_pairs"] == 3 and row["seeds_dropped"] == "3,4"
    assert row["diff_mean"] == approx(0.07) and row["p_value"] == approx(0.0198)
    assert row["n_candidate"] == 4 and row["n_baseline"] == 4


def test_single_seed_comparison_is_untestable():
    row = one(compare(frame({"lidas": [0.2], "dense": [0.1]}), primary_metrics=("gsm8k",)))
    assert row["single_seed"] and row["n_pairs"] == 1 and row["diff_mean"] == approx(0.1)
    assert math.isnan(row["p_value"]) and math.isnan(row["p_adj"])
    assert row["verdict"] == "inconclusive" and pd.isna(row["seeds_needed"])


def test_sigma_pooled_over_sizes_when_a_cell_has_few_pairs():
    df = pd.concat([frame(EXAMPLE_A, size="tiny"),
                    frame({"lidas": [0.18, 0.22], "dense": [0.12, 0.11]}, size="small")])
    table = compare(df, primary_metrics=("gsm8k",))
    small, tiny = one(table, size="small"), one(table, size="tiny")
    assert not tiny["sigma_pooled"] and tiny["sigma"] == approx(tiny["diff_std"])
    assert small["sigma_pooled"] and small["sigma_df"] == 3
    expected = math.sqrt((2 * tiny["diff_std"] ** 2 + small["diff_std"] ** 2) / 3)
    assert small["sigma"] == approx(expected)


def test_reference_metrics_are_not_compared():
    df = pd.concat([frame(EXAMPLE_B, metric="regbench_tvd", higher_is_better=False),
                    frame({"dense": [0.4] * 3, "lidas": [0.4] * 3}, metric="ngram1_tvd", higher_is_better=False)])
    assert set(compare(df)["metric"]) == {"regbench_tvd"}
    assert "ngram1_tvd" in set(summarize(df)["metric"])


# ---- (d) multiple comparisons ------------------------------------------------------------------

def test_example_d_corrections():
    p = [0.01, 0.04, 0.03, 0.20]
    np.testing.assert_allclose(holm(p), [0.04, 0.09, 0.09, 0.20], atol=TOL)
    np.testing.assert_allclose(adjust_pvalues(p, "hs"), [0.0394, 0.0873, 0.0873, 0.20], atol=TOL)
    np.testing.assert_allclose(adjust_pvalues(p, "fdr_bh"), [0.04, 0.0533, 0.0533, 0.20], atol=TOL)


def test_nan_p_values_stay_out_of_the_family():
    np.testing.assert_allclose(holm([0.01, np.nan, 0.04]), [0.02, np.nan, 0.04], atol=1e-12)


def test_holm_for_primary_metrics_and_bh_for_the_rest():
    df = pd.concat([
        frame({**EXAMPLE_B, "looped": [0.29, 0.27, 0.31]}, metric="regbench_tvd", higher_is_better=False),
        frame({**EXAMPLE_A, "looped": [0.14, 0.10, 0.15]}, metric="regbench_acc"),
    ])
    table = compare(df)
    primary = table[table["metric"] == "regbench_tvd"].sort_values("family")
    other = table[table["metric"] == "regbench_acc"].sort_values("family")
    assert set(primary["correction"]) == {"holm"} and set(other["correction"]) == {"fdr_bh"}
    np.testing.assert_allclose(primary["p_adj"], holm(primary["p_value"]), atol=1e-12)
    np.testing.assert_allclose(primary["p_holm"], primary["p_adj"], atol=1e-12)
    np.testing.assert_allclose(other["p_adj"], adjust_pvalues(other["p_value"], "fdr_bh"), atol=1e-12)
    assert other["p_holm"].isna().all()


# ---- (e) seeds needed --------------------------------------------------------------------------

@pytest.mark.parametrize("delta, n", [(0.02, 9), (0.01, 26), (0.03, 5), (0.07, 3)])
def test_example_a_seeds_needed_helper(delta, n):
    assert seeds_needed(0.017321, delta) == n


def test_seeds_needed_conservative_and_unpaired():
    assert seeds_needed(sigma_upper(0.017321, 2), 0.02) == 29
    assert seeds_needed(0.01, 0.02, paired=False) == 6
    assert seeds_needed(0.03055, 0.0433) == 7  # Example B
    assert seeds_needed(sigma_upper(0.03055, 2), 0.0433) == 20


@pytest.mark.parametrize("df, factor", [(2, 2.117), (4, 1.558), (9, 1.293)])
def test_sigma_upper_factors(df, factor):
    assert sigma_upper(1.0, df) == pytest.approx(factor, abs=1e-3)


def test_seeds_needed_limits():
    assert seeds_needed(0.5, 0.02) == SEEDS_MAX + 1  # "> 50: not resolvable by seeds alone"
    assert seeds_needed(0.0, 0.02) == 2
    assert seeds_needed(0.01, 0.0) == SEEDS_MAX + 1
    with pytest.raises(ValueError):
        seeds_needed(float("nan"), 0.02)


def test_unresolvable_flag_in_compare():
    df = frame({"lidas": [0.1, 0.5, 0.2], "dense": [0.4, 0.1, 0.3]}, metric="regbench_acc")
    row = one(compare(df))
    assert row["seeds_needed"] == SEEDS_MAX + 1 and row["seeds_unresolvable"] and pd.isna(row["seeds_more"])


def test_delta_min_per_metric():
    df = pd.concat([frame(EXAMPLE_A), frame({"lidas": [9.0, 9.5, 9.2], "dense": [10.0, 10.1, 9.9]},
                                             metric="final_loss", higher_is_better=False)])
    table = compare(df, primary_metrics=("gsm8k",), delta_min={"gsm8k": 0.02})
    assert one(table, metric="gsm8k")["seeds_needed"] == 9
    loss = one(table, metric="final_loss")
    assert math.isnan(loss["delta_min"]) and pd.isna(loss["seeds_needed"])
    assert loss["seeds_needed_observed"] >= 2


@pytest.mark.parametrize("n, p", [(3, 0.25), (4, 0.125), (5, 0.0625), (6, 0.03125)])
def test_p_min_signflip(n, p):
    assert p_min_signflip(n) == approx(p)


def test_p_min_mannwhitney():
    assert p_min_mannwhitney(3, 3) == approx(0.10)
    assert p_min_mannwhitney(4, 4) == pytest.approx(0.029, abs=1e-3)


# ---- (c) item-level columns of summarize and compare -------------------------------------------

def items_for(values: dict, n_items: int = 40, metric: str = "gsm8k", size: str = "tiny") -> pd.DataFrame:
    """Binary per-item outputs whose mean is each run's value in `values` (as frame() lays them out)."""
    rows = []
    for family, vs in values.items():
        for seed, value in enumerate(vs):
            correct = np.arange(n_items) < round(value * n_items)
            rows += [{"run_id": f"{family}-{size}-{seed}", "family": family, "size": size, "seed": seed,
                      "metric": metric, "item_id": i, "score": float(c), "weight": 1.0}
                     for i, c in enumerate(np.roll(correct, seed))]
    return pd.DataFrame(rows)


HB = ["hb_low", "hb_high", "hb_p", "hb_se_seeds", "hb_se_items"]
EXAMPLE_A_ITEMS = {"lidas": [0.2, 0.2, 0.175], "dense": [0.125, 0.1, 0.125]}  # Example A, 40 items a run


def test_compare_without_items_has_nan_hierarchical_columns():
    table = compare(frame(EXAMPLE_A), primary_metrics=("gsm8k",))
    at = list(table.columns).index("dz")
    assert list(table.columns[at:at + 7]) == ["dz", *HB, "sigma"]
    assert table[HB].isna().all().all()


def test_compare_with_items_matches_multibootstrap():
    df, items = frame(EXAMPLE_A_ITEMS), items_for(EXAMPLE_A_ITEMS)
    row = one(compare(df, primary_metrics=("gsm8k",), items=items, n_boot=500))
    hb = multibootstrap(items, "lidas", "dense", higher_is_better=True, n_boot=500)
    for column in HB:
        assert row[column] == hb[column]
    assert hb["hb_diff_mean"] == approx(row["diff_mean"], 1e-12)  # the items reproduce the run metrics
    assert row["hb_low"] < row["diff_mean"] < row["hb_high"] and 0 < row["hb_p"] < 1
    assert row["hb_se_items"] > 0 and row["hb_se_seeds"] > 0


def test_compare_items_only_fill_their_own_metric_and_cell():
    df = pd.concat([lr_sweep(), lr_sweep(metric="regbench_tvd", higher_is_better=False)], ignore_index=True)
    df["run_id"] = df["family"] + "-tiny-" + df["seed"].astype(str) + "-" + df[LR].astype(str)
    items = items_for(EXAMPLE_A_ITEMS)
    items["run_id"] = items["run_id"] + "-0.001"  # the lr comes from df, by run_id
    table = compare(df, primary_metrics=("gsm8k",), items=items, n_boot=200)
    filled = table[HB].notna().all(axis=1)
    assert list(table.loc[filled, "metric"]) == ["gsm8k"] and list(table.loc[filled, LR]) == [0.001]
    assert table.loc[~filled, HB].isna().all().all()
    with pytest.raises(ValueError, match="run_id to look them up"):
        compare(df.drop(columns="run_id"), items=items)


def test_summarize_item_noise():
    df, items = frame(EXAMPLE_A_ITEMS), items_for(EXAMPLE_A_ITEMS)
    cells = summarize(df, items=items)
    assert list(cells.columns[-3:]) == ["n_items", "item_se", "iqm"]
    lidas = one(cells, family="lidas")
    p = np.array(EXAMPLE_A_ITEMS["lidas"])
    assert lidas["n_items"] == 40 and lidas["item_se"] == approx(math.sqrt(np.mean(p * (1 - p) / 40)), 1e-12)
    plain = summarize(df)
    assert plain["n_items"].isna().all() and plain["item_se"].isna().all()
    pd.testing.assert_frame_equal(plain.drop(columns=["n_items", "item_se"]),
                                  cells.drop(columns=["n_items", "item_se"]))


# ---- verdict precedence, the confirmatory family, labels ---------------------------------------

def paired_frame(deltas, base=None, metric: str = "gsm8k", size: str = "tiny") -> pd.DataFrame:
    """dense at `base` (default a fixed spread around 0.3) and lidas = dense + deltas, seed by seed."""
    base = np.asarray(base if base is not None else 0.3 + 0.01 * np.sin(np.arange(len(deltas))), float)
    return frame({"dense": list(base), "lidas": list(base + np.asarray(deltas, float))}, metric=metric, size=size)


def test_a_significant_gap_inside_the_margin_is_equivalent_not_better():
    deltas = 0.005 + 0.002 * np.array([1, -1, 0.5, -0.5, 0, 1, -1, 0.3, -0.3, 0])
    row = one(compare(paired_frame(deltas), primary_metrics=("gsm8k",)))
    assert row["p_adj"] < 0.05 and row["ci_low"] > 0  # a real difference ...
    assert -0.02 < row["tost_low"] < row["tost_high"] < 0.02  # ... too small to matter
    assert row["significant"] and row["inside_margin"]
    assert row["verdict"] == "equivalent (negligible difference)"  # was "better"
    worse = one(compare(paired_frame(-deltas), primary_metrics=("gsm8k",)))
    assert worse["verdict"] == "equivalent (negligible difference)"


def test_verdict_rule_precedence():
    from analysis.stats import VERDICTS, verdict_rule
    #            p_adj  ci_low  ci_high tost_low tost_high delta_min
    cases = [((0.001, 0.002, 0.008, 0.003, 0.007, 0.02), "equivalent (negligible difference)"),
             ((0.001, 0.010, 0.050, 0.012, 0.048, 0.02), "better"),
             ((0.001, 0.002, 0.030, 0.004, 0.025, 0.02), "better"),  # significant, interval leaves the margin
             ((0.001, -0.05, -0.01, -0.048, -0.012, 0.02), "worse"),
             ((0.300, -0.005, 0.008, -0.004, 0.007, 0.02), "equivalent"),
             ((0.300, -0.030, 0.040, -0.025, 0.035, 0.02), "inconclusive"),
             ((0.001, 0.002, 0.008, 0.003, 0.007, np.nan), "better"),  # no margin declared: no equivalence
             ((np.nan, np.nan, np.nan, np.nan, np.nan, 0.02), "inconclusive")]
    got = verdict_rule(*np.array([c for c, _ in cases]).T, alpha=0.05)
    assert list(got) == [v for _, v in cases]
    assert set(got) <= set(VERDICTS)


def paired_verdicts(deltas: np.ndarray, alpha: float = 0.05, delta_min: float = 0.02) -> np.ndarray:
    """compare's verdict for one primary comparison per row of paired differences, vectorised: the
    paired t-test, its 1 - alpha and 1 - 2 alpha intervals and `verdict_rule` (Holm over one p is p)."""
    from analysis.stats import verdict_rule
    n = deltas.shape[1]
    mean, se = deltas.mean(1), deltas.std(1, ddof=1) / math.sqrt(n)
    p = 2 * stats.t.sf(np.abs(mean / se), n - 1)
    half, tost_half = stats.t.ppf(1 - alpha / 2, n - 1) * se, stats.t.ppf(1 - alpha, n - 1) * se
    return verdict_rule(p, mean - half, mean + half, mean - tost_half, mean + tost_half, delta_min, alpha)


def test_a_negligible_gap_is_never_called_plain_better():
    """0.005 against a 0.02 margin, 12 paired seeds with seed noise 0.006 in the difference: significant
    about 3 times in 4, which compare used to label "better"; with enough seeds the 90% interval stays
    inside the margin, so the verdict is equivalent (negligible difference) or equivalent. compare on
    12 simulated sweeps, and its rule vectorised over 20,000 (checked against compare on the 12)."""
    rng = np.random.default_rng(12)
    deltas = 0.005 + 0.006 * rng.standard_normal((20_000, 12))
    base = 0.3 + 0.02 * rng.standard_normal((12, 12))
    verdicts = [one(compare(paired_frame(d, b), primary_metrics=("gsm8k",)))["verdict"] for d, b in zip(deltas, base)]
    vectorised = paired_verdicts(deltas)
    assert verdicts == list(vectorised[:12])
    counts = pd.Series(vectorised).value_counts()
    assert "better" not in counts and "worse" not in counts
    assert counts["equivalent (negligible difference)"] / len(deltas) == pytest.approx(0.75, abs=0.05)
    assert set(counts.index) == {"equivalent (negligible difference)", "equivalent"}


CONFIRMATORY = {"regbench_tvd": False, "induction_max": True, "ablation_drop_f1": True}


def claims_sweep() -> pd.DataFrame:
    rng = np.random.default_rng(4)
    frames = []
    for metric, higher in {**CONFIRMATORY, "gsm8k": True, "final_loss": False}.items():
        base = 0.3 + 0.02 * rng.standard_normal(4)
        values = {"dense": list(base), "lidas": list(base + 0.02 + 0.01 * rng.standard_normal(4)),
                  "looped": list(base + 0.01 * rng.standard_normal(4))}
        frames.append(frame(values, metric=metric, higher_is_better=higher))
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("confirmatory", [
    ("regbench_tvd", "induction_max", "ablation_drop_f1"),
    {"ablation_drop_f1", "induction_max", "regbench_tvd"},
    {"regbench": "regbench_tvd", "induction": ["induction_max"], "ablation": ("ablation_drop_f1",)},
])
def test_several_confirmatory_metrics_share_one_holm_family(confirmatory):
    table = compare(claims_sweep(), primary_metrics=confirmatory)
    holm_rows = table[table["correction"] == "holm"]
    assert set(holm_rows["metric"]) == set(CONFIRMATORY) and len(holm_rows) == 3 * 2  # x {lidas, looped}
    np.testing.assert_allclose(holm_rows["p_adj"], holm(holm_rows["p_value"]), atol=1e-12)
    np.testing.assert_allclose(holm_rows["p_holm"], holm_rows["p_adj"], atol=1e-12)
    rest = table[table["correction"] == "fdr_bh"]
    assert set(rest["metric"]) == {"gsm8k", "final_loss"} and rest["p_holm"].isna().all()
    np.testing.assert_allclose(rest["p_adj"], adjust_pvalues(rest["p_value"], "fdr_bh"), atol=1e-12)


def test_confirmatory_metrics_forms():
    from analysis.stats import confirmatory_metrics
    assert confirmatory_metrics("gsm8k") == ("gsm8k",)
    assert confirmatory_metrics(["a", "b", "a"]) == ("a", "b")
    assert confirmatory_metrics({"b", "a"}) == ("a", "b")
    assert confirmatory_metrics({"gsm8k": "gsm8k", "regbench": ["regbench_tvd", "regbench_acc"]}) == \
        ("gsm8k", "regbench_tvd", "regbench_acc")
    with pytest.raises(ValueError, match="metric names"):
        confirmatory_metrics([1, 2])
    one_name = compare(frame(EXAMPLE_A), primary_metrics="gsm8k")
    assert list(one_name["correction"]) == ["holm"]  # a single name is not read letter by letter


def test_hierarchical_p_is_labelled_one_sided():
    table = compare(frame(EXAMPLE_A_ITEMS), primary_metrics=("gsm8k",), items=items_for(EXAMPLE_A_ITEMS), n_boot=200)
    assert one(table)["hb_p_sided"] == "one-sided"
    assert list(compare(frame(EXAMPLE_A))["hb_p_sided"]) == ["one-sided"]


def test_skewed_cells_are_flagged():
    from analysis.stats import is_skewed, skew_threshold
    symmetric = list(np.linspace(0.1, 0.5, 10))
    outlier = [0.10, 0.11, 0.10, 0.12, 0.11, 0.10, 0.11, 0.12, 0.10, 0.60]  # one seed far above the rest
    cells = summarize(pd.concat([frame({"dense": symmetric}), frame({"lidas": outlier}),
                                 frame({"looped": [0.1, 0.1, 0.9]})]))
    assert not one(cells, family="dense")["skewed"] and one(cells, family="dense")["skewness"] == approx(0.0)
    lidas = one(cells, family="lidas")
    assert lidas["skewed"] and lidas["skewness"] > skew_threshold(10) == pytest.approx(1.374, abs=1e-3)
    assert not one(cells, family="looped")["skewed"]  # 3 seeds: skew cannot be told from noise
    assert skew_threshold(4) == math.inf and skew_threshold(50) == 1.0
    assert not is_skewed(np.full(6, 0.2))
    rng = np.random.default_rng(0)  # normal seeds are flagged about 5% of the time at 10 seeds
    assert np.mean([is_skewed(x) for x in rng.standard_normal((1000, 10))]) == pytest.approx(0.05, abs=0.02)


def test_skewed_differences_are_flagged_in_compare():
    deltas = [0.01, 0.011, 0.01, 0.012, 0.011, 0.01, 0.011, 0.012, 0.01, 0.2]
    assert one(compare(paired_frame(deltas)))["diff_skewed"]
    assert not one(compare(paired_frame(np.linspace(-0.01, 0.03, 10))))["diff_skewed"]
    assert not one(compare(frame(EXAMPLE_A)))["diff_skewed"]


@pytest.mark.parametrize("n, approximate, reliable", [(3, True, False), (10, True, True), (19, True, True),
                                                      (20, False, True)])
def test_bca_is_flagged_approximate_below_20_seeds(n, approximate, reliable):
    cell = one(summarize(frame({"dense": list(np.linspace(0.1, 0.2, n))}), n_boot=199))
    assert cell["boot_approximate"] == approximate and cell["boot_reliable"] == reliable
