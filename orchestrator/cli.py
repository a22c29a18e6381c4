"""`python -m orchestrator sweep|status|report|cancel|wandb-sync|wandb-dashboard|run-one`: arguments in, lines
out; the work is the Sweep's (orchestrator/sweep.py).

Every command takes the store as `store.root=<dir>` (as `sweep` does; `--store <dir>` is the
same). Exit codes: 0 success, 1 a runtime problem (failed runs, store trouble), 2 bad input
(nothing was started or written), 130 interrupted (the same command resumes)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any, NoReturn, Optional, Sequence

from rich.console import Console
from rich.markup import escape

from common.settings import ConfigError
from orchestrator.status import CHECKED, LISTED
from store.store import Store, StoreError

# The commands import what they need when they run: composing and reporting bring in Hydra, torch
# and the analysis (seconds), which `status` has no use for.


class _Console(Console):
    """rich's console, but a reader that went away (`| tee log` ended by the same Ctrl-C, `| head`)
    silences the output instead of exiting at once: the driver goes on to record its jobs'
    ends (interrupted, with exit 130), which the store keeps and `status` shows."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.file.fileno())  # and for Python's own flush at exit
        os.close(devnull)


# Logs (CI, nohup) get a wide fixed width instead of rich's 80 columns, so tables stay readable.
console = _Console(highlight=False, width=None if sys.stdout.isatty() else 140)
# Errors on stderr, one line, as wide as it takes (a log or a terminal wraps it, not rich).
errors = _Console(stderr=True, highlight=False, soft_wrap=True)
STORE_DEFAULT = "outputs"


def cmd_sweep(args: argparse.Namespace) -> int:
    from orchestrator import sweep as sweeps

    overrides = [*args.overrides, *([f"store.root={args.store}"] if args.store else [])]
    sweep = sweeps.Sweep.compose(overrides, args.name, console)
    return sweep.dry_run() if args.dry_run else sweep.run()


def _store(args: argparse.Namespace) -> Store:
    store = Store(args.store)
    store.check()
    return store


def cmd_report(args: argparse.Namespace) -> int:
    from orchestrator import sweep as sweeps

    store = _store(args)
    name = args.sweep or sweeps.latest(store)
    return sweeps.report(store, name, console)


def cmd_status(args: argparse.Namespace) -> int:
    from orchestrator.status import status

    store = _store(args)
    return status(store, [args.sweep] if args.sweep else store.sweeps(), console, check=args.check or None,
                  every=args.all)


def cmd_cancel(args: argparse.Namespace) -> int:
    """scancel a sweep's Slurm jobs; the same `sweep` command resubmits and resumes it."""
    from orchestrator import sweep as sweeps

    return sweeps.cancel(_store(args), args.sweep, console)


def cmd_run_one(args: argparse.Namespace) -> int:
    """One run's jobs in this process (a cluster=slurm_array task)."""
    from orchestrator import sweep as sweeps

    return sweeps.run_one(args.store, args.run_id)


def cmd_wandb_sync(args: argparse.Namespace) -> int:
    """Upload a sweep's offline W&B runs: `wandb sync` on their run directories."""
    from orchestrator import tracking

    store = _store(args)
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


def cmd_wandb_dashboard(args: argparse.Namespace) -> int:
    """The sweep's saved W&B workspace (orchestrator/workspace.py)."""
    from orchestrator import sweep as sweeps
    from orchestrator import workspace

    store = _store(args)
    store.read_sweep(args.sweep)
    return workspace.publish(store, args.sweep, sweeps.latest_tracker(store, args.sweep), console)


class _Parser(argparse.ArgumentParser):
    """Usage mistakes in one line, like every other error (exit 2). With `groups`, the help ends
    with the config groups, listed only when the help is shown (listing them imports every
    component)."""

    def __init__(self, *args: Any, groups: bool = False, intermixed: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.groups, self.intermixed = groups, intermixed

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """With `intermixed`, flags may come between the positional arguments (`sweep family=dense
        --dry-run seed=0,1`), as Hydra's command lines have them."""
        if not self.intermixed:
            return super().parse_known_args(args, namespace)
        self.intermixed = False  # parse_known_intermixed_args parses through this method
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self.intermixed = True

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")

    def format_help(self) -> str:
        if self.groups:
            self.epilog, self.groups = f"{_groups_text()}\n\n{self.epilog}", False
        return super().format_help()


class _Refused(argparse.Action):
    """A flag from another tool's habits: refused with what to do instead (exit 2)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, fix: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.fix = fix

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> NoReturn:
        parser.error(f"{'/'.join(self.option_strings)}: {self.fix}")


def _store_arguments(p: argparse.ArgumentParser, default: Optional[str] = STORE_DEFAULT) -> None:
    p.add_argument("--store", default=default, help=f"store root, as store.root=<dir> (default: {STORE_DEFAULT})")


DESCRIPTION = """Train the dense, LIDAS and looped families over many seeds and analyse them.

  python -m orchestrator sweep family=lidas,looped,dense seed=0,1,2

Every command takes the store as store.root=<dir> (or --store <dir>). Exit codes: 0 success,
1 a runtime problem (failed runs, store trouble), 2 bad input (nothing was started or
written), 130 interrupted (the same command resumes)."""
MANUAL = "The manual is docs/ (`make docs` builds it as a site)"


def _groups_text() -> str:
    """The config groups and their options, as a Hydra app's --help lists them."""
    from orchestrator import config

    groups = config.config_groups()
    width = max(map(len, groups)) + 1
    return "\n".join(["== Configuration groups ==", "Choose one option per group (group=option, or several to"
                      " sweep: family=lidas,dense); eval.jobs takes a list.", "",
                      *(f"{name + ':':<{width}} {', '.join(options)}" for name, options in groups.items()), "",
                      "Any key can be set or swept as well (train.lr=1e-3,3e-4, seed=range(0,5)); `sweep --dry-run`"
                      " prints the runs without starting them."])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m orchestrator", description=DESCRIPTION, groups=True,
                     epilog=f"{MANUAL}: getting-started.md first, then sweeps.md, store.md,"
                            " statistics.md, clusters.md, tracking.md.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sweep", help="compose the grid and run every job not yet done",
                       description="Compose the grid of runs from conf/ and the overrides, and run every job"
                                   " not yet done (a sweep resumes where it stopped).",
                       groups=True, epilog=f"{MANUAL}: sweeps.md (the grid grammar, names, adaptive"
                              " seeding), clusters.md (where runs go).",
                       formatter_class=argparse.RawDescriptionHelpFormatter, intermixed=True)
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. family=lidas,dense seed=range(0,5)")
    p.add_argument("--name", help="sweep name (default: derived from the non-seed overrides)")
    p.add_argument("--dry-run", action="store_true", help="print the runs and write nothing")
    _store_arguments(p, default=None)  # None: store.root of the overrides, or conf/'s
    p.add_argument("-m", "--multirun", action=_Refused, help=argparse.SUPPRESS,
                   fix="every sweep is a multirun already (family=a,b and seed=range(0,5) sweep); drop it")
    p.set_defaults(fn=cmd_sweep)
    commands = (("status", cmd_status, "states of the runs of each sweep", "?", "sweep name (default: all)",
                 "store.md"),
                ("report", cmd_report, "rebuild and print a sweep's report", "?", "sweep name (default: the latest)",
                 "statistics.md"),
                ("cancel", cmd_cancel, "scancel a sweep's Slurm jobs (cluster=slurm, slurm_array)", None, "sweep name",
                 "clusters.md"),
                ("wandb-sync", cmd_wandb_sync, "upload a sweep's offline W&B runs (wandb sync)", None, "sweep name",
                 "tracking.md"),
                ("wandb-dashboard", cmd_wandb_dashboard, "create the sweep's W&B workspace (offline: its "
                 "specification in the sweep's folder)", None, "sweep name", "tracking.md"),
                ("run-one", cmd_run_one, "run one run's jobs in this process (a slurm_array task)", None,
                 "run id (runs/<run_id>/config.yaml in the store)", "clusters.md"))
    for cmd, fn, text, nargs, what, page in commands:
        p = sub.add_parser(cmd, help=text, description=text[0].upper() + text[1:] + ".",
                           epilog=f"{MANUAL}: {page}.")
        p.add_argument("run_id" if cmd == "run-one" else "sweep", nargs=nargs, help=what)
        _store_arguments(p)
        p.set_defaults(fn=fn)
        if cmd == "status":
            p.add_argument("--check", action="store_true",
                           help=f"check every run's files, as the next sweep does (the default up to {CHECKED} runs; "
                                f"a larger sweep is read from the store's index)")
            p.add_argument("--all", action="store_true",
                           help=f"a line for every run (default: every run up to {LISTED}, "
                                "else those not done or pending)")
    return parser


def _store_overrides(argv: list[str]) -> list[str]:
    """`store.root=<dir>` after a store command, as `sweep` takes it, read as `--store <dir>`."""
    if not argv or argv[0] == "sweep":
        return argv
    return [f"--store={a.split('=', 1)[1]}" if a.startswith("store.root=") else a for a in argv]


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(_store_overrides(list(sys.argv[1:] if argv is None else argv)))
    try:
        return args.fn(args)
    except (ConfigError, StoreError) as e:  # what the user asked cannot be done as asked
        errors.print(f"[red]error:[/] {escape(str(e))}")
        return 2
    except RuntimeError as e:
        errors.print(f"[red]error:[/] {escape(str(e))}")
        return 1
    except KeyboardInterrupt:
        return 130
