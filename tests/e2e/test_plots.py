"""The report's figures: drawn from a fake store, skipped without data, marks as documented, and the
same bytes on every run."""

import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from test_analysis_load import new_store, write_run, write_sweep
from test_report import NGRAMS, TVD

from analysis import analyse, plots, write_report
from analysis.load import load_curves, load_history
from analysis.markdown import render_markdown
from analysis.figures import draw

SWEEP = "demo"
ALL_PLOTS = {"forest", "seeds_regbench_tvd", "loss", "score_vs_flops", "tvd_by_context"}
GROW_AT = (30, 60)  # lidas goes from 2 to 4 to 6 layers at these steps


def history(family: str, seed: int) -> pd.DataFrame:
    """A training log every 10 steps: loss falling with a seed-dependent offset; lidas grows deeper."""
    step = np.arange(10, 101, 10)
    layers = np.where(step < GROW_AT[0], 2, np.where(step < GROW_AT[1], 4, 6)) if family == "lidas" else np.full(10, 6)
    return pd.DataFrame({"step": step, "loss": 3 / np.sqrt(step) + 0.01 * seed, "lr": 1e-3, "tokens": step * 64,
                         "flops": np.cumsum(layers * 1e9).astype(np.int64), "n_layers": layers})


def curves(tvd: float) -> dict:
    return {"tvd_by_context": {"n_context_strings": [0, 1, 2, 3], "n_positions": [100, 90, 40, 5],
                               "regbench_tvd": [0.7, tvd + 0.1, tvd, tvd - 0.02],
                               **{name: [0.7, value + 0.1, value, value - 0.05] for name, value in NGRAMS.items()}}}


def fake_store(root: Path, with_history: bool = True, with_curves: bool = True, seeds: dict | None = None) -> Path:
    """The families and sizes of test_report's TVD table; histories and curves optional; `seeds`
    maps (family, size) to how many of its seeds to keep."""
    root = new_store(root)
    run_ids = []
    for (family, size), values in TVD.items():
        for seed, tvd in enumerate(values[:(seeds or {}).get((family, size), len(values))]):
            run_id = f"{family}-{size}-{seed}"
            write_run(root, run_id, family, size, seed, {"regbench_tvd": tvd, **NGRAMS,
                                                         "train_flops": 1e12 * (0.8 if family == "lidas" else 1)},
                      curves=curves(tvd) if with_curves else {})
            if with_history:
                history(family, seed).to_parquet(root / "runs" / run_id / "history.parquet", index=False)
            run_ids.append(run_id)
    write_sweep(root, SWEEP, run_ids, "2025-01-01T00:00:00", ["family=dense,lidas,looped"])
    return root


def plot_dir(root: Path) -> Path:
    return root / "sweeps" / SWEEP / "plots"


def test_every_plot_is_written_as_png_and_svg(tmp_path):
    root = fake_store(tmp_path / "store")
    report = write_report(root, SWEEP).read_text()
    files = {p.name for p in plot_dir(root).iterdir()}
    assert files == {f"{name}.{fmt}" for name in ALL_PLOTS for fmt in ("png", "svg")}
    for name in ALL_PLOTS:
        assert (plot_dir(root) / f"{name}.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert ElementTree.parse(plot_dir(root) / f"{name}.svg").getroot().tag.endswith("svg")
        assert f"](plots/{name}.png)" in report
    assert "Not drawn" not in report


def test_a_store_without_histories_or_curves_skips_those_plots(tmp_path):
    root = fake_store(tmp_path / "store", with_history=False, with_curves=False)
    report = write_report(root, SWEEP).read_text()
    assert {p.stem for p in plot_dir(root).iterdir()} == ALL_PLOTS - {"loss", "tvd_by_context"}
    assert "Not drawn: no finished run has a history.parquet." in report
    assert "](plots/loss.png)" not in report
    # no run recorded (so none declared) the curve: its figure is not listed at all
    assert "tvd_by_context" not in report and "by number of in-context strings" not in report


def test_a_declared_curve_without_points_is_listed_as_not_drawn(tmp_path):
    analysis = analyse(fake_store(tmp_path / "store"), SWEEP)
    assert "tvd_by_context" in analysis.curve_specs
    figures = draw(replace(analysis, curves={}))
    curve = next(p for p in figures if p.name == "tvd_by_context")
    assert curve.figure is None and curve.title == "RegBench TVD by number of in-context strings"
    assert "Not drawn: no finished run has curves.tvd_by_context in its metrics.json." in render_markdown(
        analysis, figures)


def test_plots_of_data_that_went_away_are_removed(tmp_path):
    root = fake_store(tmp_path / "store")
    write_report(root, SWEEP)
    for path in root.glob("runs/*/history.parquet"):
        path.unlink()
    write_report(root, SWEEP)
    assert not (plot_dir(root) / "loss.png").exists() and not (plot_dir(root) / "loss.svg").exists()
    assert not list(plot_dir(root).glob(".*"))  # no temporary files left behind


def test_plots_are_byte_identical_on_rerun_and_in_a_new_process(tmp_path):
    root = fake_store(tmp_path / "store")
    write_report(root, SWEEP)
    first = {p.name: p.read_bytes() for p in plot_dir(root).iterdir()}
    write_report(root, SWEEP)
    assert {p.name: p.read_bytes() for p in plot_dir(root).iterdir()} == first
    subprocess.run([sys.executable, "-c", f"from analysis import write_report; write_report({str(root)!r}, {SWEEP!r})"],
                   check=True, cwd=Path(__file__).parents[2])  # the repository
    assert {p.name: p.read_bytes() for p in plot_dir(root).iterdir()} == first
    assert b"dc:date" not in first["forest.svg"]


def test_single_seed_cells_are_drawn_without_intervals(tmp_path):
    root = fake_store(tmp_path / "store", seeds={("lidas", "tiny"): 1})
    report = write_report(root, SWEEP).read_text()
    assert {p.stem for p in plot_dir(root).iterdir()} == ALL_PLOTS
    assert ("- **Single-seed cells** (no interval, no test, marked 'single seed' in the tables): lidas at tiny."
            in report)
    assert "- No test possible, fewer than 2 seeds: lidas on RegBench TVD at tiny (95%, Holm over m = " in report


# ---- the marks, on the figures themselves -------------------------------------------------------

def comparison_rows(**extra) -> pd.DataFrame:
    return pd.DataFrame({"family": ["lidas", "looped"], "group": "tiny", "label": "RegBench TVD",
                         "diff_mean": [0.03, -0.005], "ci_low": [0.01, -0.02], "ci_high": [0.05, 0.01],
                         "ci_level": 0.95, "verdict": ["better", "inconclusive"], "delta_min": 0.02, **extra})


def markers(figure) -> list:
    return [line for ax in figure.axes for line in ax.lines if line.get_marker() == "o"]


def test_forest_fills_decisive_markers_and_shades_the_margin():
    figure = plots.forest(comparison_rows(), ["dense", "lidas", "looped"], "dense")
    lidas, looped = markers(figure)
    assert lidas.get_xdata()[0] == 0.03 and to_rgba(lidas.get_markerfacecolor()) == to_rgba("C1")
    assert to_rgba(looped.get_markerfacecolor()) == to_rgba("white")
    ax = figure.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["lidas \u00b7 tiny", "looped \u00b7 tiny"]
    assert [c.get_linewidth()[0] for c in ax.collections if hasattr(c, "get_segments")] == [2.6, 2.6]
    band = next(p for p in ax.patches)
    assert band.get_x() == pytest.approx(-0.02) and band.get_width() == pytest.approx(0.04)
    assert any(line.get_linestyle() == "--" and list(line.get_xdata()) == [0, 0] for line in ax.lines)


def test_forest_draws_the_hierarchical_interval_as_a_thinner_whisker():
    figure = plots.forest(comparison_rows(hb_low=[0.0, -0.03], hb_high=[0.06, 0.02]),
                          ["dense", "lidas", "looped"], "dense")
    widths = [c.get_linewidth()[0] for c in figure.axes[0].collections if hasattr(c, "get_segments")]
    assert widths == [2.6, 1, 2.6, 1]
    assert "hierarchical bootstrap interval" in [t.get_text() for t in figure.legends[0].get_texts()]


def test_seed_dots_join_each_seed_across_families_and_label_references():
    values = pd.DataFrame([{"family": f, "group": "tiny", "seed": s, "value": v}
                           for (f, size), vs in TVD.items() if size == "tiny" for s, v in enumerate(vs)])
    cells = values.groupby(["family", "group"], as_index=False)["value"].mean().rename(columns={"value": "mean"})
    cells = cells.assign(ci_low=cells["mean"] - 0.01, ci_high=cells["mean"] + 0.01, ci_level=0.95)
    references = pd.DataFrame({"group": "tiny", "name": ["in-context unigram", "in-context bigram"],
                               "value": [0.42, 0.2]})
    figure = plots.seed_dots(values, cells, references, ["dense", "lidas", "looped"], "RegBench TVD")
    ax = figure.axes[0]
    pairing = [line for line in ax.lines if len(line.get_xdata()) == 3]
    assert len(pairing) == 3  # one line per seed, through dense, lidas and looped
    assert [line.get_ydata().tolist() for line in pairing][0] == [0.30, 0.25, 0.45]
    assert {t.get_text() for t in ax.texts} == {"in-context unigram 0.42", "in-context bigram 0.2"}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dense", "lidas", "looped"]


def test_loss_curves_mark_where_lidas_grew():
    frames = [history(family, seed).assign(run_id=f"{family}-{seed}", family=family, group="tiny", seed=seed)
              for family in ("dense", "lidas") for seed in range(2)]
    figure = plots.loss_curves(pd.concat(frames, ignore_index=True), ["dense", "lidas"])
    by_step, by_flops = figure.axes
    grown = [line for line in by_step.lines if line.get_marker() == "^"]
    assert [line.get_xdata()[0] for line in grown] == list(GROW_AT)
    assert len([line for line in by_flops.lines if line.get_marker() == "^"]) == 2
    assert sorted(t.get_text() for t in by_step.texts) == ["4 layers", "6 layers"]
    assert by_flops.get_xlabel() == "training FLOPs (cumulative)"


def test_loss_curves_mark_where_the_data_curriculum_ends():
    """A dotted line at the first logged step after data.warmup: one on the step axis, and on the
    FLOPs axis one per family, at the FLOPs that family had spent by then (lidas fewer)."""
    frames = [history(family, seed).assign(run_id=f"{family}-{seed}", family=family, group="tiny", seed=seed,
                                           curriculum_end=45.0)
              for family in ("dense", "lidas") for seed in range(2)]
    by_step, by_flops = plots.loss_curves(pd.concat(frames, ignore_index=True), ["dense", "lidas"]).axes

    def dotted(ax):
        return sorted({line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == ":"})
    assert dotted(by_step) == [50]
    flops_at_50 = {f: float(history(f, 0).set_index("step").loc[50, "flops"]) for f in ("dense", "lidas")}
    assert dotted(by_flops) == sorted(flops_at_50.values()) and flops_at_50["lidas"] < flops_at_50["dense"]
    without = plots.loss_curves(pd.concat(frames, ignore_index=True).drop(columns="curriculum_end"), ["dense"])
    assert not [line for ax in without.axes for line in ax.lines if line.get_linestyle() == ":"]


def test_nothing_to_draw_gives_none():
    empty = pd.DataFrame(columns=["family", "group"])
    assert plots.forest(empty, ["dense"], "dense") is None
    assert plots.loss_curves(empty, ["dense"]) is None
    assert plots.score_vs_flops(empty, ["dense"]) is None
    assert plots.context_curves(empty, ["dense"], "n", "regbench_tvd", {}, "TVD", "n", "count") is None


def test_hierarchical_columns_reach_the_forest_plot_when_present(tmp_path):
    """hb_low/hb_high (the hierarchical bootstrap) are drawn when the comparisons carry them."""
    analysis = analyse(fake_store(tmp_path / "store"), SWEEP)
    comparisons = analysis.comparisons.assign(hb_low=analysis.comparisons["ci_low"] - 0.01,
                                              hb_high=analysis.comparisons["ci_high"] + 0.01)
    forest = next(p for p in draw(replace(analysis, comparisons=comparisons)) if p.name == "forest")
    assert "thin whisker: hierarchical bootstrap interval" in forest.caption
    widths = [c.get_linewidth()[0] for c in forest.figure.axes[0].collections if hasattr(c, "get_segments")]
    assert widths.count(1) == widths.count(2.6) == 4


def test_history_and_curves_load_as_tidy_frames(tmp_path):
    root = fake_store(tmp_path / "store")
    (root / "runs" / "dense-tiny-0" / "history.parquet").unlink()
    history_table = load_history(root, SWEEP)
    assert list(history_table.columns) == ["run_id", "family", "size", "seed", "step", "loss", "lr", "tokens",
                                           "flops", "n_layers", "curriculum_end"]
    assert history_table["curriculum_end"].isna().all()  # these runs had no data curriculum
    assert len(history_table) == 10 * 17 and "dense-tiny-0" not in set(history_table["run_id"])
    curve = load_curves(root, SWEEP)
    assert list(curve.columns[:5]) == ["run_id", "family", "size", "seed", "n_context_strings"]
    assert len(curve) == 4 * 18 and set(curve.columns) >= {"regbench_tvd", "n_positions", *NGRAMS}
    assert list(load_curves(root, SWEEP, "no_such_curve").columns) == ["run_id", "family", "size", "seed"]


def test_a_cell_of_many_seeds_is_summarised_in_plots_and_tables(tmp_path):
    """500 seeds a family: the seed plot draws each family's distribution, not 1,000 dots and 500
    pairing lines, and the tables of one run a row stop at 200 rows and say where the rest are."""
    root = new_store(tmp_path / "store")
    rng = np.random.default_rng(0)
    run_ids = []
    for family, shift in (("dense", 0.0), ("lidas", -0.02)):
        for seed in range(500):
            run_ids.append(f"{family}-{seed}")
            failed = family == "lidas" and seed >= 250
            write_run(root, run_ids[-1], family, "tiny", seed,
                      None if failed else {"regbench_tvd": 0.3 + shift + 0.01 * rng.standard_normal(), **NGRAMS},
                      status="failed" if failed else "done", error="boom" if failed else None, curves={})
    write_sweep(root, SWEEP, run_ids, "2025-01-01T00:00:00", ["family=dense,lidas"])
    result = analyse(root, SWEEP)
    figure = next(p for p in draw(result) if p.name == "seeds_regbench_tvd")
    assert figure.title.endswith("the seeds") and "quartiles" in figure.caption
    ax = figure.figure.axes[0]
    assert len(ax.lines) < 50 and not any(len(c.get_offsets()) > 10 for c in ax.collections)
    report = render_markdown(result)
    assert "The first 200 of 250 rows; results/runs.parquet has every run." in report
    assert len(report.splitlines()) < 600
