"""A sweep's saved W&B workspace, built from code (wandb-workspaces): the sweep's runs grouped by
family and size (mean and min-max band over seeds) in three sections:

    Training      loss by step and by FLOPs, depth, learning rate, throughput
    Evaluation    the headline metrics beside their reference estimators, against training FLOPs,
                  and each curve a job declares as a line (the TVD by context) as a chart
    Sweep summary the analysis run's cells and comparisons tables and the report's plots

What to show comes from the store (the specs the jobs recorded, the report's plots), so a new
evaluation appears without a change here. Offline the workspace's specification is written to
the sweep's folder with the command that publishes it; online it is saved and its URL printed.
W&B trouble is one warning, never a failure (orchestrator/tracking.py's rule)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import yaml
from rich.console import Console

from analysis.load import load_specs
from common.atomic import write_text
from config.tracker import TrackerConfig
from orchestrator import tracking
from store.store import Store

SPEC = "wandb_workspace.json"  # in the sweep's folder, when offline


def _groups(store: Store, sweep: str) -> list[str]:
    """The W&B groups of the sweep's runs (<sweep>/<family>-<size>) and of its analysis run."""
    cells = set()
    for rid in store.read_sweep(sweep)["run_ids"]:
        try:
            cfg = store.read_config(rid)
        except (OSError, yaml.YAMLError):  # not planned yet, or damaged (`status` says which)
            continue
        cells.add(f"{sweep}/{cfg['family']['name']}-{cfg['model']['name']}")
    return [*sorted(cells), sweep]


def build(store: Store, sweep: str, tracker: TrackerConfig, entity: str = "") -> Any:
    """The workspace object (nothing is sent anywhere)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    band: dict[str, Any] = dict(groupby_aggfunc="mean", groupby_rangefunc="minmax")
    training: list[Any] = [  # Any: a Section takes a list of its own panel union, not of their base class
        wr.LinePlot(title="training loss by step", x="Step", y=["train/loss"], **band),
        wr.LinePlot(title="training loss by training FLOPs", x="train/flops", y=["train/loss"], **band),
        wr.LinePlot(title="depth (layers applied)", x="Step", y=["train/n_layers"], **band),
        wr.LinePlot(title="learning rate", x="Step", y=["train/lr"], **band),
        wr.LinePlot(title="throughput (tokens/s)", x="Step", y=["train/tokens_per_s"], **band)]
    metrics, curves = load_specs(store.root, sweep)
    headline = sorted(name for name, spec in metrics.items() if spec.confirmatory_for)
    costs = sorted(name for name, spec in metrics.items() if spec.cost)
    evaluation: list = []
    for name in headline:
        label = metrics[name].label
        evaluation.append(wr.BarPlot(title=f"{label} and the reference estimators",
                                     metrics=[name, *metrics[name].references], **band))
        evaluation += [wr.ScatterPlot(title=f"{label} against {metrics[cost].label}", x=wr.SummaryMetric(cost),
                                      y=wr.SummaryMetric(name)) for cost in costs]
    for name, spec in sorted(curves.items()):
        if spec.kind == "line":
            evaluation.append(wr.CustomChart.from_table(f"curves/{name}", chart_fields={"x": spec.x, "y": spec.y},
                                                            chart_strings={"title": spec.title}))
            evaluation.append(wr.WeavePanelSummaryTable(table_name=f"curves/{name}"))
    plots = sorted(p.stem for p in Path(store.layout.sweep(sweep).plots).glob("*.png"))
    summary: list[Any] = [
        wr.WeavePanelSummaryTable(table_name="comparisons"), wr.WeavePanelSummaryTable(table_name="cells"),
        *([wr.MediaBrowser(title="the report's plots", media_keys=[f"plots/{p}" for p in plots])] if plots else [])]
    return ws.Workspace(
        entity=entity, project=tracker.project, name=f"sweep {sweep}",
        sections=[ws.Section(name="Training", panels=training, is_open=True),
                  ws.Section(name="Evaluation", panels=evaluation, is_open=True),
                  ws.Section(name="Sweep summary", panels=summary, is_open=True)],
        runset_settings=ws.RunsetSettings(groupby=[expr.Metric("Group")],
                                          filters=[expr.Metric("Group").isin(_groups(store, sweep))]))


def specification(workspace: Any) -> dict:
    """The workspace as plain data (what wandb-workspaces builds the saved view from)."""
    return pydantic.TypeAdapter(type(workspace)).dump_python(workspace, mode="json", exclude_none=True)


def publish(store: Store, sweep: str, tracker: TrackerConfig, console: Console) -> int:
    """Online: save the workspace and print its URL. Offline (the default, as for the runs): write
    its specification to the sweep's folder and say how to publish it. Never fails the command."""
    online = tracking.online(tracker)
    path = store.sweep_dir(sweep) / SPEC
    try:
        workspace = build(store, sweep, tracker, tracker.entity or (tracking.default_entity() if online else ""))
        if online:
            workspace.save()
            console.print(f"sweep {sweep}: W&B workspace saved: {workspace.url}", markup=False)
            return 0
        write_text(path, json.dumps(specification(workspace), indent=1, sort_keys=True) + "\n")
    except Exception as e:  # noqa: BLE001 - W&B may raise anything; a workspace never fails the command
        console.print(f"warning: the W&B workspace of sweep {sweep} was not made ({tracking.first_line(e)})",
                      markup=False, soft_wrap=True)
        return 0
    console.print(f"sweep {sweep}: W&B workspace specification written to {path} (offline); to publish it, "
                  f"upload the runs with `wandb-sync {sweep}`, then run `WANDB_MODE=online python -m "
                  f"orchestrator wandb-dashboard {sweep}` with a W&B key (`wandb login`)", markup=False, soft_wrap=True)
    return 0
