"""backend=torch: the built-in PyTorch trainer (jobs/train.py), in the Ray task for one process
or in every rank of torchrun (DDP) for several. Evaluations get the final weights, or, when the
data has a validation split (data.train_sequences), the weights of the lowest validation loss."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import pandas as pd

from jobs.backends import BACKENDS, BackendConfig
from jobs.checkpoint import latest_checkpoint
from jobs.contract import JobResult, Progress
from jobs.families import build_model
from jobs.model import Decoder
from jobs.train import train

if TYPE_CHECKING:  # type hints only: jobs.config imports the packages that define the sections
    from jobs.config import JobConfig


@BACKENDS.register("torch")
@dataclass
class TorchBackendConfig(BackendConfig):
    def train(self, cfg: JobConfig, run_dir: Path, progress: Progress,
              rendezvous: Optional[dict] = None) -> JobResult:
        stream = cfg.data.train_stream(cfg.seed, cfg.train.batch_size)
        metrics = train(cfg, run_dir, stream.batch, progress, validation=getattr(stream, "validation", None))
        history = pd.DataFrame(metrics.pop("history"))
        curves = {"ancestors": metrics.pop("ancestors")}
        if "validation" in metrics:
            curves["validation_loss"] = metrics.pop("validation")
        return JobResult(metrics=metrics, curves=curves, history=history)

    def load_model(self, cfg: JobConfig, run_dir: Path) -> Decoder:
        state = latest_checkpoint(run_dir)
        steps = cfg.train.steps
        if state is None or state["step"] != steps:
            found = "no checkpoint" if state is None else f"step {state['step']}"
            raise FileNotFoundError(f"{run_dir} has no final checkpoint (step {steps}); found {found}")
        state = state.get("chosen") or state  # trained with a validation split: the weights it chose
        model = build_model(cfg.family, cfg.model, state["ancestors"])
        model.load_state_dict(state["model"])
        return model.eval()
