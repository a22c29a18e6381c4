"""Evaluations: one file each in this package, registered with `@evaluation`, run after training
on the run's final checkpoint when listed in `eval.jobs`.

An evaluation is declared in the config (config/evals.py `declare_evaluation`, or a plugin): its
settings (a dataclass: its section `eval.<name>`, defaults in conf/eval/default.yaml or in the
dataclass) and the data kinds it runs on. Its job, registered here under the same name, declares
a spec per metric and curve it records (label, direction, headline and confirmatory roles;
common/metrics.py), which the report reads from the store. See docs/extending.md for a worked
example.

An evaluation's own random draws (the induction eval's sequences, the ablation's random heads and
reference batch, a permutation test's null) follow the run's `seed`, never `init_seed` or
`data_seed`: they are how a trained model is measured, not how it was trained. Crossing init and
data seeds at one `seed` then measures every model of the grid on the same draws, so the spread
between them is the training's alone and splits into init and data parts (docs/statistics.md
"Where the seed spread comes from"); sweeping `seed` as before varies all three together.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from common.metrics import CurveSpec, MetricSpec
from common.registry import Registry
from config.evals import EVAL_CONFIGS
from jobs.contract import Job, JobFn


@dataclass(frozen=True)
class Evaluation(Job):
    settings: Optional[type] = None  # the dataclass of its section eval.<name>, if it has settings
    # Bumped when what its metrics mean changes: recorded with its results (with the digest of its
    # settings, orchestrator/identity.py), so results of an earlier revision are computed again.
    revision: int = 1
    # The configs it measures something on (None: every config of its data kinds); on the others
    # its job records nothing, and planning does not count its metrics (knowledge: data with facts).
    measures: Optional[Callable[[Any], bool]] = None


EVALUATIONS: Registry[Evaluation] = Registry("evaluation", "jobs.evals", "eval.jobs")


def evaluation(name: str, *, title: str, metrics: Mapping[str, MetricSpec], curves: Mapping[str, CurveSpec] = {},
               revision: int = 1, measures: Optional[Callable[[Any], bool]] = None) -> Callable[[JobFn], JobFn]:
    """Register the job of evaluation `name` (declared in the config: its settings and data kinds)
    with its report section's title, what it records, the revision of its metrics' meaning, and
    the configs it measures something on (None: all)."""
    declared = EVAL_CONFIGS[name]

    def register(fn: JobFn) -> JobFn:
        EVALUATIONS.register(name)(Evaluation(name, fn, dict(metrics), dict(curves), declared.data, title=title,
                                              settings=declared.settings, revision=revision, measures=measures))
        return fn
    return register
