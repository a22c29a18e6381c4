"""What a job is given to run on: CPUs, GPUs and memory per node, and nodes for training
(a size's `resources`, `eval.resources` for the evaluations), and the process layout it implies."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.settings import require, setting

if TYPE_CHECKING:
    from config.run import JobConfig


@dataclass(frozen=True)
class Resources:
    cpus: int = setting(gt=0)
    gpus: float = setting(ge=0)
    memory_gb: float = setting(gt=0)

    @property
    def procs_per_node(self) -> int:
        """Processes per node: one per whole GPU, or one on a CPU-only (or shared) GPU."""
        return max(1, int(self.gpus))


@dataclass(frozen=True)
class TrainResources(Resources):
    nodes: int = setting(ge=1)

    @property
    def world_size(self) -> int:
        """Training ranks of a run: nodes x processes per node."""
        return self.nodes * self.procs_per_node

    def check(self, run: JobConfig) -> None:
        require(self.gpus <= 1 or float(self.gpus).is_integer(),
                f"resources.gpus={self.gpus:g}: more than one GPU per node must be a whole number "
                f"(one training process per GPU)")
        require(self.nodes == 1 or self.gpus == 0 or float(self.gpus).is_integer(),
                f"resources.gpus={self.gpus:g}: a multi-node job needs whole GPUs per node")
        batch = run.train.batch_size
        require(batch % self.world_size == 0,
                f"train.batch_size={batch}: must be divisible by the {self.world_size} training processes "
                f"(resources.nodes={self.nodes} x {self.procs_per_node} per node); change one of them")
