"""Before a sweep runs (docs/statistics.md, "Before a sweep: what its seeds can detect"): the
comparisons a grid will make, a pilot's seed sd, and the dry run's lines of the smallest difference
each comparison detects at 80% power under Holm; an unknown sd is "unknown", never a number."""

import math
import re

import numpy as np
import pandas as pd
import pytest

from analysis.planning import SeedSd, detectable_lines, pilot_sd, planned_comparisons
from analysis.stats import compare, effect_for_power, mde, pooled_std
from test_stats import EXAMPLE_A, frame


def arms(rows: list[dict]) -> pd.DataFrame:
    """Planned run configs apart from the seed: family, size, dotted config keys, seeds."""
    return pd.DataFrame([{"train.lr": 0.001, "model.n_layers": 4, "data.kind": "regbench", **row} for row in rows])


def test_planned_comparisons_pair_each_family_with_the_baseline_per_cell():
    """A swept train.lr splits cells; a family's own keys (family.growth.alpha, looped's depth) and
    the adaptive section do not. n_pairs: the seeds both arms plan."""
    rows = []
    for lr in (0.001, 0.003):
        for size in ("tiny", "small"):
            rows += [{"family": "dense", "size": size, "train.lr": lr, "seeds": frozenset({0, 1})},
                     {"family": "lidas", "size": size, "train.lr": lr, "family.growth.alpha": 1.0,
                      "seeds": frozenset({0, 1, 2})},
                     {"family": "looped", "size": size, "train.lr": lr, "model.n_layers": 2,
                      "adaptive.seed_sd": "{}", "seeds": frozenset({5})}]
    table = planned_comparisons(arms(rows), "dense")
    assert list(table.columns) == ["family", "baseline", "size", "train.lr", "n_pairs"]
    assert len(table) == 8 and set(table["baseline"]) == {"dense"}
    assert set(table.loc[table["family"] == "lidas", "n_pairs"]) == {2}  # seed 2 has no partner
    assert set(table.loc[table["family"] == "looped", "n_pairs"]) == {0}


def test_arms_with_the_same_cell_join_their_seeds_and_no_baseline_means_no_comparison():
    rows = [{"family": "dense", "size": "tiny", "seeds": frozenset({0, 1})},
            {"family": "dense", "size": "tiny", "seeds": frozenset({2})},  # the same config, more seeds
            {"family": "lidas", "size": "tiny", "seeds": frozenset({0, 1, 2})},
            {"family": "lidas", "size": "small", "seeds": frozenset({0, 1, 2})}]  # no dense at small
    table = planned_comparisons(arms(rows), "dense")
    assert table[["family", "size", "n_pairs"]].values.tolist() == [["lidas", "tiny", 3]]
    assert planned_comparisons(arms(rows), "looped").empty


def test_pilot_sd_pools_the_paired_differences_over_comparisons():
    """Example A's differences have sd 0.017321 on 2 df; a second size with its own differences is
    pooled with it by degrees of freedom, as `pooled_std` pools."""
    tiny = frame(EXAMPLE_A, metric="regbench_acc")
    assert pilot_sd(tiny, ["regbench_acc"], "dense") == {
        "regbench_acc": (pytest.approx(0.017321, abs=1e-6), 2, 1)}
    small = frame({"dense": [0.1, 0.2, 0.3, 0.4], "lidas": [0.15, 0.2, 0.38, 0.41]}, metric="regbench_acc",
                  size="small")
    both = pd.concat([tiny, small])
    sd, df, k = pilot_sd(both, ["regbench_acc", "induction_max"], "dense")["regbench_acc"]
    table = compare(both, primary_metrics=("regbench_acc",))
    assert (sd, df, k) == (pytest.approx(pooled_std(table["diff_std"], table["n_pairs"])[0], abs=1e-12), 5, 2)
    assert "induction_max" not in pilot_sd(both, ["regbench_acc", "induction_max"], "dense")  # not measured


def test_pilot_sd_of_single_pairs_is_nan():
    single = frame({"dense": [0.3, 0.2], "lidas": [0.4, math.nan]}, metric="regbench_acc")
    sd, df, k = pilot_sd(single, ["regbench_acc"], "dense")["regbench_acc"]
    assert math.isnan(sd) and df == 0 and k == 1


def comparisons(n_pairs: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"family": [f"f{i}" for i in range(len(n_pairs))], "baseline": "dense", "size": "tiny",
                         "n_pairs": n_pairs})


def number_after(line: str, marker: str) -> float:
    return float(re.search(re.escape(marker) + r"(-?[\d.]+(?:e[-+]?\d+)?)", line).group(1))


def test_the_detectable_difference_is_mde_at_holms_first_step():
    """2 comparisons x 2 metrics: Holm over m = 4 starts at 0.05 / 4; with 3 seeds and a declared sd of
    0.02 the detectable difference is mde(0.02, 3, 0.0125) = 0.1309, and in sd units 6.546."""
    sds = {"regbench_tvd": SeedSd(0.02, "declared in adaptive.seed_sd"),
           "induction_max": SeedSd(0.05, "from the pilot (sweep x: 2 comparisons with dense, 4 df)")}
    lines = detectable_lines(comparisons([3, 3]), ["regbench_tvd", "induction_max"], sds)
    assert lines[0] == ("detectable at 80% power with 3 seeds: |difference| >= 0.131 on regbench_tvd (2 comparisons"
                        " with dense; 6.55 x seed sd 0.02 declared in adaptive.seed_sd, Holm level 0.0125 = 0.05/4)")
    assert number_after(lines[0], ">= ") == pytest.approx(mde(0.02, 3, 0.05 / 4), rel=2e-3)
    assert number_after(lines[1], ">= ") == pytest.approx(mde(0.05, 3, 0.05 / 4), rel=2e-3)
    assert "seed sd 0.05 from the pilot (sweep x" in lines[1]


def test_an_adaptive_sweep_plans_s_max_at_alpha_over_looks_and_comparisons():
    lines = detectable_lines(comparisons([8, 8, 8]), ["regbench_tvd"], {"regbench_tvd": SeedSd(0.02, "declared")},
                             alpha=0.05, n_looks=3, seeds_note=" (adaptive.max_seeds, the last look)")
    assert lines == [f"detectable at 80% power with 8 seeds (adaptive.max_seeds, the last look): |difference| >="
                     f" {mde(0.02, 8, 0.05 / 9):.3g} on regbench_tvd (3 comparisons with dense;"
                     f" {effect_for_power(8, 0.05 / 9):.3g} x seed sd 0.02 declared, Holm level 0.00556 ="
                     f" 0.05/3 looks/3)"]


def test_an_unknown_sd_is_unknown_never_a_number():
    """No pilot and nothing declared (a NaN sd): the line says "unknown" and why; the only number is
    the effect in units of the seed sd."""
    unknown = SeedSd(math.nan, "no pilot, adaptive.seed_sd.regbench_tvd unset")
    (line,) = detectable_lines(comparisons([3]), ["regbench_tvd"], {"regbench_tvd": unknown})
    assert line == ("detectable at 80% power with 3 seeds: |difference| on regbench_tvd unknown (no pilot,"
                    " adaptive.seed_sd.regbench_tvd unset); it is 3.26 x the seed sd of the difference (1 comparison"
                    " with dense, Holm level 0.05 = 0.05/1)")
    assert ">=" not in line and "nan" not in line.lower()
    (line,) = detectable_lines(comparisons([3]), ["regbench_tvd"], {})  # no entry at all: unknown as well
    assert "|difference| on regbench_tvd unknown (unknown)" in line and ">=" not in line


def test_fewer_than_two_seeds_detect_nothing_and_do_not_count_towards_holm():
    lines = detectable_lines(comparisons([1, 3]), ["regbench_tvd"], {"regbench_tvd": SeedSd(0.02, "declared")})
    assert lines[0] == ("detectable with 1 seed: nothing on regbench_tvd (1 comparison with dense: a test needs 2"
                        " seeds of both families)")
    assert "Holm level 0.05 = 0.05/1" in lines[1]  # the untestable comparison is not in m
    assert detectable_lines(comparisons([]), ["regbench_tvd"], {})[0].startswith("detectable: nothing to compare")


def test_the_printed_difference_is_found_with_80_percent_power():
    """Simulated comparisons at the dry run's numbers (m = 4, 5 paired seeds, seed sd 0.02) with the
    true gap at the printed difference: the paired t-test at Holm's first-step level alpha / m finds
    it in 80% of them (Holm rejects at least those), within Monte Carlo error and the 3 digits printed."""
    from scipy import stats
    line = detectable_lines(comparisons([5] * 4), ["regbench_acc"], {"regbench_acc": SeedSd(0.02, "declared")})[0]
    gap = number_after(line, ">= ")
    diffs = gap + 0.02 * np.random.default_rng(0).standard_normal((40_000, 5))
    t = diffs.mean(-1) / (diffs.std(-1, ddof=1) / np.sqrt(5))
    found = ((2 * stats.t.sf(np.abs(t), 4) < 0.05 / 4) & (t > 0)).mean()
    assert found == pytest.approx(0.8, abs=0.01)
