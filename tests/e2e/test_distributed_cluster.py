"""Multi-node jobs and packing on a real Ray cluster of two local 'nodes' with fake GPUs
(`ray.cluster_utils.Cluster`), through the local executor's own path; and refusals at planning."""
import io
import json

import numpy as np
import pandas as pd
import pytest
import ray
import torch
from ray.cluster_utils import Cluster
from rich.console import Console

from jobs.registry import train as train_job
from orchestrator.config import ConfigError, compose_run, hydra_session
from orchestrator.executors import executor_of
from orchestrator.plan import check_fit, plan
from store.store import Store

NODE = dict(num_cpus=2, num_gpus=2, memory=4 * 2**30, object_store_memory=80 * 2**20)


def configs(*overrides: str) -> list:
    with hydra_session():
        return [compose_run(["size=micro", "tracker=none", "eval.jobs=[]", *overrides])]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    c.add_node(**NODE)
    ray.init(address=c.address, log_to_driver=False, logging_level="WARNING")
    yield c
    ray.shutdown()
    c.shutdown()


def run(cfgs: list, store: Store) -> dict:
    """Through the local executor's own path, on the test's Ray session."""
    store.create()
    runs = plan(cfgs, store)
    return executor_of(cfgs[0].cluster).run(runs, "t", [], store, Console(file=io.StringIO())).statuses


def test_two_node_job_uses_a_placement_group_and_torchrun_per_node(cluster, tmp_path):
    [cfg] = configs("family=lidas", "resources.nodes=2", "resources.gpus=1", "resources.cpus=1",
                    "train.steps=12", "train.warmup_steps=2", "train.log_every=2")
    store = Store(tmp_path / "store")
    outcome = run([cfg], store)
    rid = next(iter(outcome))
    assert outcome[rid] == "done"
    train = store.job_state(rid, "train")
    assert train["status"] == "done" and train["attempts"] == 1
    assert len(set(train["node_ids"])) == 2 and train["node_id"] == train["node_ids"][0]
    assert ray.util.placement_group_table() and all(
        g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())
    # The same loss curve as one process on the same global batch (see test_distributed.py).
    torch.set_num_threads(1)
    single = train_job(cfg, tmp_path / "single", lambda p: None)
    history = store.run_dir(rid) / "history.parquet"
    np.testing.assert_allclose(pd.read_parquet(history)["loss"], single.history["loss"], rtol=1e-4)
    assert json.loads((store.run_dir(rid) / "metrics.json").read_text())["metrics"]["steps"] == 12


def test_one_gpu_jobs_pack_two_per_two_gpu_node(cluster, tmp_path):
    cfgs = [c for s in range(4) for c in configs("family=dense", f"seed={s}", "resources.gpus=1", "train.steps=10")]
    store = Store(tmp_path / "store")
    outcome = run(cfgs, store)
    assert set(outcome.values()) == {"done"} and len(outcome) == 4
    where = [store.job_state(rid, "train")["node_id"] for rid in outcome]
    assert sorted(where.count(n) for n in set(where)) == [2, 2]


def test_a_job_no_node_can_hold_is_refused_at_planning(cluster, tmp_path):
    store = Store(tmp_path / "store")
    with pytest.raises(ConfigError, match=r"needs 1 node\(s\) with CPU=1 GPU=4 memory=1G each, "
                                          r"but only 0 of the cluster's 2 nodes.*largest: CPU=2 GPU=2"):
        run(configs("resources.gpus=4"), store)
    with pytest.raises(ConfigError, match=r"needs 3 node\(s\).*only 2 of the cluster's 2 nodes"):
        run(configs("resources.nodes=3", "train.batch_size=9", "resources.gpus=1"), store)
    assert not list(store.root.glob("runs/*/state.json"))  # nothing started


def test_check_fit_counts_distinct_nodes_and_memory():
    [cfg] = configs("resources.nodes=2", "resources.gpus=4", "resources.memory_gb=8")
    planned = plan([cfg], Store("/nonexistent"))
    big = {"CPU": 8, "GPU": 4, "memory": 16 * 2**30}
    check_fit(planned, [big, big])
    with pytest.raises(ConfigError, match="only 1 of the cluster's 2 nodes"):
        check_fit(planned, [big, {**big, "memory": 4 * 2**30}])
    with pytest.raises(ConfigError, match="only 1 of the cluster's 1 nodes"):
        check_fit(planned, [{"CPU": 64, "GPU": 8, "memory": 2**40}])


def test_a_two_node_job_waits_with_a_clear_state_while_a_node_is_taken(cluster, tmp_path):
    """While another job holds a node the two-node job cannot start: its state says it waits and
    for what (not a stale claim), `status` says so, and it trains once the node is free."""
    import threading
    import time

    from orchestrator.status import status

    [cfg] = configs("family=dense", "resources.nodes=2", "resources.gpus=1", "resources.cpus=1", "train.steps=6")
    blocker = ray.util.placement_group([{"GPU": 2}], strategy="STRICT_PACK")  # one whole node's GPUs
    ray.get(blocker.ready())
    store = Store(tmp_path / "store")
    seen: dict = {}

    def watch() -> None:  # beside the driver, which keeps the main thread (it handles signals)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not seen:
            for rid in store.run_ids():
                if store.job_state(rid, "train")["status"] == "waiting":
                    out = io.StringIO()
                    store.record_sweep("t", [], [rid])
                    status(store, ["t"], Console(file=out, width=300))
                    seen.update(rid=rid, state=store.read_state(rid), status=out.getvalue())
            time.sleep(0.5)
        ray.util.remove_placement_group(blocker)

    watcher = threading.Thread(target=watch)
    watcher.start()
    outcome = run([cfg], store)
    watcher.join()
    rid = seen["rid"]
    assert seen["state"]["status"] == "waiting"
    assert seen["state"]["jobs"]["train"]["waiting_for"] == "2 nodes with CPU=1 GPU=1 memory=1G each"
    assert "waiting 1" in seen["status"] and f"waiting {rid}" in seen["status"] and "stale" not in seen["status"]
    assert outcome == {rid: "done"} and store.job_state(rid, "train")["attempts"] == 1
