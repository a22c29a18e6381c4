"""Upgrading a store of an older format in place, so nothing a user ran is lost.

Format 1 -> 2: metrics.json gains `specs` and `curve_specs`, the specs of its metrics and curves
as the jobs declare them now (a metric no job declares any more keeps its name as its label and
its recorded direction), and the `label` column some curves gained in format 2. The store
imports no job: the orchestrator hands the declarations over (`Declared`).
Format 2 -> 3: the index (store/index.py) is built from every run's state.json.
Format 3 -> 4: store.json becomes the marker (store/layout.py `OWNER`); nothing else changes.

Each file is rewritten atomically and the upgrade is idempotent, so two drivers may run it at
once and a killed one is finished by the next; store.json is written last."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from common.atomic import write_json
from common.metrics import MetricSpec
from store import index
from store.layout import FORMAT_VERSION
from store.records import marker, read_metrics, write_metrics
from store.store import Store


@dataclass(frozen=True)
class Declared:
    """What the jobs declare today, for the 1 -> 2 step: the spec of each metric and the record
    of each curve's spec, and for each curve that gained a `label` column in format 2 the
    function that computes it from the curve's points."""
    metrics: dict[str, MetricSpec]
    curves: dict[str, dict[str, Any]]
    labels: dict[str, Callable[[pd.DataFrame], Any]] = field(default_factory=dict)


def upgrade(store: Store, declared: Callable[[], Declared]) -> bool:
    """Bring the store to this code's format, one step per format; returns whether anything was
    rewritten. `declared` is called only when a store of format 1 needs it."""
    version = store.check()
    if version is None or version >= FORMAT_VERSION:
        return False
    if version < 2:
        _add_specs(store, declared())
    if version < 3:
        _build_index(store)
    write_json(store.layout.marker, marker())
    return True


def _add_specs(store: Store, declared: Declared) -> None:
    """1 -> 2: the metric and curve specs in metrics.json."""
    for run_id in store.run_ids():
        path = store.run(run_id).metrics
        try:
            current = read_metrics(path)
        except ValueError:  # a damaged file: `recover` moves it aside when the run is next touched
            continue
        if current is None or "specs" in current:
            continue
        directions = current.get("higher_is_better", {})
        current["specs"] = {name: (declared.metrics.get(name) or MetricSpec(name, directions.get(name))).to_record()
                            for name in current.get("metrics", {})}
        current["curve_specs"] = {name: declared.curves.get(name, {"title": name, "kind": "data"})
                                  for name in current.get("curves", {})}
        for curve, label in declared.labels.items():
            points = current.get("curves", {}).get(curve)
            if isinstance(points, dict) and "label" not in points:
                points["label"] = label(pd.DataFrame(points))
        write_metrics(path, current)


def _build_index(store: Store) -> None:
    """2 -> 3: the index of every run's status (store/index.py), from each state.json.
    Runs planned but never started have a directory in these formats: they are indexed pending."""
    index.replace(store.layout.root, index.of_states((rid, store.read_state(rid)) for rid in store.run_ids()))
