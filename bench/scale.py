"""How the orchestrator's costs grow with the sweep: the targets it is held to at 1,000, 10,000 and 100,000
runs side by side, and the peers a user would pick instead on the same no-op work.

Rows (docs/performance.md explains each and its target):

- plan: compose, validate and hash the grid, and write the sweep's record and configs file, as a
  sweep does before its first job (`family=dense,looped size=micro seed=range(0,N/2)`);
- dry run: `sweep ... --dry-run`, the whole command;
- driver: N no-op jobs (`eval.jobs=[noop]`, the run's train job left out as in
  bench/sweep_efficiency.py) through the full path on a local Ray cluster (back-pressure,
  batching of short runs, claims, state, metrics and index writes), its wall time against N raw
  Ray tasks of an empty function on the same cluster, and the driver's peak memory (VmHWM); in
  the same Ray session the full path again with its store on tmpfs, and without the store's
  work (the task functions stubbed);
- store build: the read paths read a store built by the store's own writer (`worker.execute` of
  train and noop per run, the train job's work replaced by synthetic metrics: a lower final loss
  for looped), in two processes, its index then folded as a sweep folds it when its jobs are
  done; how long that takes is printed, without a target;
- status, status <sweep>, status after the index is deleted (a rebuild), report: the commands as
  a user runs them, each in a process of its own, with its wall time, peak memory and lines.
- peers: raw Ray, Ray Tune with a trivial trainable, Hydra's multirun with its basic launcher,
  each on N no-op jobs, with this project's full path beside them.

Every measurement runs in a fresh process (`--child`), so a peak memory is that command's alone.

    python bench/scale.py [--sizes 1000,10000,100000] [--tune-trials 1000,10000] [--hydra-jobs 1000]
                          [--quick] [--store DIR] [--markdown PATH]

`--quick` is `--sizes 1000 --tune-trials 1000 --hydra-jobs 200` (a few minutes).
`--markdown PATH` also writes the tables (bench/report.py; `make bench` writes
docs/performance/scale.md, which docs/performance.md includes).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable
from unittest import mock

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import Report, markdown_argument  # noqa: E402

TARGETS = {"plan_s": 10.0, "dry_run_s": 10.0, "driver_mb": 1024.0, "status_s": 1.0, "report_s": 30.0,
           "report_mb": 2048.0, "overhead": 1.5}
SWEEP = "scale"
console = Console()
report = Report(None, console)


def grid(n: int, root: Path, families: str = "dense,looped") -> list[str]:
    """N runs: the families times N / (number of families) seeds of `micro`, no tracking."""
    per = max(1, n // len(families.split(",")))
    return [f"family={families}", "size=micro", f"seed=range(0,{per})", "eval.jobs=[noop]", "tracker=none",
            f"store.root={root}"]


# ---------------------------------------------------------------------------------------------
# The children: one measurement each, printed as a JSON line

def peak_mb() -> float:
    """This process's peak resident memory (VmHWM) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _quiet() -> Console:
    return Console(file=open(os.devnull, "w"))


def child_plan(n: int, root: Path) -> dict:
    from orchestrator.plan import plan
    from orchestrator.sweep import Sweep

    t0 = time.monotonic()
    sweep = Sweep.compose(grid(n, root), SWEEP, _quiet())
    composed = time.monotonic()
    runs = plan(sweep.configs, sweep.store)
    planned = time.monotonic()
    sweep.store.create()
    sweep.store.record_sweep(SWEEP, sweep.overrides, [r.run_id for r in runs], [r.config for r in runs])
    end = time.monotonic()
    return {"wall": end - t0, "compose": composed - t0, "hash": planned - composed, "write": end - planned,
            "runs": len(runs), "mb": peak_mb()}


def child_cli(argv: list[str]) -> dict:
    """One command of the CLI, its output counted (lines), not shown."""
    import io

    from orchestrator import cli

    out = io.StringIO()
    cli.console = Console(file=out, width=140, highlight=False)
    t0 = time.monotonic()
    code = cli.main(argv)
    wall = time.monotonic() - t0
    text = out.getvalue()
    return {"wall": wall, "code": code, "lines": text.count("\n"), "mb": peak_mb(),
            "said": [line for line in text.splitlines() if line.startswith("index")]}


def _noop_runs(n: int, root: Path) -> tuple[list, Any, Any]:
    """N planned runs of the no-op job alone (no train job) in a fresh store, recorded as a sweep."""
    from orchestrator.plan import plan
    from orchestrator.sweep import Sweep

    sweep = Sweep.compose(grid(n, root), SWEEP, _quiet())
    runs = plan(sweep.configs, sweep.store)
    for r in runs:
        r.todo = ["noop"]
    sweep.store.create()
    sweep.store.record_sweep(SWEEP, sweep.overrides, [r.run_id for r in runs], [r.config for r in runs])
    return runs, sweep.store, sweep.executor


def child_driver(n: int, root: Path) -> dict:
    """The full path for N no-op jobs (its store on `root`'s disk, then on tmpfs), the same
    without the store's work, then N raw Ray tasks, on one Ray cluster with warm workers."""
    import ray

    from bench.sweep_efficiency import store_free

    warm = _noop_runs(100, root / "warm")
    executor = warm[2]

    def full_path(store_root: Path) -> float:
        runs, store, _ = _noop_runs(n, store_root)
        t0 = time.monotonic()
        outcome = executor.run(runs, SWEEP, [], store, _quiet())
        wall = time.monotonic() - t0
        if sorted(set(outcome.statuses.values())) != ["done"] or len(outcome.statuses) != n:
            raise RuntimeError(f"the full path did not finish every job: {Counter(outcome.statuses.values())}")
        return wall

    with executor.session():
        executor.run(*warm[:1], SWEEP, [], warm[1], _quiet())  # workers import torch and the job code
        before = peak_mb()
        full = full_path(root / "driver")
        mb = peak_mb()
        # What bounds the full path: the same on a filesystem in memory, and without the store's work.
        with tempfile.TemporaryDirectory(prefix="scale-", dir=TMPFS) as memory:
            in_memory = full_path(Path(memory))
        runs, store, _ = _noop_runs(n, root / "store_free")
        with store_free():
            t0 = time.monotonic()
            executor.run(runs, SWEEP, [], store, _quiet())
            free = time.monotonic() - t0
        noop = ray.remote(lambda i: i).options(num_cpus=1)
        t0 = time.monotonic()
        ray.get([noop.remote(i) for i in range(n)])
        raw = time.monotonic() - t0
    return {"full": full, "tmpfs": in_memory, "free": free, "raw": raw, "mb": mb, "mb_before": before}


TMPFS = "/dev/shm"  # where the full path is measured again with its store in memory


def child_store(n: int, root: Path) -> dict:
    """The store's work of N no-op jobs alone, `worker.execute` in this process without Ray, and
    its profile (what the overhead's note shows)."""
    import cProfile

    from orchestrator.store import config_yaml
    from orchestrator.worker import execute

    warm, warm_store, _ = _noop_runs(2, root / "warm")
    text = config_yaml(warm[0].config)  # the no-op job reads none of it
    for r in warm:  # as the Ray workers are, warm
        execute("noop", r.run_id, str(warm_store.root), r.config, config_text=text)
    runs, store, _ = _noop_runs(n, root / "store")
    profiler = cProfile.Profile()
    t0 = time.monotonic()
    with profiler:
        for r in runs:
            execute("noop", r.run_id, str(store.root), r.config, config_text=text)
    return {"wall": time.monotonic() - t0, "profile": _top(profiler)}


def _synthetic(job: str, family: str, seed: int) -> Any:
    """What a job of the real registry records, the work itself replaced: looped's final loss
    is lower by 0.05 (seed noise 0.1), so the report has a verdict to reach."""
    import numpy as np

    from jobs.contract import JobResult

    if job != "train":
        return JobResult(metrics={"noop": 1.0})
    rng = np.random.default_rng(seed * 7 + len(family))
    return JobResult(metrics={"final_loss": 3.0 - 0.05 * (family == "looped") + 0.1 * rng.standard_normal(),
                              "train_flops": 7.13e9, "n_params": 5.0e4, "steps": 100.0})


def _write_runs(args: tuple[str, list]) -> None:
    from jobs.registry import get_job
    from orchestrator import worker
    from orchestrator.plan import jobs_of

    root, configs = args

    def stand_in(name: str) -> Any:
        job = get_job(name)
        return dataclasses.replace(job, fn=lambda cfg, run_dir, progress: _synthetic(name, cfg.family.name, cfg.seed))
    with mock.patch.object(worker, "get_job", stand_in):
        for run_id, cfg in configs:
            for job in jobs_of(cfg):
                worker.execute(job, run_id, root, cfg)


def child_build(n: int, root: Path) -> dict:
    """A store of N finished runs, written by the store's writer in two processes."""
    from orchestrator import index
    from orchestrator.identity import run_ids
    from orchestrator.sweep import Sweep

    t0 = time.monotonic()
    sweep = Sweep.compose(grid(n, root), SWEEP, _quiet())
    ids = run_ids(sweep.configs)
    sweep.store.create()
    sweep.store.record_sweep(SWEEP, sweep.overrides, ids, sweep.configs)
    pairs = list(zip(ids, sweep.configs))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_write_runs, [(str(root), pairs[i::2]) for i in range(2)])
    index.fold(str(root))  # as a sweep does once its jobs are done
    return {"wall": time.monotonic() - t0, "bytes": _bytes(root), "runs": len(ids)}


def _bytes(root: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True).stdout.split()[0])


def child_tune(n: int, root: Path) -> dict:
    """N trials of a trainable that reports once and returns, one CPU each."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    import ray
    from ray import tune

    ray.init(num_cpus=os.cpu_count(), log_to_driver=False, logging_level="ERROR")

    def trainable(config: dict) -> dict:
        return {"x": config["i"]}
    t0 = time.monotonic()
    tuner = tune.Tuner(trainable, param_space={"i": tune.grid_search(list(range(n)))},
                       tune_config=tune.TuneConfig(reuse_actors=True),  # its fastest setting for short trials
                       run_config=tune.RunConfig(storage_path=str(root), name="tune", verbose=0))
    results = tuner.fit()
    wall = time.monotonic() - t0
    ray.shutdown()
    return {"wall": wall, "ok": sum(r.error is None for r in results)}


HYDRA_APP = '''
import hydra

@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg):
    return cfg.i

main()
'''


def child_hydra(n: int, root: Path) -> dict:
    """N jobs of an empty Hydra app by multirun with the basic launcher (one process, in turn)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "app.py").write_text(HYDRA_APP)
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(root / "app.py"), "-m", f"+i=range(0,{n})",
                    f"hydra.sweep.dir={root / 'multirun'}", "hydra/job_logging=none", "hydra/hydra_logging=none"],
                   check=True, capture_output=True, cwd=root)
    return {"wall": time.monotonic() - t0}


CHILDREN: dict[str, Callable[..., dict]] = {
    "plan": child_plan, "driver": child_driver, "store": child_store, "build": child_build, "tune": child_tune,
    "hydra": child_hydra}


def child(part: str, n: int, root: Path, argv: list[str]) -> dict:
    """Run one measurement in a fresh process; its JSON result, also printed as it comes (a long
    run stopped half-way still shows what it measured)."""
    cmd = [sys.executable, __file__, "--child", part, "--n", str(n), "--root", str(root), "--", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{part} at {n}: exit {done.returncode}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    console.print(f"    {part} {' '.join(argv[:1])}: {json.dumps(result)}", markup=False, highlight=False)
    return result


def profile(part: str, n: int, root: Path, argv: list[str]) -> list[str]:
    """The functions that bound a measurement that missed its target (cProfile, own time)."""
    if part == "store":  # profiles itself, its loop alone
        return child(part, n, root, argv)["profile"]
    out = root.parent / f"{part}-{n}.prof"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(out), __file__, "--child", part, "--n", str(n),
           "--root", str(root), "--", *argv]
    subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    return _top(str(out))


def _top(stats: Any, top: int = 8) -> list[str]:
    """The first lines of a profile (a cProfile.Profile or a file of one) by own time."""
    import io
    import pstats

    text = io.StringIO()
    pstats.Stats(stats, stream=text).sort_stats("tottime").print_stats(top)
    lines = [line for line in text.getvalue().splitlines() if line.strip() and line.lstrip()[0].isdigit()]
    return lines[:top]


# ---------------------------------------------------------------------------------------------
# The parent: measure, then the tables

@dataclasses.dataclass
class Row:
    name: str
    target: str
    met: Callable[[float], bool]
    shown: Callable[[dict], str]
    key: Callable[[dict], float]
    figures: dict = dataclasses.field(default_factory=dict)  # size -> measured dict


def _s(x: float) -> str:
    return f"{x:.2f}s" if x < 10 else f"{x:.0f}s"


def _remove(path: Path) -> None:
    """Delete a store, and wait for the disk to have done it: the next measurement should not
    pay for this one's deletions."""
    shutil.rmtree(path, ignore_errors=True)
    os.sync()


def measure(sizes: list[int], base: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for n in sizes:
        plan_root, store = base / f"plan{n}", base / f"store{n}"
        m: dict[str, Any] = {}
        console.print(f"[bold]{n:,} runs[/]: plan, dry run")
        m["plan"] = child("plan", n, plan_root, [])
        _remove(plan_root)
        m["dry"] = child("cli", n, plan_root, ["sweep", *grid(n, plan_root), "--name", SWEEP, "--dry-run"])
        console.print("  driver (no-op jobs through Ray) and raw Ray tasks")
        m["driver"] = child("driver", n, base / f"driver{n}", [])
        _remove(base / f"driver{n}")
        console.print("  store built by its writer")
        m["build"] = child("build", n, store, [])
        m["status"] = child("cli", n, store, ["status", "--store", str(store)])
        m["status_sweep"] = child("cli", n, store, ["status", "--store", str(store), SWEEP])
        shutil.rmtree(store / "index")
        m["rebuild"] = child("cli", n, store, ["status", "--store", str(store)])
        console.print("  report")
        m["report"] = child("cli", n, store, ["report", "--store", str(store), SWEEP])
        m["argv"] = {"plan": ("plan", n, plan_root, []),
                     "dry": ("cli", n, plan_root, ["sweep", *grid(n, plan_root), "--name", SWEEP, "--dry-run"]),
                     "status": ("cli", n, store, ["status", "--store", str(store)]),
                     "report": ("cli", n, store, ["report", "--store", str(store), SWEEP]),
                     "overhead": ("store", PROFILED_JOBS, base / "store_alone", [])}
        out[n] = m
    return out


def rows() -> list[Row]:
    t = TARGETS
    return [
        Row("plan (compose, validate, hash, write configs)", f"<= {t['plan_s']:g}s", lambda x: x <= t["plan_s"],
            lambda m: f"{_s(m['plan']['wall'])} (compose {_s(m['plan']['compose'])}, hash {_s(m['plan']['hash'])},"
                      f" write {_s(m['plan']['write'])})", lambda m: m["plan"]["wall"]),
        Row("sweep --dry-run (whole command)", f"<= {t['dry_run_s']:g}s", lambda x: x <= t["dry_run_s"],
            lambda m: f"{_s(m['dry']['wall'])}, {m['dry']['lines']} lines", lambda m: m["dry"]["wall"]),
        Row("driver peak memory, no-op jobs through Ray", f"<= {t['driver_mb']:g} MB", lambda x: x <= t["driver_mb"],
            lambda m: f"{m['driver']['mb']:.0f} MB", lambda m: m["driver"]["mb"]),
        Row(OVERHEAD, f"<= {t['overhead']:g}x", lambda x: x <= t["overhead"],
            lambda m: f"{m['driver']['full'] / m['driver']['raw']:.2f}x ({_s(m['driver']['full'])} vs"
                      f" {_s(m['driver']['raw'])}; store on tmpfs {m['driver']['tmpfs'] / m['driver']['raw']:.2f}x,"
                      f" no store work {m['driver']['free'] / m['driver']['raw']:.2f}x)",
            lambda m: m["driver"]["full"] / m["driver"]["raw"]),
        Row("status (every sweep)", f"<= {t['status_s']:g}s", lambda x: x <= t["status_s"],
            lambda m: f"{_s(m['status']['wall'])}, {m['status']['lines']} lines", lambda m: m["status"]["wall"]),
        Row("status <sweep>", f"<= {t['status_s']:g}s", lambda x: x <= t["status_s"],
            lambda m: f"{_s(m['status_sweep']['wall'])}, {m['status_sweep']['lines']} lines",
            lambda m: m["status_sweep"]["wall"]),
        Row("status, index deleted (rebuilt from the runs)", "none", lambda x: True,
            lambda m: f"{_s(m['rebuild']['wall'])}", lambda m: m["rebuild"]["wall"]),
        Row("report wall", f"<= {t['report_s']:g}s", lambda x: x <= t["report_s"],
            lambda m: _s(m["report"]["wall"]), lambda m: m["report"]["wall"]),
        Row("report peak memory", f"<= {t['report_mb']:g} MB", lambda x: x <= t["report_mb"],
            lambda m: f"{m['report']['mb']:.0f} MB", lambda m: m["report"]["mb"]),
        Row("store built by the store's writer (2 processes)", "none", lambda x: True,
            lambda m: f"{_s(m['build']['wall'])}, {m['build']['bytes'] / m['build']['runs'] / 1024:.1f} KiB a run",
            lambda m: m["build"]["wall"]),
    ]


OVERHEAD = "no-op jobs, full path / raw Ray tasks"
OVERHEAD_BOUND = ("The peers table splits it, each measured in the same Ray session: Ray and the driver alone (the"
                  " task functions stubbed; short runs go several to a task, so it is below raw Ray's task per"
                  " job), and the full path with its store on tmpfs, which shows what the disk costs. The profile"
                  " is of the store's work without Ray ({jobs:,} jobs in one process: claim, damage check,"
                  " config, state, metrics and index writes), file creations and renames first.")
PROFILED = {"plan (compose, validate, hash, write configs)": "plan", "sweep --dry-run (whole command)": "dry",
            "status (every sweep)": "status", "status <sweep>": "status", "report wall": "report",
            OVERHEAD: "overhead"}
PROFILED_JOBS = 2000  # no-op jobs of the store's work profiled in one process


def targets_table(results: dict[int, dict]) -> list[tuple[Row, int]]:
    sizes = sorted(results)
    table = Table(title=f"targets, sweeps of {', '.join(f'{n:,}' for n in sizes)} runs "
                        "(micro, dense and looped; no-op jobs; read paths on a store built by its writer)")
    table.add_column("figure")
    table.add_column("target", justify="right")
    for n in sizes:
        table.add_column(f"{n:,} runs", justify="right")
    table.add_column(f"met at {sizes[-1]:,}")
    missed = []
    for row in rows():
        last = row.key(results[sizes[-1]])
        ok = row.met(last)
        table.add_row(row.name, row.target, *(row.shown(results[n]) for n in sizes),
                      "-" if row.target == "none" else ("yes" if ok else "NO"))
        if not ok:
            missed.append((row, sizes[-1]))
    report.table(table)
    return missed


def peers_table(results: dict[int, dict], tune: dict[int, dict], hydra: dict[int, dict]) -> None:
    table = Table(title="the same no-op jobs through each tool, per job (wall / jobs), this machine")
    for col in ("tool", "jobs", "wall", "per job", "ratio to raw Ray"):
        table.add_column(col, justify="right" if col != "tool" else "left")
    for n, m in sorted(results.items()):
        raw = m["driver"]["raw"] / n
        table.add_row("raw Ray tasks", f"{n:,}", _s(m["driver"]["raw"]), f"{raw * 1e3:.2f}ms", "1.00")
        for path, wall in (("this project, its tasks and driver, no store work (task functions stubbed)",
                            m["driver"]["free"]),
                           ("this project, full path, store on tmpfs", m["driver"]["tmpfs"]),
                           ("this project, full path", m["driver"]["full"])):
            table.add_row(path, f"{n:,}", _s(wall), f"{wall / n * 1e3:.2f}ms", f"{wall / m['driver']['raw']:.2f}")
    per_raw = {n: m["driver"]["raw"] / n for n, m in results.items()}
    nearest = (lambda n: per_raw[min(per_raw, key=lambda k: abs(k - n))]) if per_raw else (lambda n: float("nan"))
    for tool, figures in (("Ray Tune, trivial trainable", tune), ("Hydra multirun, basic launcher", hydra)):
        for n, m in sorted(figures.items()):
            table.add_row(tool, f"{n:,}", _s(m["wall"]), f"{m['wall'] / n * 1e3:.2f}ms",
                          f"{m['wall'] / n / nearest(n):.2f}")
    report.table(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000", help="sweep sizes, comma-separated")
    parser.add_argument("--tune-trials", default="1000,10000", help="Ray Tune trial counts ('' for none)")
    parser.add_argument("--hydra-jobs", type=int, default=1000, help="Hydra multirun jobs (0 for none)")
    parser.add_argument("--quick", action="store_true", help="--sizes 1000 --tune-trials 1000 --hydra-jobs 200")
    parser.add_argument("--store", type=Path, help="keep the stores here (default: a temporary directory)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("argv", nargs="*", help=argparse.SUPPRESS)
    markdown_argument(parser)
    args = parser.parse_args()
    if args.child:
        result = child_cli(args.argv) if args.child == "cli" else CHILDREN[args.child](args.n, args.root)
        print(json.dumps(result))
        return
    if args.quick:
        args.sizes, args.tune_trials, args.hydra_jobs = "1000", "1000", 200
    report.arguments(parser, args, ignore=("markdown", "store", "child", "n", "root", "argv"))
    with tempfile.TemporaryDirectory() as tmp:
        base = args.store or Path(tmp)
        results = measure([int(s) for s in args.sizes.split(",") if s], base)
        console.print("peers: Ray Tune, Hydra multirun")
        tune = {n: child("tune", n, base / f"tune{n}", []) for n in (int(s) for s in args.tune_trials.split(",") if s)}
        hydra = {args.hydra_jobs: child("hydra", args.hydra_jobs, base / "hydra", [])} if args.hydra_jobs else {}
        missed = targets_table(results)
        peers_table(results, tune, hydra)
        for row, n in missed:
            if row.name not in PROFILED:  # a memory figure
                report.note(f"**{row.name}** at {n:,} runs: {row.shown(results[n])} against {row.target}.")
                continue
            kind, jobs, root, argv = results[n]["argv"][PROFILED[row.name]]
            lines = profile(kind, jobs, root, argv)
            report.note(f"**{row.name}** at {n:,} runs: {row.shown(results[n])} against {row.target}; what bounds"
                        f" it (cProfile, own time):\n\n```\n" + "\n".join(lines) + "\n```"
                        + ("\n\n" + OVERHEAD_BOUND.format(jobs=jobs)) * (row.name == OVERHEAD))
    report.write()


if __name__ == "__main__":
    main()
