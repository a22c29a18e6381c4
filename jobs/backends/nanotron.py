"""backend=nanotron: nanotron's trainer, stage by stage, launched with torchrun on the job's
GPUs (jobs/nanotron/); evaluations load its final checkpoint through the checkpoint bridge."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from config.run import JobConfig
from jobs.backends import BACKENDS, Backend, Rendezvous
from jobs.contract import JobResult, Progress
from jobs.model import Decoder
from jobs.nanotron.bridge import final_model
from jobs.nanotron.render import dry_run_text
from jobs.nanotron.train import train_job


@BACKENDS.register("nanotron")
class NanotronBackend(Backend):
    def train(self, cfg: JobConfig, run_dir: Path, progress: Optional[Progress],
              rendezvous: Optional[Rendezvous] = None) -> Optional[JobResult]:
        return train_job(cfg, run_dir, progress, rendezvous)

    def load_model(self, cfg: JobConfig, run_dir: Path) -> Decoder:
        return final_model(cfg, run_dir).eval()

    def dry_run_text(self, cfg: JobConfig, run_id: str, run_dir: Path) -> str:
        """Each stage's nanotron YAML and torchrun command, for `sweep --dry-run`."""
        return dry_run_text(cfg, run_id, run_dir)
