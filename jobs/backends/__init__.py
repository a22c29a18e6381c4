"""Training backends: one file each in this package, a config class registered under its name
(`backend.name`). A backend trains a run (`train`) and loads its final model for evaluations
(`load_model`), so the rest of the project never names one."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from common.registry import Registry
from common.settings import setting
from jobs.contract import JobResult, Progress
from jobs.model import Decoder


@dataclass
class BackendConfig:
    name: str = setting()
    device: str = setting(choices=("auto", "cpu", "cuda"))  # auto: CUDA when the job was given GPUs

    # True: the backend starts torchrun itself (on every node of a multi-node job, with the
    # rendezvous); False: a multi-process job runs this backend's `train` in each torchrun rank.
    launches_ranks = False
    # True: training reads the run's data section (data.train_stream); False: the backend trains
    # on a dataset of its own, so data options of the training set (data.train_sequences) are refused.
    trains_on_data = True

    def train(self, cfg: Any, run_dir: Path, progress: Progress,
              rendezvous: Optional[dict] = None) -> Optional[JobResult]:
        """Train (or resume) the run; returns its result (None on nodes other than rank 0)."""
        raise NotImplementedError

    def load_model(self, cfg: Any, run_dir: Path) -> Decoder:
        """The finished run's model on CPU in eval mode; refuses a run that has not finished."""
        raise NotImplementedError


BACKENDS: Registry[type[BackendConfig]] = Registry("backend", "jobs.backends", "backend.name")
