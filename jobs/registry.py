"""Jobs by name: `train` (the run's backend trains it) and every registered evaluation.

A job is `fn(cfg, run_dir, progress) -> JobResult` (jobs/contract.py) with the specs of what it
records; `get_job` is how the orchestrator's worker and a torchrun rank find one."""
from __future__ import annotations

from pathlib import Path

from common.metrics import CurveSpec, MetricSpec
from config.run import JobConfig
from jobs.backends import backend_of
from jobs.contract import Job, JobResult, Progress
from jobs.evals import EVALUATIONS


def train(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    """Train (or resume) the run with its backend, in this process."""
    result = backend_of(cfg).train(cfg, run_dir, progress)
    assert result is not None  # the single-process path is rank 0
    return result


# Only the loss is an outcome; FLOPs, tokens, steps and timings describe the run.
TRAIN = Job("train", train, metrics={
    "final_loss": MetricSpec("final loss", higher_is_better=False),
    "train_flops": MetricSpec("training FLOPs", cost=True, claim="LIDAS trains on fewer FLOPs than dense",
                              paper=(("lidas", 0.26),), paper_at="3B"),
    "train_tokens": MetricSpec("training tokens"),
    "steps": MetricSpec("optimizer steps"),
    "n_params": MetricSpec("parameters"),
    "final_layers": MetricSpec("final effective depth"),
    "wall_time_s": MetricSpec("wall time (s)"),
    "tokens_per_s": MetricSpec("training throughput (tokens/s)"),
    # With a fixed training set (data.train_sequences): the checkpoint the evaluations score.
    "chosen_val_loss": MetricSpec("validation loss of the evaluated checkpoint (the lowest)", higher_is_better=False),
    "chosen_step": MetricSpec("step of the evaluated checkpoint (lowest validation loss)"),
}, curves={"ancestors": CurveSpec("the initial layer each final layer descends from", "data"),
           "validation_loss": CurveSpec("validation loss by step (fixed training set)", "data")}, title="Training")


def get_job(name: str) -> Job:
    return TRAIN if name == "train" else EVALUATIONS[name]


def recording_jobs(cfg: JobConfig) -> list[Job]:
    """train and the evaluations of cfg.eval.jobs that record metrics on `cfg` (an evaluation
    may measure only some configs of its data kinds: `measures=` of @evaluation)."""
    evaluations = [EVALUATIONS[name] for name in cfg.eval.jobs]
    return [TRAIN, *(e for e in evaluations if e.measures is None or e.measures(cfg))]


def catalog() -> dict[str, frozenset[str]]:
    """Job name -> the outcome metrics it records (compared between families)."""
    return {"train": TRAIN.outcomes(), **{name: ev.outcomes() for name, ev in EVALUATIONS.items()}}


def _declared_metrics() -> list[tuple[str, MetricSpec]]:
    """(name, spec) of every metric every job declares: train's, then each evaluation's."""
    jobs = [TRAIN, *(ev for _, ev in EVALUATIONS.items())]
    return [(name, spec) for job in jobs for name, spec in job.metrics.items()]


def headline(data_kind: str) -> str | None:
    """The headline metric of a data kind, as the jobs declare it (e.g. regbench_tvd)."""
    return next((name for name, spec in _declared_metrics() if data_kind in spec.headline_for), None)


def claims() -> dict[str, MetricSpec]:
    """Every metric, of every job, that declares one of the paper's claims: the report names those
    a sweep did not measure."""
    return {name: spec for name, spec in _declared_metrics() if spec.claim}
