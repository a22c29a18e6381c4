"""Sweeps on Slurm: render sbatch scripts, submit them, read their state, cancel them.

`cluster=slurm` renders one allocation that starts a Ray head on its first node and Ray workers
on the others (`srun`), then runs the same sweep driver inside it as a `cluster=ray` sweep
against that Ray; `cluster=slurm_array` renders one array task per run, each running its run's
jobs in-process (`python -m orchestrator run-one`), and a report job that depends on the array.
The store on the shared filesystem is what the allocation reads and writes, so a cancelled,
pre-empted or timed-out allocation resubmitted (`--requeue`, or the same `sweep` again) resumes
where it stopped: finished jobs are skipped, interrupted ones resume from their checkpoints.

Every value that reaches a shell goes through `shlex.quote`; `#SBATCH` values are checked in
`config._check_slurm` (sbatch reads those lines itself, without a shell)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from rich.console import Console

from .config import ConfigError
from .store import Store, now

KINDS = ("slurm", "slurm_array")
SWEEP_NAME = re.compile(r"[A-Za-z0-9._-]{1,120}")
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING",
          "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"}


def _q(values: list[str]) -> str:
    return " ".join(shlex.quote(v) for v in values)


def _header(cluster: dict, job_name: str, output: Path, cpus: int, mem_gb: float, gpus: int,
            nodes: int = 1) -> list[str]:
    """The `#SBATCH` lines shared by both kinds (values already checked by config._check_slurm)."""
    lines = [f"--job-name={job_name}", f"--nodes={nodes}", "--ntasks-per-node=1",
             f"--cpus-per-task={cpus}", f"--mem={max(1, round(mem_gb * 1024))}M",
             f"--time={cluster['time']}", f"--output={output}", "--open-mode=append"]
    if gpus:
        lines.append(f"--gres=gpu:{gpus}")
    for key in ("partition", "account", "qos"):
        if cluster[key]:
            lines.append(f"--{key}={cluster[key]}")
    if cluster["requeue"]:
        lines.append("--requeue")
    return [f"#SBATCH {line}" for line in lines + list(cluster["sbatch"])]


def _prologue(cluster: dict) -> list[str]:
    """Strict mode, the submission directory (relative store roots), then the setup lines.

    Setup lines are shell commands by design (module loads, venv activation), written as given."""
    return ["set -euo pipefail", f"cd {shlex.quote(os.getcwd())}", *cluster["setup"]]


def _slurm_dir(store: Store, name: str) -> Path:
    return (store.sweep_dir(name) / "slurm").resolve()


def inner_overrides(overrides: list[str]) -> list[str]:
    """The user's overrides minus the cluster ones: inside the allocation the cluster is Ray."""
    def key(o: str) -> str:
        return o.split("=", 1)[0].lstrip("+~")
    return [o for o in overrides if key(o) != "cluster" and not key(o).startswith("cluster.")]


def render_allocation(configs: list[dict], store: Store, name: str, overrides: list[str]) -> str:
    """cluster=slurm: Ray head on the first node, workers on the others, the driver on the head.

    Ray's token authentication (on by default) needs the same RAY_AUTH_MODE/RAY_AUTH_TOKEN on
    every node and in the driver: a fresh token per allocation, exported before `srun`, reaches
    them all. Ray waits for ever on a request no node can satisfy; the driver's `check_fit`
    refuses those against the allocation's live nodes."""
    cl = configs[0]["cluster"]
    out = _slurm_dir(store, name)
    driver = ["python", "-m", "orchestrator", "sweep", *inner_overrides(overrides), "cluster=ray",
              "cluster.ship_code=false"]
    gpus = cl["gpus_per_node"]
    return "\n".join([
        "#!/bin/bash",
        f"# Sweep {name} on Slurm (cluster=slurm), rendered by `python -m orchestrator sweep`.",
        *_header(cl, f"sweep-{name}", out / "%j.out", cl["cpus_per_node"], cl["mem_gb"], gpus,
                 cl["nodes"]),
        *_prologue(cl),
        "",
        "# One Ray cluster per allocation: its own port, temp dir and token.",
        "export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token",
        "RAY_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(32))')",
        "export RAY_AUTH_TOKEN",
        'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'HEAD=${NODES[0]}',
        'HEAD_IP=$(srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" hostname --ip-address | awk \'{print $1}\')',
        "# Ray moves a loopback --node-ip-address to the primary interface unless told to stay.",
        'case $HEAD_IP in 127.*) export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ;; esac',
        'PORT=$((20000 + SLURM_JOB_ID % 20000))',
        'export RAY_ADDRESS=$HEAD_IP:$PORT',
        'MEM=$((SLURM_MEM_PER_NODE * 1024 * 1024))',
        f'RAY_ARGS=(--block --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus={gpus} '
        '--memory=$((MEM * 3 / 4)) --object-store-memory=$((MEM / 4)) --disable-usage-stats)',
        'PIDS=()',
        "# Never `ray stop` here: it would stop every Ray of this user on the node.",
        'stop_ray() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }',
        'trap stop_ray EXIT',
        'ray_nodes() { ray status --address="$RAY_ADDRESS" 2>/dev/null | grep -c " node_" || true; }',
        'wait_nodes() {',
        f'  for _ in $(seq {int(cl["ray_start_timeout_s"])}); do',
        '    [ "$(ray_nodes)" -ge "$1" ] && return 0; sleep 1',
        '  done',
        '  echo "Ray: fewer than $1 nodes joined" >&2; return 1',
        '}',
        'srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" ray start --head --node-ip-address="$HEAD_IP" '
        '--port="$PORT" --temp-dir="/tmp/ray-$SLURM_JOB_ID" --include-dashboard=false "${RAY_ARGS[@]}" &',
        'PIDS+=($!)',
        'wait_nodes 1',
        'if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then',
        '  srun --nodes=$((SLURM_JOB_NUM_NODES - 1)) --ntasks=$((SLURM_JOB_NUM_NODES - 1)) '
        '--ntasks-per-node=1 --overlap --exclude="$HEAD" ray start --address="$RAY_ADDRESS" '
        '"${RAY_ARGS[@]}" &',
        '  PIDS+=($!)',
        '  wait_nodes "$SLURM_JOB_NUM_NODES"',
        'fi',
        "",
        "# The same sweep driver, against this allocation's Ray; it resumes what is not done.",
        f'{_q(driver)} "cluster.address=$RAY_ADDRESS" --name {shlex.quote(name)}',
        "",
    ])


def allocation_nodes(cluster: dict) -> list[dict[str, float]]:
    """The Ray nodes the allocation will start, in Ray's resource names (as the script sizes them)."""
    node = {"CPU": cluster["cpus_per_node"], "GPU": cluster["gpus_per_node"],
            "memory": int(cluster["mem_gb"] * 2**30 * 3 / 4)}
    return [dict(node) for _ in range(cluster["nodes"])]


def array_resources(configs: list[dict]) -> tuple[int, float, int]:
    """(cpus, memory GB, GPUs) of one array task: the most any job of any run needs."""
    from .worker import jobs_of, resources_of

    needs = [resources_of(c, j) for c in configs for j in jobs_of(c)]
    return (max(int(r["cpus"]) for r in needs), max(r["memory_gb"] for r in needs),
            max(int(-(-r["gpus"] // 1)) for r in needs))


def render_array(configs: list[dict], run_ids: list[str], store: Store, name: str) -> tuple[str, str]:
    """cluster=slurm_array: (array script, report script); task i runs run_ids[i] without Ray."""
    cl = configs[0]["cluster"]
    for c in configs:  # several GPUs of one node are fine: `execute` starts torchrun on them
        if c["resources"]["nodes"] > 1:
            raise ConfigError(f"cluster=slurm_array runs each run on one node; resources.nodes="
                              f"{c['resources']['nodes']} needs cluster=slurm (Ray across nodes)")
    out, root = _slurm_dir(store, name), str(store.root.resolve())
    cpus, mem, gpus = array_resources(configs)
    array = "\n".join([
        "#!/bin/bash",
        f"# Sweep {name} on Slurm (cluster=slurm_array): one array task per run to do.",
        *_header(cl, f"sweep-{name}", out / "%A_%a.out", cpus, mem, gpus),
        f"#SBATCH --array=0-{len(run_ids) - 1}",
        *_prologue(cl),
        f"RUNS=({_q(run_ids)})",
        f'exec python -m orchestrator run-one --store {shlex.quote(root)} "${{RUNS[$SLURM_ARRAY_TASK_ID]}}"',
        "",
    ])
    report = "\n".join([
        "#!/bin/bash",
        f"# The report of sweep {name}, once its array is over (sbatch --dependency=afterany:...).",
        *[line for line in _header(cl, f"report-{name}", out / "%j.out", 1, 2, 0)
          if "--requeue" not in line],
        *_prologue(cl),
        f"exec python -m orchestrator report {shlex.quote(name)} --store {shlex.quote(root)}",
        "",
    ])
    return array, report


# ---------------------------------------------------------------------------------------------
# Talking to Slurm

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


def _active(job_ids: list[str]) -> list[str]:
    return [jid for jid, s in states(job_ids).items() if s.split()[0] in ACTIVE]


def recorded_jobs(sweep: dict) -> list[dict]:
    return sweep.get("slurm_jobs", [])


# ---------------------------------------------------------------------------------------------
# The CLI's entry points

def submit(runs: list, store: Store, name: str, overrides: list[str], dry_run: bool,
           console: Console) -> int:
    """`sweep` with cluster=slurm / slurm_array: render, print (--dry-run) or submit and record."""
    if not SWEEP_NAME.fullmatch(name):
        raise ConfigError(f"--name {name!r}: a Slurm sweep's name goes into #SBATCH lines and "
                          f"paths; use letters, digits, '.', '_' and '-' only")
    configs = [r.config for r in runs]
    kind = configs[0]["cluster"]["name"]
    todo = [r for r in runs if r.todo]
    if kind == "slurm":
        from .scheduler import check_fit

        check_fit(todo, allocation_nodes(configs[0]["cluster"]))  # refused now, not after the queue
        scripts = {"allocation": render_allocation(configs, store, name, overrides)}
    else:
        if configs[0]["adaptive"]["metric"]:
            raise ConfigError("adaptive.metric: an adaptive sweep decides between looks in its "
                              "driver; use cluster=slurm (the driver runs in the allocation)")
        array, report = render_array([r.config for r in todo] or configs,
                                     [r.run_id for r in todo], store, name)
        scripts = {"array": array, "report": report}
    if dry_run:
        for label, text in scripts.items():
            console.print(f"# ---- {label} script ({len(runs)} runs, {len(todo)} to do)",
                          markup=False, highlight=False)
            console.print(text, markup=False, highlight=False, soft_wrap=True)
        console.print(f"sweep {name}: dry run, nothing submitted or written", markup=False)
        return 0
    if not todo:
        console.print(f"sweep {name}: all {len(runs)} runs are done; nothing to submit")
        return -1  # the caller writes the report
    previous = [j["id"] for j in recorded_jobs(store.read_sweep(name))] if name in store.sweeps() else []
    if busy := _active(previous):
        raise RuntimeError(f"sweep {name} already has Slurm job(s) {', '.join(busy)} queued or "
                           f"running; wait for them or `python -m orchestrator cancel {name}`")
    store.create()
    for r in runs:
        store.write_config(r.run_id, r.config)
    store.record_sweep(name, overrides, [r.run_id for r in runs])
    out = _slurm_dir(store, name)
    out.mkdir(parents=True, exist_ok=True)
    stamp = now().replace(":", "").replace("+", "Z")[:17]
    paths = {}
    for label, text in scripts.items():
        paths[label] = out / f"{label}-{stamp}.sbatch"
        paths[label].write_text(text)
    jobs: list[tuple[str, str]] = []
    for label in paths:  # each id recorded at once, so `cancel` finds it whatever fails next
        options = [f"--dependency=afterany:{jobs[0][0]}"] if label == "report" else []
        jobs.append((sbatch(paths[label], *options), label))
        store.record_slurm_job(name, {"id": jobs[-1][0], "kind": label, "cluster": kind,
                                      "script": str(paths[label]), "at": now()})
    console.print(f"sweep {name}: {len(todo)} of {len(runs)} runs to do, submitted Slurm "
                  + ", ".join(f"{label} job {jid}" for jid, label in jobs)
                  + f"; logs in {out}; follow with `python -m orchestrator status {name}`",
                  markup=False, soft_wrap=True)
    return 0


def status_lines(sweep: dict) -> list[str]:
    """One line per recorded Slurm job of the sweep with its current state."""
    jobs = recorded_jobs(sweep)
    if not jobs:
        return []
    found = summary([j["id"] for j in jobs]) if shutil.which("squeue") else {}
    return [f"slurm {j['kind']} job {j['id']} ({j['cluster']}, submitted {j['at'][:19]}): "
            f"{found.get(j['id'], 'unknown (no squeue here)')}" for j in jobs]


def cancel(sweep: dict, console: Console) -> int:
    """scancel the sweep's queued and running Slurm jobs."""
    jobs = [j["id"] for j in recorded_jobs(sweep)]
    if not jobs:
        console.print(f"sweep {sweep['name']}: no Slurm jobs recorded (it ran locally); "
                      f"nothing to cancel", markup=False)
        return 0
    busy = _active(jobs)
    if not busy:
        console.print(f"sweep {sweep['name']}: its Slurm jobs {', '.join(jobs)} are over; "
                      f"nothing to cancel", markup=False)
        return 0
    _slurm("scancel", *busy)
    console.print(f"sweep {sweep['name']}: cancelled Slurm job(s) {', '.join(busy)}; the same "
                  f"`sweep` command resubmits and resumes it", markup=False)
    return 0


def run_one(store_root: str, run_id: str) -> int:
    """One array task: the run's jobs in order, in this process, from its stored config."""
    from .worker import execute, jobs_of

    store = Store(store_root)
    try:
        cfg = store.read_config(run_id)
    except FileNotFoundError:
        raise ConfigError(f"run {run_id}: no config.yaml in {store.run_dir(run_id)}; "
                          f"was it planned by a sweep of this store?") from None
    for job in jobs_of(cfg):
        print(f"{run_id} {job}: {execute(job, run_id, store_root, cfg)}", file=sys.stderr, flush=True)
    return 0
