"""Plan a sweep's jobs and run them on Ray with a live view.

One Ray task per job with the resources its size declares; an evaluation task takes the train
task's result as an argument, so Ray starts it only once the checkpoint exists. Runs are
submitted longest first (estimated FLOPs), which keeps every core busy until the end."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from rich.console import Console
from rich.live import Live

from jobs.flops import schedule_flops

from . import progress as view
from .identity import run_id, run_label
from .store import DONE, FAILED, INTERRUPTED, RUNNING, Store
from .worker import execute, jobs_of, resources_of


@dataclass
class PlannedRun:
    run_id: str
    label: str
    config: dict
    todo: list[str]
    cost: float
    state: dict = field(default_factory=dict)

    @property
    def cached(self) -> bool:
        return not self.todo


def estimated_flops(cfg: dict) -> float:
    t, d = cfg["train"], cfg["data"]
    return schedule_flops(cfg, t["batch_size"] * d["seq_len"], d["seq_len"])


def plan(configs: list[dict], store: Store) -> list[PlannedRun]:
    """One PlannedRun per distinct run id, with the jobs not yet done (read-only)."""
    planned: dict[str, PlannedRun] = {}
    for cfg in configs:
        rid = run_id(cfg)
        if rid in planned:
            continue
        state = store.read_state(rid)
        todo = [j for j in jobs_of(cfg) if state.get("jobs", {}).get(j, {}).get("status") != DONE]
        planned[rid] = PlannedRun(rid, run_label(cfg), cfg, todo, estimated_flops(cfg), state)
    return list(planned.values())


def job_resources(cfg: dict, job: str) -> dict:
    r = resources_of(cfg, job)
    return {"num_cpus": r["cpus"], "num_gpus": r["gpus"], "memory": int(r["memory_gb"] * 2**30)}


def resources_text(cfg: dict) -> str:
    r = cfg["resources"]
    return f"cpu={r['cpus']:g} gpu={r['gpus']:g} mem={r['memory_gb']:g}G nodes={r['nodes']}"


def init_ray(cluster: dict) -> None:
    import logging

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray turns token authentication on for local clusters (good) and says so on every start.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    kwargs: dict[str, Any] = dict(include_dashboard=cluster["include_dashboard"],
                                  dashboard_host=cluster["dashboard_host"],
                                  log_to_driver=False, logging_level="WARNING")
    if cluster["address"]:
        ray.init(address=cluster["address"], **kwargs)
    else:
        ray.init(num_cpus=cluster["num_cpus"] or os.cpu_count(),
                 num_gpus=cluster["num_gpus"] or 0, **kwargs)


def check_fit(runs: list[PlannedRun]) -> None:
    """Ray waits for ever on a request no node can satisfy: refuse it before submitting."""
    import ray

    total = ray.cluster_resources()
    for run in runs:
        for job in run.todo:
            want = job_resources(run.config, job)
            for key, ray_key in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
                if want[key] > total.get(ray_key, 0):
                    raise RuntimeError(
                        f"{run.label} ({run.run_id}) job {job} asks for {want[key]:g} {ray_key} "
                        f"but the cluster has {total.get(ray_key, 0):g}; lower its resources or "
                        f"use a larger cluster")


class Interrupted(Exception):
    """Raised in the driver by Ctrl-C or SIGTERM."""


def _raise_interrupted(signum: int, frame: Optional[object]) -> None:
    raise Interrupted(signal.Signals(signum).name)


def run(runs: list[PlannedRun], store: Store, cluster: dict, console: Console) -> dict[str, str]:
    """Execute every job still to do; returns run id -> final status."""
    import ray

    todo = [r for r in runs if r.todo]
    outcome = {r.run_id: DONE for r in runs if r.cached}
    if not todo:
        return outcome
    owns_ray = not ray.is_initialized()  # a caller (tests, bench) may share its own session
    if owns_ray:
        init_ray(cluster)
    remote = ray.remote(execute)
    try:
        check_fit(todo)
        inflight: dict[Any, tuple[PlannedRun, str]] = {}
        for r in sorted(todo, key=lambda r: -r.cost):
            train_ref = None
            for job in r.todo:
                opts = job_resources(r.config, job)
                retries = r.config["train"]["max_retries"]
                after = [train_ref] if train_ref is not None else []
                ref = remote.options(**opts, max_retries=retries, retry_exceptions=True,
                                     name=f"{r.label}:{job}").remote(
                    job, r.run_id, str(store.root), r.config, *after)
                train_ref = ref if job == "train" else train_ref
                inflight[ref] = (r, job)
        outcome.update(_drive(inflight, runs, store, console))
    finally:
        if owns_ray:
            ray.shutdown()
    return outcome


def _drive(inflight: dict, runs: list[PlannedRun], store: Store, console: Console) -> dict:
    import ray

    outcome: dict[str, str] = {}
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        with Live(view.render(runs, store, outcome, started), console=console,
                  refresh_per_second=2, transient=False) as live:
            while inflight:
                # Everything that finishes within half a second, then one refresh of the view.
                ready, _ = ray.wait(list(inflight), num_returns=len(inflight), timeout=0.5)
                for ref in ready:
                    r, job = inflight.pop(ref)
                    try:
                        ray.get(ref)
                        run_done = all(store.job_state(r.run_id, j).get("status") == DONE for j in r.todo)
                        if run_done:
                            outcome[r.run_id] = DONE
                        live.console.print(view.finished_line(r, job, store, run_done))
                    except Exception as e:  # the job failed after its retries
                        outcome[r.run_id] = FAILED
                        _record_crash(store, r, job, e)
                        live.console.print(view.failed_line(r, job, store))
                live.update(view.render(runs, store, outcome, started))
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
