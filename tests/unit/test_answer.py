"""The headline's sentences (analysis/answer.py) that need no store."""
import pandas as pd

from analysis.answer import _odd_runs


def test_the_runs_against_their_familys_median_are_named_by_seed_up_to_six():
    """The headline's "Not every run agrees" clause (analysis.answer): the runs on the other side
    of the mechanism's threshold from their family's median, their seeds named, the rest counted."""
    runs = pd.DataFrame({"seed": range(15), "value": [0.1] * 7 + [0.7] * 7 + [float("nan")]})
    assert _odd_runs(runs, "lidas", 0.5, formed=True) == (
        "7 of 14 lidas runs did not form them (seeds 0, 1, 2, 3, 4, 5 and 1 more)")
    assert _odd_runs(runs, "lidas", 0.5, formed=False) == (
        "7 of 14 lidas runs formed them (seeds 7, 8, 9, 10, 11, 12 and 1 more)")
    assert _odd_runs(runs[runs["seed"].isin([3, 8])], "dense", 0.5, formed=True) == (
        "1 of 2 dense runs did not form them (seed 3)")
    assert _odd_runs(runs[runs["seed"] >= 7], "looped", 0.5, formed=True) == ""
