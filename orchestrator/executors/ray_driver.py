"""Running a sweep's jobs on Ray with a live view: what the local and the existing-cluster
executors share (local.py, ray_cluster.py); a Slurm allocation runs the same inside it.

One Ray task per job with the resources its size declares (short runs of a large sweep several to
a task, `Feed`); an evaluation task takes the train task's result as an argument, so Ray starts
it only once the checkpoint exists. Runs are
submitted longest first (estimated FLOPs), which keeps every core busy until the end, and only
while fewer than a window of jobs is in flight: a sweep of 100,000 runs holds a few thousand
tasks in Ray at a time, and the driver's memory does not grow with the sweep. A
multi-node training job is one resource-free coordinating task (`worker.execute_nodes`) that
reserves a placement group. Ray never fails a request that no node can satisfy (it waits for
ever), so `check_fit` refuses those against the live nodes before anything is submitted."""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import signal
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from rich.console import Console
from rich.live import Live

from orchestrator import progress as view
from orchestrator.executors import Executor, Outcome
from orchestrator.identity import SeedTemplates
from orchestrator.identity import config_yaml
from orchestrator.plan import PlannedRun, bundle_of, check_fit, jobs_of, processes_of
from orchestrator.worker import RunBatch, execute, execute_nodes, execute_runs, process_options
from store.records import RunState
from store.store import DONE, FAILED, INTERRUPTED, RUNNING, Store


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

    def check(self, runs: list[PlannedRun], name: str, store: Store) -> None:
        """Jobs that no node can hold, refused against the nodes known before connecting (the
        real run checks the live nodes again once connected)."""
        nodes = self.nodes()
        if nodes is not None:
            check_fit([r for r in runs if r.todo], nodes)

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
            # the root resolved: tasks may run elsewhere (a shipped working_dir)
            feed = Feed(todo, str(store.root.resolve()), window(nodes), cpus=int(sum(n.get("CPU", 0) for n in nodes)),
                        batch=len(todo) > LISTED, sweep=name)
            outcome.update(_drive(feed, view.Tally(len(runs), len(outcome), active=feed.active), store, console))
        return Outcome(outcome)


def window(nodes: list[dict[str, float]]) -> int:
    """How many jobs may be submitted and not yet finished: enough to keep every core of the
    cluster busy with short jobs, few enough that the driver's memory does not grow with the
    sweep (Ray holds each submitted task's arguments until it ends)."""
    return max(WINDOW, 4 * int(sum(n.get("CPU", 0) for n in nodes)))


WINDOW = 1000


@dataclass
class Task:
    """What one Ray task in flight does: one job of one run, or (`job` None) every job to do of
    several short runs, in turn (`worker.execute_runs`)."""
    runs: list[PlannedRun]
    job: Optional[str]

    def jobs(self) -> Iterator[tuple[PlannedRun, str]]:
        return ((r, job) for r in self.runs for job in ([self.job] if self.job else r.todo))


SHORT_S = 0.05  # a kind of run whose jobs took less than this, together, is batched
BATCH_S = 0.25  # of such runs' work per task
MAX_BATCH = 64
TIMED = 4  # runs of a kind timed, one task per job, before its runs may be batched


class Feed:
    """The runs to do, submitted longest first, a whole run (train, then its evaluations, each
    waiting on the train task) at a time, while fewer than `window` jobs are in flight. Each
    task gets its run's config.yaml text, rendered once per group of seed variants.

    Runs whose jobs take milliseconds (a Ray task costs about one) are batched, several to a
    task: in a large sweep (`batch`), the first `TIMED` runs of each kind (`_kind`) run a task
    per job, and once their jobs took less than `SHORT_S` together, the next runs of that kind go
    `BATCH_S` of work to a task, fewer when that would leave cores idle at the end. Until a kind
    is timed, at most two of its runs per core are in flight, so that most of it waits for the
    timing instead of going a task per job."""

    def __init__(self, runs: list[PlannedRun], root: str, window: int, cpus: int = 1, batch: bool = False,
                 sweep: Optional[str] = None):
        import ray

        self.runs, self.root, self.window, self.cpus = deque(runs), root, window, max(1, cpus)
        self.sweep = sweep  # the jobs' W&B group
        self.remote, self.coordinate = ray.remote(execute), ray.remote(execute_nodes)
        # ray.remote types a task by the arity of its function, and a batch is sent `sweep` too: a
        # function of three arguments, not of execute_runs's two required ones.
        batch_task: Callable[[str, RunBatch, Optional[str]], list[RunState]] = execute_runs
        self.remote_batch = ray.remote(batch_task)
        self.texts = SeedTemplates(config_yaml)
        self.inflight: dict[Any, Task] = {}
        self.active: dict[str, PlannedRun] = {}  # the runs with a job in flight
        self.jobs_in_flight = 0
        self._jobs_left: dict[str, int] = {}
        self._kinds = Counter(_kind(r) for r in runs if batch and _batchable(r))  # runs left to submit
        self._timed: dict[tuple, list[float]] = {kind: [] for kind in self._kinds}  # seconds of each timed run
        self._flying: Counter = Counter()  # kind -> its runs in flight
        self.batched_runs = 0

    def fill(self) -> None:
        """Submit runs until the window is full (or a kind still being timed has its share out)."""
        while self.jobs_in_flight < self.window and self.runs:
            r = self.runs[0]
            size = self._batch_size(r)
            if size == 0:
                return
            batch = [self.runs.popleft()]
            while len(batch) < size and self.runs and _kind(self.runs[0]) == _kind(r):
                batch.append(self.runs.popleft())
            if len(batch) > 1:
                self._submit_batch(batch)
            else:
                self.submit(r)
            for b in batch:
                self.active[b.run_id], self._jobs_left[b.run_id] = b, len(b.todo)
                self.jobs_in_flight += len(b.todo)
                if _kind(b) in self._kinds:
                    self._kinds[_kind(b)] -= 1
                    self._flying[_kind(b)] += 1

    def _batch_size(self, r: PlannedRun) -> int:
        """How many runs of `r`'s kind the next task takes: 1 until the kind is timed, and 0
        (none now) while it is being timed and two runs per core are in flight already."""
        kind = _kind(r)
        if kind not in self._kinds:
            return 1
        timed = self._timed[kind]
        if len(timed) < TIMED:
            return 1 if self._flying[kind] < 2 * self.cpus else 0
        took = sum(timed) / len(timed)
        if took >= SHORT_S:
            return 1
        tail = self._kinds[kind] // (2 * self.cpus)  # every core gets two tasks of what is left
        return max(1, min(MAX_BATCH, int(BATCH_S / max(took, 1e-4)), tail))

    def time(self, r: PlannedRun, state: dict) -> None:
        """Note how long a run's jobs took, once the run is done (its kind's batching waits on it)."""
        timed = self._timed.get(_kind(r))
        if timed is None or len(timed) >= TIMED:
            return
        seconds = 0.0
        for job in r.todo:
            entry = state["jobs"].get(job, {})
            if entry.get("started_at") and entry.get("ended_at"):
                seconds += (dt.datetime.fromisoformat(entry["ended_at"])
                            - dt.datetime.fromisoformat(entry["started_at"])).total_seconds()
        timed.append(seconds)

    def pop(self, ref: Any) -> Task:
        """The task that finished, no longer in flight."""
        task = self.inflight.pop(ref)
        for r, _ in task.jobs():
            self._jobs_left[r.run_id] -= 1
            self.jobs_in_flight -= 1
            if not self._jobs_left[r.run_id]:
                del self.active[r.run_id], self._jobs_left[r.run_id]
                if _kind(r) in self._kinds:
                    self._flying[_kind(r)] -= 1
        return task

    def submit(self, r: PlannedRun) -> None:
        train_ref, text = None, self.texts(r.config)
        for job in r.todo:
            after: list[Any] = [train_ref] if train_ref is not None else []  # Ray object refs
            fn = self.coordinate if multi_node(r.config, job) else self.remote
            ref = fn.options(**job_resources(r.config, job), **process_options(r.config),
                             max_retries=r.config.train.max_retries,
                             retry_exceptions=infrastructure_failures(), name=f"{r.label}:{job}").remote(
                job, r.run_id, self.root, r.config, *after, config_text=text, sweep=self.sweep)
            train_ref = ref if job == "train" else train_ref
            self.inflight[ref] = Task([r], job)

    def _submit_batch(self, runs: list[PlannedRun]) -> None:
        first = runs[0]
        ref = self.remote_batch.options(**job_resources(first.config, first.todo[0]), **process_options(first.config),
                                       max_retries=first.config.train.max_retries,
                                       retry_exceptions=infrastructure_failures(),
                                       name=f"{first.label}+{len(runs) - 1}").remote(
            self.root, [(r.run_id, r.config, r.todo, self.texts(r.config)) for r in runs], self.sweep)
        self.inflight[ref] = Task(runs, None)
        self.batched_runs += len(runs)


def infrastructure_failures() -> list[type[Exception]]:
    """The exceptions a task is retried for (up to train.max_retries): failures of where a job
    ran, which may not recur, never the job's own exceptions, which would (a bad value, a loss
    that turns NaN, a full disk: the job's one-line error goes to its state at once). Ray
    retries a task whose worker or node died, an OOM kill included, by itself; these are the
    same failures met inside a task: a multi-node job's node task that died, a lost object."""
    from ray import exceptions as e

    return [e.WorkerCrashedError, e.NodeDiedError, e.LocalRayletDiedError, e.ObjectLostError, e.OutOfMemoryError,
            e.RaySystemError]


def _batchable(r: PlannedRun) -> bool:
    """Whether the run's jobs may share a task with other runs': each of one process on one
    node, all needing the same resources."""
    cfg = r.config
    return (all(processes_of(cfg, job) == (1, 1) for job in r.todo) and not cfg.backend.launches_ranks
            and len({tuple(sorted(job_resources(cfg, job).items())) for job in r.todo}) == 1)


def _kind(r: PlannedRun) -> tuple:
    """Runs of one kind take about as long as each other: the same jobs, family, size and steps;
    and they share a task's process: the same CPU kernels (`process_options`)."""
    return (tuple(r.todo), r.config.family.name, r.config.model.name, r.config.train.steps,
            r.config.train.cpu_capability)


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
                lines = [line for ref in ready for line in _finished(ref, feed, tally, store, listed)]
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


def _finished(ref: Any, feed: Feed, tally: view.Tally, store: Store, listed: bool) -> list[str]:
    """Record one finished task (its runs' states come back with it); its lines."""
    import ray

    task = feed.pop(ref)
    try:
        result = ray.get(ref)
    except Exception as e:  # the task failed after its retries
        return _failed(task, e, tally, store)
    lines = []
    for r, state in zip(task.runs, [result[1]] if task.job else result):
        run_done = all(state["jobs"].get(j, {}).get("status") == DONE for j in r.todo)
        if run_done:
            tally.ended[r.run_id] = DONE
            feed.time(r, state)
        if listed:
            lines += [view.finished_line(r, job, state, store if run_done else None)
                      for job in ([task.job] if task.job else r.todo)]
    return lines


def _failed(task: Task, error: Exception, tally: view.Tally, store: Store) -> list[str]:
    """A task that failed after its retries: its job (a batch: the first job not done of each of
    its runs; the others are done) failed, or its worker died."""
    lines = []
    for r in task.runs:
        state = store.read_state(r.run_id).get("jobs", {})
        job = task.job or next((j for j in r.todo if state.get(j, {}).get("status") != DONE), None)
        if job is None:
            tally.ended[r.run_id] = DONE
            continue
        tally.ended[r.run_id] = FAILED
        _record_crash(store, r, job, error)
        lines.append(view.failed_line(r, job, store))
    return lines


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
    pending = {(r.run_id, job, tuple(jobs_of(r.config))) for task in inflight.values() for r, job in task.jobs()}
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
