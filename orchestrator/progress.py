"""The live view of a sweep: counts per state and one line per running job (step, loss, ETA).

It reads only the store (state.json and progress.json of the runs in flight), the same files
`status` reads; the counts are the driver's."""
from __future__ import annotations

import datetime as dt
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from jobs.registry import headline
from orchestrator.plan import PlannedRun
from store.records import RunState
from store.store import DONE, FAILED, PENDING, RUNNING, Store


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


class States:
    """Run states as the view last saw them; a state.json is parsed again only when a stat says
    it changed (the view looks at every unfinished run twice a second, on a shared filesystem)."""

    def __init__(self, store: Store):
        self.store = store
        # run id -> (state.json's stat key (None: no file), its state)
        self._seen: dict[str, tuple[Optional[tuple[int, int, int]], RunState]] = {}

    def __call__(self, run_id: str) -> RunState:
        try:  # an atomic write is a new file: its inode, size or mtime changes
            st = os.stat(self.store.run(run_id).state)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            key = None
        seen = self._seen.get(run_id)
        if seen is None or seen[0] != key:
            seen = self._seen[run_id] = (key, self.store.read_state(run_id))
        return seen[1]


@dataclass
class Tally:
    """What the driver knows of its runs without reading the store: how many, which were cached,
    how those it ran ended, and which have a job in flight (the only ones that can be running)."""
    runs: int
    cached: int
    ended: dict[str, str] = field(default_factory=dict)  # run id -> done or failed
    active: dict[str, PlannedRun] = field(default_factory=dict)


ROWS = 20  # running jobs shown in the live view


def render(tally: Tally, states: States, started: float) -> Group:
    """The counts and a row per running job; reads only the states of the runs in flight, so a
    refresh costs the same for 100 runs or 100,000."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("run", "id", "job", "step", "loss", "layers", "tok/s", "eta"):
        table.add_column(col, justify="right" if col not in ("run", "id", "job") else "left")
    running = [r for r in tally.active.values() if states(r.run_id).get("status") == RUNNING]
    for r in running[:ROWS]:
        p = states.store.read_progress(r.run_id)
        step = f"{p.get('step', 0)}/{p.get('total_steps', '?')}" if "step" in p else "-"
        loss = f"{p['loss']:.3f}" if "loss" in p else "-"
        table.add_row(r.label, r.run_id, p.get("job", "?"), step, loss, str(p.get("n_layers", "-")),
                      f"{p.get('tokens_per_s', 0):,.0f}", _eta(p.get("eta_s")))
    ended = Counter(tally.ended.values())
    counts = {"cached": tally.cached, DONE: ended[DONE], RUNNING: len(running),
              PENDING: tally.runs - tally.cached - len(tally.ended) - len(running), FAILED: ended[FAILED]}
    summary = "  ".join(f"{k} {n}" for k, n in counts.items() if n)
    more = f"  ({len(running) - ROWS} more running)" if len(running) > ROWS else ""
    header = Text(f"{tally.runs} runs  {summary}  elapsed {_eta(time.monotonic() - started)}{more}")
    return Group(header, table) if table.row_count else Group(header)


def finished_line(r: PlannedRun, job: str, run_state: dict, store: Store | None) -> str:
    """`job` done; with `store` (given once the whole run is done) also the run's headline metric."""
    state = run_state["jobs"].get(job, {})
    took = ""
    if state.get("started_at") and state.get("ended_at"):
        seconds = (dt.datetime.fromisoformat(state["ended_at"])
                   - dt.datetime.fromisoformat(state["started_at"])).total_seconds()
        took = f" in {_eta(seconds)}"
    shown = ""
    if store is not None:
        name = headline(r.config.data.kind)
        if name and (value := store.read_metrics(r.run_id).get("metrics", {}).get(name)) is not None:
            shown = f", {name} {value:.4f}"
    return f"[green]done[/] {r.label} {r.run_id} {job}{took}{shown}"


def failed_line(r: PlannedRun, job: str, store: Store) -> str:
    error = store.read_state(r.run_id).get("error") or "unknown error"
    return f"[red]failed[/] {r.label} {r.run_id} {job}: {escape(error)}"
