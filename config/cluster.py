"""cluster: where a sweep's jobs run (conf/cluster/<kind>.yaml), by `cluster.name`. Each kind's
executor (orchestrator/executors/, registered under the same name) runs or submits them.

    local        a Ray started on this machine for the sweep
    ray          an existing Ray cluster at cluster.address
    slurm        a Slurm allocation with Ray inside; the same sweep driver runs in it
    slurm_array  one Slurm array task per run, without Ray
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from common.registry import Registry
from common.settings import require, setting

if TYPE_CHECKING:
    from config.run import RunConfig

# sbatch reads `#SBATCH` lines itself, without a shell: their values must be single plain words.
SBATCH_WORD = re.compile(r"[A-Za-z0-9_.,:@%+=/-]+")
# A Ray head's address: host:port (a name, an IPv4 or a bracketed IPv6 address), ray:// for Ray Client.
RAY_ADDRESS = re.compile(r"(ray://)?([A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})")


@dataclass(frozen=True)
class ClusterConfig:
    """What every cluster kind has: its name, and what the dry run's GPU-hours estimate assumes
    (training FLOPs / (peak x MFU) / 3600; H100 bf16 dense by default)."""
    name: str = setting()
    gpu_peak_flops_per_s: float = setting(gt=0)
    gpu_mfu: float = setting(gt=0, le=1)


CLUSTER_CONFIGS: Registry[type[ClusterConfig]] = Registry("cluster kind", "config.cluster", "cluster.name")


@CLUSTER_CONFIGS.register("local")
@dataclass(frozen=True)
class LocalConfig(ClusterConfig):
    """A Ray started on this machine for the sweep (CPU only unless told otherwise)."""
    num_cpus: Optional[int] = setting(gt=0)   # null: all cores
    num_gpus: Optional[int] = setting(ge=0)   # null: none
    include_dashboard: bool = setting()
    dashboard_host: str = setting()

    def check(self, run: RunConfig) -> None:
        """Ray fails with a traceback when the dashboard's packages (ray[default]) are missing."""
        if self.include_dashboard:
            from ray._private.utils import get_dashboard_dependency_error  # imports Ray: only when asked

            require(get_dashboard_dependency_error() is None,
                    "cluster.include_dashboard=true: Ray's dashboard needs `pip install 'ray[default]'` "
                    "(same version as ray); or leave the dashboard off")


@CLUSTER_CONFIGS.register("ray")
@dataclass(frozen=True)
class RayClusterConfig(ClusterConfig):
    """An existing Ray cluster."""
    address: Optional[str] = setting()     # head-ip:6379, or auto
    ship_code: Optional[bool] = setting()  # null: ship the project unless the address is on this machine
    connect_timeout_s: float = setting(gt=0)  # to reach the head before the sweep is refused

    def check(self, run: RunConfig) -> None:
        require(bool(self.address), "cluster.address: cluster=ray needs the address of a running cluster, "
                "e.g. cluster.address=10.0.0.5:6379 (or auto for the one started on this machine)")
        if self.address != "auto":
            match = RAY_ADDRESS.fullmatch(str(self.address))
            require(match is not None and 0 < int(match[3]) < 65536,
                    f"cluster.address={self.address}: not host:port; give the head's address and port, "
                    f"e.g. cluster.address=10.0.0.5:6379 (ray://10.0.0.5:10001 for Ray Client, or auto)")


@dataclass(frozen=True)
class SlurmCommon(ClusterConfig):
    """The settings both Slurm kinds share: where the jobs queue, for how long, and what runs
    first in each job (module loads, venv activation)."""
    partition: Optional[str] = setting()  # #SBATCH --partition (null: the cluster's default)
    account: Optional[str] = setting()
    qos: Optional[str] = setting()
    time: str = setting()
    requeue: bool = setting()             # a pre-empted job comes back and resumes
    sbatch: list[str] = setting()         # extra options, one per item: ["--constraint=a100"]
    setup: list[str] = setting()          # shell lines run first

    def check(self, run: RunConfig) -> None:
        for key in ("partition", "account", "qos", "time"):
            value = getattr(self, key)
            require(value is None or bool(SBATCH_WORD.fullmatch(str(value))),
                    f"cluster.{key}={value!r}: not a Slurm name (letters, digits and _.,:@%+=/- only)")
        for option in self.sbatch:
            require(option.startswith("-") and bool(SBATCH_WORD.fullmatch(option)),
                    f"cluster.sbatch: {option!r} is not one sbatch option such as --constraint=a100 "
                    f"(one word, letters, digits and _.,:@%+=/- only)")
        for line in self.setup:
            require("\n" not in line and "\r" not in line,
                    f"cluster.setup: {line!r} spans several lines; give one list item per line")


@CLUSTER_CONFIGS.register("slurm")
@dataclass(frozen=True)
class SlurmConfig(SlurmCommon):
    """A Slurm allocation with Ray inside."""
    nodes: int = setting(ge=1)                 # Ray nodes = Slurm nodes; resources.nodes of a run must fit
    gpus_per_node: int = setting(ge=0)         # #SBATCH --gres=gpu:N, and Ray's --num-gpus per node
    cpus_per_node: int = setting(ge=1)         # #SBATCH --cpus-per-task (one task per node), Ray's --num-cpus
    mem_gb: float = setting(gt=0)              # #SBATCH --mem per node; Ray gets 3/4, its object store 1/4
    ray_start_timeout_s: int = setting(gt=0)   # seconds to wait for every node to join the Ray cluster


@CLUSTER_CONFIGS.register("slurm_array")
@dataclass(frozen=True)
class SlurmArrayConfig(SlurmCommon):
    """One Slurm array task per run, without Ray."""

    def check(self, run: RunConfig) -> None:
        super().check(run)
        require(run.resources.nodes == 1, f"cluster=slurm_array runs each run on one node; resources.nodes="
                f"{run.resources.nodes} needs cluster=slurm (Ray across nodes)")
        require(run.adaptive.metric is None, "adaptive.metric: an adaptive sweep decides between looks in "
                "its driver; use cluster=slurm (the driver runs in the allocation)")
