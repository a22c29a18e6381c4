"""`python -m orchestrator sweep|status|report`.

Exit codes: 0 success, 1 a runtime problem (failed runs, store trouble), 2 bad input (nothing was
started or written), 130 interrupted (the same command resumes)."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Optional

from rich.console import Console
from rich.table import Table

from .config import ConfigError
from .store import FAILED, Store, StoreError

# Logs (CI, nohup) get a wide fixed width instead of rich's 80 columns, so tables stay readable.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)


def cmd_sweep(args: argparse.Namespace) -> int:
    from jobs.registry import evaluations

    from . import grid, scheduler

    points, default_name = grid.expand(args.overrides, evaluations())
    roots = {p.config["store"]["root"] for p in points}
    if len(roots) != 1:
        raise ConfigError(f"store.root: one sweep must use one store, got {sorted(roots)}")
    store = Store(roots.pop())
    store.check()
    runs = scheduler.plan([p.config for p in points], store)
    name = args.name or default_name
    if args.dry_run:
        for r in runs:
            c = r.config
            console.print(f"{r.run_id}  {c['family']['name']:<7} {c['model']['name']:<6} "
                          f"seed={c['seed']:<3} {scheduler.resources_text(c)}  "
                          f"{'cached' if r.cached else 'new'}")
        console.print(f"sweep {name}: {len(runs)} runs, "
                      f"{sum(not r.cached for r in runs)} to do (dry run: nothing written)")
        return 0
    store.create()
    for r in runs:
        store.write_config(r.run_id, r.config)
    store.record_sweep(name, args.overrides, [r.run_id for r in runs])
    console.print(f"sweep [bold]{name}[/]: {len(runs)} runs, {sum(r.cached for r in runs)} "
                  f"cached, store {store.root}")
    outcome = scheduler.run(runs, store, runs[0].config["cluster"], console)
    return _report(store, name) or (1 if FAILED in outcome.values() else 0)


def _report(store: Store, name: str) -> int:
    import analysis

    sweep = store.read_sweep(name)
    states = [store.read_state(r)["status"] for r in sweep["run_ids"]]
    if "done" not in states:
        console.print(f"sweep {name}: no finished runs yet; nothing to report")
        return 1
    result = analysis.analyse(store.root, name)
    path = analysis.save_report(result, store.root)
    console.print(analysis.render_summary(result))
    console.print(f"report: {path}")
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
        for rid in sweep["run_ids"]:
            state = store.read_state(rid)
            counts[state["status"]] += 1
            try:
                cfg = store.read_config(rid)
                label = f"{cfg['family']['name']}-{cfg['model']['name']}-s{cfg['seed']}"
            except (OSError, ValueError, KeyError, TypeError):
                label = "?"
            jobs = state.get("jobs", {})
            attempts = "  ".join(f"{j} {s.get('status')} x{s.get('attempts', 0)}"
                                 for j, s in jobs.items()) or "-"
            p = store.read_progress(rid) if state["status"] == "running" else {}
            prog = f"{p.get('job')} {p.get('step')}/{p.get('total_steps')}" if p else ""
            table.add_row(label, rid, state["status"], attempts, prog, state.get("error") or "")
        console.print(table)
        console.print("  ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator", description=__doc__,
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
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        console.print(f"[red]error:[/] {e}", soft_wrap=True)
        return 2
    except (StoreError, RuntimeError) as e:
        console.print(f"[red]error:[/] {e}", soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        return 130
