"""cluster=ray across real hosts: three network namespaces with their own addresses and
hostnames (scripts/hosts-up.sh), a `ray start` head on node1 and workers on node2 and node3 with
token authentication (scripts/hosts-ray-up.sh), the sweep driver on node1.

A `nodes=2` DDP job (gloo) trains across two hosts with the ranks' rendezvous at the first
bundle's address: its loss curve equals one process's (the tolerance of test_distributed.py).
Then every process of one of its hosts is killed mid-job: Ray sees the node die, the job is
retried on the hosts left and resumes from its last checkpoint to the same metrics, bit for bit,
as the undisturbed run; the killed host rejoins with the same up script."""
import json
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import history, metrics, state, wait_for
from hostbed import Bed, bed_fixture

from jobs.registry import train as train_job
from orchestrator.config import compose_run, hydra_session

# 120 steps, a checkpoint every 20: LIDAS grows 1 -> 4 layers (DDP rebuilt at each growth) and
# a kill after step 40 lands between checkpoints with most of the run still to do.
STEPS = 120
RUN = ["size=micro", "family=lidas", "seed=0", "tracker=none", "eval.jobs=[regbench]", "eval.regbench.instances=20",
       "eval.resources.memory_gb=1", "resources.nodes=2", f"train.steps={STEPS}", "train.checkpoint_every=20"]
COMPARED = ("final_loss", "train_flops", "train_tokens", "final_layers", "steps")


@pytest.fixture(scope="module")
def bed(request) -> Bed:
    bed = bed_fixture(request, "mnray", "198.18.1")
    bed.ray_up()
    return bed


def sweep_args(bed: Bed, store, name: str) -> list[str]:
    return ["python", "-m", "orchestrator", "sweep", *RUN, "cluster=ray",
            f"cluster.address={bed.ray_address}", f"store.root={store}", "--name", name]


def only_run(store) -> str:
    [run] = [p.name for p in (store / "runs").iterdir()]
    return run


def checkpointed(store, at_step: int, count: int) -> bool:
    """The run's training has reported `at_step` and written `count` checkpoints."""
    runs = list((store / "runs").glob("*/checkpoints"))
    return bool(runs) and progress_of(store).get("step", 0) >= at_step and \
        len(checkpoints(store, runs[0].parent.name)) >= count


@pytest.fixture(scope="module")
def reference(bed):
    """The undisturbed two-host run, driven from node1."""
    store = bed.shared("reference")
    done = bed.on(1, *sweep_args(bed, store, "ddp"))
    assert done.returncode == 0, done.stdout + done.stderr
    rid = only_run(store)
    return {"store": store, "rid": rid, "metrics": metrics(store, rid),
            "history": history(store, rid), "nodes": bed.ray_nodes()}


def test_ddp_across_two_hosts_equals_one_process(bed, reference):
    store, rid, nodes = reference["store"], reference["rid"], reference["nodes"]
    assert len(nodes) == 3 and all(n["alive"] for n in nodes.values())
    assert sorted(n["host"] for n in nodes.values()) == ["node1", "node2", "node3"]
    assert {n["ip"] for n in nodes.values()} == {bed.addr(k) for k in (1, 2, 3)}
    train = state(store, rid)["jobs"]["train"]
    assert train["status"] == "done" and train["attempts"] == 1
    where = [nodes[i] for i in train["node_ids"]]  # one bundle per host: two hosts, two addresses
    assert len({n["host"] for n in where}) == 2 and len({n["ip"] for n in where}) == 2
    assert train["host"] == where[0]["host"]  # node rank 0 (the run's state) on the first bundle
    with hydra_session():
        cfg = compose_run(RUN)
    torch.set_num_threads(1)
    single = train_job(cfg, bed.shared("single"), lambda p: None)
    got = reference["history"]
    assert got["step"].tolist() == single.history["step"].tolist()
    np.testing.assert_allclose(got["loss"], single.history["loss"], rtol=1e-4)  # as test_distributed
    m = reference["metrics"]
    assert (m["train_tokens"], m["train_flops"], m["final_layers"]) == \
        (single.metrics["train_tokens"], single.metrics["train_flops"], cfg.model.n_layers)


def progress_of(store) -> dict:
    try:
        [path] = list((store / "runs").glob("*/progress.json"))
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def checkpoints(store, rid: str) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (store / "runs" / rid / "checkpoints").glob("step_*.pt")}


def torchrun_args(bed: Bed, k: int) -> dict[str, str]:
    """The rendezvous arguments of the torchrun running on host k."""
    for pid in bed.pids(k):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "torch.distributed.run" in argv:
            pairs = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
            return {key: pairs.get(key) for key in ("--nnodes", "--node_rank", "--master_addr")}
    return {}


def test_a_host_killed_mid_job_fails_over_and_resumes_to_identical_metrics(bed, reference, tmp_path):
    store, log = bed.shared("killed"), tmp_path / "driver.log"
    driver = bed.start_on(1, *sweep_args(bed, store, "ddp"), output=log)
    # Mid-run, after two checkpoints: kill every process of the job's host that is not the head.
    wait_for(lambda: checkpointed(store, 40, 2), timeout=300, process=driver)
    rid = only_run(store)
    before = state(store, rid)["jobs"]["train"]
    nodes = reference["nodes"]
    victim_id = next(i for i in before["node_ids"] if nodes[i]["host"] != "node1")
    victim = int(nodes[victim_id]["host"].removeprefix("node"))
    # Each bundle's host runs its node's torchrun, node rank = bundle index, all of them with
    # the rendezvous at the first bundle's address.
    first_addr = nodes[before["node_ids"][0]]["ip"]
    for rank, node_id in enumerate(before["node_ids"]):
        k = int(nodes[node_id]["host"].removeprefix("node"))
        assert torchrun_args(bed, k) == {"--nnodes": "2", "--node_rank": str(rank),
                                         "--master_addr": first_addr}, (k, rank)
    assert bed.kill_host(victim) > 0
    last_checkpoint = max(int(name[5:12]) for name in checkpoints(store, rid))
    # The retry's first progress report: where the second attempt started training. A report
    # written after the state says attempt 2 is the retry's (the first attempt's node rank 0
    # had to end for the retry to get the run's claim); progress.json may still hold an older one.
    progress_file, since = store / "runs" / rid / "progress.json", []

    def retried() -> Optional[int]:
        try:
            attempts = state(store, rid)["jobs"]["train"]["attempts"]
            written = progress_file.stat().st_mtime_ns
        except (OSError, ValueError, KeyError):
            return None
        if attempts < 2:
            return None
        since.append(since[0] if since else written)
        return progress_of(store).get("step") if written > since[0] else None
    first_step = wait_for(retried, timeout=300, process=driver)
    assert driver.wait(timeout=300) == 0, log.read_text()

    train = state(store, rid)["jobs"]["train"]
    assert train["status"] == "done" and train["attempts"] == 2  # one retry, on the hosts left
    assert victim_id not in train["node_ids"] and len(set(train["node_ids"])) == 2
    # Ray saw the node die: its health checks give up on a killed host after about 15 s, which
    # may be after the retry has finished (the retry's tasks learn of the death from their own RPCs).
    assert wait_for(lambda: bed.ray_nodes()[victim_id]["alive"] is False, timeout=120)
    # Resumed, not restarted: the retry's first report is past the last checkpoint before the
    # kill, and the history has every step once.
    assert first_step > last_checkpoint >= 40, (first_step, last_checkpoint)
    assert history(store, rid)["step"].tolist() == list(range(5, STEPS + 1, 5))
    pd.testing.assert_frame_equal(history(store, rid), reference["history"])  # bit for bit
    got = metrics(store, rid)
    assert {k: got[k] for k in COMPARED} == {k: reference["metrics"][k] for k in COMPARED}

    # The killed host rejoins: the same up script starts only its missing worker.
    bed.ray_up()
    alive = [n for n in bed.ray_nodes().values() if n["alive"]]
    assert sorted(n["host"] for n in alive) == ["node1", "node2", "node3"]
