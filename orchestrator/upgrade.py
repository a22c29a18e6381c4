"""Upgrading a store of an older format in place, so nothing a user ran is lost.

Format 1 -> 2: metrics.json gains `specs` and `curve_specs`, the specs of its metrics and curves
as the jobs declare them now (a metric no job declares any more keeps its name as its label and
its recorded direction), and the induction-heads curve the `label` column format 2 adds.
Format 2 -> 3: the index (orchestrator/index.py) is built from every run's state.json.

Each file is rewritten atomically and the upgrade is idempotent, so two drivers may run it at
once and a killed one is finished by the next; store.json's version is written last."""
from __future__ import annotations

import os

import pandas as pd

from common.atomic import read_json, write_json
from common.metrics import MetricSpec
from jobs.evals import EVALUATIONS
from jobs.evals.induction import CURVES as INDUCTION_CURVES
from jobs.evals.induction import head_labels
from jobs.registry import TRAIN
from orchestrator import index
from orchestrator.store import FORMAT_VERSION, Store


HEADS = next(iter(INDUCTION_CURVES))  # the curve whose format changed


def _declared() -> tuple[dict[str, MetricSpec], dict[str, dict]]:
    jobs = [TRAIN, *(ev for _, ev in EVALUATIONS.items())]
    metrics = {name: spec for job in jobs for name, spec in job.metrics.items()}
    curves = {name: spec.to_record() for job in jobs for name, spec in job.curves.items()}
    return metrics, curves


def upgrade(store: Store) -> bool:
    """Bring the store to this code's format, one step per format; returns whether anything was
    rewritten. Each step is idempotent, and store.json's version is written last."""
    if not (store.root / "store.json").exists() or store.format_version() >= FORMAT_VERSION:
        return False
    version = store.format_version()
    if version < 2:
        _add_specs(store)
    if version < 3:
        _build_index(store)
    write_json(os.path.join(store.root, "store.json"), {"format_version": FORMAT_VERSION})
    return True


def _add_specs(store: Store) -> None:
    """1 -> 2: the metric and curve specs in metrics.json."""
    metrics, curves = _declared()
    for run_id in store.run_ids():
        path = store.run_file(run_id, "metrics.json")
        try:
            current = read_json(path)
        except ValueError:  # a damaged file: `recover` moves it aside when the run is next touched
            continue
        if current is None or "specs" in current:
            continue
        directions = current.get("higher_is_better", {})
        current["specs"] = {name: (metrics.get(name) or MetricSpec(name, directions.get(name))).to_record()
                            for name in current.get("metrics", {})}
        current["curve_specs"] = {name: curves.get(name, {"title": name, "kind": "data"})
                                  for name in current.get("curves", {})}
        heads = current.get("curves", {}).get(HEADS)
        if isinstance(heads, dict) and "label" not in heads:
            heads["label"] = head_labels(pd.DataFrame(heads))
        write_json(path, current)


def _build_index(store: Store) -> None:
    """2 -> 3: the index of every run's status (orchestrator/index.py), from each state.json.
    Runs planned but never started have a directory in these formats: they are indexed pending."""
    index.replace(str(store.root), index.of_states((rid, store.read_state(rid)) for rid in store.run_ids()))
