"""Faults, each real: processes killed with SIGKILL, files truncated on disk, a disk that fills up,
a run that cannot train. Through the real CLI on real local Ray clusters, micro runs.

The two overlapping sweeps started at the same time (fault 3) are also the uninterrupted
reference: every other fault must end with bit-identical metrics and training history."""
import os
import signal
import subprocess

import pandas as pd
import pytest
import yaml
from helpers import (claims_free, history, metrics, running_train, start_sweep, state, sweep,
                     wait_for)

from jobs.checkpoint import checkpoint_paths, latest_checkpoint
from orchestrator.cli import main
from store import integrity

# 200 steps: LIDAS grows at steps 20, 60 and 120, which leaves time to kill it mid-stage.
LONG = ["size=micro", "seed=0", "train.steps=200", "train.checkpoint_every=20", "tracker=none",
        "cluster.num_cpus=2", "eval.jobs=[regbench]"]
COMPARED = ("final_loss", "train_flops", "train_tokens", "regbench_tvd", "regbench_l1_ref",
            "regbench_acc")


def family_ids(root, sweep_name: str) -> dict[str, str]:
    ids = yaml.safe_load((root / "sweeps" / sweep_name / "sweep.yaml").read_text())["run_ids"]
    return {yaml.safe_load((root / "runs" / r / "config.yaml").read_text())["family"]["name"]: r
            for r in ids}


def assert_same_as_reference(reference, root, rid: str) -> None:
    ref_root, ref_metrics = reference["root"], reference["metrics"][rid]
    got = metrics(root, rid)
    assert {k: got[k] for k in COMPARED} == {k: ref_metrics[k] for k in COMPARED}, rid
    pd.testing.assert_frame_equal(history(root, rid), reference["history"][rid])
    assert ref_root != root


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Fault 3: sweeps a (lidas, dense) and b (lidas, looped) started together on one store."""
    root = tmp_path_factory.mktemp("overlap")
    drivers = [start_sweep(root, *LONG, "family=lidas,dense", name="a"),
               start_sweep(root, *LONG, "family=lidas,looped", name="b")]
    outs = [d.communicate(timeout=600)[0] for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0], outs
    ids = {**family_ids(root, "a"), **family_ids(root, "b")}
    return {"root": root, "ids": ids, "a": family_ids(root, "a"), "b": family_ids(root, "b"),
            "metrics": {r: metrics(root, r) for r in ids.values()},
            "history": {r: history(root, r) for r in ids.values()}}


def test_overlapping_sweeps_started_together_train_each_shared_run_once(reference):
    root, a, b = reference["root"], reference["a"], reference["b"]
    assert a["lidas"] == b["lidas"] and len(reference["ids"]) == 3
    for rid in reference["ids"].values():
        st = state(root, rid)
        assert st["status"] == "done"
        assert {s["attempts"] for s in st["jobs"].values()} == {1} and "train" in st["jobs"]
        steps = reference["history"][rid]["step"].tolist()
        assert steps == list(range(5, 201, 5))  # one training history, no step twice
    for name, ids in (("a", a), ("b", b)):
        runs = pd.read_parquet(root / "sweeps" / name / "results" / "runs.parquet")
        assert sorted(runs["run_id"].unique()) == sorted(ids.values())
        assert set(runs["status"]) == {"done"}
        assert (root / "sweeps" / name / "report.md").exists()


def test_trainer_killed_mid_growth_is_retried_and_resumes_bit_identically(reference, tmp_path):
    root = tmp_path / "store"
    driver = start_sweep(root, *LONG, "family=lidas", name="kill")
    rid, pid, progress = wait_for(lambda: running_train(root, min_layers=2), process=driver)
    os.kill(pid, signal.SIGKILL)
    out, _ = driver.communicate(timeout=600)
    assert driver.returncode == 0, out
    assert 20 < progress["step"] < 200 and rid == reference["ids"]["lidas"]
    st = state(root, rid)
    assert st["status"] == "done" and st["jobs"]["train"]["attempts"] == 2
    assert st["jobs"]["train"]["pid"] != pid  # Ray retried it in a new worker
    assert_same_as_reference(reference, root, rid)


def status_lines(root, capsys) -> list[str]:
    assert main(["status", "--store", str(root)]) == 0
    return capsys.readouterr().out.splitlines()


def test_driver_killed_then_rerun_finishes_every_run_and_repairs_damaged_files(
        reference, tmp_path, capsys):
    """Fault 2 (driver SIGKILL mid-sweep, same command again) and fault 4 (a truncated
    checkpoint, a corrupted state.json, a half-written metrics.json) on one store."""
    root, ids = tmp_path / "store", reference["ids"]
    # Both checkpoints kept as training left them, so their unchanged files show that nothing
    # finished was retrained (the default keeps the final weights alone, rewritten once a run is
    # done: tests/e2e/test_sweep_e2e.py).
    args = (*LONG, "family=lidas,looped,dense", "store.keep_checkpoints=last_two")
    driver = start_sweep(root, *args, name="k")

    def moment():  # dense and looped trained; lidas past its first growth, two checkpoints kept
        trained = [(root / "runs" / ids[f] / "state.json").exists()
                   and state(root, ids[f])["jobs"]["train"]["status"] == "done" for f in ("dense", "looped")]
        running = all(trained) and running_train(root, min_layers=2, min_checkpoints=2)
        return running if running and running[0] == ids["lidas"] else None

    _, trainer, _ = wait_for(moment, process=driver)
    driver.kill()  # and the trainer with it: Ray takes a while to stop the driver's workers, time
    os.kill(trainer, signal.SIGKILL)  # in which the training could finish
    driver.communicate(timeout=60)
    wait_for(lambda: claims_free(root), timeout=120)  # the workers die with the driver's Ray
    lidas, dense, looped = ids["lidas"], ids["dense"], ids["looped"]
    assert state(root, lidas)["status"] == "running"  # what the killed process left behind
    lines = [s.strip() for s in status_lines(root, capsys)]
    (row,) = [line for line in lines if line.split()[:2] == ["lidas-micro-s0", lidas]]
    assert row.split()[2] == "stale" and "train stale x1" in row
    assert any(line.startswith(f"stale {lidas} lidas-micro-s0: ") for line in lines)
    assert not any("running x" in line for line in lines)  # no job shown as running for ever

    # Damage: the newest checkpoint of the interrupted run, the state of one finished run,
    # the metrics of another.
    newest = checkpoint_paths(root / "runs" / lidas)[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    (root / "runs" / dense / "state.json").write_text('{"status": "do')
    metrics_file = root / "runs" / looped / "metrics.json"
    metrics_file.write_text(metrics_file.read_text()[:40])
    finished = {p: p.stat().st_mtime_ns for r in (dense, looped)
                for p in (root / "runs" / r / "checkpoints").glob("step_*.pt")}

    problems = [s.strip() for s in status_lines(root, capsys) if s.strip().startswith("problem ")]
    assert len(problems) == 3
    assert any(p.startswith(f"problem {lidas} ") and f"checkpoint {newest.name}" in p for p in problems)
    assert any(p.startswith(f"problem {dense} ") and "state.json unreadable" in p for p in problems)
    assert any(p.startswith(f"problem {looped} ") and "metrics.json unreadable" in p for p in problems)
    assert main(["report", "k", "--store", str(root)]) == 2  # one line, not a traceback
    error = [s for s in capsys.readouterr().err.splitlines() if s.startswith("error:")]
    assert len(error) == 1 and "see `status`" in error[0]

    again = sweep(root, *args, name="k")
    assert again.returncode == 0, again.stdout + again.stderr
    for rid in ids.values():
        assert state(root, rid)["status"] == "done"
        assert_same_as_reference(reference, root, rid)
    assert state(root, lidas)["jobs"]["train"]["attempts"] == 2
    assert finished == {p: p.stat().st_mtime_ns for p in finished}  # nothing finished was retrained
    quarantine = integrity.quarantined(root / "runs" / lidas / "checkpoints")
    assert len(quarantine) == 1 and newest.name in quarantine[0]
    assert (newest.parent / f"{newest.name}.corrupt").exists()
    assert [r["problem"] for r in state(root, dense)["recovered"]][0].startswith("state.json unreadable")
    assert [r["problem"] for r in state(root, looped)["recovered"]][0].startswith("metrics.json unreadable")
    lines = [s.strip() for s in status_lines(root, capsys)]
    assert not [s for s in lines if s.startswith(("problem ", "stale "))]
    assert {s.split()[1] for s in lines if s.startswith("recovered ")} == {lidas, dense, looped}
    runs = pd.read_parquet(root / "sweeps" / "k" / "results" / "runs.parquet")
    assert sorted(runs["run_id"].unique()) == sorted(ids.values()) and set(runs["status"]) == {"done"}


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of its own, so the test can fill it (needs root to mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_disk_full_while_checkpointing_fails_clearly_and_keeps_the_previous_checkpoint(small_disk):
    root = small_disk / "store"
    driver = start_sweep(root, "size=micro", "family=dense", "seed=0", "train.steps=300",
                         "train.checkpoint_every=100", "train.max_retries=1", "train.snapshots=0", "tracker=none",
                         "eval.jobs=[regbench]", "cluster.num_cpus=1", name="full")
    (rid,) = wait_for(lambda: [p.parent.parent.name for p in root.glob("runs/*/checkpoints/step_0000100.pt.sha256")],
                      process=driver)
    used = os.statvfs(small_disk)
    used_bytes = (used.f_blocks - used.f_bfree) * used.f_frsize
    # The disk fills up: room for the small files, not for another checkpoint.
    subprocess.run(["mount", "-o", f"remount,size={used_bytes + 200 * 1024}", str(small_disk)], check=True)
    out, _ = driver.communicate(timeout=600)
    assert driver.returncode == 1, out
    train = state(root, rid)["jobs"]["train"]
    assert train["status"] == "failed" and train["attempts"] == 1  # the job's own error: not retried
    assert "disk full writing checkpoint" in train["error"] and "free space or move store.root" in train["error"]
    assert "disk full writing checkpoint" in out
    run_dir = root / "runs" / rid
    assert [p.name for p in checkpoint_paths(run_dir)] == ["step_0000100.pt"]
    assert not list((run_dir / "checkpoints").glob(".*"))  # no partial file left
    assert integrity.problem(checkpoint_paths(run_dir)[0], full=True) is None
    assert latest_checkpoint(run_dir)["step"] == 100


def test_a_run_that_cannot_train_fails_once_and_the_sweep_goes_on(tmp_path):
    root = tmp_path / "store"
    done = sweep(root, "size=micro", "family=dense", "seed=0", "train.lr=0.003,1e30",
                 "train.max_retries=2", "tracker=none", "eval.jobs=[regbench]", "cluster.num_cpus=2",
                 name="nan")
    assert done.returncode == 1, done.stdout + done.stderr
    by_lr = {yaml.safe_load((root / "runs" / r / "config.yaml").read_text())["train"]["lr"]: r
             for r in yaml.safe_load((root / "sweeps" / "nan" / "sweep.yaml").read_text())["run_ids"]}
    bad, good = state(root, by_lr[1e30]), state(root, by_lr[0.003])
    assert good["status"] == "done"
    assert bad["status"] == "failed" and bad["jobs"]["train"]["attempts"] == 1  # deterministic: not retried
    assert "FloatingPointError: training loss is nan" in bad["error"]
    report = (root / "sweeps" / "nan" / "report.md").read_text()
    failed_rows = [line for line in report.splitlines() if by_lr[1e30] in line]
    assert failed_rows and "failed" in failed_rows[0] and "FloatingPointError" in failed_rows[0]
    runs = pd.read_parquet(root / "sweeps" / "nan" / "results" / "runs.parquet")
    assert dict(zip(runs["run_id"], runs["status"])) == {by_lr[0.003]: "done", by_lr[1e30]: "failed"}
