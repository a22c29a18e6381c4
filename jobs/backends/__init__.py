"""Training backends: one file each in this package, a `Backend` registered under its name
(`backend.name`, its config in config/backend.py). A backend trains a run (`train`) and loads
its final model for evaluations (`load_model`), so the rest of the project never names one."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from common.registry import Registry
from config.run import JobConfig
from jobs.contract import JobResult, Progress
from jobs.model import Decoder

# torchrun's rendezvous of a multi-node job: node_rank, master_addr, master_port (and the nodes' Ray ids)
Rendezvous = dict[str, object]


class Backend:
    def train(self, cfg: JobConfig, run_dir: Path, progress: Optional[Progress],
              rendezvous: Optional[Rendezvous] = None) -> Optional[JobResult]:
        """Train (or resume) the run; returns its result (None on nodes other than rank 0)."""
        raise NotImplementedError

    def load_model(self, cfg: JobConfig, run_dir: Path) -> Decoder:
        """The finished run's model on CPU in eval mode; refuses a run that has not finished."""
        raise NotImplementedError

    def dry_run_text(self, cfg: JobConfig, run_id: str, run_dir: Path) -> Optional[str]:
        """What `sweep --dry-run` shows of how the backend would run the job (None: nothing)."""
        return None


BACKENDS: Registry[type[Backend]] = Registry("backend", "jobs.backends", "backend.name")


def backend_of(cfg: JobConfig) -> Backend:
    """The behaviour of the run's backend."""
    return BACKENDS[cfg.backend.name]()


def load_model(cfg: JobConfig, run_dir: Path) -> Decoder:
    """The finished run's model, loaded by its backend (what evaluations score)."""
    return backend_of(cfg).load_model(cfg, run_dir)
