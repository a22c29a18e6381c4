"""The report's figures, drawn from tidy tables (docs/statistics.md, section g).

Every function takes frames that already carry a `group` column (the size and cell-key values as
text, such as "tiny, train.lr=0.003", in the order to show them) and the families in their report
order, so colours match across figures; it returns a matplotlib Figure, or None when there is
nothing to draw. Figures are built without pyplot (no global state, Agg canvas on save) under one
fixed style, and `render` writes them with fixed metadata and SVG ids: the same tables give the
same PNG and SVG bytes.
"""

from __future__ import annotations

import io
import itertools
import textwrap
from typing import Any
from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import transforms
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from matplotlib.typing import RcKeyType

from analysis.text import level_text

STYLE: dict[RcKeyType, Any] = {
    "font.family": "DejaVu Sans", "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9,
    "legend.fontsize": 8, "legend.frameon": False, "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.6, "figure.dpi": 100, "savefig.dpi": 150,
    "svg.hashsalt": "analysis.plots", "svg.fonttype": "path",
}
# Fixed metadata: SVG would otherwise carry the time it was written, both the matplotlib version.
METADATA = {"png": {"Software": "matplotlib"}, "svg": {"Date": None, "Creator": "matplotlib"}}
BAND = "min-max over seeds"
REFERENCE_STYLES = (":", "--", "-.")  # in-context unigram, bigram, trigram
GROUP_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
DODGE_POINTS = 7  # families drawn this far apart sideways, so equal-compute points do not hide each other
LABEL_GAP_POINTS = 10  # reference labels in the margin at least this far apart, so close values stay legible
# Figures are sized for report.html, which shows them at 100 CSS px per inch (analysis/html.py) in a
# page 11.5 inches wide: a panel of PANEL_WIDTH inches keeps three side by side at full size.
PANEL_WIDTH = 3.3
_styled = matplotlib.rc_context(STYLE)  # as a decorator: each drawing under STYLE


def render(figure: Figure, fmt: str) -> bytes:
    """The figure as PNG or SVG bytes, identical on every call (no date, salted SVG ids)."""
    buffer = io.BytesIO()
    with matplotlib.rc_context(STYLE):
        figure.savefig(buffer, format=fmt, metadata=METADATA[fmt])
    return buffer.getvalue()


def _colours(families: Sequence[str]) -> dict[str, str]:
    return {family: f"C{i % 10}" for i, family in enumerate(families)}


def _wrapped(text: str, width: int) -> str:
    """`text` broken into lines of at most `width` characters: metric names run long and an axis
    label longer than its axis spills over the next panel or off the figure."""
    return textwrap.fill(text, width, break_long_words=False)


def _groups(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["group"]))


def _present(families: Sequence[str], frame: pd.DataFrame) -> list[str]:
    """`families` that have rows in `frame`, in their given order."""
    return [f for f in families if f in set(frame["family"])]


def _spread(frame: pd.DataFrame, x: str, value: str) -> pd.DataFrame:
    """Per x: mean, min and max of `value` over the runs (seeds) that have it."""
    return frame.groupby(x)[value].agg(["mean", "min", "max"]).reset_index()


def _band(ax, x: np.ndarray, spread: pd.DataFrame, colour: str, label: str) -> None:
    ax.fill_between(x, spread["min"], spread["max"], color=colour, alpha=0.18, linewidth=0)
    ax.plot(x, spread["mean"], color=colour, linewidth=1.6, label=label)


def _whiskers(ax, x, low, high, y, y_low, y_high, colour: str, transform) -> None:
    """Horizontal (low..high) and vertical (y_low..y_high) interval bars through (x, y); NaN bounds
    (single seeds) draw nothing."""
    ax.hlines(y, low, high, color=colour, linewidth=1.6, transform=transform)
    ax.vlines(x, y_low, y_high, color=colour, linewidth=1.6, transform=transform)


# ---- forest plot -------------------------------------------------------------------------------

@_styled
def forest(comparisons: pd.DataFrame, families: Sequence[str], baseline: str) -> Figure | None:
    """One panel per metric (`label`), one row per family x group: the improvement diff_mean (> 0 =
    better, for every metric) with its t-interval, the hierarchical interval (hb_low..hb_high) as a
    thinner whisker below it when present, filled markers for decisive verdicts, "early stop" beside
    the comparisons decided before the last look (winners_curse), 0 dashed and +-delta_min shaded."""
    if comparisons.empty:
        return None
    colours = _colours(families)
    rows = list(dict.fromkeys(zip(comparisons["group"], comparisons["family"])))
    y = {row: -float(i) for i, row in enumerate(rows)}
    hierarchical = {"hb_low", "hb_high"} <= set(comparisons.columns) and comparisons["hb_low"].notna().any()
    labels = list(dict.fromkeys(comparisons["label"]))
    figure = Figure(figsize=(max(6.0, PANEL_WIDTH * len(labels) + 1.4), 2.2 + 0.42 * len(rows)), layout="constrained")
    axes = figure.subplots(1, len(labels), squeeze=False, sharey=True)[0]
    for ax, label in zip(axes, labels):
        table = comparisons[comparisons["label"] == label]
        margin = table["delta_min"].dropna()
        if not margin.empty:
            ax.axvspan(-margin.iloc[0], margin.iloc[0], color="0.88", linewidth=0, zorder=0)
        ax.axvline(0, color="0.25", linestyle="--", linewidth=1, zorder=1)
        for row in table.itertuples():
            at, colour = y[(row.group, row.family)], colours[row.family]
            ax.hlines(at, row.ci_low, row.ci_high, color=colour, linewidth=2.6)
            if hierarchical:
                ax.hlines(at - 0.22, row.hb_low, row.hb_high, color=colour, linewidth=1)
            decisive = row.verdict in ("better", "worse")
            ax.plot(row.diff_mean, at, "o", markersize=8, markeredgewidth=1.6, color=colour,
                    markerfacecolor=colour if decisive else "white", zorder=3)
            if getattr(row, "winners_curse", False):
                ax.annotate("early stop", (row.ci_high, at), xytext=(4, 4), textcoords="offset points", fontsize=8,
                            color="0.3")
        ax.set_xlabel(f"{_wrapped(label, 44)}\nimprovement over {baseline} (> 0 = better)")
        ax.text(0, 1.01, "\u2190 worse", transform=ax.transAxes, ha="left", va="bottom", color="0.4")
        ax.text(1, 1.01, "better \u2192", transform=ax.transAxes, ha="right", va="bottom", color="0.4")
        ax.grid(axis="y", visible=False)
    axes[0].set_yticks(list(y.values()), [f"{family} \u00b7 {group}" for group, family in rows])
    axes[0].set_ylim(min(y.values()) - 0.6, 0.6)
    level = comparisons["ci_level"].iloc[0]
    legend: list[Artist] = [
        Line2D([], [], marker="o", color="0.3", linestyle="", markersize=7, label="decisive (better / worse)"),
        Line2D([], [], marker="o", color="0.3", markerfacecolor="white", linestyle="", markersize=7,
               label="not decisive"),
        Line2D([], [], color="0.3", linewidth=2.6, label=f"{level_text(level)} t-interval over seeds")]
    if hierarchical:
        legend.append(Line2D([], [], color="0.3", linewidth=1, label="hierarchical bootstrap interval"))
    legend.append(Patch(color="0.88", label="\u00b1delta_min (equivalence margin)"))
    # three columns fit under two panels or more; under one (a sweep of one primary metric), two
    figure.legend(handles=legend, loc="outside lower center", ncols=3 if len(labels) > 1 else 2)
    return figure


# ---- per-seed dots -----------------------------------------------------------------------------

def _seed_offsets(seeds: pd.Series) -> dict[object, float]:
    """A small fixed horizontal offset per seed, so equal values stay visible side by side."""
    unique = sorted(set(seeds))
    step = min(0.08, 0.3 / max(len(unique), 1))
    return {seed: (i - (len(unique) - 1) / 2) * step for i, seed in enumerate(unique)}


def _reference_lines(ax, references: pd.DataFrame) -> None:
    """Horizontal lines at the references' values (`_reference_labels` names them)."""
    for style, row in zip(itertools.cycle(REFERENCE_STYLES), references.itertuples()):
        ax.axhline(row.value, color="0.35", linestyle=style, linewidth=1, zorder=1)


def _reference_labels(ax, references: pd.DataFrame, height: float) -> None:
    """Each reference's name and value in the right margin beside its line, once the y-limits are
    final; labels closer than LABEL_GAP_POINTS (on an axes `height` points tall) are spread apart
    around their lines, in the lines' order (the in-context bigram and trigram often nearly agree)."""
    low, high = ax.get_ylim()
    rows = sorted(references.itertuples(), key=lambda row: row.value)
    at = _dodge([(row.value - low) / (high - low) for row in rows], LABEL_GAP_POINTS / height)
    for row, y in zip(rows, at):
        ax.annotate(f"{row.name} {row.value:.3g}", (1, y), xycoords="axes fraction", xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8, color="0.25", annotation_clip=False)


def _dodge(positions: list[float], gap: float) -> list[float]:
    """Ascending `positions` moved apart to at least `gap`: each run of crowded ones is spaced by
    `gap` and centred on its own mean, so every label stays as near its line as the others allow."""
    runs: list[list[float]] = []
    for position in positions:
        runs.append([position])
        while len(runs) > 1 and _span(runs[-2], gap)[1] + gap > _span(runs[-1], gap)[0]:
            runs.append(runs.pop(-2) + runs.pop())
    return [low + i * gap for run in runs for low in [_span(run, gap)[0]] for i in range(len(run))]


def _span(run: list[float], gap: float) -> tuple[float, float]:
    """Lowest and highest position of a run of labels spaced by `gap` around its mean."""
    half = (len(run) - 1) / 2 * gap
    return float(np.mean(run)) - half, float(np.mean(run)) + half


DOTS_MAX = 200  # seeds per cell up to which each is a dot; beyond, the cell's distribution is drawn


def too_many_dots(values: pd.DataFrame) -> bool:
    """Whether a cell has more seeds than can be told apart as dots (`seed_dots` summarises then)."""
    return not values.empty and int(values.groupby(["group", "family"])["seed"].nunique().max()) > DOTS_MAX


@_styled
def seed_dots(values: pd.DataFrame, cells: pd.DataFrame, references: pd.DataFrame, families: Sequence[str],
              label: str) -> Figure | None:
    """One panel per group, x = family: a dot per seed, the same seed joined across families (the
    pairing), the cell mean with its t-interval beside the dots, and `references` (group, name,
    value) as labelled horizontal lines. With more than DOTS_MAX seeds in a cell, each family's
    seeds are a box (quartiles, whiskers at the 5th and 95th percentiles) instead of dots."""
    if values.empty:
        return None
    groups = _groups(values)
    colours = _colours(families)
    boxes = too_many_dots(values)
    offsets = _seed_offsets(values["seed"]) if not boxes else {}
    figure = Figure(figsize=(1.2 + 1.25 * len(families) * len(groups) + 1.3 * (not references.empty), 3.8),
                    layout="constrained")
    axes = figure.subplots(1, len(groups), squeeze=False, sharey=True)[0]
    for ax, group in zip(axes, groups):
        present = _present(families, values[values["group"] == group])
        x = {family: float(i) for i, family in enumerate(present)}
        if boxes:
            _boxes(ax, values[values["group"] == group], x, colours)
        else:
            _dots(ax, values[values["group"] == group], x, offsets, colours)
        for cell in cells[cells["group"] == group].itertuples():
            at = x[cell.family] + 0.3
            ax.vlines(at, cell.ci_low, cell.ci_high, color="0.1", linewidth=1.4)
            ax.plot(at, cell.mean, marker="_", markersize=14, markeredgewidth=2, color="0.1")
        _reference_lines(ax, references[references["group"] == group])
        ax.set_xticks(list(x.values()), present)
        ax.set_xlim(-0.5, len(present) - 0.3)
        ax.set_title(group)
        ax.grid(axis="x", visible=False)
    height = axes[0].get_position().height * figure.get_figheight() * 72  # points, before the layout's trims
    for ax, group in zip(axes, groups):
        _reference_labels(ax, references[references["group"] == group], height)
    axes[0].set_ylabel(_wrapped(label, 40))
    level = cells["ci_level"].iloc[0] if not cells.empty else 0.95
    legend: list[Artist] = (
        [Patch(facecolor="0.85", edgecolor="0.3", label="seeds: quartiles, whiskers 5th-95th percentile")]
        if boxes else
        [Line2D([], [], marker="o", color="0.4", linestyle="", markersize=5, label="one seed"),
         Line2D([], [], color="0.55", linewidth=0.8, label="same seed across families")])
    legend.append(Line2D([], [], marker="_", color="0.1", markersize=10, markeredgewidth=2,
                         label=f"mean, {level_text(level)} t-interval"))
    figure.legend(handles=legend, loc="outside lower center", ncols=3)
    return figure


def _dots(ax, values: pd.DataFrame, x: dict[str, float], offsets: dict[object, float], colours: dict[str, str]) -> None:
    """A dot per seed, the same seed joined across families."""
    dots = values.assign(x=lambda d: d["family"].map(x) + d["seed"].map(offsets))
    for _, seed in dots.sort_values("family", key=lambda f: f.map(x)).groupby("seed"):
        ax.plot(seed["x"], seed["value"], color="0.55", linewidth=0.8, alpha=0.6, zorder=1)
    ax.scatter(dots["x"], dots["value"], s=28, c=dots["family"].map(colours), zorder=2,
               edgecolors="white", linewidths=0.5)


def _boxes(ax, values: pd.DataFrame, x: dict[str, float], colours: dict[str, str]) -> None:
    """A box per family: its seeds' quartiles, whiskers at the 5th and 95th percentiles."""
    for family, at in x.items():
        box = ax.boxplot(values.loc[values["family"] == family, "value"].dropna().to_numpy(), positions=[at],
                         widths=0.35, whis=(5, 95), showfliers=False, patch_artist=True, manage_ticks=False)
        for patch in box["boxes"]:
            patch.set(facecolor=colours[family], alpha=0.45, edgecolor="0.3")
        for line in box["medians"]:
            line.set(color="0.2")


# ---- curves ------------------------------------------------------------------------------------

def _growth(runs: pd.DataFrame) -> pd.DataFrame:
    """The logged steps at which a run's depth grew (n_layers above the previous log line)."""
    runs = runs.sort_values(["run_id", "step"])
    grew = runs.groupby("run_id")["n_layers"].diff() > 0
    return runs.loc[grew, ["step", "n_layers"]].drop_duplicates()


LOSS_AXES = {"step": "step", "flops": "training FLOPs (cumulative)"}  # history column -> x-axis label


@_styled
def loss_curves(history: pd.DataFrame, families: Sequence[str]) -> Figure | None:
    """Per group, training loss per family against step and, when logged, cumulative training FLOPs:
    mean over seeds with a min-max band; triangles mark the steps where a run grew deeper."""
    if history.empty or "loss" not in history.columns:
        return None
    colours = _colours(families)
    groups = _groups(history)
    x_axes = {column: label for column, label in LOSS_AXES.items() if column in history.columns}
    figure = Figure(figsize=(4.8 * len(x_axes), 3.3 * len(groups)), layout="constrained")
    axes = figure.subplots(len(groups), len(x_axes), squeeze=False, sharey=True)
    for row, group in zip(axes, groups):
        frame = history[history["group"] == group]
        for family in _present(families, frame):
            runs = frame[frame["family"] == family]
            loss = _spread(runs, "step", "loss")
            grown = _growth(runs) if "n_layers" in runs.columns else pd.DataFrame(columns=["step", "n_layers"])
            handover = _curriculum_end(runs, loss["step"])
            for ax, column in zip(row, x_axes):
                x = runs.groupby("step")[column].mean().reindex(loss["step"]).to_numpy()
                _band(ax, x, loss, colours[family], family)
                if handover is not None:  # on the FLOPs axis each family reaches that step elsewhere
                    ax.axvline(x[handover], color="0.35" if column == "step" else colours[family],
                               linestyle=":", linewidth=1.0, zorder=1)
                for grow in grown.itertuples():
                    at = loss.index[loss["step"] == grow.step][0]
                    point = (x[at], loss["mean"].iloc[at])
                    ax.plot(*point, marker="^", markersize=8, color=colours[family], markeredgecolor="black",
                            markeredgewidth=0.6, linestyle="", zorder=4)
                    ax.annotate(f"{grow.n_layers} layers", point, xytext=(0, 9), textcoords="offset points",
                                ha="center", fontsize=8, color=colours[family],
                                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"})
        row[0].set_ylim(top=_zoom_top(frame))
        row[0].set_ylabel("training loss (per batch)")
        for ax, label in zip(row, x_axes.values()):
            ax.set(title=f"{group}: against {label.split(' (')[0]}", xlabel=label)
    handles: list[Artist] = [Line2D([], [], color=colours[f], linewidth=1.6, label=f)
                             for f in _present(families, history)]
    handles += [Patch(color="0.5", alpha=0.25, label=f"band: {BAND}"),
                Line2D([], [], marker="^", color="0.5", markeredgecolor="black", linestyle="",
                       label="depth grown (layers added)")]
    if has_curriculum(history):
        handles.append(Line2D([], [], color="0.35", linestyle=":", label="data curriculum ends"))
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4))
    return figure


def has_curriculum(history: pd.DataFrame) -> bool:
    """Whether any run of the training logs had a data curriculum (a `curriculum_end` step)."""
    return "curriculum_end" in history.columns and bool(history["curriculum_end"].notna().any())


def _curriculum_end(runs: pd.DataFrame, steps: pd.Series) -> int | None:
    """The position in `steps` (the logged steps) of the first step after the runs' data
    curriculum (data.warmup): the loss jumps there because the data changes. None without one."""
    ends = runs["curriculum_end"].dropna() if "curriculum_end" in runs.columns else pd.Series(dtype=float)
    after = (steps >= ends.iloc[0]).to_numpy().nonzero()[0] if len(ends) else []
    return int(after[0]) if len(after) else None


def _zoom_top(frame: pd.DataFrame) -> float:
    """Upper loss limit: the highest loss after the first 5% of steps, so the long tail where the
    families differ is not squashed by the first steps (which leave the panel at the top)."""
    late = frame[frame["step"] >= frame["step"].min() + 0.05 * (frame["step"].max() - frame["step"].min())]
    return float(late["loss"].max()) * 1.02


@_styled
def context_curves(curves: pd.DataFrame, families: Sequence[str], x: str, model: str,
                   references: Mapping[str, str], label: str, x_label: str, count: str) -> Figure | None:
    """Per group, `model` against `x` per family (mean over seeds, min-max band) and each reference
    column of `references` (column -> name) dashed, averaged over the runs; below it, when the
    curves have it, `count` (positions evaluated per x, mean over runs), which says where the curve
    rests on few positions."""
    if curves.empty or model not in curves.columns:
        return None
    colours = _colours(families)
    groups = _groups(curves)
    counted = count in curves.columns
    figure = Figure(figsize=(8.4, 4.6 * len(groups)), layout="constrained")
    axes = figure.subplots(2 * len(groups) if counted else len(groups), 1, squeeze=False, sharex=True,
                           height_ratios=[4, 1] * len(groups) if counted else None)[:, 0]
    for i, group in enumerate(groups):
        ax = axes[2 * i if counted else i]
        frame = curves[curves["group"] == group]
        for family in _present(families, frame):
            spread = _spread(frame[frame["family"] == family], x, model)
            _band(ax, spread[x].to_numpy(), spread, colours[family], family)
        present = [(c, name) for c, name in references.items() if c in frame.columns]
        for style, (column, name) in zip(itertools.cycle(REFERENCE_STYLES), present):
            mean = frame.groupby(x)[column].mean()
            ax.plot(mean.index, mean.to_numpy(), color="0.3", linestyle=style, linewidth=1.2, label=_wrapped(name, 32))
        ax.fill_between([], [], color="0.5", alpha=0.25, label=f"band: {BAND}")
        ax.set(title=group, ylabel=_wrapped(label, 45))
        if counted:
            positions = frame.groupby(x)[count].mean()
            axes[2 * i + 1].bar(positions.index, positions.to_numpy(), color="0.75", width=0.7)
            axes[2 * i + 1].set_ylabel("positions", fontsize=8)
    axes[-1].set_xlabel(x_label)
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.legend(handles=axes[0].get_legend_handles_labels()[0], loc="outside right upper")
    return figure


# ---- score against compute ---------------------------------------------------------------------

def _fit_limits(ax, points: pd.DataFrame) -> None:
    """Axis limits around the points and their bars: artists drawn with a shifted transform do not
    take part in autoscaling."""
    x = points[["flops", "flops_low", "flops_high"]].to_numpy(float).ravel()
    y = points[["mean", "ci_low", "ci_high"]].to_numpy(float).ravel()
    corners = np.column_stack([x, y])
    ax.update_datalim(corners[np.isfinite(corners).all(axis=1)])
    ax.autoscale_view()


@_styled
def score_vs_flops(points: pd.DataFrame, families: Sequence[str]) -> Figure | None:
    """One panel per metric (`label`): per family and group, the mean score (t-interval) against mean
    train_flops (t-interval, zero width when every seed used the same compute); marker = group."""
    if points.empty:
        return None
    colours = _colours(families)
    groups = _groups(points)
    markers = {group: GROUP_MARKERS[i % len(GROUP_MARKERS)] for i, group in enumerate(groups)}
    labels = list(dict.fromkeys(points["label"]))
    figure = Figure(figsize=(max(6.0, (PANEL_WIDTH + 0.3) * len(labels)), 3.8), layout="constrained")
    axes = figure.subplots(1, len(labels), squeeze=False)[0]
    dodge = {family: (i - (len(families) - 1) / 2) * DODGE_POINTS for i, family in enumerate(families)}
    for ax, label in zip(axes, labels):
        for p in points[points["label"] == label].itertuples():
            colour = colours[p.family]
            shifted = transforms.offset_copy(ax.transData, figure, x=dodge[p.family], units="points")
            _whiskers(ax, p.flops, p.flops_low, p.flops_high, p.mean, p.ci_low, p.ci_high, colour, shifted)
            ax.plot(p.flops, p.mean, marker=markers[p.group], markersize=8, color=colour, linestyle="",
                    markeredgecolor="white", zorder=3, transform=shifted)
        _fit_limits(ax, points[points["label"] == label])
        ax.set(xlabel="training FLOPs (mean over seeds)", ylabel=f"{_wrapped(label, 40)}\n(mean over seeds)")
        ax.margins(x=0.15, y=0.1)
    level = points["ci_level"].iloc[0]
    handles = [Line2D([], [], marker="o", color=colours[f], linestyle="", label=f)
               for f in _present(families, points)]
    if len(groups) > 1:
        handles += [Line2D([], [], marker=m, color="0.4", linestyle="", label=g) for g, m in markers.items()]
    handles.append(Line2D([], [], color="0.4", linewidth=1.6, label=f"{level_text(level)} t-interval over seeds"))
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    return figure
