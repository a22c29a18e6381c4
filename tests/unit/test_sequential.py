"""The group-sequential stopping rule (docs/statistics.md, f): Example A at look 1 of 3, and
decisive, equivalent, futile and inconclusive stops on synthetic sweeps."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.sequential import SeedPlan, next_seeds
from analysis.stats import holm
from analysis.sequential import settled_verdicts
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
SLOW = [0.050, 0.020, 0.035, 0.040, 0.030, 0.045, 0.025, 0.035]  # open at look 1, better at look 2


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


# ---- settled verdicts stay settled; seeds only to open arms ------------------------------------

def by_family(plan) -> pd.DataFrame:
    return plan.comparisons.set_index("family")


def test_a_verdict_settled_at_look_1_is_kept_at_look_2():
    """lidas is better at look 1 and looped still open; at look 2 lidas's new seeds (run although its
    arm was closed) would no longer make it better, but the settled verdict stands, with the look that
    settled it."""
    first = next_seeds(sweep({"lidas": DECISIVE, "looped": SLOW}, 3), **PRIMARY)
    assert list(first.comparisons["verdict"]) == ["better", "continue"]
    assert first.comparisons["settled_at_look"].iloc[0] == 1 and pd.isna(first.comparisons["settled_at_look"].iloc[1])
    assert first.settled == {("lidas", "tiny", (), "regbench_acc"): ("better", 1)}
    assert first.open_arms == (("looped", "tiny", ()), ("dense", "tiny", ()))
    reversed_ = [*DECISIVE[:3], -0.20, -0.30]
    later = sweep({"lidas": reversed_, "looped": SLOW}, 5)
    fresh = by_family(next_seeds(later, **PRIMARY))
    assert fresh.loc["lidas", "verdict"] != "better"  # what the data alone now say
    kept = next_seeds(later, settled=first.settled, **PRIMARY)
    table = by_family(kept)
    assert table.loc["lidas", "verdict"] == "better" and table.loc["lidas", "settled_at_look"] == 1
    assert table.loc["lidas", "n_more"] == 0 and pd.isna(table.loc["lidas", "p_holm"])
    assert table.loc["lidas", "significant"] and not table.loc["lidas", "inside_margin"]
    assert table.loc["looped", "verdict"] == "better" and table.loc["looped", "settled_at_look"] == 2
    assert kept.decision == "stop: decisive" and kept.open_arms == ()
    assert kept.settled == {("lidas", "tiny", (), "regbench_acc"): ("better", 1),
                            ("looped", "tiny", (), "regbench_acc"): ("better", 2)}


def test_equivalent_and_futile_verdicts_are_kept_too():
    settled = {("lidas", "tiny", (), "regbench_acc"): ("equivalent", 1),
               ("looped", "tiny", (), "regbench_acc"): ("futile", 1)}
    plan = next_seeds(sweep({"lidas": DECISIVE, "looped": DECISIVE}, 5), settled=settled, **PRIMARY)
    assert list(plan.comparisons["verdict"]) == ["equivalent", "futile"]
    assert list(plan.comparisons["settled_at_look"]) == [1, 1] and plan.decision == "stop: futile"


def test_settled_comparisons_count_in_holm_at_p_1():
    """Holm over the open comparisons still counts the settled ones (entered at p = 1), so each look
    keeps its alpha / K whatever was settled before."""
    df = sweep({"lidas": DECISIVE, "looped": PROMISING, "wide": FUTILE}, 5)
    settled = {("wide", "tiny", (), "regbench_acc"): ("futile", 1)}
    table = by_family(next_seeds(df, settled=settled, **PRIMARY))
    p = [table.loc["lidas", "p_value"], table.loc["looped", "p_value"], 1.0]
    np.testing.assert_allclose(table.loc[["lidas", "looped"], "p_holm"], holm(p)[:2], atol=1e-12)
    assert pd.isna(table.loc["wide", "p_holm"]) and table.loc["wide", "verdict"] == "futile"


def test_the_plan_record_is_plain_yaml_and_reads_back():
    yaml = pytest.importorskip("yaml")
    df = sweep({"lidas": DECISIVE, "looped": SLOW}, 3).assign(**{"train.lr": 0.001})
    df = pd.concat([df, df.assign(**{"train.lr": 0.003})], ignore_index=True)
    plan = next_seeds(df, **PRIMARY)
    assert plan.cell_keys == ("train.lr",)
    text = yaml.safe_dump(plan.to_record(), sort_keys=False)
    record = yaml.safe_load(text)
    assert record["comparisons"][0]["cell"] == {"train.lr": 0.001}
    back = SeedPlan.from_record(record)
    assert (back.decision, back.look, back.n_more, back.open_arms) == (plan.decision, plan.look, plan.n_more,
                                                                      plan.open_arms)
    assert back.settled == plan.settled == settled_verdicts(record) == settled_verdicts([plan])
    assert set(plan.settled) == {("lidas", "tiny", (("train.lr", 0.001),), "regbench_acc"),
                                 ("lidas", "tiny", (("train.lr", 0.003),), "regbench_acc")}
    assert back.needs_seeds("looped", "tiny", {"train.lr": 0.003}) and not back.needs_seeds("lidas", "tiny",
                                                                                            {"train.lr": 0.003})
    later = next_seeds(pd.concat([df, sweep({"lidas": DECISIVE, "looped": SLOW}, 5).assign(**{"train.lr": 0.001})
                                  .query("seed >= 3")]), settled=settled_verdicts(record), **PRIMARY)
    assert later.look == 2 and (later.comparisons.query("family == 'lidas'")["settled_at_look"] == 1).all()


def test_the_earliest_settlement_wins_across_records():
    look_1 = {"look": 1, "n_looks": 3, "n_seeds": 3, "level": 0.98, "decision": "continue", "n_more": 2,
              "comparisons": [{"family": "lidas", "size": "tiny", "cell": {}, "metric": "m", "verdict": "better",
                               "settled_at_look": 1}]}
    look_2 = {**look_1, "look": 2, "comparisons": [{**look_1["comparisons"][0], "verdict": "worse",
                                                    "settled_at_look": 2}]}
    assert settled_verdicts([look_1, look_2]) == {("lidas", "tiny", (), "m"): ("better", 1)}


def test_seeds_go_only_to_open_arms():
    plan = next_seeds(sweep({"lidas": DECISIVE, "looped": PROMISING, "wide": FUTILE}, 5), **PRIMARY)
    assert plan.decision == "continue" and plan.n_more == 3
    assert plan.open_arms == (("looped", "tiny", ()), ("dense", "tiny", ()))
    assert plan.needs_seeds("looped", "tiny") and plan.needs_seeds("dense", "tiny")
    assert not plan.needs_seeds("lidas", "tiny") and not plan.needs_seeds("wide", "tiny")
    assert plan.runs_saved == 3 * 2  # lidas and wide skip the 3 seeds of look 3
    stop = next_seeds(sweep({"lidas": DECISIVE}, 3), **PRIMARY)
    assert stop.open_arms == () and stop.runs_saved == 0
    before = next_seeds(sweep({"lidas": DECISIVE, "looped": FUTILE}, 2), **PRIMARY)
    assert set(before.open_arms) == {("lidas", "tiny", ()), ("looped", "tiny", ()), ("dense", "tiny", ())}


def test_open_arms_follow_sizes():
    small = sweep({"lidas": DECISIVE, "looped": PROMISING}, 5).assign(size="small")
    tiny = sweep({"lidas": PROMISING, "looped": DECISIVE}, 5)
    plan = next_seeds(pd.concat([small, tiny], ignore_index=True), **PRIMARY)
    assert set(plan.open_arms) == {("looped", "small", ()), ("dense", "small", ()), ("lidas", "tiny", ()),
                                   ("dense", "tiny", ())}


def test_a_negligible_difference_stops_as_equivalent():
    deltas = [0.005, 0.0052, 0.0048, 0.0051, 0.0049]
    plan = next_seeds(sweep({"lidas": deltas}, 5), looks=(5, 8), **PRIMARY)
    row = one(plan.comparisons)
    assert row["verdict"] == "equivalent (negligible difference)" and row["settled_at_look"] == 1
    assert plan.decision == "stop: equivalent"
    both = next_seeds(sweep({"lidas": deltas, "looped": DECISIVE[:5]}, 5), looks=(5, 8), **PRIMARY)
    assert both.decision == "stop: decisive"


def test_settled_verdicts_are_checked():
    key = ("lidas", "tiny", (), "regbench_acc")
    with pytest.raises(ValueError, match="settled at look 2"):
        next_seeds(sweep({"lidas": DECISIVE}, 3), settled={key: ("better", 2)}, **PRIMARY)
    with pytest.raises(ValueError, match="must be one of"):
        next_seeds(sweep({"lidas": DECISIVE}, 3), settled={key: ("continue", 1)}, **PRIMARY)


def test_several_confirmatory_metrics_in_the_rule():
    df = pd.concat([sweep({"lidas": DECISIVE}, 3), sweep({"lidas": PROMISING}, 3).assign(metric="induction_max")])
    plan = next_seeds(df, primary_metrics={"regbench": "regbench_acc", "induction": ["induction_max"]})
    assert set(plan.comparisons["metric"]) == {"regbench_acc", "induction_max"}
    np.testing.assert_allclose(plan.comparisons["p_holm"], holm(plan.comparisons["p_value"]), atol=1e-12)
