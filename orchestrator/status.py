"""`status`: each sweep's runs by state, the running and failed ones, damage, the cluster's queue.

A sweep of at most `CHECKED` runs (or any sweep, with `--check`) is read run by run: every run's
state, config and files are checked, as `report` and the next sweep check them. A larger one is
read from the store's index (store/index.py), which answers in a second for 100,000 runs:
only the runs it says are running are read from their files (to tell running from stale). Up to
`LISTED` runs get a line each; beyond that, the counts and the runs that are not done or pending
(all with `--all`).

This module imports neither torch nor the analysis, so that `status` starts quickly."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterator, Optional

import yaml
from rich.console import Console
from rich.table import Table

from orchestrator.executors import recorded_executor
from orchestrator.identity import seed_axes_label
from store import index
from store.records import RunState, SweepConfigs
from store.store import CORRUPT, DONE, PENDING, RUNNING, WAITING, Store, StoreError

CHECKED = 1000  # runs up to which `status` checks every run's files unless told otherwise
LISTED = 200  # runs up to which each gets a line (here, in the live view, in the dry run)
STALE = "stale"


@dataclass
class Row:
    run_id: str
    status: str
    jobs: dict  # job -> (status, attempts)
    error: Optional[str]
    progress: str = ""


def status(store: Store, names: list[str], console: Console, check: Optional[bool] = None,
           every: bool = False) -> int:
    """A table per sweep of its runs' states, the cluster's queue states, and damage notes."""
    if not names:
        raise StoreError(f"no sweeps in {store.root} yet; run `python -m orchestrator sweep` first")
    found: Optional[index.Index] = None
    for name in names:
        sweep, labels = store.read_sweep(name), Labels(store, name)
        ids = sweep["run_ids"]
        if check or (check is None and len(ids) <= CHECKED):
            rows, notes = _checked(store, ids, labels)
        else:
            found = found or load_index(store, console)
            rows, notes = _indexed(store, ids, found, labels)
        listed = rows if every or len(rows) <= LISTED else [r for r in rows if r.status not in (DONE, PENDING)][:LISTED]
        _table(console, name, listed, labels)
        console.print("  ".join(f"{k} {v}" for k, v in sorted(Counter(r.status for r in rows).items())))
        if len(listed) < len(rows):
            console.print(f"{len(listed)} of {len(rows)} runs listed (not done or pending, at most {LISTED}); "
                          f"`status {name} --all` lists every run", markup=False)
        executor = recorded_executor(sweep)
        for line in executor.status_lines(sweep) if executor else []:
            console.print(line, markup=False, soft_wrap=True)
        for note in notes:
            console.print(f"  {note}", soft_wrap=True, markup=False)
    return 0


def _table(console: Console, name: str, rows: list[Row], labels: "Labels") -> None:
    table = Table(title=f"sweep {name}", title_justify="left", box=None, header_style="bold")
    for col in ("run", "id", "status", "jobs (status x attempts)", "progress", "error"):
        table.add_column(col)
    for row in rows:
        jobs = "  ".join(f"{j} {s} x{a}" for j, (s, a) in row.jobs.items()) or "-"
        table.add_row(labels(row.run_id), row.run_id, row.status, jobs, row.progress, row.error or "")
    console.print(table)


class Labels:
    """`<family>-<size>-s<seed>` of a sweep's runs, from its configs file, else config.yaml; the
    configs file is read at the first label asked for (a sweep with nothing to list needs none)."""

    def __init__(self, store: Store, name: str):
        self.store, self.name = store, name

    @cached_property
    def configs(self) -> SweepConfigs:
        return _sweep_configs(self.store, self.name)

    def __call__(self, run_id: str) -> str:
        try:
            cfg = self.configs.config(run_id) if run_id in self.configs.runs else self.store.read_config(run_id)
            return f"{cfg['family']['name']}-{cfg['model']['name']}-s{cfg['seed']}{seed_axes_label(cfg)}"
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
            return "?"


def _sweep_configs(store: Store, name: str) -> SweepConfigs:
    try:
        return store.sweep_configs(name)
    except ValueError:  # a damaged configs file: config.yaml has the same
        return SweepConfigs()


def _row(run_id: str, state: RunState) -> Row:
    jobs = {j: (s.get("status"), s.get("attempts", 0)) for j, s in state.get("jobs", {}).items()}
    return Row(run_id, state["status"], jobs, state.get("error"))


def _checked(store: Store, ids: list[str], labels: Labels) -> tuple[list[Row], list[str]]:
    """Every run read from its files, with its problems."""
    rows, notes = [], []
    for rid in ids:
        state = store.read_state(rid)
        notes += _damage_notes(store, rid, labels(rid), state)
        rows.append(_with_progress(store, _row(rid, state)))
    return rows, notes


def _indexed(store: Store, ids: list[str], found: index.Index, labels: Labels) -> tuple[list[Row], list[str]]:
    """Every run as the index says; the running and waiting ones read from their files (stale
    or not, and what they wait for)."""
    rows, notes = [], []
    for rid in ids:
        rec = found.runs.get(rid)
        if rec is None:
            rows.append(Row(rid, PENDING, {}, None))
        elif rec["status"] in (RUNNING, WAITING):
            state = store.read_state(rid)
            notes += _damage_notes(store, rid, labels(rid), state)
            rows.append(_with_progress(store, _row(rid, state)))
        else:
            rows.append(Row(rid, rec["status"], rec["jobs"], rec["error"]))  # job -> [status, attempts]
    return rows, notes


def _with_progress(store: Store, row: Row) -> Row:
    p = store.read_progress(row.run_id) if row.status == RUNNING else {}
    row.progress = f"{p.get('job')} {p.get('step')}/{p.get('total_steps')}" if p else ""
    return row


def _damage_notes(store: Store, rid: str, label: str, state: RunState) -> list[str]:
    """One line per problem of a run (and per past one that was repaired); marks the state
    `stale` (running, claim free: its process was killed) or `corrupt` (damaged files)."""
    notes = [f"problem {rid} {label}: {p}; the next sweep of this run moves it aside and reruns "
             f"the run's jobs (training resumes from its newest sound checkpoint)"
             for p in store.problems(rid)]
    if notes:
        state["status"] = CORRUPT
    elif store.is_stale(rid, state):
        for job in [state, *state.get("jobs", {}).values()]:
            if job.get("status") == RUNNING:
                job["status"] = STALE
        notes.append(f"stale {rid} {label}: state.json says running but no process holds its "
                     f"claim (killed); the next sweep resumes it from its last checkpoint")
    notes += [f"waiting {rid} {label}: since {entry.get('waiting_since')} job {job} needs {entry['waiting_for']},"
              " which the cluster cannot give now (a node was lost, or other jobs hold them); it starts when they"
              " are free (if the sweep's driver was stopped meanwhile, rerun the sweep)"
              for job, entry in state.get("jobs", {}).items() if entry.get("status") == WAITING]
    return notes + [f"recovered {rid} {label}: {r}" for r in store.recovered(rid)]


COMPACT_AFTER = 10_000  # journal lines past the snapshot at which `status` folds them in


def load_index(store: Store, console: Console) -> index.Index:
    """The index, made whole: rebuilt from every run's state.json when its snapshot is damaged
    or it is gone, completed with the runs it lacks (a record lost with a killed process), and
    compacted when its journals grew long. `status` says when it rebuilt or completed it; on a
    read-only store it reads the same, and says that it could not write."""
    root = str(store.root)
    try:
        found = index.read(root)
    except index.IndexDamaged as e:
        console.print(f"index damaged ({e}): rebuilt from the run directories", markup=False)
        found = index.of_states(_states(store, store.started_runs()))
        _write(console, lambda: index.replace(root, found))
        return found
    states = dict(_states(store, store.started_runs() - found.runs.keys()))
    lost = [rid for rid, state in states.items() if state["status"] != RUNNING]  # running: just starting
    if lost:
        what = "missing" if found.generation < 0 and not found.sizes else f"lacked {len(lost)} runs"
        console.print(f"index {what}: rebuilt from the run directories", markup=False)
    for rid, state in states.items():
        found.add(rid, index.record(state))
    if lost or found.unfolded > COMPACT_AFTER:
        _write(console, lambda: index.compact(root, found))
    return found


def _states(store: Store, run_ids: set[str]) -> Iterator[tuple[str, RunState]]:
    return ((rid, store.read_state(rid)) for rid in sorted(run_ids))


def _write(console: Console, write: Callable[[], object]) -> None:
    """Write the index; a store that cannot be written is read all the same."""
    try:
        write()
    except OSError as e:
        console.print(f"index not written ({e.strerror}); reading it as rebuilt", markup=False)
