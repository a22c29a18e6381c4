"""The store's upgrade (store/upgrade.py) with what the jobs declare today: the store imports no
job, so the orchestrator hands their metric and curve specs over."""
from __future__ import annotations

from jobs.evals import EVALUATIONS
from jobs.evals.induction import CURVES as INDUCTION_CURVES
from jobs.evals.induction import head_labels
from jobs.registry import TRAIN
from store import upgrade as steps
from store.store import Store


def declared() -> steps.Declared:
    jobs = [TRAIN, *(ev for _, ev in EVALUATIONS.items())]
    return steps.Declared(
        metrics={name: spec for job in jobs for name, spec in job.metrics.items()},
        curves={name: spec.to_record() for job in jobs for name, spec in job.curves.items()},
        labels={next(iter(INDUCTION_CURVES)): head_labels})  # the induction-heads curve gained labels in format 2


def upgrade(store: Store) -> bool:
    """Bring the store to this code's format (store/upgrade.py); whether anything was rewritten."""
    return steps.upgrade(store, declared)
