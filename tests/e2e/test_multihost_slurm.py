"""cluster=slurm and cluster=slurm_array across real hosts: three network namespaces with their
own addresses and hostnames (scripts/hosts-up.sh), slurmctld on node1 and a slurmd on node2 and
node3 (scripts/hosts-slurm-up.sh); every command of the CLI runs on node1, the login host.

The allocation over two hosts starts the Ray head on its first node and a worker on the second
with `srun`, and a `nodes=2` DDP job trains across them; one host dies inside the allocation:
Slurm marks it down and requeues the allocation, `status` shows it waiting, `cancel` cancels it,
and once the host is back the same command resubmits and the run resumes from its checkpoint.
The run ends bit-identical to an undisturbed DDP run. Array tasks land on both hosts."""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import history, metrics, state, wait_for
from hostbed import BIN, Bed, bed_fixture

from jobs import launch
from config.run import job_dict
from jobs.registry import train as train_job
from orchestrator.config import compose_run, hydra_session
from orchestrator.executors.slurm_tools import ACTIVE
from store.store import DONE, Store

STEPS = 200
RUN = ["size=micro", "family=lidas", "seed=0", "tracker=none", "eval.jobs=[regbench]", "eval.regbench.instances=20",
       "eval.resources.memory_gb=1", "resources.nodes=2", f"train.steps={STEPS}", "train.checkpoint_every=20"]
SETUP = f'cluster.setup=["export PATH={BIN}:$PATH"]'
ALLOCATION = ["cluster=slurm", "cluster.nodes=2", "cluster.cpus_per_node=1", "cluster.mem_gb=2",
              "cluster.time=00:10:00", SETUP]
COMPARED = ("final_loss", "train_flops", "train_tokens", "final_layers", "steps")


@pytest.fixture(scope="module")
def bed(request) -> Bed:
    bed = bed_fixture(request, "mnslurm", "198.18.2")
    bed.script("hosts-slurm-up.sh", timeout=600)
    return bed


def undisturbed() -> dict:
    """The same run as two DDP processes on one host, never interrupted, and as one process."""
    with hydra_session():
        cfg = compose_run(RUN)
    with tempfile.TemporaryDirectory(prefix="undisturbed-") as tmp:
        tmp = Path(tmp)
        (tmp / "cfg.json").write_text(json.dumps(job_dict(cfg)))
        launch.run_torchrun(["-m", "jobs.rank", "--job", "train", "--config", str(tmp / "cfg.json"),
                             "--run-dir", str(tmp / "ddp"), "--result", str(tmp / "result.json")],
                            nproc_per_node=2)
        ddp = launch.load_result(tmp / "result.json")
        torch.set_num_threads(1)
        single = train_job(cfg, tmp / "single", lambda p: None)
    return {"history": ddp.history, "metrics": ddp.metrics, "single": single}


def cli(bed: Bed, *args: str, timeout: float = 300):
    return bed.on(1, sys.executable, "-m", "orchestrator", *args, timeout=timeout)


def submit(bed: Bed, store: Path, name: str, *overrides: str):
    out = cli(bed, "sweep", *overrides, f"store.root={store}", "--name", name)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def slurm_ids(store: Path, name: str) -> list[str]:
    return [j["id"] for j in Store(store).read_sweep(name).get("slurm_jobs", [])]


def slurm_states(bed: Bed, store: Path, name: str) -> dict[str, str]:
    """squeue on node1: job (or array task) id -> state, finished jobs included."""
    out = bed.on(1, "squeue", "-h", "-r", "-t", "all", "-j", ",".join(slurm_ids(store, name)),
                 "-o", "%i %T", timeout=60)
    return dict(line.split() for line in out.stdout.splitlines() if line.strip())


def over(bed: Bed, store: Path, name: str) -> bool:
    return not any(s in ACTIVE for s in slurm_states(bed, store, name).values())


def node_states(bed: Bed) -> dict[str, str]:
    out = bed.on(1, "sinfo", "-h", "-N", "-o", "%N %T", timeout=60)
    return dict(line.split() for line in out.stdout.splitlines() if line.strip())


def logs(store: Path, name: str) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                     for p in sorted((store / "sweeps" / name / "slurm").glob("*.out")))


def progress(store: Path) -> dict:
    try:
        [path] = list((store / "runs").glob("*/progress.json"))
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def training(store: Path, at_step: int) -> bool:
    """The nodes=2 job has reported `at_step` and written a checkpoint."""
    return progress(store).get("step", 0) >= at_step and bool(list(store.glob("runs/*/checkpoints/step_*.pt")))


def signal_ranks(bed: Bed, hosts: tuple[int, ...], sig: signal.Signals) -> int:
    """Send `sig` to the job's ranks on `hosts`; how many got it. The test freezes the ranks
    (SIGSTOP) so that the micro job cannot finish while it looks at it, and thaws the survivor
    (SIGCONT) once its peer's host is dead, so that it meets the lost peer as a real rank would."""
    sent = 0
    for k in hosts:
        for pid in bed.pids(k):
            try:
                if b"jobs.rank" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, sig)
                    sent += 1
            except (OSError, ProcessLookupError):
                pass
    return sent


def processes(bed: Bed, k: int) -> set[str]:
    names = set()
    for pid in bed.pids(k):
        try:
            names.add(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            pass
    return names


def ray_hosts(bed: Bed, job_id: str, node_ids: list[str]) -> list[str]:
    """The host each Ray node id of allocation `job_id` ran on: its session files in that host's
    private /tmp (the allocation's `--temp-dir=/tmp/ray-<job id>`)."""
    return [next((f"node{k}" for k in range(1, bed.n + 1)
                  if list((bed.dir / f"node{k}" / "tmp" / f"ray-{job_id}").glob(f"session_*/*_port_{i}"))),
                 "nowhere") for i in node_ids]


def test_a_host_lost_inside_a_two_host_allocation_resumes_on_resubmission(bed):
    """One story, one run: an allocation over node2 and node3 trains a nodes=2 job (Ray head on
    node2, worker on node3, `status` RUNNING); node3 dies (every process killed); Slurm marks it
    down and requeues the allocation, which waits (`status` PENDING) with nothing left running on
    node2; `cancel` cancels it; the host comes back; the same command resubmits and the run
    resumes to the undisturbed run's metrics, bit for bit."""
    store, name = bed.shared("nodefail"), "two-hosts"
    args = [*RUN, *ALLOCATION]
    assert "submitted Slurm allocation job" in submit(bed, store, name, *args)
    wait_for(lambda: (training(store, 40) and signal_ranks(bed, (2, 3), signal.SIGSTOP))
             or (over(bed, store, name) and "over"),
             timeout=300)
    assert not over(bed, store, name), logs(store, name)
    status = cli(bed, "status", name, "--store", str(store)).stdout
    assert "slurm allocation job" in status and "RUNNING" in status, status
    [rid] = Store(store).read_sweep(name)["run_ids"]
    first = state(store, rid)["jobs"]["train"]
    # Ray runs on both hosts of the allocation; node rank 0 (the run's state) on the first bundle.
    [job] = slurm_ids(store, name)
    hosts = ray_hosts(bed, job, first["node_ids"])
    assert sorted(hosts) == ["node2", "node3"] and first["host"] == hosts[0], (hosts, first)
    assert "raylet" in processes(bed, 2) and "raylet" in processes(bed, 3)

    assert bed.kill_host(3) > 0  # slurmd, munged, the Ray worker, the rank: all of node3
    signal_ranks(bed, (2,), signal.SIGCONT)
    reference = ThreadPoolExecutor(1).submit(undisturbed)  # meanwhile, on the root namespace's CPU
    # Slurm marks the silent node down (SlurmdTimeout) and requeues the allocation (--requeue),
    # which waits for two nodes; nothing of it is left on node2.
    try:
        wait_for(lambda: node_states(bed).get("node3", "").startswith("down"), timeout=120)
        try:
            wait_for(lambda: set(slurm_states(bed, store, name).values()) <= {"PENDING", "REQUEUED"}, timeout=120)
        except AssertionError:
            raise AssertionError(f"not requeued: {slurm_states(bed, store, name)}, nodes {node_states(bed)}, "
                                 f"node2: {processes(bed, 2)}\n{logs(store, name)}") from None
        status = cli(bed, "status", name, "--store", str(store)).stdout
        assert "PENDING" in status or "REQUEUED" in status, status
        try:
            wait_for(lambda: processes(bed, 2) <= {"munged", "slurmd"}, timeout=60)
        except AssertionError:
            raise AssertionError(f"left on node2: {processes(bed, 2)}\n{logs(store, name)}") from None
        assert state(store, rid)["jobs"]["train"]["status"] != DONE
        out = cli(bed, "cancel", name, "--store", str(store))
        assert out.returncode == 0 and "cancelled Slurm job" in out.stdout, out.stdout + out.stderr
        wait_for(lambda: over(bed, store, name), timeout=90)
        assert "CANCELLED" in cli(bed, "status", name, "--store", str(store)).stdout
    except BaseException:  # leave nothing of this story to the next test
        cli(bed, "cancel", name, "--store", str(store))
        raise
    finally:
        bed.script("hosts-slurm-up.sh", timeout=300)  # the host comes back: its daemons again
    again = submit(bed, store, name, *args)
    assert "1 of 1 runs to do" in again, again
    wait_for(lambda: over(bed, store, name), timeout=400)
    train = state(store, rid)["jobs"]["train"]
    assert train["status"] == DONE and train["attempts"] == 2, (train, logs(store, name))
    assert sorted(ray_hosts(bed, slurm_ids(store, name)[-1], train["node_ids"])) == ["node2", "node3"]
    assert "COMPLETED" in cli(bed, "status", name, "--store", str(store)).stdout
    # Every step once, and the undisturbed DDP run's history and metrics, bit for bit ...
    ref = reference.result(timeout=600)
    assert history(store, rid)["step"].tolist() == list(range(5, STEPS + 1, 5))
    pd.testing.assert_frame_equal(history(store, rid), ref["history"])
    got = metrics(store, rid)
    assert {k: got[k] for k in COMPARED} == {k: ref["metrics"][k] for k in COMPARED}
    # ... whose curve is one process's, to the tolerance of test_distributed.py.
    np.testing.assert_allclose(history(store, rid)["loss"], ref["single"].history["loss"], rtol=1e-4)


def test_array_tasks_land_on_different_hosts(bed):
    store, name = bed.shared("array"), "array"
    out = submit(bed, store, name, "size=micro", "family=dense,looped", "seed=0", "tracker=none",
                 "eval.jobs=[regbench]", "eval.regbench.instances=20", "eval.resources.memory_gb=1",
                 "cluster=slurm_array", "cluster.time=00:10:00", SETUP)
    assert "submitted Slurm array job" in out and "report job" in out, out
    wait_for(lambda: over(bed, store, name), timeout=300)
    runs = Store(store).read_sweep(name)["run_ids"]
    states = {rid: state(store, rid) for rid in runs}
    assert all(s["status"] == DONE for s in states.values()), (states, logs(store, name))
    # One CPU per host: the two tasks ran at once, one on each.
    assert sorted(s["jobs"]["train"]["host"] for s in states.values()) == ["node2", "node3"]
    assert all(s["jobs"][j]["attempts"] == 1 for s in states.values() for j in s["jobs"])
    assert (store / "sweeps" / name / "report.md").exists(), logs(store, name)
    assert "COMPLETED" in cli(bed, "status", name, "--store", str(store)).stdout
