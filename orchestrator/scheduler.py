"""Plan a sweep's jobs and run them on Ray with a live view.

One Ray task per job with the resources its size declares; an evaluation task takes the train
task's result as an argument, so Ray starts it only once the checkpoint exists. Runs are
submitted longest first (estimated FLOPs), which keeps every core busy until the end. A
multi-node training job is one resource-free coordinating task (`worker.execute_nodes`) that
reserves a placement group. Ray never fails a request that no node can satisfy (it waits for
ever), so `check_fit` refuses those against the live nodes before anything is submitted."""
from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from rich.console import Console
from rich.live import Live

from jobs.flops import schedule_flops

from . import progress as view
from .identity import run_id, run_label
from .store import DONE, FAILED, INTERRUPTED, RUNNING, Store
from .config import ConfigError
from .worker import PROJECT_ROOT, bundle_of, execute, execute_nodes, jobs_of, processes_of

# Never shipped to a cluster with the project (runtime_env working_dir).
SHIP_EXCLUDES = [".venv", ".git", "outputs", "wandb", "**/__pycache__", "*.egg-info",
                 ".pytest_cache", "*.pt", "*.parquet"]


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
        if store.problems(rid):  # damaged files: every job reruns (worker.execute recovers them)
            todo = jobs_of(cfg)
        planned[rid] = PlannedRun(rid, run_label(cfg), cfg, todo, estimated_flops(cfg), state)
    return list(planned.values())


def multi_node(cfg: dict, job: str) -> bool:
    return processes_of(cfg, job)[0] > 1


def job_resources(cfg: dict, job: str) -> dict:
    """Ray task options; a multi-node job's coordinator holds nothing (its bundles do)."""
    if multi_node(cfg, job):
        return {"num_cpus": 0}
    b = bundle_of(cfg, job)
    return {"num_cpus": b["CPU"], "num_gpus": b["GPU"], "memory": b["memory"]}


def resources_text(cfg: dict) -> str:
    r = cfg["resources"]
    return f"cpu={r['cpus']:g} gpu={r['gpus']:g} mem={r['memory_gb']:g}G nodes={r['nodes']}"


def gpu_hours(cfg: dict) -> float:
    """Estimated GPU hours of training: FLOPs / (peak FLOP/s per GPU x MFU) / 3600; 0 on CPU."""
    if cfg["resources"]["gpus"] <= 0:
        return 0.0
    c = cfg["cluster"]
    return estimated_flops(cfg) / (c["gpu_peak_flops_per_s"] * c["gpu_mfu"]) / 3600


def ships_code(cluster: dict) -> bool:
    """cluster.ship_code, or (null) whether the address is not a cluster on this machine."""
    if cluster["ship_code"] is not None:
        return cluster["ship_code"]
    address = cluster["address"]
    if not address or address == "auto":
        return False
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    local = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        local |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return host not in local


def init_ray(cluster: dict) -> None:
    """A new local Ray (cluster.address null) or a connection to a running one, shipping the
    project with the runtime_env where the nodes do not share this machine's files."""
    import logging

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray turns token authentication on for local clusters (good) and says so on every start.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    kwargs: dict[str, Any] = dict(log_to_driver=False, logging_level="WARNING")
    if not cluster["address"]:  # "local": a Ray of its own even where `ray start` runs on this machine
        ray.init(address="local", num_cpus=cluster["num_cpus"] or os.cpu_count(),
                 num_gpus=cluster["num_gpus"] or 0, include_dashboard=cluster["include_dashboard"],
                 dashboard_host=cluster["dashboard_host"], **kwargs)
        return
    if ships_code(cluster):
        kwargs["runtime_env"] = {"working_dir": str(PROJECT_ROOT), "excludes": SHIP_EXCLUDES}
    try:
        ray.init(address=cluster["address"], **kwargs)
    except ray.exceptions.AuthenticationError:
        raise RuntimeError(
            f"cluster.address={cluster['address']}: the Ray cluster refused this driver's token; "
            f"export the cluster's RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH), "
            f"the same on every node") from None
    except ConnectionError as e:  # also what a driver without the cluster's token gets
        raise RuntimeError(
            f"cluster.address={cluster['address']}: cannot connect to Ray "
            f"({str(e).strip().splitlines()[0]}); check that `ray start --head` runs there and, "
            f"with token authentication (Ray's default), that this shell exports the cluster's "
            f"RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)") from None


def live_nodes() -> list[dict[str, float]]:
    """Each alive Ray node's total resources."""
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def planned_nodes(cluster: dict) -> Optional[list[dict[str, float]]]:
    """The one node `init_ray` would start for cluster=local (for --dry-run); None for a
    cluster that exists only elsewhere."""
    if cluster["address"]:
        return None
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return [{"CPU": cluster["num_cpus"] or os.cpu_count(), "GPU": cluster["num_gpus"] or 0,
             "memory": memory}]


def _text(resources: dict[str, float], keys: list[str]) -> str:
    return " ".join(f"{k}={resources.get(k, 0) / 2**30:.3g}G" if k == "memory"
                    else f"{k}={resources.get(k, 0):g}" for k in keys)


def check_fit(runs: list[PlannedRun], nodes: list[dict[str, float]]) -> None:
    """Refuse, in one line, a job that no node (or not enough distinct nodes) can hold."""
    for run in runs:
        for job in run.todo:
            want, count = bundle_of(run.config, job), processes_of(run.config, job)[0]
            fitting = [n for n in nodes if all(want[k] <= n.get(k, 0) for k in want if want[k] > 0)]
            if len(fitting) >= count:
                continue
            biggest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)), default={})
            raise ConfigError(
                f"{run.label} ({run.run_id}) job {job} needs {count} node(s) with "
                f"{_text(want, list(want))} each, but only {len(fitting)} of the cluster's "
                f"{len(nodes)} nodes can hold that (largest: {_text(biggest, list(want))}); lower "
                f"resources.* (or eval.resources.*) or use a larger cluster")


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
    remote, coordinate = ray.remote(execute), ray.remote(execute_nodes)
    root = str(store.root.resolve())  # tasks may run elsewhere (a shipped working_dir)
    try:
        check_fit(todo, live_nodes())
        inflight: dict[Any, tuple[PlannedRun, str]] = {}
        for r in sorted(todo, key=lambda r: -r.cost):
            train_ref = None
            for job in r.todo:
                opts = job_resources(r.config, job)
                retries = r.config["train"]["max_retries"]
                after = [train_ref] if train_ref is not None else []
                fn = coordinate if multi_node(r.config, job) else remote
                ref = fn.options(**opts, max_retries=retries, retry_exceptions=True,
                                 name=f"{r.label}:{job}").remote(job, r.run_id, root, r.config, *after)
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
