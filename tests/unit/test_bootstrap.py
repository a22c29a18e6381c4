"""The hierarchical seed x item bootstrap (docs/statistics.md, c): Example C exactly and by Monte
Carlo, the exact enumeration against a direct transcription of the definition, and item noise."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.bootstrap import item_noise, multibootstrap

EXAMPLE_C = {"lidas": [[1, 0, 1], [1, 1, 0]], "dense": [[0, 0, 1], [1, 0, 0]]}


def item_table(scores: dict, weight=None, cluster=None, metric: str = "gsm8k", size: str = "tiny",
               seeds: dict | None = None) -> pd.DataFrame:
    """The table of analysis.load_items for {family: [[score per item] per seed]} (seeds 0.. unless
    given), every item with weight[i] (default 1) and, when given, cluster[i]."""
    seeds = seeds or {}
    rows = [{"run_id": f"{family}-{seed}", "family": family, "size": size, "seed": seed, "metric": metric,
             "item_id": f"q{i}", "score": float(score), "weight": 1.0 if weight is None else float(weight[i]),
             **({} if cluster is None else {"cluster_id": cluster[i]})}
            for family, runs in scores.items()
            for seed, run in zip(seeds.get(family, range(len(runs))), runs) for i, score in enumerate(run)]
    return pd.DataFrame(rows)


def definition(scores: dict, weight, cluster, candidate: str, baseline: str, paired: bool):
    """Every equally likely draw of the hierarchical bootstrap, straight from its definition: seeds
    with replacement (one draw for both families when paired), clusters with replacement, a seed's
    score the weighted mean of the items in the drawn clusters. Returns (crossed, seeds only, items only)."""
    y = {f: np.asarray(v, float) for f, v in scores.items()}
    w = np.asarray(weight, float)
    groups = [np.flatnonzero(np.asarray(cluster) == c) for c in sorted(set(cluster))]

    def family(f, seed_draw, cluster_draw):
        items = np.concatenate([groups[g] for g in cluster_draw])
        return np.mean([np.sum(w[items] * y[f][s, items]) / np.sum(w[items]) for s in seed_draw])

    def seed_draws(f):
        n = len(y[f])
        return list(itertools.product(range(n), repeat=n))

    seed_pairs = ([(d, d) for d in seed_draws(candidate)] if paired
                  else list(itertools.product(seed_draws(candidate), seed_draws(baseline))))
    cluster_draws = list(itertools.product(range(len(groups)), repeat=len(groups)))
    every_seed = (range(len(y[candidate])), range(len(y[baseline])))
    every_cluster = range(len(groups))

    def delta(seed_pair, cluster_draw):
        return family(candidate, seed_pair[0], cluster_draw) - family(baseline, seed_pair[1], cluster_draw)

    return (np.array([delta(p, c) for p in seed_pairs for c in cluster_draws]),
            np.array([delta(p, every_cluster) for p in seed_pairs]),
            np.array([delta(every_seed, c) for c in cluster_draws]))


def studentised(scores: dict, weight, candidate: str, baseline: str, paired: bool, item_se: float) -> float:
    """statistics.md (c)'s hb_p from its definition: each seed's pooled score on every item; the gap
    over sqrt(var of the seeds' gaps / n + item_se^2) (unpaired: each family's seed variance / its
    seeds), one-sided against Student's t with n - 1 df (unpaired: the smaller family's)."""
    w = np.asarray(weight, float)
    pooled = {f: np.asarray(v, float) @ w / w.sum() for f, v in scores.items()}
    parts = [pooled[candidate] - pooled[baseline]] if paired else [pooled[candidate], pooled[baseline]]
    if min(len(x) for x in parts) < 2:
        return math.nan
    gap = pooled[candidate].mean() - pooled[baseline].mean()
    se = math.sqrt(sum(np.var(x, ddof=1) / len(x) for x in parts) + item_se**2)
    return stats.t.sf(gap / se, min(len(x) for x in parts) - 1)


# ---- Example C --------------------------------------------------------------------------------

def test_example_c_exact():
    hb = multibootstrap(item_table(EXAMPLE_C), "lidas", higher_is_better=True, exact=True)
    assert hb["hb_n_boot"] == 108 and hb["hb_n_items"] == 3 and hb["hb_n_units"] == 3
    assert hb["hb_diff_mean"] == pytest.approx(1 / 3, abs=1e-6)
    assert hb["hb_boot_mean"] == pytest.approx(1 / 3, abs=1e-6)
    assert hb["hb_se"] == pytest.approx(0.215166, abs=1e-6)
    assert hb["hb_se_seeds"] == pytest.approx(0, abs=1e-12)  # both seeds gain exactly 1/3
    assert hb["hb_se_items"] == pytest.approx(math.sqrt(1 / 54), abs=1e-12)  # 0.5 (u1 + u2) / 3, u1 + u2 ~ B(3, 2/3)
    # one-sided p: the seeds agree, so the gap is studentised by the items alone, T = sqrt(6), 1 df
    assert hb["hb_p"] == pytest.approx(0.123376, abs=1e-6)
    assert hb["hb_p"] == pytest.approx(stats.t.sf(math.sqrt(6), 1), abs=1e-12)
    assert (hb["hb_low"], hb["hb_high"]) == (pytest.approx(0.0), pytest.approx(2 / 3))


def test_example_c_monte_carlo():
    hb = multibootstrap(item_table(EXAMPLE_C), "lidas", higher_is_better=True, n_boot=20_000)
    assert hb["hb_n_boot"] == 20_000 and hb["hb_diff_mean"] == pytest.approx(1 / 3, abs=1e-12)
    assert hb["hb_se"] == pytest.approx(0.215166, abs=0.005)
    assert hb["hb_p"] == pytest.approx(0.123376, abs=0.01)
    assert hb["hb_boot_mean"] == pytest.approx(1 / 3, abs=0.01)


@pytest.mark.parametrize("pairing", ["paired", "unpaired"])
def test_exact_enumeration_follows_the_definition(pairing):
    scores = {"lidas": [[0.9, 0.2, 0.4, 0.7], [0.5, 0.1, 0.8, 0.3]],
              "dense": [[0.3, 0.6, 0.2, 0.5], [0.1, 0.4, 0.6, 0.2]]}
    if pairing == "unpaired":
        scores["dense"] = scores["dense"][:1]  # 2^2 * 1^1 * 3^3 draws
    weight, cluster = [3, 1, 2, 5], ["a", "b", "a", "c"]
    items = item_table(scores, weight, cluster, metric="regbench_tvd")
    hb = multibootstrap(items, "lidas", higher_is_better=False, pairing=pairing, exact=True, delta_min=0.05)
    crossed, seeds_only, items_only = definition(scores, weight, cluster, "dense", "lidas", pairing == "paired")
    assert hb["hb_n_boot"] == len(crossed) and hb["hb_n_units"] == 3 and hb["hb_n_items"] == 4
    assert hb["hb_boot_mean"] == pytest.approx(crossed.mean(), abs=1e-12)
    assert hb["hb_se"] == pytest.approx(crossed.std(), abs=1e-12)
    assert hb["hb_se_seeds"] == pytest.approx(seeds_only.std(), abs=1e-12)
    assert hb["hb_se_items"] == pytest.approx(items_only.std(), abs=1e-12)
    expected = studentised(scores, weight, "dense", "lidas", pairing == "paired", items_only.std())
    assert hb["hb_p"] == pytest.approx(expected, abs=1e-12, nan_ok=True)
    assert np.isnan(hb["hb_p"]) == (pairing == "unpaired")  # dense has one seed there: no seed variance
    assert hb["hb_p_ge_delta"] == pytest.approx(np.mean(crossed >= 0.05), abs=1e-12)
    low, high = np.quantile(crossed, [0.025, 0.975])
    assert (hb["hb_low"], hb["hb_high"]) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))


def test_exact_refuses_too_many_draws():
    items = item_table({"lidas": [[1, 0, 1, 1, 0, 1, 0]] * 2, "dense": [[0, 0, 1, 1, 0, 0, 0]] * 2})
    with pytest.raises(ValueError, match="exact=True would enumerate"):
        multibootstrap(items, "lidas", higher_is_better=True, exact=True)  # 2^2 * 7^7 draws


# ---- point estimate, direction, pairing -------------------------------------------------------

def random_items(rng: np.random.Generator, n_seeds: int = 4, n_items: int = 30, metric: str = "regbench_tvd"):
    """Weighted per-instance scores for dense and lidas, with weights (positions) shared by all runs."""
    weight = rng.integers(1, 40, n_items)
    scores = {f: rng.random((n_seeds, n_items)) * 0.5 + shift for f, shift in (("dense", 0.3), ("lidas", 0.25))}
    return item_table(scores, weight, metric=metric), weight


def test_point_estimate_is_the_difference_of_pooled_run_metrics():
    items, _ = random_items(np.random.default_rng(1))
    # the run metric pools positions: the weight-weighted mean of its items' scores
    runs = (items.groupby(["family", "size", "seed", "metric"])
            .apply(lambda r: np.average(r["score"], weights=r["weight"]), include_groups=False)
            .rename("value").reset_index())
    by_family = runs.pivot(index="seed", columns="family", values="value")
    hb = multibootstrap(items, "lidas", higher_is_better=False)
    assert hb["hb_diff_mean"] == pytest.approx((by_family["dense"] - by_family["lidas"]).mean(), abs=1e-12)
    lower_is_worse = multibootstrap(items, "lidas", higher_is_better=True)
    assert lower_is_worse["hb_diff_mean"] == pytest.approx(-hb["hb_diff_mean"], abs=1e-12)
    assert lower_is_worse["hb_low"] == pytest.approx(-hb["hb_high"], abs=1e-12)  # the same draws, mirrored


def test_direction_from_the_table_and_metric_selection():
    items, _ = random_items(np.random.default_rng(2))
    both = pd.concat([items, items.assign(metric="regbench_acc", score=1 - items["score"])])
    with pytest.raises(ValueError, match="values of metric"):
        multibootstrap(both, "lidas", higher_is_better=False)
    with pytest.raises(ValueError, match="pass higher_is_better"):
        multibootstrap(both, "lidas", metric="regbench_tvd")
    declared = both.assign(higher_is_better=both["metric"] == "regbench_acc")
    tvd = multibootstrap(declared, "lidas", metric="regbench_tvd")
    assert tvd == multibootstrap(items, "lidas", higher_is_better=False)


def test_deterministic_under_the_analysis_seed():
    items, _ = random_items(np.random.default_rng(3))
    first = multibootstrap(items, "lidas", higher_is_better=False, n_boot=500)
    assert first == multibootstrap(items, "lidas", higher_is_better=False, n_boot=500)
    assert first != multibootstrap(items, "lidas", higher_is_better=False, n_boot=500, seed=1)


def test_unpaired_uses_every_seed_and_paired_only_matched_ones():
    scores = {"lidas": [[0.9, 0.8], [0.7, 0.6], [0.1, 0.1]], "dense": [[0.5, 0.4], [0.3, 0.2]]}
    items = item_table(scores, seeds={"lidas": [0, 1, 7], "dense": [0, 1]})
    paired = multibootstrap(items, "lidas", higher_is_better=True, n_boot=200)
    unpaired = multibootstrap(items, "lidas", higher_is_better=True, pairing="unpaired", n_boot=200)
    assert paired["hb_diff_mean"] == pytest.approx(0.4)  # seed 7 has no partner
    assert unpaired["hb_diff_mean"] == pytest.approx((0.85 + 0.65 + 0.1) / 3 - 0.35)
    with pytest.raises(ValueError, match="pairing"):
        multibootstrap(items, "lidas", higher_is_better=True, pairing="matched")


def test_p_value_of_identical_seeds_comes_from_the_items():
    """Every seed scores alike: the gap is studentised by the item spread alone, with the seeds' df
    (no draw is <= 0 here, so the share of such draws, hb_p's former reading, said 1/draws)."""
    items = item_table({"lidas": [[1, 1, 1, 0.5]] * 3, "dense": [[0, 0, 0, 0]] * 3})
    hb = multibootstrap(items, "lidas", higher_is_better=True, n_boot=400)
    assert hb["hb_p"] == pytest.approx(stats.t.sf(0.875 / hb["hb_se_items"], 2), abs=1e-12)
    assert 1 / 400 < hb["hb_p"] < 0.05 and hb["hb_p_ge_delta"] == 1.0


def test_p_value_without_any_spread_or_seeds():
    """No spread at all: 0 for a positive gap, 1 otherwise; one seed: NaN, never a number."""
    ahead = item_table({"lidas": [[1, 1]] * 3, "dense": [[0, 0]] * 3})
    assert multibootstrap(ahead, "lidas", higher_is_better=True, n_boot=50)["hb_p"] == 0.0
    assert multibootstrap(ahead, "lidas", higher_is_better=False, n_boot=50)["hb_p"] == 1.0
    level = item_table({"lidas": [[1, 0]] * 3, "dense": [[1, 0]] * 3})
    assert multibootstrap(level, "lidas", higher_is_better=True, n_boot=50)["hb_p"] == 1.0
    one_seed = item_table({"lidas": [[1, 0, 1]], "dense": [[0, 0, 1]]})
    assert math.isnan(multibootstrap(one_seed, "lidas", higher_is_better=True, n_boot=50)["hb_p"])


def test_variance_breakdown_names_the_source_of_noise():
    rng = np.random.default_rng(4)
    shared = rng.random(200)  # both families score the same items alike: only seed offsets differ
    seed_noise = {f: [shared + offset for offset in rng.normal(0, 0.05, 5)] for f in ("lidas", "dense")}
    hb = multibootstrap(item_table(seed_noise), "lidas", higher_is_better=True)
    assert hb["hb_se_items"] == pytest.approx(0, abs=1e-12) and hb["hb_se_seeds"] > 0.01
    item_effect = rng.normal(0, 0.3, 200)  # lidas gains an item-dependent amount, the same for every seed
    item_noise_only = {"lidas": [shared + item_effect] * 5, "dense": [shared] * 5}
    hb = multibootstrap(item_table(item_noise_only), "lidas", higher_is_better=True)
    assert hb["hb_se_seeds"] == pytest.approx(0, abs=1e-12)
    assert hb["hb_se_items"] == pytest.approx(0.3 / math.sqrt(200), rel=0.2)
    assert hb["hb_se"] == pytest.approx(hb["hb_se_items"], rel=0.1)


def test_items_some_run_lacks_are_left_out():
    items = item_table({"lidas": [[1, 0, 1], [1, 1, 0]], "dense": [[0, 0, 1], [1, 0, 0]]})
    items = items.drop(items.index[(items["family"] == "dense") & (items["seed"] == 1) & (items["item_id"] == "q2")])
    hb = multibootstrap(items, "lidas", higher_is_better=True, n_boot=100)
    assert hb["hb_n_items"] == 2 and hb["hb_diff_mean"] == pytest.approx((0.5 - 0) / 2 + (1 - 0.5) / 2)


def test_no_shared_seed_gives_nan():
    items = item_table({"lidas": [[1, 0]], "dense": [[0, 0]]}, seeds={"lidas": [1], "dense": [0]})
    hb = multibootstrap(items, "lidas", higher_is_better=True)
    assert math.isnan(hb["hb_low"]) and math.isnan(hb["hb_se"]) and hb["hb_n_boot"] == 0


@pytest.mark.parametrize("change, message", [
    (lambda t: pd.concat([t, t.assign(size="small")]), "values of size"),
    (lambda t: pd.concat([t, t.iloc[:1]]), "scores item 'q0' twice"),
    (lambda t: t.assign(weight=np.where(t["seed"] == 0, 1.0, 2.0)), "weight differs across runs"),
    (lambda t: t.assign(cluster_id=np.where(t["item_id"] == "q0", None, "a")), "cluster_id is missing"),
    (lambda t: t.assign(cluster_id=t["seed"].astype(str)), "several clusters"),
    (lambda t: t.drop(columns="weight"), "lacks columns"),
])
def test_malformed_tables_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        multibootstrap(change(item_table(EXAMPLE_C)), "lidas", higher_is_better=True)


# ---- item noise of one run -------------------------------------------------------------------

def test_item_noise_of_a_proportion():
    correct = np.zeros(1319)
    correct[:round(0.19 * 1319)] = 1  # p = 0.19 on GSM8K's 1319 problems
    noise = item_noise(item_table({"lidas": [correct]}))
    row = noise.iloc[0]
    p = round(0.19 * 1319) / 1319
    assert row["n_items"] == 1319 and row["item_se"] == pytest.approx(math.sqrt(p * (1 - p) / 1319), abs=1e-12)
    assert row["item_se"] == pytest.approx(0.0108, abs=1e-4)  # 1.08 points


def test_item_noise_of_a_pooled_mean():
    rng = np.random.default_rng(5)
    y = rng.random(50)
    unit = item_noise(item_table({"dense": [y]}, metric="regbench_tvd")).iloc[0]
    assert unit["item_se"] == pytest.approx(np.std(y, ddof=1) / math.sqrt(50), abs=1e-12)
    w = rng.integers(1, 20, 50)
    mean = np.average(y, weights=w)
    expected = math.sqrt(50 / 49 * np.sum((w * (y - mean)) ** 2)) / w.sum()
    assert item_noise(item_table({"dense": [y]}, w)).iloc[0]["item_se"] == pytest.approx(expected, abs=1e-12)


def test_item_noise_with_clusters_sums_residuals_per_cluster():
    y, cluster = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), ["a", "a", "b", "b", "c", "c"]
    row = item_noise(item_table({"dense": [y]}, cluster=cluster)).iloc[0]
    residuals = np.array([0.0, 1.0, -1.0])  # per cluster: the sum of y - 0.5
    assert row["item_se"] == pytest.approx(math.sqrt(3 / 2 * np.sum(residuals**2)) / 6, abs=1e-12)
