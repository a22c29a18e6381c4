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
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rich.console import Console

from common.atomic import write_text
from common.settings import ConfigError
from config.cluster import SlurmCommon
from orchestrator.executors import Executor, Outcome
from orchestrator.plan import PlannedRun
from store.records import SlurmJob, SweepManifest, now
from store.store import Store

SWEEP_NAME = re.compile(r"[A-Za-z0-9._-]{1,120}")
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING",
          "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"}


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


# squeue's pending reasons that need the user, in plain words with the fix; others are shown as
# Slurm gives them (Priority, Resources, Dependency: the queue at work).
PENDING_REASONS = {
    "PartitionConfig": "the request exceeds what the partition's nodes offer (nodes, CPUs, memory or GPUs per "
                       "node), so it can never start: cancel, lower the cluster.* sizes and resubmit",
    "PartitionTimeLimit": "cluster.time exceeds the partition's time limit: cancel, lower cluster.time and resubmit",
    "PartitionNodeLimit": "more nodes than the partition allows: cancel, lower cluster.nodes and resubmit",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved; it starts when the node is back",
    "DependencyNeverSatisfied": "the job it depends on failed, so it never starts: cancel and resubmit the sweep",
    "InvalidAccount": "cluster.account is not valid here: cancel, fix cluster.account and resubmit",
    "InvalidQOS": "cluster.qos is not valid here: cancel, fix cluster.qos and resubmit",
}


def states(job_ids: list[str]) -> dict[str, str]:
    """Job (or array task) id -> Slurm state (with the pending reason, in plain words where the user
    must act), from squeue, with sacct for jobs squeue forgot."""
    if not job_ids:
        return {}
    found: dict[str, str] = {}
    q = _slurm("squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r", check=False)
    for line in q.stdout.splitlines():
        jid, state, reason = (line.split("|") + ["", ""])[:3]
        why = PENDING_REASONS.get(reason.strip(), reason.strip())
        found[jid] = state.strip() + (f" ({why})" if state.strip() == "PENDING" and why not in ("", "None") else "")
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


def recorded_jobs(sweep: SweepManifest) -> list[SlurmJob]:
    return sweep.get("slurm_jobs", [])


# ---- pre-flight: what Slurm would accept but never start -----------------------------------------

@dataclass(frozen=True)
class Request:
    """What a Slurm job asks of each of its nodes, and the config key behind each number."""
    nodes: int
    cpus: int
    mem_gb: float
    gpus: int
    keys: dict[str, str]  # nodes / cpus / mem_gb / gpus -> the key a user lowers


@dataclass(frozen=True)
class NodeGroup:
    """One line of `sinfo` for a partition: `count` nodes alike."""
    count: int
    cpus: int
    mem_gb: float
    gpus: int


def _gpus(gres: str) -> int:
    """GPUs per node in sinfo's %G ("gpu:4", "gpu:a100:4(S:0-1)", "(null)")."""
    counts = [part.split("(")[0].rsplit(":", 1)[-1] for part in gres.split(",") if part.startswith("gpu")]
    return sum(int(c) for c in counts if c.isdigit())


def minutes(limit: str) -> Optional[float]:
    """Slurm's time syntax ([D-]HH:MM:SS, MM:SS, MM, D-HH[:MM]) in minutes; None for no limit."""
    if limit in ("infinite", "UNLIMITED", "", "n/a"):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [float(p) for p in clock.split(":")]
    if days:  # D-HH[:MM[:SS]]
        h, m, sec = (parts + [0.0, 0.0])[:3]
    elif len(parts) == 3:  # HH:MM:SS
        h, m, sec = parts
    elif len(parts) == 2:  # MM:SS
        h, m, sec = 0.0, parts[0], parts[1]
    else:  # MM
        h, m, sec = 0.0, parts[0], 0.0
    return float(days or 0) * 1440 + h * 60 + m + sec / 60


def partition(name: Optional[str]) -> tuple[str, list[NodeGroup], Optional[float]]:
    """The partition's name (the default one when `name` is None), its node groups and its time
    limit in minutes, from sinfo."""
    rows = [line.split("|") for line in _slurm("sinfo", "-h", "-o", "%P|%D|%c|%m|%G|%l").stdout.splitlines()]
    mine = [r for r in rows if (r[0].rstrip("*") == name if name else r[0].endswith("*"))]
    groups = [NodeGroup(int(r[1]), int(r[2].rstrip("+")), float(r[3].rstrip("+")) / 1024, _gpus(r[4])) for r in mine]
    return (mine[0][0].rstrip("*") if mine else name or "default"), groups, (minutes(mine[0][5]) if mine else None)


def misfits(request: Request, groups: list[NodeGroup], limit: Optional[float], time: str) -> list[str]:
    """Each key to lower, with what it asks and what the partition offers."""
    if not groups:
        return []
    fixes = [f"{request.keys[field]} (asks {getattr(request, field):g}, its nodes have at most {most:g} {unit})"
             for field, unit in (("cpus", "CPUs"), ("mem_gb", "GB"), ("gpus", "GPUs"))
             if getattr(request, field) > (most := max(getattr(g, field) for g in groups))]
    fitting = sum(g.count for g in groups
                  if g.cpus >= request.cpus and g.mem_gb >= request.mem_gb and g.gpus >= request.gpus)
    if not fixes and request.nodes > fitting:
        fixes.append(f"{request.keys['nodes']} (asks {request.nodes} nodes, {fitting} of its nodes can hold"
                     " one task each)")
    if limit is not None and (minutes(time) or 0) > limit:
        fixes.append(f"cluster.time (asks {time}, its limit is {limit:g} minutes)")
    return fixes


def test_only(text: str) -> Optional[str]:
    """sbatch --test-only on a script: None if Slurm could start it, else its refusal (one line).
    Nothing is queued."""
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch") as script:
        script.write(text)
        script.flush()
        proc = _slurm("sbatch", "--test-only", script.name, check=False)
    return None if proc.returncode == 0 else " ".join((proc.stderr or proc.stdout).split())


class SlurmExecutor(Executor):
    """Submits scripts (`scripts`) and records their job ids in the sweep; the runs finish in
    Slurm, and `status` follows them."""

    synchronous = False
    config: SlurmCommon

    def scripts(self, runs: list[PlannedRun], name: str, overrides: list[str], store: Store) -> dict[str, str]:
        """label -> script text, submitted in order (a "report" script after the others)."""
        raise NotImplementedError

    def request(self, runs: list[PlannedRun]) -> Request:
        """What the main job asks of each node, with the keys behind it."""
        raise NotImplementedError

    def preflight(self, runs: list[PlannedRun], name: str, store: Store) -> None:
        """Refuse what sbatch would queue but Slurm could never start (pending for ever with reason
        PartitionConfig): each script through `sbatch --test-only`, and on a refusal the keys to
        lower, from what the partition's nodes offer (sinfo)."""
        for label, text in self.scripts(runs, name, [], store).items():
            refusal = test_only(text)
            if refusal is None:
                continue
            part, groups, limit = partition(self.config.partition)
            fixes = misfits(self.request(runs), groups, limit, self.config.time) if label != "report" else []
            raise ConfigError(f"cluster={self.config.name}: Slurm would never start the sweep's {label} job on"
                              f" partition {part}" + (f"; lower {'; '.join(fixes)}" if fixes else "")
                              + f" (sbatch --test-only: {refusal})")

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
        if any(r.todo for r in runs):
            self.preflight(runs, name, store)

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

    def status_lines(self, sweep: SweepManifest) -> list[str]:
        """One line per recorded Slurm job of the sweep with its current state."""
        jobs = recorded_jobs(sweep)
        if not jobs:
            return []
        found = summary([j["id"] for j in jobs]) if shutil.which("squeue") else {}
        return [f"slurm {j['kind']} job {j['id']} ({j['cluster']}, submitted {j['at'][:19]}): "
                f"{found.get(j['id'], 'unknown (no squeue here)')}" for j in jobs]

    def cancel(self, sweep: SweepManifest, console: Console) -> int:
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
