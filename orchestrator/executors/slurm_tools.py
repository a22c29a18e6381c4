"""What both Slurm executors share (slurm.py, slurm_array.py): the #SBATCH header and the
script's prologue, submitting with sbatch, reading states from squeue/sacct, cancelling.

Every value that reaches a shell goes through `shlex.quote`; `#SBATCH` values are checked by
the cluster configs (sbatch reads those lines itself, without a shell)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rich.console import Console

from common.atomic import write_text
from common.settings import ConfigError, require, setting
from orchestrator.executors import ClusterConfig, Executor, Outcome
from orchestrator.plan import PlannedRun
from orchestrator.store import Store, now

SWEEP_NAME = re.compile(r"[A-Za-z0-9._-]{1,120}")
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING",
          "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"}
# sbatch reads `#SBATCH` lines itself, without a shell: their values must be single plain words.
SBATCH_WORD = re.compile(r"[A-Za-z0-9_.,:@%+=/-]+")


@dataclass
class SlurmCommon(ClusterConfig):
    """The settings both Slurm kinds share: where the jobs queue, for how long, and what runs
    first in each job (module loads, venv activation)."""
    partition: Optional[str] = setting()  # #SBATCH --partition (null: the cluster's default)
    account: Optional[str] = setting()
    qos: Optional[str] = setting()
    time: str = setting()
    requeue: bool = setting()             # a pre-empted job comes back and resumes
    sbatch: list[str] = setting()         # extra options, one per item: ["--constraint=a100"]
    setup: list[str] = setting()          # shell lines run first

    def check(self, run: Any) -> None:
        for key in ("partition", "account", "qos", "time"):
            value = getattr(self, key)
            require(value is None or bool(SBATCH_WORD.fullmatch(str(value))),
                    f"cluster.{key}={value!r}: not a Slurm name (letters, digits and _.,:@%+=/- only)")
        for option in self.sbatch:
            require(option.startswith("-") and bool(SBATCH_WORD.fullmatch(option)),
                    f"cluster.sbatch: {option!r} is not one sbatch option such as --constraint=a100 "
                    f"(one word, letters, digits and _.,:@%+=/- only)")
        for line in self.setup:
            require("\n" not in line and "\r" not in line,
                    f"cluster.setup: {line!r} spans several lines; give one list item per line")


def quoted(values: list[str]) -> str:
    return " ".join(shlex.quote(v) for v in values)


def header(cluster: SlurmCommon, job_name: str, output: Path, cpus: int, mem_gb: float, gpus: int,
           nodes: int = 1) -> list[str]:
    """The `#SBATCH` lines of both kinds (values checked by SlurmCommon.check)."""
    lines = [f"--job-name={job_name}", f"--nodes={nodes}", "--ntasks-per-node=1",
             f"--cpus-per-task={cpus}", f"--mem={max(1, round(mem_gb * 1024))}M",
             f"--time={cluster.time}", f"--output={output}", "--open-mode=append"]
    if gpus:
        lines.append(f"--gres=gpu:{gpus}")
    for key in ("partition", "account", "qos"):
        if getattr(cluster, key):
            lines.append(f"--{key}={getattr(cluster, key)}")
    if cluster.requeue:
        lines.append("--requeue")
    return [f"#SBATCH {line}" for line in lines + list(cluster.sbatch)]


def prologue(cluster: SlurmCommon) -> list[str]:
    """Strict mode, the submission directory (relative store roots), then the setup lines.

    Setup lines are shell commands by design (module loads, venv activation), written as given."""
    return ["set -euo pipefail", f"cd {shlex.quote(os.getcwd())}", *cluster.setup]


def slurm_dir(store: Store, name: str) -> Path:
    return (store.sweep_dir(name) / "slurm").resolve()


def _slurm(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise RuntimeError(f"{argv[0]}: not found; cluster=slurm needs the Slurm client commands "
                           f"on PATH (run the sweep on a login node)")
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(argv[:2])} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def sbatch(script: Path, *options: str) -> str:
    """Submit; returns the job id (`--parsable` prints `id[;cluster]`)."""
    out = _slurm("sbatch", "--parsable", *options, str(script)).stdout.strip()
    return out.split(";", 1)[0]


def states(job_ids: list[str]) -> dict[str, str]:
    """Job (or array task) id -> Slurm state, from squeue, with sacct for jobs squeue forgot."""
    if not job_ids:
        return {}
    found: dict[str, str] = {}
    q = _slurm("squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-o", "%i %T", check=False)
    for line in q.stdout.splitlines():
        jid, _, state = line.partition(" ")
        found[jid] = state.strip()
    missing = [j for j in job_ids if not any(k.split("_")[0] == j for k in found)]
    if missing and shutil.which("sacct"):
        a = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(missing), "-o", "JobID,State"],
                           capture_output=True, text=True, timeout=60)
        for line in a.stdout.splitlines() if a.returncode == 0 else []:
            jid, _, state = line.partition("|")
            found[jid] = state.split()[0] if state else "UNKNOWN"
    return found


def summary(job_ids: list[str]) -> dict[str, str]:
    """Each recorded job id -> its state, an array as counts of its tasks' states."""
    found = states(job_ids)
    out = {}
    for jid in job_ids:
        mine = [s for k, s in found.items() if k == jid or k.startswith(f"{jid}_")]
        if not mine:
            out[jid] = "gone (finished; no longer known to Slurm)"
        elif len(mine) == 1:
            out[jid] = mine[0]
        else:
            out[jid] = ", ".join(f"{s} x{mine.count(s)}" for s in sorted(set(mine)))
    return out


def active(job_ids: list[str]) -> list[str]:
    return [jid for jid, s in states(job_ids).items() if s.split()[0] in ACTIVE]


def recorded_jobs(sweep: dict) -> list[dict]:
    return sweep.get("slurm_jobs", [])


class SlurmExecutor(Executor):
    """Submits scripts (`scripts`) and records their job ids in the sweep; the runs finish in
    Slurm, and `status` follows them."""

    synchronous = False
    config: SlurmCommon

    def scripts(self, runs: list[PlannedRun], name: str, overrides: list[str], store: Store) -> dict[str, str]:
        """label -> script text, submitted in order (a "report" script after the others)."""
        raise NotImplementedError

    def check(self, runs: list[PlannedRun], name: str, store: Store) -> None:
        """Refuse, before anything is written, what Slurm could never run, and a second
        submission while the sweep's previous one is still queued or running."""
        if not SWEEP_NAME.fullmatch(name):
            raise ConfigError(f"--name {name!r}: a Slurm sweep's name goes into #SBATCH lines and "
                              f"paths; use letters, digits, '.', '_' and '-' only")
        previous = [j["id"] for j in recorded_jobs(store.read_sweep(name))] if name in store.sweeps() else []
        if busy := active(previous):
            raise RuntimeError(f"sweep {name} already has Slurm job(s) {', '.join(busy)} queued or "
                               f"running; wait for them or `python -m orchestrator cancel {name}`")

    def describe(self, runs: list[PlannedRun], name: str, overrides: list[str], store: Store,
                 console: Console) -> None:
        todo = [r for r in runs if r.todo]
        for label, text in self.scripts(runs, name, overrides, store).items():
            console.print(f"# ---- {label} script ({len(runs)} runs, {len(todo)} to do)",
                          markup=False, highlight=False)
            console.print(text, markup=False, highlight=False, soft_wrap=True)

    def run(self, runs: list[PlannedRun], name: str, overrides: list[str], store: Store,
            console: Console) -> Outcome:
        todo = [r for r in runs if r.todo]
        if not todo:
            console.print(f"sweep {name}: all {len(runs)} runs are done; nothing to submit")
            return Outcome({r.run_id: "done" for r in runs})
        out = slurm_dir(store, name)
        out.mkdir(parents=True, exist_ok=True)
        stamp = now().replace(":", "").replace("+", "Z")[:17]
        jobs: list[tuple[str, str]] = []
        for label, text in self.scripts(runs, name, overrides, store).items():
            path = out / f"{label}-{stamp}.sbatch"
            write_text(path, text)
            options = [f"--dependency=afterany:{jobs[0][0]}"] if label == "report" else []
            jobs.append((sbatch(path, *options), label))  # each id recorded at once, so `cancel`
            store.record_slurm_job(name, {"id": jobs[-1][0], "kind": label,  # finds it whatever fails next
                                          "cluster": self.config.name, "script": str(path), "at": now()})
        console.print(f"sweep {name}: {len(todo)} of {len(runs)} runs to do, submitted Slurm "
                      + ", ".join(f"{label} job {jid}" for jid, label in jobs)
                      + f"; logs in {out}; follow with `python -m orchestrator status {name}`",
                      markup=False, soft_wrap=True)
        return Outcome(submitted=[jid for jid, _ in jobs])

    def status_lines(self, sweep: dict) -> list[str]:
        """One line per recorded Slurm job of the sweep with its current state."""
        jobs = recorded_jobs(sweep)
        if not jobs:
            return []
        found = summary([j["id"] for j in jobs]) if shutil.which("squeue") else {}
        return [f"slurm {j['kind']} job {j['id']} ({j['cluster']}, submitted {j['at'][:19]}): "
                f"{found.get(j['id'], 'unknown (no squeue here)')}" for j in jobs]

    def cancel(self, sweep: dict, console: Console) -> int:
        """scancel the sweep's queued and running Slurm jobs."""
        jobs = [j["id"] for j in recorded_jobs(sweep)]
        busy = active(jobs)
        if not busy:
            console.print(f"sweep {sweep['name']}: its Slurm jobs {', '.join(jobs)} are over; "
                          f"nothing to cancel", markup=False)
            return 0
        _slurm("scancel", *busy)
        console.print(f"sweep {sweep['name']}: cancelled Slurm job(s) {', '.join(busy)}; the same "
                      f"`sweep` command resubmits and resumes it", markup=False)
        return 0
