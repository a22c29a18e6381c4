"""Where everything of a results store lies: the one place that names its files.

    <root>/store.json                        the marker: this store's owner and format
    <root>/runs/<run_id>/config.yaml         resolved config (written by the run's first job)
    <root>/runs/<run_id>/state.json          per job: status, attempts, times, host, error
    <root>/runs/<run_id>/metrics.json        metrics, specs and curves merged over jobs
    <root>/runs/<run_id>/history.parquet     the training log
    <root>/runs/<run_id>/items/<eval>.parquet  per-example outputs of an evaluation
    <root>/runs/<run_id>/checkpoints/        step_XXXXXXX.pt and their digests (store/integrity.py)
    <root>/runs/<run_id>/snapshots/          step_XXXXXXX.pt: weights at train.snapshots' steps, with digests
    <root>/runs/<run_id>/progress.json       the running job's progress
    <root>/runs/<run_id>/environment.json    the environments (software, device, threads) its jobs ran in
    <root>/runs/<run_id>/.lock               the claim of the job working on the run
    <root>/sweeps/<name>/sweep.yaml          the sweep's manifest
    <root>/sweeps/<name>/configs/            each invocation's run configs, one file
    <root>/sweeps/<name>/paper_flops.json    the paper-scale FLOPs table of the report
    <root>/sweeps/<name>/claims.json         the metric specs of every claim the jobs can measure
    <root>/sweeps/<name>/.lock               held while sweep.yaml is changed
    <root>/index/                            every run's latest status (store/index.py)

Paths are strings joined by hand, not pathlib: a job reads and writes several files of its run,
and pathlib costs more than the system calls (a quarter of a no-op job's store work)."""
from __future__ import annotations

import os
from typing import Union

FORMAT_VERSION = 4  # of the whole store; the upgrade steps are in store/upgrade.py
OWNER = "depthgrowth-orchestrator"  # store.json's "store": the marker says the store is ours
MARKER = "store.json"
RUNS, SWEEPS, INDEX = "runs", "sweeps", "index"
TOP_LEVEL = (MARKER, RUNS, SWEEPS, INDEX, "wandb")  # what a store of ours holds at its root (wandb: the
# tracker's own directories, orchestrator/tracking.py)
RUN_JSON = ("state.json", "metrics.json")  # a run's JSON files, parse-checked by `Store.inspect`
STATE, METRICS = RUN_JSON
ENVIRONMENT = "environment.json"  # not in RUN_JSON: damage to it never reruns a job (records.py)


class RunPaths:
    """The files of one run."""
    __slots__ = ("dir",)

    def __init__(self, directory: str):
        self.dir = directory

    @property
    def state(self) -> str:
        return self.dir + "/" + STATE

    @property
    def metrics(self) -> str:
        return self.dir + "/" + METRICS

    @property
    def config(self) -> str:
        return self.dir + "/config.yaml"

    @property
    def history(self) -> str:
        return self.dir + "/history.parquet"

    @property
    def items_dir(self) -> str:
        return self.dir + "/items"

    def items(self, eval_name: str) -> str:
        return f"{self.dir}/items/{eval_name}.parquet"

    @property
    def checkpoints(self) -> str:
        return self.dir + "/checkpoints"

    @property
    def snapshots(self) -> str:
        return self.dir + "/snapshots"

    @property
    def progress(self) -> str:
        return self.dir + "/progress.json"

    @property
    def environment(self) -> str:
        return self.dir + "/" + ENVIRONMENT

    @property
    def lock(self) -> str:
        return self.dir + "/.lock"

    def json(self, name: str) -> str:
        """One of `RUN_JSON` by name."""
        return self.dir + "/" + name


class SweepPaths:
    """The files of one sweep."""
    __slots__ = ("dir",)

    def __init__(self, directory: str):
        self.dir = directory

    @property
    def manifest(self) -> str:
        return self.dir + "/sweep.yaml"

    @property
    def configs(self) -> str:
        return self.dir + "/configs"

    @property
    def paper_flops(self) -> str:
        return self.dir + "/paper_flops.json"

    @property
    def claims(self) -> str:
        return self.dir + "/claims.json"

    @property
    def lock(self) -> str:
        return self.dir + "/.lock"

    # The report's files (analysis/report.py writes them; schemas in docs/store.md).
    @property
    def results(self) -> str:
        """The folder of the tidy tables, one file per table and format."""
        return self.dir + "/results"

    def results_table(self, table: str, fmt: str) -> str:
        return f"{self.dir}/results/{table}.{fmt}"

    @property
    def report(self) -> str:
        return self.dir + "/report.md"

    @property
    def report_html(self) -> str:
        return self.dir + "/report.html"

    @property
    def plots(self) -> str:
        """Each figure as <name>.png and <name>.svg; report.md links them as plots/<name>.png."""
        return self.dir + "/plots"


class Layout:
    """The paths of the store at `root`."""
    __slots__ = ("root", "runs", "sweeps", "index", "marker")

    def __init__(self, root: Union[str, os.PathLike[str]]):
        self.root = os.fspath(root)
        self.runs = os.path.join(self.root, RUNS)
        self.sweeps = os.path.join(self.root, SWEEPS)
        self.index = os.path.join(self.root, INDEX)
        self.marker = os.path.join(self.root, MARKER)

    def run(self, run_id: str) -> RunPaths:
        return RunPaths(self.runs + "/" + run_id)

    def sweep(self, name: str) -> SweepPaths:
        return SweepPaths(self.sweeps + "/" + name)
