"""How close the scheduler gets to the machine's limit. Prints three tables:

1. makespan: the default sweep (3 families x 3 seeds, `tiny`) run into a fresh store; its job
   phase (first job start to last job end) against sum(job wall times) / cores, the ideal.
2. overhead: N no-op jobs through the full path (plan, Ray task, claim, state and metrics files)
   against N raw Ray tasks of an empty function, on the same Ray cluster, in the same run:
   alternating rounds with warm workers (medians), and the first sweep, whose workers import
   torch and the job code, on its own. A third path between them swaps the task functions
   (`execute`, and `execute_runs` of a batch of short runs) for ones that return at once: our
   tasks and the driver's bookkeeping without the store's work (claim, checks, state and metrics
   writes), so the two differences split the cost.
3. planning: composing the no-op grid (N seeds) as the sweep does, against Hydra composing
   each point on its own (timed on the first 50 points).

    python bench/sweep_efficiency.py [--size tiny] [--noop-jobs 1000] [--noop-rounds 3] [--skip-sweep] [--store DIR]
                                     [--markdown PATH]

The no-op jobs run untracked (tracker=none): a W&B session per job would be measured instead.
`--store DIR` keeps the stores (DIR/sweep, DIR/noop/round*) to read the sweep's report afterwards.
`--markdown PATH` also writes the tables as markdown (bench/report.py; `make bench` writes
docs/performance/sweep_efficiency.md, which docs/performance.md includes).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator
from unittest import mock

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Report, markdown_argument  # noqa: E402
from orchestrator import grid  # noqa: E402
from orchestrator.cli import main  # noqa: E402
from orchestrator.config import hydra_session, typed_run  # noqa: E402
from orchestrator.executors import executor_of, ray_driver  # noqa: E402
from orchestrator.identity import config_yaml  # noqa: E402
from orchestrator.plan import plan  # noqa: E402
from store.store import Store  # noqa: E402

console = Console()
report = Report(None, console)


def _t(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def makespan(size: str, root: Path) -> None:
    t0 = time.monotonic()
    code = main(["sweep", f"size={size}", f"store.root={root}", "--name", "bench"])
    wall = time.monotonic() - t0
    assert code == 0, f"sweep failed with exit code {code}"
    store = Store(root)
    spans = [(_t(j["started_at"]), _t(j["ended_at"]))
             for rid in store.read_sweep("bench")["run_ids"]
             for j in store.read_state(rid)["jobs"].values()]
    busy = sum(e - s for s, e in spans)
    phase = max(e for _, e in spans) - min(s for s, _ in spans)
    cores = os.cpu_count()
    table = Table(title=f"makespan, default sweep at size={size}, {cores} cores")
    for col in ("jobs", "sum of job times", "ideal (sum/cores)", "job phase", "ratio", "whole command"):
        table.add_column(col, justify="right")
    table.add_row(str(len(spans)), f"{busy:.1f}s", f"{busy / cores:.1f}s", f"{phase:.1f}s",
                  f"{phase / (busy / cores):.3f}", f"{wall:.1f}s")
    report.table(table)


def noop_grid(n: int, root: Path) -> list[str]:
    return ["family=dense", f"seed=range(0,{n})", "size=micro", "eval.jobs=[noop]", "tracker=none",
            f"store.root={root}"]


def noop_runs(n: int, root: Path) -> tuple[list, Store, object]:
    """n planned runs of one no-op job each, in a fresh store at root, and their executor."""
    cfgs = [p.config for p in grid.expand(noop_grid(n, root))[0]]
    store = Store(root)
    store.create()
    runs = plan(cfgs, store)
    for r in runs:
        r.todo = ["noop"]
        store.write_config(r.run_id, lambda: config_yaml(r.config))  # noqa: B023 (called at once)
    return runs, store, executor_of(cfgs[0].cluster)


def _execute_free(job: str, run_id: str, store_root: str, cfg: object, *after: object, **_: object) -> tuple[str, dict]:
    """Stands in for orchestrator.worker.execute: same task, no store work; the state it returns
    says the job is done, as the real one's would."""
    return "done", {"jobs": {job: {"status": "done"}}}


def _execute_runs_free(store_root: str, runs: list, sweep: str | None = None) -> list[dict]:
    """Stands in for orchestrator.worker.execute_runs (a batch of short runs), likewise."""
    return [{"jobs": {job: {"status": "done"} for job in todo}} for _, _, todo, _ in runs]


@contextlib.contextmanager
def store_free() -> Iterator[None]:
    """The driver's tasks and bookkeeping without the store's work: the task functions stubbed."""
    with mock.patch.object(ray_driver, "execute", _execute_free), \
            mock.patch.object(ray_driver, "execute_runs", _execute_runs_free):
        yield


def overhead(n: int, root: Path, rounds: int) -> None:
    import ray

    paths = ("full", "store_free")
    stores = {(p, r): noop_runs(n, root / f"{p}{r}") for p in paths for r in range(1, rounds + 1)}
    stores["full", 0] = noop_runs(n, root / "cold")
    session = stores["full", 0][2].session()
    session.__enter__()
    noop = ray.remote(lambda i: i)
    ray.get([noop.options(num_cpus=1).remote(-1) for _ in range(4)])  # warm the workers up

    def raw() -> float:
        t0 = time.monotonic()
        ray.get([noop.options(num_cpus=1).remote(i) for i in range(n)])
        return time.monotonic() - t0

    def full(runs, store, executor) -> float:
        t0 = time.monotonic()
        executor.run(runs, "bench", [], store, Console(file=open(os.devnull, "w")))
        return time.monotonic() - t0

    def without_store(*planned) -> float:
        with store_free():
            return full(*planned)

    cold = full(*stores["full", 0])  # its workers import torch and the job code first
    walls = {"raw": [], "store_free": [], "full": []}
    for r in range(1, rounds + 1):  # alternating, so that machine noise hits all alike
        walls["raw"].append(raw())
        walls["store_free"].append(without_store(*stores["store_free", r]))
        walls["full"].append(full(*stores["full", r]))
    session.__exit__(None, None, None)
    raw_s, free_s, full_s = (statistics.median(walls[k]) for k in ("raw", "store_free", "full"))

    table = Table(title=f"orchestration overhead, {n} no-op jobs, median of {rounds} rounds")
    for col in ("path", "wall", "per job", "ratio to raw Ray"):
        table.add_column(col, justify="right")
    rows = [("raw Ray tasks (warm workers)", raw_s),
            ("our tasks and driver, no store work (task functions stubbed)", free_s),
            ("full path, warm workers", full_s),
            ("full path, first sweep (workers import torch)", cold)]
    for name, wall in rows:
        table.add_row(name, f"{wall:.2f}s", f"{wall / n * 1e3:.2f}ms", f"{wall / raw_s:.2f}")
    report.table(table)


def planning(n: int, root: Path, alone: int = 50) -> None:
    from hydra import compose

    t0 = time.monotonic()
    points, _ = grid.expand(noop_grid(n, root))
    batched = time.monotonic() - t0
    with hydra_session():
        t0 = time.monotonic()
        for p in points[:alone]:
            typed_run(compose("config", overrides=list(p.overrides)))
        per_point = (time.monotonic() - t0) / min(alone, n)
    table = Table(title=f"planning, a grid of {n} seeds")
    for col in ("composition", "wall", "per point", "ratio"):
        table.add_column(col, justify="right")
    table.add_row(f"Hydra, each point on its own (first {min(alone, n)}, extrapolated)",
                  f"{per_point * n:.1f}s", f"{per_point * 1e3:.1f}ms", f"{per_point * n / batched:.1f}")
    table.add_row("the sweep's (group choices once, values on copies)", f"{batched:.1f}s",
                  f"{batched / n * 1e3:.1f}ms", "1.0")
    report.table(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--noop-jobs", type=int, default=1000)
    parser.add_argument("--noop-rounds", type=int, default=3)
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--store", type=Path, help="keep the stores here (default: a temporary directory)")
    markdown_argument(parser)
    args = parser.parse_args()
    report.arguments(parser, args)
    with tempfile.TemporaryDirectory() as tmp:
        base = args.store or Path(tmp)
        if not args.skip_sweep:
            makespan(args.size, base / "sweep")
        overhead(args.noop_jobs, base / "noop", args.noop_rounds)
        planning(args.noop_jobs, base / "plan")
    report.write()
