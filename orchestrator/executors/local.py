"""cluster=local: a Ray started on this machine for the sweep (CPU only unless told otherwise),
shut down when the sweep ends. The default: nothing to configure."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from common.settings import require, setting
from orchestrator.executors import CLUSTERS, ClusterConfig
from orchestrator.executors.ray_driver import RAY_OPTIONS, RayExecutor


class LocalExecutor(RayExecutor):
    config: "LocalConfig"

    def connect(self) -> None:
        import ray

        c = self.config  # address="local": a Ray of its own even where `ray start` runs here
        ray.init(address="local", num_cpus=c.num_cpus or os.cpu_count(), num_gpus=c.num_gpus or 0,
                 include_dashboard=c.include_dashboard, dashboard_host=c.dashboard_host, **RAY_OPTIONS)

    def nodes(self) -> Optional[list[dict[str, float]]]:
        """The one node `connect` starts."""
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return [{"CPU": self.config.num_cpus or os.cpu_count() or 1, "GPU": self.config.num_gpus or 0,
                 "memory": memory}]


@CLUSTERS.register("local")
@dataclass
class LocalConfig(ClusterConfig):
    num_cpus: Optional[int] = setting(gt=0)   # null: all cores
    num_gpus: Optional[int] = setting(ge=0)   # null: none
    include_dashboard: bool = setting()
    dashboard_host: str = setting()

    executor_class = LocalExecutor

    def check(self, run: object) -> None:
        """Ray fails with a traceback when the dashboard's packages (ray[default]) are missing."""
        if self.include_dashboard:
            from ray._private.utils import get_dashboard_dependency_error  # imports Ray: only when asked

            require(get_dashboard_dependency_error() is None,
                    "cluster.include_dashboard=true: Ray's dashboard needs `pip install 'ray[default]'` "
                    "(same version as ray); or leave the dashboard off")
