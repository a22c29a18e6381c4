"""Where a sweep's jobs run: one executor per cluster kind, a file each in this package,
registered under the kind's name (its config, the `cluster` section, is in config/cluster.py).

    local        a Ray started on this machine for the sweep (ray_driver.py)
    ray          an existing Ray cluster at cluster.address
    slurm        a Slurm allocation with Ray inside; the same sweep driver runs in it
    slurm_array  one Slurm array task per run, without Ray

An executor is handed the planned runs and runs their jobs (Ray: now, with a live view) or
submits them (Slurm: the allocation or the array writes the store, `status` follows it)."""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Optional

from common.registry import Registry
from config.cluster import ClusterConfig

if TYPE_CHECKING:  # for annotations only; plan and sweep import this package, not the reverse
    from rich.console import Console

    from orchestrator.plan import PlannedRun
    from store.records import SweepManifest
    from store.store import Store


@dataclass
class Outcome:
    """What `Executor.run` did: run id -> final status of the runs it ran (Ray), or the Slurm
    jobs it submitted (the runs finish there; `status` follows them)."""
    statuses: dict[str, str] = field(default_factory=dict)
    submitted: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return not self.submitted


class Executor(ABC):
    """How a sweep's planned runs get executed on one kind of cluster. `config` is the cluster
    section, or None for an executor made from a sweep's record (status, cancel)."""

    #: whether `run` returns only once the jobs are over (adaptive looks need it)
    synchronous = True

    def __init__(self, config: Optional[ClusterConfig]):
        self.config = config

    def check(self, runs: list["PlannedRun"], name: str, store: "Store") -> None:
        """Refuse, before anything is written, jobs this cluster can never run."""

    def describe(self, runs: list["PlannedRun"], name: str, overrides: list[str], store: "Store",
                 console: "Console") -> None:
        """What `--dry-run` adds to the plan: the scripts or commands that would run."""

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """The connection the executor keeps across several `run` calls (a Ray session)."""
        yield

    @abstractmethod
    def run(self, runs: list["PlannedRun"], name: str, overrides: list[str], store: "Store",
            console: "Console") -> Outcome:
        """Run (or submit) every job still to do of `runs` (already recorded in `store`)."""

    def status_lines(self, sweep: SweepManifest) -> list[str]:
        """Lines `status` adds for the sweep's jobs on this cluster (Slurm: queue states)."""
        return []

    def cancel(self, sweep: SweepManifest, console: "Console") -> int:
        console.print(f"sweep {sweep['name']}: no Slurm jobs recorded (it ran locally); nothing to cancel",
                      markup=False)
        return 0


EXECUTORS: Registry[type[Executor]] = Registry("cluster kind", "orchestrator.executors", "cluster.name")


def executor_of(config: ClusterConfig) -> Executor:
    """The executor of the run's cluster section."""
    return EXECUTORS[config.name](config)


def recorded_executor(sweep: SweepManifest) -> Optional[Executor]:
    """The executor of the cluster jobs a sweep record lists (None: it ran on Ray directly)."""
    kinds = [job.get("cluster") for job in sweep.get("slurm_jobs", [])]
    return EXECUTORS[kinds[-1]](None) if kinds else None
