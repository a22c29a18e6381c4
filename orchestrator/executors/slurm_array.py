"""cluster=slurm_array: one Slurm array task per run to do, without Ray. Each task runs its run's
jobs (train, then the evaluations) in one process (`python -m orchestrator run-one`), and a job
that depends on the array writes the report. Task resources: the most any job of the sweep asks
for (resources.* / eval.resources.*). For clusters where Ray cannot run."""
from __future__ import annotations

import shlex

from rich.console import Console

from config.cluster import SlurmArrayConfig
from config.run import RunConfig
from orchestrator.executors import EXECUTORS, Outcome
from orchestrator.executors.slurm_tools import (Request, SlurmExecutor, header, prologue, quoted,
                                                slurm_dir)
from orchestrator.identity import SeedTemplates
from orchestrator.identity import config_yaml
from orchestrator.plan import PlannedRun, jobs_of, resources_of
from store.store import Store


def task_resources(configs: list[RunConfig]) -> tuple[int, float, int]:
    """(cpus, memory GB, GPUs) of one array task: the most any job of any run needs."""
    needs = [resources_of(c, j) for c in configs for j in jobs_of(c)]
    return (max(r.cpus for r in needs), max(r.memory_gb for r in needs), max(int(-(-r.gpus // 1)) for r in needs))


@EXECUTORS.register("slurm_array")
class SlurmArrayExecutor(SlurmExecutor):
    config: SlurmArrayConfig

    def run(self, runs: list[PlannedRun], name: str, overrides: list[str], store: Store,
            console: Console) -> Outcome:
        """Each array task reads its run's config.yaml (`run-one`), so they are written first."""
        texts = SeedTemplates(config_yaml)
        for r in runs:
            if r.todo:
                store.write_config(r.run_id, lambda: texts(r.config))  # noqa: B023 (called at once)
        return super().run(runs, name, overrides, store, console)

    def scripts(self, runs: list[PlannedRun], name: str, overrides: list[str], store: Store) -> dict[str, str]:
        """The array (task i runs the i-th run to do) and the report job that waits for it."""
        todo = [r for r in runs if r.todo] or runs
        cl, out, root = self.config, slurm_dir(store, name), str(store.root.resolve())
        cpus, mem, gpus = task_resources([r.config for r in todo])
        array = "\n".join([
            "#!/bin/bash",
            f"# Sweep {name} on Slurm (cluster=slurm_array): one array task per run to do.",
            *header(cl, f"sweep-{name}", out / "%A_%a.out", cpus, mem, gpus),
            f"#SBATCH --array=0-{len(todo) - 1}",
            *prologue(cl),
            f"RUNS=({quoted([r.run_id for r in todo])})",
            f'exec python -m orchestrator run-one --store {shlex.quote(root)} "${{RUNS[$SLURM_ARRAY_TASK_ID]}}"',
            "",
        ])
        report = "\n".join([
            "#!/bin/bash",
            f"# The report of sweep {name}, once its array is over (sbatch --dependency=afterany:...).",
            *[line for line in header(cl, f"report-{name}", out / "%j.out", 1, 2, 0) if "--requeue" not in line],
            *prologue(cl),
            f"exec python -m orchestrator report {shlex.quote(name)} --store {shlex.quote(root)}",
            "",
        ])
        return {"array": array, "report": report}

    def request(self, runs: list[PlannedRun]) -> Request:
        cpus, mem, gpus = task_resources([r.config for r in runs if r.todo] or [r.config for r in runs])
        return Request(1, cpus, mem, gpus, {"nodes": "resources.nodes",
                                            "cpus": "resources.cpus (or eval.resources.cpus)",
                                            "mem_gb": "resources.memory_gb (or eval.resources.memory_gb)",
                                            "gpus": "resources.gpus (or eval.resources.gpus)"})
