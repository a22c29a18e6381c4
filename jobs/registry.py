"""Jobs by name. `train` trains a run; every module in `jobs/evals/` registers its evaluations
with `@evaluation("name")`, so adding one is one file plus its name in `eval.jobs`.

A job is `fn(cfg, run_dir, progress) -> JobResult`: it reads and writes only inside `run_dir`
(checkpoints) and returns what the orchestrator records in the store."""
from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

Progress = Callable[[dict], None]


@dataclass
class JobResult:
    metrics: dict[str, float]
    higher_is_better: dict[str, bool]
    curves: dict = field(default_factory=dict)
    items: Optional[pd.DataFrame] = None      # per-example outputs: item_id, metric, score, weight
    history: Optional[pd.DataFrame] = None    # training curve: step, loss, lr, tokens, flops, ...


JobFn = Callable[[dict, Path, Progress], JobResult]
EVALUATIONS: dict[str, JobFn] = {}
METRICS: dict[str, frozenset[str]] = {"train": frozenset({"final_loss"})}  # outcome metrics per job
DATA_KINDS: dict[str, frozenset[str]] = {}  # evaluation -> the data.kind values it runs on
# The confirmatory (primary) metric of each data.kind: the console shows it, the report tests it first.
HEADLINE_METRICS: dict[str, str] = {"regbench": "regbench_tvd", "arith": "gsm8k_em_strict"}


def evaluation(name: str, metrics: tuple[str, ...],
               data: tuple[str, ...] = ("regbench",)) -> Callable[[JobFn], JobFn]:
    """Register an evaluation job, the outcome metrics it records and the data kinds it runs on
    (both checked in configs)."""
    def register(fn: JobFn) -> JobFn:
        if name in EVALUATIONS:
            raise ValueError(f"evaluation {name!r} registered twice")
        EVALUATIONS[name] = fn
        METRICS[name] = frozenset(metrics)
        DATA_KINDS[name] = frozenset(data)
        return fn
    return register


@functools.cache  # once per process: a worker runs thousands of jobs
def _discover() -> None:
    from . import evals
    for module in pkgutil.iter_modules(evals.__path__):
        importlib.import_module(f"{evals.__name__}.{module.name}")


def catalog() -> dict[str, frozenset[str]]:
    """Job name -> the outcome metrics it records, for `train` and every evaluation."""
    _discover()
    return dict(METRICS)


def data_kinds() -> dict[str, frozenset[str]]:
    """Evaluation name -> the data.kind values it runs on."""
    _discover()
    return dict(DATA_KINDS)


def train_stream(cfg: dict):
    """The data.kind's training stream; `.batch(step)` is a pure function of (seed, step)."""
    if cfg["data"]["kind"] == "arith":
        from .data.arith import TrainStream
    else:
        from .data.regbench import TrainStream
    return TrainStream(cfg["data"], cfg["seed"], cfg["train"]["batch_size"])


def train_job(cfg: dict, run_dir: Path, progress: Progress) -> JobResult:
    """Train on the configured data stream; the stream is a pure function of (seed, step)."""
    if cfg["backend"]["name"] == "nanotron":  # nanotron's trainer, stage by stage (jobs/nanotron)
        from .nanotron.train import train_job as nanotron_train
        return nanotron_train(cfg, run_dir, progress)
    from .train import train

    stream = train_stream(cfg)
    metrics = train(cfg, run_dir, stream.batch, progress)
    history = pd.DataFrame(metrics.pop("history"))
    curves = {"ancestors": metrics.pop("ancestors")}
    # Only the loss is an outcome; FLOPs, tokens, steps and timings describe the run.
    return JobResult(metrics=metrics, higher_is_better={"final_loss": False}, curves=curves,
                     history=history)


def get_job(name: str) -> JobFn:
    if name == "train":
        return train_job
    _discover()
    return EVALUATIONS[name]
