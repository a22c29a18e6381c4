"""`python -m orchestrator sweep|status|report|cancel|wandb-sync|run-one`.

Exit codes: 0 success, 1 a runtime problem (failed runs, store trouble), 2 bad input (nothing was
started or written), 130 interrupted (the same command resumes)."""
from __future__ import annotations

import argparse
import copy
import re
import sys
from collections import Counter
from typing import NoReturn, Optional

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import slurm, tracking
from .config import ConfigError
from .identity import run_id
from .store import CORRUPT, FAILED, Store, StoreError

# Logs (CI, nohup) get a wide fixed width instead of rich's 80 columns, so tables stay readable.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)


def cmd_sweep(args: argparse.Namespace) -> int:
    from jobs.registry import catalog

    from . import grid, scheduler

    points, default_name = grid.expand(args.overrides, catalog())
    roots = {p.config["store"]["root"] for p in points}
    if len(roots) != 1:
        raise ConfigError(f"store.root: one sweep must use one store, got {sorted(roots)}")
    store = Store(roots.pop())
    store.check()
    name = args.name or default_name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(f"--name {name!r}: it names a directory under sweeps/; use letters, "
                          f"digits, '.', '_' and '-' (starting with a letter or digit)")
    configs = [p.config for p in points]
    if configs[0]["cluster"]["name"] in slurm.KINDS:  # submitted; the driver runs in the allocation
        code = slurm.submit(scheduler.plan(configs, store), store, name, args.overrides,
                            args.dry_run, console)
        return _report(store, name) if code < 0 else code
    adaptive = configs[0]["adaptive"]
    if adaptive["metric"]:
        return _adaptive_sweep(configs, store, name, args)
    runs = scheduler.plan(configs, store)
    if args.dry_run:
        _print_plan(runs, name)
        return 0
    outcome = _run(runs, store, name, args.overrides)
    return _report(store, name) or (1 if FAILED in outcome.values() else 0)


def _print_plan(runs: list, name: str) -> None:
    """One line per run with its training FLOPs and GPU hours (FLOPs / (peak x MFU) / 3600)."""
    from .scheduler import check_fit, gpu_hours, planned_nodes, resources_text

    for r in runs:
        c = r.config
        hours = f"{gpu_hours(c):,.0f} GPU h" if c["resources"]["gpus"] > 0 else "CPU"
        console.print(f"{r.run_id}  {c['family']['name']:<7} {c['model']['name']:<6} "
                      f"seed={c['seed']:<3} {resources_text(c)}  {r.cost:.2e} FLOPs {hours}  "
                      f"{'cached' if r.cached else 'new'}")
    new = [r for r in runs if not r.cached]
    cluster = runs[0].config["cluster"] if runs else None
    if new and any(r.config["resources"]["gpus"] > 0 for r in new):
        console.print(f"estimate: {sum(gpu_hours(r.config) for r in new):,.0f} GPU hours for the "
                      f"{len(new)} runs to do (training FLOPs / (cluster.gpu_peak_flops_per_s="
                      f"{cluster['gpu_peak_flops_per_s']:.3g} x cluster.gpu_mfu={cluster['gpu_mfu']:g}))")
    if cluster and cluster["name"] == "local":
        try:
            check_fit(new, planned_nodes(cluster))  # the node init_ray would start
        except ConfigError as e:  # the real run refuses it with this line
            console.print(f"[yellow]would not run here:[/] {e}", soft_wrap=True)
    for r in runs:  # backend=nanotron: each stage's nanotron YAML and torchrun command
        if r.config["backend"]["name"] == "nanotron":
            from jobs.nanotron.render import dry_run_text
            run_dir = Store(r.config["store"]["root"]).run_dir(r.run_id)
            console.print(dry_run_text(r.config, r.run_id, run_dir), markup=False, soft_wrap=True)
    console.print(f"sweep {name}: {len(runs)} runs, "
                  f"{sum(not r.cached for r in runs)} to do (dry run: nothing written)")


def _run(runs: list, store: Store, name: str, overrides: list[str]) -> dict[str, str]:
    from . import scheduler

    store.create()
    for r in runs:
        store.write_config(r.run_id, r.config)
    tracking.tag_sweep([r.config for r in runs], name)  # the jobs' W&B group, not in config.yaml
    store.record_sweep(name, overrides, [r.run_id for r in runs])
    console.print(f"sweep [bold]{name}[/]: {len(runs)} runs, {sum(r.cached for r in runs)} "
                  f"cached, store {store.root}")
    return scheduler.run(runs, store, runs[0].config["cluster"], console)


def _with_seeds(configs: list[dict], seeds: range) -> list[dict]:
    """Every distinct non-seed config of the grid (by run identity), once per seed."""
    distinct = {run_id({**c, "seed": 0}): c for c in configs}
    return [{**copy.deepcopy(c), "seed": s} for c in distinct.values() for s in seeds]


def _adaptive_sweep(configs: list[dict], store: Store, name: str, args: argparse.Namespace) -> int:
    """Run the declared looks (statistics.md (f)): seeds 0..n-1 at each look, then the rule."""
    import analysis
    import ray

    from . import scheduler
    from .config import adaptive_looks

    a = configs[0]["adaptive"]
    looks = adaptive_looks(a)
    families = {c["family"]["name"] for c in configs}
    if a["baseline"] not in families or len(families) < 2:
        raise ConfigError(f"adaptive.baseline={a['baseline']}: the sweep's families are "
                          f"{sorted(families)}; include the baseline and at least one other family")
    if args.dry_run:
        console.print(f"adaptive sweep on {a['metric']}: looks at {looks} seeds, level "
                      f"{1 - a['alpha'] / len(looks):.4f} per look; first look:")
        _print_plan(scheduler.plan(_with_seeds(configs, range(looks[0])), store), name)
        return 0
    owns_ray = not ray.is_initialized()
    if owns_ray:
        scheduler.init_ray(configs[0]["cluster"])
    try:
        n, failed = looks[0], False
        while True:
            runs = scheduler.plan(_with_seeds(configs, range(n)), store)
            failed |= FAILED in _run(runs, store, name, args.overrides).values()
            plan = analysis.next_seeds(analysis.load(store.root, name), looks=looks,
                                       alpha=a["alpha"], delta_min=a["delta_min"],
                                       baseline=a["baseline"], primary_metrics=(a["metric"],))
            verdicts = {f"{r['family']}/{r['size']}": r["verdict"]
                        for _, r in plan.comparisons.iterrows()}
            store.record_look(name, {"look": plan.look, "n_looks": plan.n_looks,
                                     "n_seeds": plan.n_seeds, "level": plan.level,
                                     "decision": plan.decision, "n_more": plan.n_more,
                                     "verdicts": verdicts,
                                     "rule": {k: a[k] for k in ("metric", "alpha", "delta_min",
                                                                "baseline", "looks", "max_seeds")}})
            console.print(f"look {plan.look}/{plan.n_looks} at {plan.n_seeds} seeds "
                          f"(level {plan.level:.4f}): {plan.decision}"
                          + (f", adding {plan.n_more} seeds" if plan.decision == "continue" else "")
                          + "; " + ", ".join(f"{k} {v}" for k, v in verdicts.items()))
            if plan.decision != "continue" or plan.n_more <= 0:
                break
            n += plan.n_more
    finally:
        if owns_ray:
            ray.shutdown()
    return _report(store, name) or (1 if failed else 0)


def _report(store: Store, name: str) -> int:
    import analysis

    sweep = store.read_sweep(name)
    damaged = [(r, p) for r in sweep["run_ids"] for p in store.problems(r)]
    if damaged:
        raise StoreError(f"sweep {name}: run {damaged[0][0]}: {damaged[0][1]} ({len(damaged)} "
                         f"problems, see `status`); run the sweep again to repair them")
    states = [store.read_state(r)["status"] for r in sweep["run_ids"]]
    if "done" not in states:
        console.print(f"sweep {name}: no finished runs yet; nothing to report")
        return 1
    result = analysis.analyse(store.root, name)
    path = analysis.save_report(result, store.root)
    console.print(analysis.render_summary(result))
    console.print(f"report: {path}")
    if logged := tracking.log_sweep(store, name, result):  # W&B sweep summary; never raises
        console.print(f"W&B: sweep summary logged as run {logged} "
                      f"under {store.root / tracking.WANDB_DIR}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    store = Store(args.store)
    store.check()
    name = args.sweep or _latest_sweep(store)
    store.read_sweep(name)
    return _report(store, name)


def _latest_sweep(store: Store) -> str:
    sweeps = store.sweeps()
    if not sweeps:
        raise StoreError(f"no sweeps in {store.root} yet; run `python -m orchestrator sweep` first")
    return max(sweeps, key=lambda s: store.read_sweep(s)["invocations"][-1]["at"])


def cmd_status(args: argparse.Namespace) -> int:
    store = Store(args.store)
    store.check()
    names = [args.sweep] if args.sweep else store.sweeps()
    if not names:
        raise StoreError(f"no sweeps in {store.root} yet; run `python -m orchestrator sweep` first")
    for name in names:
        sweep = store.read_sweep(name)
        table = Table(title=f"sweep {name}", title_justify="left", box=None, header_style="bold")
        for col in ("run", "id", "status", "jobs (status x attempts)", "progress", "error"):
            table.add_column(col)
        counts: Counter = Counter()
        notes: list[str] = []
        for rid in sweep["run_ids"]:
            state = store.read_state(rid)
            try:
                cfg = store.read_config(rid)
                label = f"{cfg['family']['name']}-{cfg['model']['name']}-s{cfg['seed']}"
            except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
                label = "?"
            notes += _damage_notes(store, rid, label, state)
            counts[state["status"]] += 1
            jobs = state.get("jobs", {})
            attempts = "  ".join(f"{j} {s.get('status')} x{s.get('attempts', 0)}"
                                 for j, s in jobs.items()) or "-"
            p = store.read_progress(rid) if state["status"] == "running" else {}
            prog = f"{p.get('job')} {p.get('step')}/{p.get('total_steps')}" if p else ""
            table.add_row(label, rid, state["status"], attempts, prog, state.get("error") or "")
        console.print(table)
        console.print("  ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for line in slurm.status_lines(sweep):
            console.print(line, markup=False, soft_wrap=True)
        for note in notes:
            console.print(f"  {note}", soft_wrap=True, markup=False)
    return 0


def _damage_notes(store: Store, rid: str, label: str, state: dict) -> list[str]:
    """One line per problem of a run (and per past one that was repaired); marks the state
    `stale` (running, claim free: its process was killed) or `corrupt` (damaged files)."""
    notes = [f"problem {rid} {label}: {p}; the next sweep of this run moves it aside and reruns "
             f"the run's jobs (training resumes from its newest sound checkpoint)"
             for p in store.problems(rid)]
    if notes:
        state["status"] = CORRUPT
    elif store.is_stale(rid, state):
        for job in [state, *state.get("jobs", {}).values()]:
            job["status"] = "stale" if job.get("status") == "running" else job.get("status")
        notes.append(f"stale {rid} {label}: state.json says running but no process holds its "
                     f"claim (killed); the next sweep resumes it from its last checkpoint")
    return notes + [f"recovered {rid} {label}: {r}" for r in store.recovered(rid)]


def cmd_cancel(args: argparse.Namespace) -> int:
    """scancel a sweep's Slurm jobs; the same `sweep` command resubmits and resumes it."""
    store = Store(args.store)
    store.check()
    return slurm.cancel(store.read_sweep(args.sweep), console)


def cmd_run_one(args: argparse.Namespace) -> int:
    """One run's jobs in this process (a cluster=slurm_array task)."""
    return slurm.run_one(args.store, args.run_id)


def cmd_wandb_sync(args: argparse.Namespace) -> int:
    """Upload a sweep's offline W&B runs: `wandb sync` on their run directories."""
    import subprocess

    store = Store(args.store)
    store.check()
    dirs = tracking.offline_runs(store, args.sweep)
    where = store.root / tracking.WANDB_DIR
    if not dirs:
        console.print(f"sweep {args.sweep}: no offline W&B runs under {where}; nothing to upload")
        return 0
    command = tracking.sync_command(dirs)
    console.print(f"sweep {args.sweep}: {len(dirs)} offline W&B run directories to upload: "
                  f"{' '.join(command)}", soft_wrap=True)
    problem = tracking.unreachable()
    if problem:
        raise RuntimeError(f"{problem}; nothing uploaded, the runs stay under {where} "
                           f"(rerun `wandb-sync {args.sweep}` when online)")
    code = subprocess.run(command).returncode
    if code:
        raise RuntimeError(f"wandb sync exited with {code} (see its output above; `wandb login` "
                           f"if it asks for an API key); rerunning uploads what is left")
    console.print(f"sweep {args.sweep}: wandb sync done ({len(dirs)} run directories; those "
                  f"synced before were skipped)")
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage mistakes in one line, like every other error (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m orchestrator", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sweep", help="compose the grid and run every job not yet done")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. family=lidas,dense seed=range(0,5)")
    p.add_argument("--name", help="sweep name (default: derived from the non-seed overrides)")
    p.add_argument("--dry-run", action="store_true", help="print the runs and write nothing")
    p.set_defaults(fn=cmd_sweep)
    for cmd, fn, text in (("status", cmd_status, "states of the runs of each sweep"),
                          ("report", cmd_report, "rebuild and print a sweep's report")):
        p = sub.add_parser(cmd, help=text)
        p.add_argument("sweep", nargs="?", help="sweep name (default: all / the latest)")
        p.add_argument("--store", default="outputs", help="store root (default: outputs)")
        p.set_defaults(fn=fn)
    p = sub.add_parser("cancel", help="scancel a sweep's Slurm jobs (cluster=slurm, slurm_array)")
    p.add_argument("sweep", help="sweep name")
    p.add_argument("--store", default="outputs", help="store root (default: outputs)")
    p.set_defaults(fn=cmd_cancel)
    p = sub.add_parser("run-one", help="run one run's jobs in this process (a slurm_array task)")
    p.add_argument("run_id", help="run id (runs/<run_id>/config.yaml in the store)")
    p.add_argument("--store", default="outputs", help="store root (default: outputs)")
    p.set_defaults(fn=cmd_run_one)
    p = sub.add_parser("wandb-sync", help="upload a sweep's offline W&B runs (wandb sync)")
    p.add_argument("sweep", help="sweep name")
    p.add_argument("--store", default="outputs", help="store root (default: outputs)")
    p.set_defaults(fn=cmd_wandb_sync)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    except (StoreError, RuntimeError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        return 130
