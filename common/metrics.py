"""What a metric and a curve mean, declared by the job that records them and stored with the run.

An evaluation declares a `MetricSpec` for each metric it records and a `CurveSpec` for each curve;
the worker writes them into the run's metrics.json (`specs`, `curve_specs`), and `analysis` reads
them from there. So the report knows every metric's label, direction and role without knowing any
evaluation by name, and an evaluation added later is reported like the built-in ones.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

# In a declared metric's name and label: a template of one metric per training step, e.g.
# `induction_max_step{step}` declares `induction_max_step550` (see MetricSpec.step).
STEP = "{step}"


@dataclass(frozen=True)
class MetricSpec:
    """One metric of a job.

    higher_is_better: the direction it is compared in; None = descriptive (shown, never tested).
    headline_for: the data kinds (data.kind) whose headline metric this is: the console shows it,
        the report opens with it.
    confirmatory_for: the data kinds where it belongs to the confirmatory family (Holm); every other
        compared metric is exploratory (Benjamini-Hochberg).
    references: reference estimators (other metrics, weakest first) shown as rows beside it; a
        model that does not beat the first one is flagged, with `below_first` saying what that means.
    reference: this metric is such a reference estimator: the same in every run of a data setting,
        not a result of the model, so never compared.
    effect: what "higher" means when the metric measures an effect rather than a quality.
    p_value: a per-run p-value; the report combines it across seeds (Fisher's method), showing the
        `companions` (other metrics: the statistic and its chance value) beside it.
    cost: a cost (training FLOPs): the report states each family's saving against the baseline.
    claim: the paper's claim this metric measures, in words; the report's claims table puts the
        sweep's verdict on it beside `paper`, the paper's single-seed values per family (at
        `paper_at`; for a cost, each family's saving against the baseline; for a p-value, its
        first companion).
    mechanism: the mechanism a model has when the median of this metric over its seeds is at least
        `present_at` (e.g. induction heads): the report's headline says in one sentence whether each
        family formed it, so that no one reads mechanistic numbers from models that have none.
    section: the report section it is shown in: the title of the job that records it, filled in
        by the Job it is declared with (jobs/contract.py), not declared.
    measured_with: what measuring its claim takes, for the report's line on the claims a sweep did
        not measure (a claim beyond the CPU sizes says so there).
    step: the training step of a metric declared as a per-step template (a name with `STEP`), filled
        in from its name (`at_step`), not declared. Per-step metrics are descriptive values for the
        results tables; the report draws them as curves over training rather than a section each.
    """
    label: str
    higher_is_better: Optional[bool] = None
    headline_for: tuple[str, ...] = ()
    confirmatory_for: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    below_first: str = ""
    reference: bool = False
    effect: str = ""
    p_value: bool = False
    companions: tuple[str, ...] = ()
    cost: bool = False
    claim: str = ""
    paper: tuple[tuple[str, float], ...] = ()
    paper_at: str = ""
    mechanism: str = ""
    present_at: Optional[float] = None
    section: str = ""
    measured_with: str = ""
    step: Optional[int] = None

    def at_step(self, step: int) -> MetricSpec:
        """The spec of this per-step template's metric at `step`: the step in its label too."""
        return dataclasses.replace(self, label=self.label.replace(STEP, str(step)), step=step)

    def paper_value(self, family: str) -> Optional[float]:
        return dict(self.paper).get(family)

    def to_record(self) -> dict[str, Any]:
        """Plain values for metrics.json (only what differs from the defaults)."""
        default = MetricSpec(self.label)
        return {f.name: _lists(v) for f in dataclasses.fields(self)
                if (v := getattr(self, f.name)) != getattr(default, f.name) or f.name == "label"}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> MetricSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: _tuples(v) for k, v in record.items() if k in known})


@dataclass(frozen=True)
class CurveSpec:
    """One curve of a job (a column table in metrics.json's `curves`), and how the report shows it.

    kind: "line": `y` (and the `references` columns) against `x`, mean and band over seeds per
        family, with the number of points behind each x from `count`;
        "table": the mean over seeds of `columns` at each `x`;
        "ranking": per run, the `top` rows of highest `y`, each written as `row` (a format string
        over the curve's columns);
        "data": kept in the store for whoever reads it, not shown.
    section: as MetricSpec.section.
    """
    title: str
    kind: str
    x: str = ""
    x_label: str = ""
    y: str = ""
    references: tuple[str, ...] = ()
    count: str = ""
    columns: tuple[str, ...] = ()
    top: int = 3
    row: str = ""
    caption: str = ""
    section: str = ""

    def to_record(self) -> dict[str, Any]:
        return {f.name: _lists(v) for f in dataclasses.fields(self)
                if (v := getattr(self, f.name)) != f.default or f.name in ("title", "kind")}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> CurveSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: _tuples(v) for k, v in record.items() if k in known})


def step_of(template: str, name: str) -> Optional[int]:
    """The step at which metric `name` instantiates the per-step `template` (a name with `STEP`),
    or None when it does not."""
    prefix, found, suffix = template.partition(STEP)
    middle = name[len(prefix):len(name) - len(suffix)]
    if not found or not name.startswith(prefix) or not name.endswith(suffix) or not middle.isdigit():
        return None
    return int(middle)


def _lists(value: Any) -> Any:
    """Tuples (nested too) as lists, for JSON."""
    return [_lists(v) for v in value] if isinstance(value, tuple) else value


def _tuples(value: Any) -> Any:
    """Lists (nested too) back as tuples, so a spec read back equals the one declared."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
