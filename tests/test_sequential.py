"""The group-sequential stopping rule (design/statistics.md, f): Example A at look 1 of 3, and
decisive, equivalent, futile and inconclusive stops on synthetic sweeps."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis import holm, next_seeds
from test_stats import EXAMPLE_A, approx, frame, one

DENSE = [0.30, 0.28, 0.33, 0.31, 0.29, 0.32, 0.30, 0.27]
PRIMARY = {"primary_metrics": ("regbench_acc",)}


def sweep(deltas: dict, n: int) -> pd.DataFrame:
    """Seeds 0..n-1 of dense (DENSE) and of each family, dense + its per-seed delta."""
    values = {"dense": DENSE[:n], **{f: list(np.add(DENSE[:n], d[:n])) for f, d in deltas.items()}}
    return frame(values, metric="regbench_acc")


DECISIVE = [0.070, 0.075, 0.068, 0.072, 0.071, 0.069, 0.070, 0.070]
EQUIVALENT = [0.002, -0.001, 0.000, 0.001, -0.002, 0.001, 0.000, 0.000]
FUTILE = [0.05, -0.06, 0.01, 0.03, -0.04, 0.00, 0.00, 0.00]
OPEN = [0.0266, -0.0046, 0.0305, -0.0020, 0.0175, 0.0006, 0.0110, 0.0084]  # small gap, never settled
PROMISING = [0.024, 0.000, 0.027, 0.002, 0.017, 0.004, 0.012, 0.010]  # open at look 2, within reach of 8


def test_example_a_at_look_1_of_3_continues():
    plan = next_seeds(frame(EXAMPLE_A), primary_metrics=("gsm8k",))
    assert (plan.decision, plan.n_more, plan.look, plan.n_looks, plan.n_seeds) == ("continue", 2, 1, 3, 3)
    assert plan.level == approx(0.98333)
    assert stats.t.ppf(1 - 0.05 / 3 / 2, 2) == pytest.approx(7.649, abs=1e-3)
    row = one(plan.comparisons)
    assert row["ci_level"] == approx(0.98333)
    assert (row["ci_low"], row["ci_high"]) == (approx(-0.0065), approx(0.1465))
    assert row["verdict"] == "continue" and row["n_more"] == 2 and (row["look"], row["n_looks"]) == (1, 3)
    assert row["plan_delta"] == approx(0.07) and row["seeds_to_decide"] <= 8  # a 0.07 gap is within reach
    assert list(plan.comparisons.columns[-3:]) == ["look", "n_looks", "verdict"]


def test_between_looks_the_look_uses_its_own_seeds():
    four = pd.concat([frame(EXAMPLE_A), frame({"lidas": [0.5], "dense": [0.0]}, seeds={"lidas": [3], "dense": [3]})])
    plan = next_seeds(four, primary_metrics=("gsm8k",))
    at_look = next_seeds(frame(EXAMPLE_A), primary_metrics=("gsm8k",))
    assert (plan.decision, plan.look, plan.n_seeds, plan.n_more) == ("continue", 1, 4, 1)  # one more reaches 5
    row = one(plan.comparisons)
    assert row["n_pairs"] == 3 and row["ci_low"] == approx(-0.0065)  # seed 3 waits for look 2
    pd.testing.assert_frame_equal(plan.comparisons.drop(columns="n_more"), at_look.comparisons.drop(columns="n_more"))


def test_before_the_first_look_nothing_is_tested():
    plan = next_seeds(sweep({"lidas": DECISIVE}, 2), **PRIMARY)
    assert (plan.decision, plan.look, plan.n_more) == ("continue", 0, 1)
    assert one(plan.comparisons)["verdict"] == "continue"


def test_decisive_stop():
    plan = next_seeds(sweep({"lidas": DECISIVE}, 3), **PRIMARY)
    assert (plan.decision, plan.n_more, plan.look) == ("stop: decisive", 0, 1)
    row = one(plan.comparisons)
    assert row["verdict"] == "better" and row["ci_low"] > 0 and row["p_holm"] < 0.05 / 3 and row["n_more"] == 0
    flipped = next_seeds(frame({"dense": DENSE[:3], "lidas": list(np.subtract(DENSE[:3], DECISIVE[:3]))},
                               metric="regbench_acc"), **PRIMARY)
    assert flipped.decision == "stop: decisive" and one(flipped.comparisons)["verdict"] == "worse"


def test_equivalent_stop():
    plan = next_seeds(sweep({"lidas": EQUIVALENT}, 3), **PRIMARY)
    row = one(plan.comparisons)
    assert plan.decision == "stop: equivalent" and row["verdict"] == "equivalent"
    assert -0.02 < row["tost_low"] < row["tost_high"] < 0.02


def test_futile_stop():
    plan = next_seeds(sweep({"lidas": FUTILE}, 3), **PRIMARY)
    row = one(plan.comparisons)
    assert plan.decision == "stop: futile" and row["verdict"] == "futile" and row["seeds_to_decide"] > 8
    assert row["plan_delta"] == approx(0.02)  # the observed gap is below delta_min


def test_open_comparisons_continue_to_the_next_look_and_are_inconclusive_at_s_max():
    plan = next_seeds(sweep({"lidas": OPEN}, 8), **PRIMARY)
    row = one(plan.comparisons)
    assert (plan.decision, plan.look, plan.n_more) == ("inconclusive", 3, 0)
    assert row["verdict"] == "inconclusive" and row["ci_low"] < 0 < row["ci_high"] and row["tost_high"] > 0.02
    assert row["seeds_to_decide"] <= 8  # not futile: 8 seeds should have told, but did not


def test_the_sweep_decision_names_the_weakest_outcome():
    both = next_seeds(sweep({"lidas": DECISIVE, "looped": EQUIVALENT}, 3), **PRIMARY)
    assert list(both.comparisons["verdict"]) == ["better", "equivalent"] and both.decision == "stop: decisive"
    futile = next_seeds(sweep({"lidas": DECISIVE, "looped": FUTILE}, 3), **PRIMARY)
    assert futile.decision == "stop: futile"
    open_ = next_seeds(sweep({"lidas": DECISIVE, "looped": PROMISING}, 5), **PRIMARY)
    assert list(open_.comparisons["verdict"]) == ["better", "continue"]
    assert (open_.decision, open_.n_more) == ("continue", 3)
    assert list(open_.comparisons["n_more"]) == [0, 3]


def test_holm_across_cells_at_the_look_level():
    plan = next_seeds(sweep({"lidas": DECISIVE, "looped": PROMISING, "wide": FUTILE}, 5), **PRIMARY)
    table = plan.comparisons
    np.testing.assert_allclose(table["p_holm"], holm(table["p_value"]), atol=1e-12)
    np.testing.assert_allclose(table["ci_level"], 1 - 0.05 / 3)
    assert list(table["verdict"]) == ["better", "continue", "futile"] and plan.decision == "continue"


def test_exploratory_metrics_do_not_enter_the_rule():
    df = pd.concat([sweep({"lidas": DECISIVE}, 3), frame(EXAMPLE_A, metric="final_loss", higher_is_better=False)])
    plan = next_seeds(df, **PRIMARY)
    assert list(plan.comparisons["metric"]) == ["regbench_acc"] and plan.decision == "stop: decisive"


@pytest.mark.parametrize("looks", [(), (1, 3), (3, 3, 5), (5, 3)])
def test_look_schedule_is_checked(looks):
    with pytest.raises(ValueError, match="looks"):
        next_seeds(frame(EXAMPLE_A), looks=looks, primary_metrics=("gsm8k",))


def test_nothing_to_decide():
    with pytest.raises(ValueError, match="no comparison"):
        next_seeds(frame({"dense": DENSE[:3]}, metric="regbench_acc"), **PRIMARY)
