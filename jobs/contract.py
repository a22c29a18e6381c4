"""The job contract: what a job is given and what it returns to the orchestrator.

A job is `fn(cfg, run_dir, progress) -> JobResult`: it reads its typed config, reads and writes
only inside `run_dir` (checkpoints), reports progress through `progress` (a dict per report:
step, total_steps, loss, ...), and returns its results, which the orchestrator records in the
store. A `Job` is such a function with the specs of the metrics and curves it records.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from common.metrics import STEP, CurveSpec, MetricSpec, step_of

Progress = Callable[[dict], None]


@dataclass
class JobResult:
    metrics: dict[str, float]
    curves: dict = field(default_factory=dict)  # name -> {column: [values]} (or any JSON value)
    items: Optional[pd.DataFrame] = None        # per-example outputs: item_id, metric, score, weight
    history: Optional[pd.DataFrame] = None      # training curve: step, loss, lr, tokens, flops, ...


JobFn = Callable[[Any, Path, Progress], JobResult]


@dataclass(frozen=True)
class Job:
    """A job by name, with what it records. `data`: the data kinds it runs on (empty: any);
    `title`: the report section its metrics and curves are shown in."""
    name: str
    fn: JobFn
    metrics: Mapping[str, MetricSpec]
    curves: Mapping[str, CurveSpec] = field(default_factory=dict)
    data: tuple[str, ...] = ()
    title: str = ""

    def __post_init__(self) -> None:
        """Each spec carries its report section: the job's title (or name)."""
        section = self.title or self.name
        object.__setattr__(self, "metrics", {n: replace(s, section=section) for n, s in self.metrics.items()})
        object.__setattr__(self, "curves", {n: replace(s, section=section) for n, s in self.curves.items()})

    def outcomes(self) -> frozenset[str]:
        """The metrics it records that are compared between families (not descriptive; a per-step
        template names no metric of its own)."""
        return frozenset(name for name, spec in self.metrics.items()
                         if spec.higher_is_better is not None and not spec.reference and STEP not in name)

    def spec_of(self, name: str) -> Optional[MetricSpec]:
        """The spec metric `name` is declared with: its own, or, for a per-step metric, its
        template's at that step (`induction_max_step{step}` declares `induction_max_step550`)."""
        if name in self.metrics:
            return self.metrics[name]
        for template, spec in self.metrics.items():
            if (step := step_of(template, name)) is not None:
                return spec.at_step(step)
        return None

    def specs_of(self, result: JobResult) -> tuple[dict[str, dict], dict[str, dict]]:
        """The records of the specs of what `result` holds; a metric or curve the job did not
        declare is a programming error, refused here before anything is written."""
        specs = {name: self.spec_of(name) for name in result.metrics}
        undeclared = sorted({name for name, spec in specs.items() if spec is None}
                            | (set(result.curves) - set(self.curves)))
        if undeclared:
            raise ValueError(f"job {self.name} recorded {undeclared} without declaring them "
                             f"(its metrics= / curves= where it is registered)")
        return ({name: spec.to_record() for name, spec in specs.items() if spec is not None},
                {name: self.curves[name].to_record() for name in result.curves})
