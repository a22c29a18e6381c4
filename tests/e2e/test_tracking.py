"""W&B tracking, checked on what wandb itself wrote offline (its `run-<id>.wandb` transaction
logs): one W&B run per store run holding its training and its evaluations, the sweep's analysis
run, resumes that continue the same run, no secret in any file, and W&B trouble that never fails
a job. The config helpers and the W&B environment of each test are test_tracking_config's."""
import dataclasses
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pandas as pd
import pytest
import yaml

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402

from jobs.contract import Job  # noqa: E402
from orchestrator import tracking, worker  # noqa: E402
from orchestrator.cli import main  # noqa: E402
from orchestrator.identity import run_id  # noqa: E402
from store.store import Store  # noqa: E402
from test_tracking_config import FAKE_KEY, UNREACHABLE, micro, with_tracker  # noqa: E402
from test_tracking_config import base_cfg, w_and_b_env  # noqa: E402, F401 (fixtures; w_and_b_env is autouse)

FAKE_TOKEN = "sk-test-4f9c2b7e1a6d8e3f5b0c9d"


# ---------------------------------------------------------------------------------------------
# Reading what W&B wrote. wandb 0.31 reads its transaction logs only in its Go core (the Python
# datastore module is gone), so this is the log's framing (leveldb's log format: 7-byte file
# header ':W&B' magic version; 32 KiB blocks of chunks crc32(type+data), length, type) around
# records in wandb's own protobuf schema, wandb_internal_pb2.Record.

def records(path: Path) -> list:
    data = path.read_bytes()
    if len(data) < 7:  # not even the header written yet
        return []
    assert data[:4] == b":W&B"
    out, pos, parts = [], 7, b""
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # the zero padding at a block's end
            pos += room
            continue
        if pos + 7 + length > len(data):  # the writer is in the middle of this chunk
            break
        chunk = data[pos + 7:pos + 7 + length]
        assert zlib.crc32(bytes([kind]) + chunk) == crc
        pos, parts = pos + 7 + length, parts + chunk
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
            parts = b""
    return out


def _nested(items) -> dict:
    out: dict = {}
    for item in items:
        *parents, leaf = list(item.nested_key) or [item.key]
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = json.loads(item.value_json)
    return out


class Session:
    """One `run-<id>.wandb` file: one wandb.init ... finish."""

    def __init__(self, path: Path):
        self.path, recs = path, records(path)
        kinds = [(r.WhichOneof("record_type"), r) for r in recs]
        self.run = next(r.run for k, r in kinds if k == "run")
        self.config = _nested(self.run.config.update)
        self.history = [_nested(r.history.item) for k, r in kinds if k == "history"]
        self.summary: dict = {}
        for k, r in kinds:
            if k == "summary":
                self.summary.update(_nested(r.summary.update))
        self.exit_code = next(r.exit.exit_code for k, r in kinds if k == "exit")


def _complete(path: Path) -> bool:
    kinds = {r.WhichOneof("record_type") for r in records(path)}
    return {"run", "exit"} <= kinds


def sessions(root: Path, rid: str, timeout: float = 60.0) -> list[Session]:
    """The finished sessions of `rid`. W&B's core writes the file after `finish` returns (on a
    busy machine, noticeably later), so wait for each file's run and exit records first."""
    files = sorted((root / "wandb").glob(f"offline-run-*/run-{rid}.wandb"))
    deadline = time.monotonic() + timeout
    while not all(_complete(p) for p in files):
        assert time.monotonic() < deadline, f"W&B did not finish writing {files}"
        time.sleep(0.1)
    return [Session(p) for p in files]


def run_ids_on_disk(root: Path) -> set[str]:
    """Ids from the run-<id>.wandb files (directory names get a -1 suffix when two sessions start
    within the same second)."""
    return {f.name[len("run-"):-len(".wandb")] for f in (root / "wandb").glob("offline-run-*/run-*.wandb")}


def assert_nowhere(root: Path, *secrets: str) -> None:
    for path in (p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        assert not any(s.encode() in data for s in secrets), path


# ---------------------------------------------------------------------------------------------
# The real path: a sweep through the CLI, Ray and the worker

@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("store")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": UNREACHABLE}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "size=micro",
                          "family=dense", "seed=0", "eval.jobs=[regbench]", f"store.root={root}",
                          "--name", "t"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "W&B: sweep summary logged" in out.stdout and "TrackingWarning" not in out.stderr
    assert not (root / "wandb" / "warnings.log").exists()  # where the jobs' warnings would be
    (rid,) = yaml.safe_load((root / "sweeps" / "t" / "sweep.yaml").read_text())["run_ids"]
    return root, rid


def test_a_run_and_its_evaluation_are_one_wandb_run(swept):
    root, rid = swept
    train, evaluation = sessions(root, rid)  # two sessions (jobs), one W&B run id
    for s in (train, evaluation):
        assert (s.run.run_id, s.run.display_name, s.run.run_group, s.run.job_type) == (
            rid, "dense-micro-s0", "t/dense-micro", "train")
        assert set(s.run.tags) == {"family=dense", "size=micro", "seed=0", "backend=torch"}
        assert s.run.resume and s.run.project == "depthgrowth"
        assert s.config["run_id"] == rid and s.config["model"]["name"] == "micro"
        assert "tracker" not in s.config
    stored_config = yaml.safe_load((root / "runs" / rid / "config.yaml").read_text())
    assert "sweep" not in stored_config["tracker"]  # the sweep reaches the jobs only, not their config
    stored = pd.read_parquet(root / "runs" / rid / "history.parquet")
    rows = [h for h in train.history if "train/loss" in h]
    assert [h["_step"] for h in rows] == stored["step"].tolist() == list(range(5, 41, 5))
    assert [h["train/loss"] for h in rows] == stored["loss"].tolist()
    assert [h["train/flops"] for h in rows] == stored["flops"].tolist()
    assert all({"train/lr", "train/tokens", "train/n_layers"} <= h.keys() for h in rows)
    metrics = json.loads((root / "runs" / rid / "metrics.json").read_text())
    assert evaluation.summary["regbench_tvd"] == metrics["metrics"]["regbench_tvd"]
    assert evaluation.summary["final_loss"] == metrics["metrics"]["final_loss"]
    table = evaluation.summary["curves/tvd_by_context"]
    assert table["_type"] == "table-file"
    saved = json.loads((evaluation.path.parent / "files" / table["path"]).read_text())
    assert {"n_context_strings", "regbench_tvd"} <= set(saved["columns"])
    assert len(saved["data"]) == len(metrics["curves"]["tvd_by_context"]["n_context_strings"])


def test_the_sweep_summary_run_holds_tables_and_plots(swept):
    root, rid = swept
    (analysis_id,) = run_ids_on_disk(root) - {rid}
    (s,) = sessions(root, analysis_id)
    assert (s.run.job_type, s.run.run_group, s.run.display_name) == ("analysis", "t", "t-analysis")
    assert s.config["run_ids"] == [rid]
    logged = {k: v for row in s.history for k, v in row.items()}
    assert logged["cells"]["_type"] == logged["comparisons"]["_type"] == "table-file"
    plots = {p.stem for p in (root / "sweeps" / "t" / "plots").glob("*.png")}
    assert plots and {f"plots/{p}" for p in plots} <= logged.keys()
    assert logged[f"plots/{sorted(plots)[0]}"]["_type"] == "image-file"
    assert main(["report", "t", "--store", str(root)]) == 0  # same report: not logged again
    assert run_ids_on_disk(root) == {rid, analysis_id}


def test_no_key_anywhere_in_the_store(swept):
    assert_nowhere(swept[0], FAKE_KEY)


def test_wandb_sync_fails_cleanly_offline_and_runs_wandb_sync_online(swept, monkeypatch, capsys):
    root = swept[0]
    monkeypatch.setenv("WANDB_CACHE_DIR", str(root / "wandb" / "cache"))  # W&B's service logs
    assert main(["wandb-sync", "t", "--store", str(root)]) == 1
    out = capsys.readouterr()
    assert f"3 offline W&B run directories to upload: {sys.executable} -m wandb sync" in out.out
    error = [line for line in out.err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"cannot reach the W&B server {UNREACHABLE}" in error[0]

    calls = []
    monkeypatch.setattr(tracking, "unreachable", lambda: None)
    monkeypatch.setattr(subprocess, "run",
                        lambda cmd: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert main(["wandb-sync", "t", "--store", str(root)]) == 0
    dirs = sorted((root / "wandb").glob("offline-run-*"))
    assert calls == [[sys.executable, "-m", "wandb", "sync", *map(str, dirs)]]
    assert "wandb sync done (3 run directories" in capsys.readouterr().out
    assert main(["wandb-sync", "nope", "--store", str(root)]) == 2  # a store error


# ---------------------------------------------------------------------------------------------
# Direct calls


def test_resume_continues_the_same_run_and_logs_every_nth_step(tmp_path, base_cfg):
    cfg = with_tracker(base_cfg, log_every=10)
    rid, seen = run_id(cfg), []
    tracker = tracking.open_run(cfg, rid, "train", tmp_path, sweep="s")
    report = tracker.progress(seen.append)
    for step in range(5, 25, 5):
        report({"step": step, "total_steps": 20, "loss": 1 / step, "lr": 0.01, "tokens": step * 8,
                "flops": step * 1e6, "n_layers": 4, "tokens_per_s": 100.0})
    tracker.finish()
    again = tracking.open_run(cfg, rid, "regbench", tmp_path, sweep="s")
    again.record({"metrics": {"regbench_tvd": 0.5}, "curves": {"ancestors": [0, 1, 2, 3]}})
    again.finish()

    assert len(seen) == 4 and run_ids_on_disk(tmp_path) == {rid}
    first, second = sessions(tmp_path, rid)
    assert first.run.resume and second.run.resume and first.run.run_group == "s/dense-micro"
    assert [h["_step"] for h in first.history if "train/loss" in h] == [10, 20]
    assert not [h for h in second.history if "train/loss" in h]
    assert second.summary["regbench_tvd"] == 0.5
    assert second.summary["curves/ancestors"] == [0, 1, 2, 3]


def test_secrets_never_reach_any_file(tmp_path):
    notes = {"api_key": "plain words", "hf_token": "x", "url": FAKE_TOKEN,
             "login": "https://me:hunter2@example.com", "kept": "lr sweep"}
    assert tracking.redact(notes) == {"kept": "lr sweep"}
    # Secrets a user may put into values of the config: a setup line that exports a token, a
    # dataset path with a password in its URL.
    cfg = micro("cluster=slurm", f"cluster.setup=['export HF_TOKEN={FAKE_TOKEN}','module load cuda']",
                "eval.gsm8k.path=null")
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, partition=None,
                                                               sbatch=["https://me:hunter2@example.com"]),
                              tracker=dataclasses.replace(cfg.tracker, entity=None))
    tracker = tracking.open_run(cfg, run_id(cfg), "train", tmp_path)
    tracker.finish()
    (s,) = sessions(tmp_path, run_id(cfg))
    assert s.config["cluster"]["setup"] == ["module load cuda"] and s.config["cluster"]["sbatch"] == []
    assert_nowhere(tmp_path, FAKE_KEY, FAKE_TOKEN, "hunter2", "plain words")


def test_a_failed_job_fails_and_marks_its_wandb_session_failed(tmp_path, base_cfg, monkeypatch):
    def crash(cfg, run_dir, progress):
        progress({"step": 5, "total_steps": 40, "loss": 2.0})
        raise FloatingPointError("training loss is nan at step 6")

    monkeypatch.setattr(worker, "get_job", lambda job: Job(job, crash, metrics={}))
    rid = run_id(base_cfg)
    with pytest.raises(FloatingPointError):
        worker.execute("train", rid, str(tmp_path), base_cfg)
    (s,) = sessions(tmp_path, rid)
    assert s.exit_code == 1 and [h["train/loss"] for h in s.history if "train/loss" in h] == [2.0]
    assert Store(tmp_path).job_state(rid, "train")["status"] == "failed"


def test_an_unreachable_server_falls_back_to_offline(tmp_path, base_cfg, monkeypatch):
    monkeypatch.setattr(tracking, "_online_failed", set())
    cfg = with_tracker(base_cfg, mode="online", init_timeout_s=2)
    with pytest.warns(tracking.TrackingWarning, match="online init .* failed .*logging offline"):
        tracker = tracking.open_run(cfg, "fallback0001", "train", tmp_path)
    assert tracker.active
    tracker.finish()
    assert run_ids_on_disk(tmp_path) == {"fallback0001"}
    assert "logging offline" in (tmp_path / "wandb" / "warnings.log").read_text()


def test_the_wandb_workspace_of_a_real_offline_sweep(swept, capsys, monkeypatch):
    """Built with wandb-workspaces from what the store holds; offline its specification is written
    to the sweep's folder (no network is touched)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    from orchestrator import workspace

    root, rid = swept
    monkeypatch.delenv("WANDB_MODE", raising=False)
    store = Store(root)
    built = workspace.build(store, "t", micro().tracker)
    assert [s.name for s in built.sections] == ["Training", "Evaluation", "Sweep summary"]
    training, evaluation, summary = (s.panels for s in built.sections)
    assert [p.y for p in training] == [["train/loss"], ["train/loss"], ["train/n_layers"], ["train/lr"],
                                       ["train/tokens_per_s"]]
    assert training[1].x == "train/flops" and all(p.groupby_rangefunc == "minmax" for p in training)
    bar, scatter, chart, table = evaluation
    assert isinstance(bar, wr.BarPlot) and bar.metrics == ["regbench_tvd", "ngram1_tvd", "ngram2_tvd", "ngram3_tvd"]
    assert (scatter.x, scatter.y) == (wr.SummaryMetric("train_flops"), wr.SummaryMetric("regbench_tvd"))
    assert isinstance(chart, wr.CustomChart) and table.table_name == "curves/tvd_by_context"
    assert [p.table_name for p in summary[:2]] == ["comparisons", "cells"]
    assert "plots/loss" in summary[2].media_keys and "plots/tvd_by_context" in summary[2].media_keys
    assert built.runset_settings.groupby == [expr.Metric("Group")]
    assert built.runset_settings.filters == """Metric("Group") in ['t/dense-micro', 't']"""  # its runs and analysis

    assert main(["wandb-dashboard", "t", f"store.root={root}"]) == 0
    out = capsys.readouterr().out
    assert "W&B workspace specification written to" in out and "WANDB_MODE=online" in out
    spec = json.loads((root / "sweeps" / "t" / "wandb_workspace.json").read_text())
    assert [s["name"] for s in spec["sections"]] == ["Training", "Evaluation", "Sweep summary"]
    assert spec["project"] == "depthgrowth" and spec["name"] == "sweep t"
