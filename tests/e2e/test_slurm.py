"""cluster=slurm and cluster=slurm_array against a real one-node Slurm on localhost.

The session fixture starts it with scripts/slurm-local-up.sh (installs Slurm and munge with
apt-get on a fresh machine; needs root) unless `sinfo` already answers. Sweeps are real `micro`
sweeps: Ray inside the allocation, array tasks running `run-one`, reports written by the jobs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.executors.slurm import ALIVE_NODES_AWK, inner_overrides
from orchestrator.executors.slurm_tools import active
from store.store import DONE, Store

REPO = Path(__file__).resolve().parents[2]
# The jobs find this interpreter's environment (the checkout's .venv under `make test`).
SETUP = f'cluster.setup=["export PATH={Path(sys.executable).parent}:$PATH"]'
MICRO = ["size=micro", "tracker.enabled=false", "eval.jobs=[regbench]", "cluster.time=00:10:00", SETUP]
# A value that would run a command, break out of quotes or add a line if it reached a shell raw.
NASTY = "it's \"$(touch {marker})\" `touch {marker}`\nnext line"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _sinfo_answers() -> bool:
    return shutil.which("sinfo") is not None and subprocess.run(
        ["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0


_stores: list[Path] = []  # stores of the sweeps the tests submitted


@pytest.fixture(scope="session")
def slurm_cluster():
    if not _sinfo_answers():
        assert os.geteuid() == 0, "no Slurm answers and scripts/slurm-local-up.sh needs root"
        up = subprocess.run(["bash", str(REPO / "scripts" / "slurm-local-up.sh")],
                            capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, up.stderr + up.stdout
    yield
    # Leave no job of ours behind (the daemons may stay up).
    ids = [j["id"] for root in _stores for name in Store(root).sweeps()
           for j in Store(root).read_sweep(name).get("slurm_jobs", [])]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60)


def hydra_quoted(value: str) -> str:
    """A Hydra single-quoted value (quotes inside escaped; NASTY has no backslashes)."""
    return "'" + value.replace("'", "\\'") + "'"


def sweep(store: Path, name: str, *overrides: str) -> subprocess.CompletedProcess:
    _stores.append(store)
    return cli("sweep", *MICRO, f"store.root={store}", *overrides, "--name", name)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.3)


def jobs_over(store: Path, name: str) -> bool:
    ids = [j["id"] for j in Store(store).read_sweep(name).get("slurm_jobs", [])]
    return not active(ids)


def run_states(store: Path, name: str) -> dict[str, dict]:
    s = Store(store)
    return {rid: s.read_state(rid) for rid in s.read_sweep(name)["run_ids"]}


def log_tail(store: Path, name: str) -> str:
    logs = sorted((store / "sweeps" / name / "slurm").glob("*.out"))
    return "\n".join(f"== {p.name}\n" + p.read_text()[-3000:] for p in logs)


def test_allocation_with_ray_cancel_midway_and_resubmit_resumes(slurm_cluster, tmp_path, capsys):
    """Ray head in the allocation, 3 runs on 1 CPU; scancel once the first training is done;
    the same command resubmits, trains only the rest, and the report appears. An override
    full of shell syntax reaches the driver intact and never runs."""
    store, name, marker = tmp_path / "store", "slurm-ray", tmp_path / "pwned"
    # 600 steps (about 10 s a training here, more under load) leave the scancel time to land
    # between trainings.
    # Both checkpoints kept as training left them (store.keep_checkpoints=last_two), so their
    # unchanged files show that nothing finished was retrained.
    args = ["family=dense,lidas,looped", "seed=0", "train.steps=600", "cluster=slurm",
            "cluster.cpus_per_node=1", "store.keep_checkpoints=last_two",
            "cluster.mem_gb=3", "cluster.gpus_per_node=1",
            f"tracker.project={hydra_quoted(NASTY.format(marker=marker))}"]
    first = sweep(store, name, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "submitted Slurm allocation job" in first.stdout
    again = sweep(store, name, *args)  # while it is queued or running: refused, nothing doubled
    assert again.returncode == 1 and "already has Slurm job" in again.stderr, again.stdout + again.stderr

    def trained(states: dict) -> set[str]:
        return {rid for rid, s in states.items() if s["jobs"].get("train", {}).get("status") == DONE}

    def one_trained() -> bool:
        assert not jobs_over(store, name), "allocation ended early:\n" + log_tail(store, name)
        return bool(trained(run_states(store, name)))
    # Ray runs the three trainings one after another (1 CPU), then the evaluations.
    wait_for(one_trained, 180, "the first training to finish inside the allocation")
    assert main(["cancel", name, "--store", str(store)]) == 0  # in-process: no start-up delay
    assert "cancelled Slurm job" in capsys.readouterr().out
    wait_for(lambda: jobs_over(store, name), 60, "scancel to take effect")
    states = run_states(store, name)
    finished = trained(states)
    assert 0 < len(finished) < 3, states  # cancelled mid-way
    left = sum(s["status"] != DONE for s in states.values())
    status = cli("status", name, "--store", str(store))
    assert "slurm allocation job" in status.stdout and "CANCELLED" in status.stdout, status.stdout
    stamps = {rid: sorted((p.name, p.stat().st_mtime_ns)
                          for p in (store / "runs" / rid / "checkpoints").iterdir())
              for rid in finished}

    second = sweep(store, name, *args)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"{left} of 3 runs to do" in second.stdout, second.stdout
    wait_for(lambda: jobs_over(store, name), 240, "the resubmitted allocation")
    states = run_states(store, name)
    assert all(s["status"] == DONE for s in states.values()), (states, log_tail(store, name))
    for rid in finished:  # not retrained: one attempt, the same checkpoint files untouched
        assert states[rid]["jobs"]["train"]["attempts"] == 1
        assert sorted((p.name, p.stat().st_mtime_ns)
                      for p in (store / "runs" / rid / "checkpoints").iterdir()) == stamps[rid]
    assert (store / "sweeps" / name / "report.md").exists(), log_tail(store, name)
    assert not marker.exists()
    config = Store(store).read_config(next(iter(states)))
    assert config["tracker"]["project"] == NASTY.format(marker=marker)  # arrived intact
    jobs = Store(store).read_sweep(name)["slurm_jobs"]
    assert [j["kind"] for j in jobs] == ["allocation", "allocation"]
    assert "COMPLETED" in cli("status", name, "--store", str(store)).stdout


def test_array_one_task_per_run_then_the_report_job(slurm_cluster, tmp_path):
    store, name = tmp_path / "store", "slurm-array"
    out = sweep(store, name, "family=dense,lidas", "seed=0", "cluster=slurm_array")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "submitted Slurm array job" in out.stdout and "report job" in out.stdout
    wait_for(lambda: jobs_over(store, name), 180, "the array and its report job")
    states = run_states(store, name)
    assert len(states) == 2 and all(s["status"] == DONE for s in states.values()), \
        (states, log_tail(store, name))
    assert all(s["jobs"][j]["attempts"] == 1 for s in states.values() for j in s["jobs"])
    assert (store / "sweeps" / name / "report.md").exists(), log_tail(store, name)
    status = cli("status", name, "--store", str(store)).stdout
    assert "slurm array job" in status and "COMPLETED" in status, status
    # Everything done: the same command submits nothing and reports at once.
    again = sweep(store, name, "family=dense,lidas", "seed=0", "cluster=slurm_array")
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout
    assert len(Store(store).read_sweep(name)["slurm_jobs"]) == 2


@pytest.mark.parametrize("cluster", ["slurm", "slurm_array"])
def test_rendered_script_passes_bash_and_sbatch_test_only(slurm_cluster, tmp_path, cluster, capsys):
    marker = tmp_path / "pwned"
    sizing = {"slurm": ["cluster.cpus_per_node=2", "cluster.mem_gb=4", "cluster.gpus_per_node=2"],
              "slurm_array": ["resources.gpus=2", "train.batch_size=8"]}  # tasks sized by the run
    code = main(["sweep", *MICRO, f"store.root={tmp_path / 'store'}", "family=dense", "seed=0",
                 f"cluster={cluster}", *sizing[cluster], "cluster.partition=debug",
                 "cluster.sbatch=['--comment=orchestrator-test']",
                 f"tracker.project={hydra_quoted(NASTY.format(marker=marker))}", "--dry-run"])
    out = capsys.readouterr()
    assert code == 0, out.out
    assert out.out.rstrip().endswith("dry run, nothing submitted or written")
    body = out.out.rsplit("\nsweep ", 1)[0]
    scripts = [s.split("\n", 1)[1] for s in body.split("# ---- ")[1:]]
    assert len(scripts) == (1 if cluster == "slurm" else 2)
    for text in scripts:
        path = tmp_path / "job.sbatch"
        path.write_text(text)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
        test = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True,
                              cwd=tmp_path, timeout=60)
        assert test.returncode == 0 and "to start at" in test.stderr, test.stderr
        assert "#SBATCH --partition=debug" in text and "#SBATCH --comment=orchestrator-test" in text
    assert "#SBATCH --gres=gpu:2" in scripts[0]
    if cluster == "slurm":
        assert "--num-gpus=2" in scripts[0]
    assert not marker.exists() and not (tmp_path / "store").exists()  # a dry run writes nothing


def test_bad_slurm_values_fail_before_anything_with_exit_2(tmp_path, capsys):
    for override, words in (("cluster.partition='gpu\n#SBATCH --wrap=x'", "cluster.partition"),
                            ("cluster.sbatch=['--comment=a b']", "cluster.sbatch"),
                            ("cluster.nodes=0", "cluster.nodes=0: must be >= 1")):
        assert main(["sweep", "size=micro", "family=dense", "seed=0", "cluster=slurm",
                     f"store.root={tmp_path}", override]) == 2
        assert words in capsys.readouterr().err
    assert main(["sweep", "size=micro", "family=dense", "seed=0", "cluster=slurm",
                 f"store.root={tmp_path}", "--name", "a b"]) == 2
    assert "--name 'a b'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_inside_the_allocation_the_cluster_overrides_give_way_to_its_ray():
    assert inner_overrides(["cluster=slurm", "cluster.nodes=2", "+cluster.x=1", "seed=0,1",
                                  "clusters_note=x", "family=dense"]) == \
        ["seed=0,1", "clusters_note=x", "family=dense"]


def test_cancel_of_a_local_sweep_says_there_is_nothing_to_cancel(tmp_path, capsys):
    store = Store(tmp_path)
    store.create()
    store.record_sweep("local-one", ["seed=0"], [])
    assert main(["cancel", "local-one", "--store", str(tmp_path)]) == 0
    assert "nothing to cancel" in capsys.readouterr().out
    assert "slurm_jobs" not in store.read_sweep("local-one")
    assert main(["cancel", "nope", "--store", str(tmp_path)]) == 2  # a store error
    assert "no sweep named 'nope'" in capsys.readouterr().err


def test_an_allocation_slurm_could_never_start_is_refused_with_the_keys_to_lower(slurm_cluster, tmp_path, capsys):
    """As a new user tries it on this one-node Slurm (2 CPUs): the defaults ask 4 CPUs per node,
    which sbatch would queue for ever (PartitionConfig). Refused in one line, exit 2, store untouched."""
    store = tmp_path / "store"
    cases = ((["cluster=slurm"], "lower cluster.cpus_per_node (asks 4, its nodes have at most 2 CPUs)"),
             (["cluster=slurm", "cluster.cpus_per_node=1", "cluster.mem_gb=2", "cluster.nodes=2"],
              "lower cluster.nodes (asks 2 nodes, 1 of its nodes can hold one task each)"),
             (["cluster=slurm_array", "resources.memory_gb=4096"],
              "lower resources.memory_gb (or eval.resources.memory_gb) (asks 4096, its nodes have at most"))
    for overrides, words in cases:
        code = main(["sweep", *MICRO, "family=dense,lidas", "seed=0", f"store.root={store}", *overrides])
        out = capsys.readouterr().err
        assert code == 2 and words in out and "Slurm would never start" in out, out
        assert len(out.strip().splitlines()) == 1 and not store.exists()


def test_status_says_why_a_job_pends_in_plain_words(slurm_cluster, tmp_path, capsys):
    """A job Slurm accepted but cannot start (submitted by hand, past the pre-flight): `status`
    shows squeue's reason as what to do."""
    script = tmp_path / "big.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --cpus-per-task=8\n#SBATCH --time=00:01:00\n"
                      f"#SBATCH --output={tmp_path}/%j.out\ntrue\n")
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        store = Store(tmp_path / "store")
        store.create()
        store.record_sweep("big", [], [])
        store.record_slurm_job("big", {"id": job, "kind": "allocation", "cluster": "slurm", "script": str(script),
                                       "at": "2026-01-01T00:00:00"})
        wait_for(lambda: "PartitionConfig" in subprocess.run(["squeue", "-h", "-j", job, "-o", "%r"],
                                                             capture_output=True, text=True).stdout, 60, "a reason")
        assert main(["status", "big", f"store.root={store.root}"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert f"allocation job {job}" in out and "PENDING (the request exceeds what the partition's nodes offer" in out
        assert "lower the cluster.* sizes and resubmit" in out
    finally:
        subprocess.run(["scancel", job])


def test_misfits_name_each_key_against_the_partition():
    """The arithmetic behind the pre-flight line, on a made-up partition of two node kinds."""
    from orchestrator.executors.slurm_tools import NodeGroup, Request, minutes, misfits

    groups = [NodeGroup(4, 8, 60.0, 0), NodeGroup(2, 32, 250.0, 4)]
    keys = {"nodes": "cluster.nodes", "cpus": "cluster.cpus_per_node", "mem_gb": "cluster.mem_gb",
            "gpus": "cluster.gpus_per_node"}
    assert misfits(Request(2, 16, 100, 4, keys), groups, None, "01:00:00") == []
    assert misfits(Request(3, 16, 100, 4, keys), groups, None, "01:00:00") == [
        "cluster.nodes (asks 3 nodes, 2 of its nodes can hold one task each)"]
    assert misfits(Request(1, 64, 300, 8, keys), groups, 2880.0, "3-00:00:00") == [
        "cluster.cpus_per_node (asks 64, its nodes have at most 32 CPUs)",
        "cluster.mem_gb (asks 300, its nodes have at most 250 GB)",
        "cluster.gpus_per_node (asks 8, its nodes have at most 4 GPUs)",
        "cluster.time (asks 3-00:00:00, its limit is 2880 minutes)"]
    assert [minutes(t) for t in ("04:00:00", "30", "10:30", "1-00:00:00", "2-12", "infinite")] == [
        240, 30, 10.5, 1440, 3600, None]


@pytest.mark.parametrize("legacy", [True, False])
def test_the_node_count_the_ray_bring_up_waits_for_leaves_out_dead_nodes(legacy):
    """The allocation (and the test bed's hosts-ray-up.sh) waits until `ray status` shows every
    node; its "Recent failures" section names dead nodes as well, which must not count: a host
    killed and rejoining would pass for up before its new node registered. The status text comes
    from Ray's own formatter, in its v1 (Active only) and newer (Active and Idle) shapes."""
    from ray.autoscaler._private.autoscaler import AutoscalerSummary
    from ray.autoscaler._private.util import LoadMetricsSummary, format_info_string

    def count(active: dict[str, int], idle: dict[str, int], failed: list[tuple[str, str]]) -> int:
        summary = AutoscalerSummary(active_nodes=active, idle_nodes=idle, pending_nodes=[],
                                    pending_launches={}, failed_nodes=failed, legacy=legacy)
        load = LoadMetricsSummary(usage={"CPU": (1.0, 3.0)}, resource_demand=[], pg_demand=[],
                                  request_demand=[], node_types=[])
        text = format_info_string(load, summary)
        got = subprocess.run(["awk", ALIVE_NODES_AWK], input=text, capture_output=True, text=True, check=True)
        return int(got.stdout)

    up, dead = {"node_" + "a" * 56: 1, "node_" + "b" * 56: 1}, [("10.0.0.2", "node_" + "c" * 56)]
    idle = {} if legacy else {"node_" + "d" * 56: 1}
    assert count(up, idle, dead) == 2 + len(idle)
    assert count({}, {}, dead) == 0
    assert count(up, idle, []) == 2 + len(idle)
    hosts_script = (Path(__file__).parents[2] / "scripts" / "hosts-ray-up.sh").read_text()
    assert f"awk '{ALIVE_NODES_AWK}'" in hosts_script  # the test bed counts the same way
