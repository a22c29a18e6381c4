"""The fixed training set (data.train_sequences) through the real CLI on a real local Ray: a
micro run that trains on 64 instances for five epochs, validates once per epoch and is evaluated
on the checkpoint of the lowest validation loss; and a store's regbench results of an earlier
revision of its metrics, evaluated again on their checkpoints without retraining."""
import json
import subprocess

import pytest
import torch
import yaml
from helpers import CLI, metrics, sweep

from jobs.checkpoint import latest_checkpoint
from jobs.evals.regbench import evaluate
from jobs.families import build_model
from orchestrator.config import load_run_config

FIXED = ["size=micro", "family=lidas", "seed=0", "data.train_sequences=64", "data.validation_sequences=16",
         "eval.jobs=[regbench]", "tracker=none", "cluster.num_cpus=1"]


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixed")
    done = sweep(root, *FIXED, name="fixed")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_id,) = yaml.safe_load((root / "sweeps" / "fixed" / "sweep.yaml").read_text())["run_ids"]
    return root, run_id


def test_a_micro_run_on_a_fixed_set_is_evaluated_at_its_lowest_validation_loss(fixed_run):
    root, run_id = fixed_run
    run = root / "runs" / run_id
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["train_sequences"] == 64 and config["data"]["validation_sequences"] == 16
    assert config["data"]["cut_at_context"] is True  # regbench_easy declares that it fills the context
    recorded = json.loads((run / "metrics.json").read_text())
    validation = recorded["curves"]["validation_loss"]
    # 40 steps of 8 rows: a pass over the 64 instances every 8 steps, each followed by a validation
    assert validation["step"] == [8, 16, 24, 32, 40]
    m = recorded["metrics"]
    best = min(range(5), key=lambda i: validation["val_loss"][i])
    assert m["chosen_step"] == validation["step"][best] and m["chosen_val_loss"] == validation["val_loss"][best]
    assert recorded["specs"]["chosen_val_loss"]["section"] == "Training"

    final = latest_checkpoint(run)
    assert final["step"] == 40 and final["chosen"]["step"] == m["chosen_step"]
    cfg = load_run_config(config)

    def tvd(weights: dict) -> float:
        model = build_model(cfg.family, cfg.model, weights["ancestors"])
        model.load_state_dict(weights["model"])
        with torch.no_grad():
            return evaluate(cfg.data, cfg.eval.regbench, model.eval()).metrics["regbench_tvd"]
    assert tvd(final["chosen"]) == pytest.approx(m["regbench_tvd"], abs=1e-9)  # regbench scored the chosen weights
    if m["chosen_step"] != 40:
        assert tvd(final) != pytest.approx(m["regbench_tvd"], abs=1e-6)  # not the final ones


def test_regbench_results_of_an_earlier_revision_are_evaluated_again(fixed_run):
    """A store written before regbench's revision 2 holds its results without a digest: `report`
    says they are outdated, and the same sweep command evaluates them again, training nothing."""
    root, run_id = fixed_run
    run = root / "runs" / run_id
    state_file, metrics_file = run / "state.json", run / "metrics.json"
    state = json.loads(state_file.read_text())
    del state["jobs"]["regbench"]["settings"]  # as the code of revision 1 recorded it
    state_file.write_text(json.dumps(state))
    recorded = json.loads(metrics_file.read_text())
    tvd = recorded["metrics"]["regbench_tvd"]
    recorded["metrics"]["regbench_tvd"] = 0.5  # what revision 1 measured: another quantity
    metrics_file.write_text(json.dumps(recorded))
    checkpoints = {p: p.stat().st_mtime_ns for p in run.glob("checkpoints/*.pt")}

    report = subprocess.run([*CLI, "report", "fixed", "--store", str(root)], capture_output=True, text=True)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "warning: sweep fixed: results of regbench (1 runs) were recorded by an earlier revision" in report.stdout

    again = sweep(root, *FIXED, name="fixed")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 runs, 0 cached" in again.stdout
    assert metrics(root, run_id)["regbench_tvd"] == tvd
    assert json.loads(state_file.read_text())["jobs"]["regbench"]["settings"]
    assert json.loads(state_file.read_text())["jobs"]["train"]["attempts"] == 1
    assert {p: p.stat().st_mtime_ns for p in run.glob("checkpoints/*.pt")} == checkpoints
