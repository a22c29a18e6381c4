"""Evaluations: one file each in this package, registered with `@evaluation`, run after training
on the run's final checkpoint when listed in `eval.jobs`.

An evaluation declares, where it is registered, everything the rest of the project needs: the
settings it reads (a dataclass: its section `eval.<name>`, defaults in conf/eval/default.yaml
or in the dataclass), the data kinds it runs on, and a spec per metric and curve it records
(label, direction, headline and confirmatory roles; common/metrics.py), which the report reads
from the store. See docs/extending.md for a worked example.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from common.metrics import CurveSpec, MetricSpec
from common.registry import Registry
from common.settings import require, section, setting
from jobs.contract import Job, JobFn
from jobs.resources import Resources


@dataclass(frozen=True)
class Evaluation(Job):
    settings: Optional[type] = None  # the dataclass of its section eval.<name>, if it has settings
    # Bumped when what its metrics mean changes: recorded with its results (with the digest of its
    # settings, orchestrator/identity.py), so results of an earlier revision are computed again.
    revision: int = 1


EVALUATIONS: Registry[Evaluation] = Registry("evaluation", "jobs.evals", "eval.jobs")


def evaluation(name: str, *, title: str, metrics: Mapping[str, MetricSpec], curves: Mapping[str, CurveSpec] = {},
               data: tuple[str, ...] = ("regbench",), settings: Optional[type] = None,
               revision: int = 1) -> Callable[[JobFn], JobFn]:
    """Register an evaluation job with its report section's title, what it records, the data kinds
    it runs on, its settings, and the revision of its metrics' meaning."""
    def register(fn: JobFn) -> JobFn:
        EVALUATIONS.register(name)(Evaluation(name, fn, dict(metrics), dict(curves), tuple(data), title=title,
                                              settings=settings, revision=revision))
        return fn
    return register


@dataclass
class EvalSection:
    """`eval`: which evaluations run (`jobs`), on what (`resources`), and one section of settings
    per evaluation that has them, added by `eval_config` from the registry."""
    jobs: list[str] = setting()
    resources: Resources = section(Resources)

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any:
            """The settings section of an evaluation (a field `eval_config` adds), for the type checker."""

    def check(self, run: Any) -> None:
        kind = run.data.kind
        for name in self.jobs:
            ev = EVALUATIONS[name]
            require(not ev.data or kind in ev.data,
                    f"eval.jobs: {name} needs data.kind={'/'.join(sorted(ev.data))}, but data={run.data.name} "
                    f"is data.kind={kind}; drop {name} from eval.jobs or choose other data")


@functools.cache
def eval_config() -> type:
    """The `eval` section's class: EvalSection plus a field per registered evaluation with settings."""
    fields = [(name, ev.settings, field(default_factory=ev.settings))
              for name, ev in EVALUATIONS.items() if ev.settings is not None]
    cls = dataclasses.make_dataclass("EvalConfig", fields, bases=(EvalSection,))
    cls.__module__ = __name__  # pickled by reference, found through the module's __getattr__
    return cls


def __getattr__(name: str) -> Any:
    if name == "EvalConfig":
        return eval_config()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
