"""Running a sweep's jobs on Ray with a live view: what the local and the existing-cluster
executors share (local.py, ray_cluster.py); a Slurm allocation runs the same inside it.

One Ray task per job with the resources its size declares; an evaluation task takes the train
task's result as an argument, so Ray starts it only once the checkpoint exists. Runs are
submitted longest first (estimated FLOPs), which keeps every core busy until the end, and only
while fewer than a window of jobs is in flight: a sweep of 100,000 runs holds a few thousand
tasks in Ray at a time, and the driver's memory does not grow with the sweep. A
multi-node training job is one resource-free coordinating task (`worker.execute_nodes`) that
reserves a placement group. Ray never fails a request that no node can satisfy (it waits for
ever), so `check_fit` refuses those against the live nodes before anything is submitted."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from typing import Any, Iterator, Optional

from rich.console import Console
from rich.live import Live

from common.settings import ConfigError

from orchestrator import progress as view
from orchestrator.executors import Executor, Outcome
from orchestrator.identity import SeedTemplates
from orchestrator.plan import PlannedRun, bundle_of, check_fit, jobs_of, processes_of
from orchestrator.store import DONE, FAILED, INTERRUPTED, RUNNING, Store, config_yaml
from orchestrator.worker import execute, execute_nodes


def multi_node(cfg: Any, job: str) -> bool:
    return processes_of(cfg, job)[0] > 1


def job_resources(cfg: Any, job: str) -> dict:
    """Ray task options; a multi-node job's coordinator holds nothing (its bundles do)."""
    if multi_node(cfg, job):
        return {"num_cpus": 0}
    b = bundle_of(cfg, job)
    return {"num_cpus": b["CPU"], "num_gpus": b["GPU"], "memory": b["memory"]}


class Interrupted(Exception):
    """Raised in the driver by Ctrl-C or SIGTERM."""


def _raise_interrupted(signum: int, frame: Optional[object]) -> None:
    raise Interrupted(signal.Signals(signum).name)


class RayExecutor(Executor):
    """Runs each job as a Ray task on the Ray session `connect` opens, with a live view; the
    session is this executor's when it opened it (a caller, such as a test, may share its own)."""

    def connect(self) -> None:
        raise NotImplementedError

    def nodes(self) -> Optional[list[dict[str, float]]]:
        """The nodes the jobs will have, for the dry run's check (None: known only once connected)."""
        return None

    def describe(self, runs: list[PlannedRun], name: str, overrides: list[str], store: Store,
                 console: Console) -> None:
        nodes = self.nodes()
        if nodes is None:
            return
        try:
            check_fit([r for r in runs if r.todo], nodes)
        except ConfigError as e:  # the real run refuses it with this line
            console.print(f"[yellow]would not run here:[/] {e}", soft_wrap=True)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Ray turns token authentication on for local clusters (good) and says so on every start.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        owns = not ray.is_initialized()
        if owns:
            self.connect()
        try:
            yield
        finally:
            if owns:
                ray.shutdown()

    def run(self, runs: list[PlannedRun], name: str, overrides: list[str], store: Store,
            console: Console) -> Outcome:
        """Execute every job still to do; the outcome maps run id -> final status."""
        todo = sorted((r for r in runs if r.todo), key=lambda r: -r.cost)
        outcome = {r.run_id: DONE for r in runs if r.cached}
        if not todo:
            return Outcome(outcome)
        with self.session():
            nodes = live_nodes()
            check_fit(todo, nodes)
            feed = Feed(todo, str(store.root.resolve()), window(nodes))  # tasks may run elsewhere (a shipped working_dir)
            outcome.update(_drive(feed, view.Tally(len(runs), len(outcome), active=feed.active), store, console))
        return Outcome(outcome)


def window(nodes: list[dict[str, float]]) -> int:
    """How many jobs may be submitted and not yet finished: enough to keep every core of the
    cluster busy with short jobs, few enough that the driver's memory does not grow with the
    sweep (Ray holds each submitted task's arguments until it ends)."""
    return max(WINDOW, 4 * int(sum(n.get("CPU", 0) for n in nodes)))


WINDOW = 1000


class Feed:
    """The runs to do, submitted longest first, a whole run (train, then its evaluations, each
    waiting on the train task) at a time, while fewer than `window` jobs are in flight. Each
    task gets its run's config.yaml text, rendered once per group of seed variants."""

    def __init__(self, runs: list[PlannedRun], root: str, window: int):
        import ray

        self.runs, self.root, self.window = iter(runs), root, window
        self.remote, self.coordinate = ray.remote(execute), ray.remote(execute_nodes)
        self.texts = SeedTemplates(config_yaml)
        self.inflight: dict[Any, tuple[PlannedRun, str]] = {}
        self.active: dict[str, PlannedRun] = {}  # the runs with a job in flight
        self._jobs_left: dict[str, int] = {}

    def fill(self) -> None:
        """Submit runs until the window is full."""
        while len(self.inflight) < self.window and (r := next(self.runs, None)) is not None:
            self.submit(r)
            self.active[r.run_id], self._jobs_left[r.run_id] = r, len(r.todo)

    def pop(self, ref: Any) -> tuple[PlannedRun, str]:
        """The run and job of a finished task, no longer in flight."""
        r, job = self.inflight.pop(ref)
        self._jobs_left[r.run_id] -= 1
        if not self._jobs_left[r.run_id]:
            del self.active[r.run_id], self._jobs_left[r.run_id]
        return r, job

    def submit(self, r: PlannedRun) -> None:
        train_ref, text = None, self.texts(r.config)
        for job in r.todo:
            after = [train_ref] if train_ref is not None else []
            fn = self.coordinate if multi_node(r.config, job) else self.remote
            ref = fn.options(**job_resources(r.config, job), max_retries=r.config.train.max_retries,
                             retry_exceptions=True, name=f"{r.label}:{job}").remote(
                job, r.run_id, self.root, r.config, *after, config_text=text)
            train_ref = ref if job == "train" else train_ref
            self.inflight[ref] = (r, job)


RAY_OPTIONS: dict[str, Any] = dict(log_to_driver=False, logging_level="WARNING")  # of every ray.init here


def live_nodes() -> list[dict[str, float]]:
    """Each alive Ray node's total resources."""
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def _drive(feed: Feed, tally: view.Tally, store: Store, console: Console) -> dict:
    """Submit and follow the jobs; a line per finished job while the sweep has at most
    `LISTED` runs to do (beyond that, nobody reads them: failures only, and the counts)."""
    import ray

    started, states = time.monotonic(), view.States(store)
    listed = tally.runs - tally.cached <= LISTED
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        with Live(view.render(tally, states, started), console=console,
                  refresh_per_second=2, transient=False) as live:
            feed.fill()
            while feed.inflight:
                # What finishes within half a second (or a quarter of the window, whichever comes
                # first), then one refresh of the view and the window filled again.
                refs = list(feed.inflight)
                ready, _ = ray.wait(refs, num_returns=min(len(refs), max(1, feed.window // 4)), timeout=0.5)
                lines = [line for ref in ready if (line := _finished(ref, feed, tally, store, listed))]
                if lines:  # one print per batch: rich's rendering costs more than the line
                    live.console.print("\n".join(lines), highlight=False, soft_wrap=True)
                feed.fill()
                live.update(view.render(tally, states, started))
        console.print()
    except (KeyboardInterrupt, Interrupted):
        _interrupt(feed.inflight, store, console)
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    return tally.ended


LISTED = 200  # runs to do up to which each finished job gets a line


def _finished(ref: Any, feed: Feed, tally: view.Tally, store: Store, listed: bool) -> Optional[str]:
    """Record one finished task (its run's state comes back with it); its line, if any."""
    import ray

    r, job = feed.pop(ref)
    try:
        _, state = ray.get(ref)
    except Exception as e:  # the job failed after its retries
        tally.ended[r.run_id] = FAILED
        _record_crash(store, r, job, e)
        return view.failed_line(r, job, store)
    run_done = all(state["jobs"].get(j, {}).get("status") == DONE for j in r.todo)
    if run_done:
        tally.ended[r.run_id] = DONE
    return view.finished_line(r, job, state, store if run_done else None) if listed else None


def _record_crash(store: Store, r: PlannedRun, job: str, error: Exception) -> None:
    """A killed worker cannot write its own state; the driver does, once the claim is free."""
    with store.claim(r.run_id, wait=False) as got:
        if got and store.job_state(r.run_id, job).get("status") != FAILED:
            message = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            store.end_job(r.run_id, job, jobs_of(r.config), error=message[:500])


def _interrupt(inflight: dict, store: Store, console: Console) -> None:
    """Stop the running jobs and mark them interrupted; their checkpoints stay for the resume."""
    import ray

    for ref in inflight:
        ray.cancel(ref, force=True)
    deadline = time.monotonic() + 10
    pending = {(r.run_id, job, tuple(jobs_of(r.config))) for r, job in inflight.values()}
    while pending and time.monotonic() < deadline:
        for rid, job, jobs in list(pending):
            with store.claim(rid, wait=False) as got:
                if not got:
                    continue
                if store.job_state(rid, job).get("status") in (RUNNING, FAILED):
                    store.update_job(rid, job, list(jobs), status=INTERRUPTED)
                pending.discard((rid, job, jobs))
        time.sleep(0.2)
    console.print(f"[yellow]interrupted[/]: {len(inflight)} jobs stopped; run the same command "
                  f"again to resume them from their last checkpoints")
