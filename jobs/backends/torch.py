"""backend=torch: the built-in PyTorch trainer (jobs/train.py), in the Ray task for one process
or in every rank of torchrun (DDP) for several. Evaluations get the final weights, or, when the
data has a validation split (data.train_sequences), the weights of the lowest validation loss."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd

from config.run import JobConfig
from jobs.backends import BACKENDS, Backend, Rendezvous
from jobs.checkpoint import latest_checkpoint
from jobs.contract import JobResult, Progress
from jobs.data import train_stream
from jobs.families import build_model
from jobs.model import Decoder
from jobs.train import train


@BACKENDS.register("torch")
class TorchBackend(Backend):
    def train(self, cfg: JobConfig, run_dir: Path, progress: Optional[Progress],
              rendezvous: Optional[Rendezvous] = None) -> JobResult:
        stream = train_stream(cfg.data, cfg.effective_data_seed, cfg.train.batch_size)
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
