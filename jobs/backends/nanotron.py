"""backend=nanotron: nanotron's trainer, stage by stage, launched with torchrun on the job's
GPUs (jobs/nanotron/); evaluations load its final checkpoint through the checkpoint bridge."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from common.settings import section
from jobs.backends import BACKENDS, BackendConfig
from jobs.contract import JobResult, Progress
from jobs.model import Decoder
from jobs.nanotron.bridge import final_model
from jobs.nanotron.render import dry_run_text
from jobs.nanotron.settings import NanotronSettings
from jobs.nanotron.train import train_job

if TYPE_CHECKING:  # type hints only: jobs.config imports the packages that define the sections
    from jobs.config import JobConfig


@BACKENDS.register("nanotron")
@dataclass
class NanotronBackendConfig(BackendConfig):
    nanotron: NanotronSettings = section(NanotronSettings)

    launches_ranks = True  # it runs torchrun itself, once per stage
    trains_on_data = False  # backend.nanotron.dataset, not data.*

    def train(self, cfg: JobConfig, run_dir: Path, progress: Progress,
              rendezvous: Optional[dict] = None) -> Optional[JobResult]:
        return train_job(cfg, run_dir, progress, rendezvous)

    def load_model(self, cfg: JobConfig, run_dir: Path) -> Decoder:
        return final_model(cfg, run_dir).eval()

    def dry_run_text(self, cfg: JobConfig, run_id: str, run_dir: Path) -> str:
        """Each stage's nanotron YAML and torchrun command, for `sweep --dry-run`."""
        return dry_run_text(cfg, run_id, run_dir)
