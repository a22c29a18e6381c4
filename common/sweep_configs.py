"""The configs file of a sweep: the resolved config of every run one invocation planned, in one
file, sweeps/<name>/configs/<time>-<pid>.json, written once by the orchestrator and read by it
(`status` labels) and by the analysis (the config columns of the report).

    {"configs": [config, ...], "runs": {run id: [index into configs, seed]}}

A config is what the run's config.yaml holds; the runs of one group of seed variants share one,
with each run's own seed beside it, so 100,000 seeds of a grid point take one config and a line
each. Files of later invocations add runs; a run planned again keeps its first entry (its config
is the same: the run id is a hash of it)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Union

from common.atomic import read_json

CONFIGS = "configs"


@dataclass
class SweepConfigs:
    configs: list[dict] = field(default_factory=list)
    runs: dict[str, tuple[int, int]] = field(default_factory=dict)  # run id -> (config index, seed)

    def config(self, run_id: str) -> dict:
        """The run's config as its config.yaml holds it; KeyError for a run no file lists."""
        index, seed = self.runs[run_id]
        return {**self.configs[index], "seed": seed}


def read_sweep_configs(sweep_dir: Union[str, os.PathLike]) -> SweepConfigs:
    """Every configs file of the sweep, oldest first (none: empty, as a store of format 2 has)."""
    directory = os.path.join(sweep_dir, CONFIGS)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        names = []
    out = SweepConfigs()
    for name in names:
        record: Any = read_json(os.path.join(directory, name)) or {}
        offset = len(out.configs)
        out.configs += record.get("configs", [])
        for run_id, (index, seed) in record.get("runs", {}).items():
            out.runs.setdefault(run_id, (offset + index, seed))
    return out
