"""Running a sweep's jobs on Ray with a live view: what the local and the existing-cluster
executors share (local.py, ray_cluster.py); a Slurm allocation runs the same inside it.

One Ray task per job with the resources its size declares; an evaluation task takes the train
task's result as an argument, so Ray starts it only once the checkpoint exists. Runs are
submitted longest first (estimated FLOPs), which keeps every core busy until the end. A
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
from orchestrator.plan import PlannedRun, bundle_of, check_fit, jobs_of, processes_of
from orchestrator.store import DONE, FAILED, INTERRUPTED, RUNNING, Store
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
        import ray

        todo = [r for r in runs if r.todo]
        outcome = {r.run_id: DONE for r in runs if r.cached}
        if not todo:
            return Outcome(outcome)
        with self.session():
            remote, coordinate = ray.remote(execute), ray.remote(execute_nodes)
            root = str(store.root.resolve())  # tasks may run elsewhere (a shipped working_dir)
            check_fit(todo, live_nodes())
            inflight: dict[Any, tuple[PlannedRun, str]] = {}
            for r in sorted(todo, key=lambda r: -r.cost):
                train_ref = None
                for job in r.todo:
                    opts = job_resources(r.config, job)
                    after = [train_ref] if train_ref is not None else []
                    fn = coordinate if multi_node(r.config, job) else remote
                    ref = fn.options(**opts, max_retries=r.config.train.max_retries, retry_exceptions=True,
                                     name=f"{r.label}:{job}").remote(job, r.run_id, root, r.config, *after)
                    train_ref = ref if job == "train" else train_ref
                    inflight[ref] = (r, job)
            outcome.update(_drive(inflight, runs, store, console))
        return Outcome(outcome)


RAY_OPTIONS: dict[str, Any] = dict(log_to_driver=False, logging_level="WARNING")  # of every ray.init here


def live_nodes() -> list[dict[str, float]]:
    """Each alive Ray node's total resources."""
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def _drive(inflight: dict, runs: list[PlannedRun], store: Store, console: Console) -> dict:
    import ray

    outcome: dict[str, str] = {}
    started, states = time.monotonic(), view.States(store)
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        with Live(view.render(runs, states, outcome, started), console=console,
                  refresh_per_second=2, transient=False) as live:
            while inflight:
                # Everything that finishes within half a second, then one refresh of the view.
                ready, _ = ray.wait(list(inflight), num_returns=len(inflight), timeout=0.5)
                lines = []
                for ref in ready:
                    r, job = inflight.pop(ref)
                    try:
                        ray.get(ref)
                        state = store.read_state(r.run_id)
                        run_done = all(state["jobs"].get(j, {}).get("status") == DONE for j in r.todo)
                        if run_done:
                            outcome[r.run_id] = DONE
                        lines.append(view.finished_line(r, job, state, store if run_done else None))
                    except Exception as e:  # the job failed after its retries
                        outcome[r.run_id] = FAILED
                        _record_crash(store, r, job, e)
                        lines.append(view.failed_line(r, job, store))
                if lines:  # one print per batch: rich's rendering costs more than the line
                    live.console.print("\n".join(lines), highlight=False, soft_wrap=True)
                live.update(view.render(runs, states, outcome, started))
        console.print()
    except (KeyboardInterrupt, Interrupted):
        _interrupt(inflight, store, console)
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    return outcome


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
