"""cluster=local: a Ray started on this machine for the sweep (CPU only unless told otherwise),
shut down when the sweep ends. The default: nothing to configure."""
from __future__ import annotations

import os
from typing import Optional

from config.cluster import LocalConfig
from orchestrator.executors import EXECUTORS
from orchestrator.executors.ray_driver import RAY_OPTIONS, RayExecutor


@EXECUTORS.register("local")
class LocalExecutor(RayExecutor):
    config: LocalConfig

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
