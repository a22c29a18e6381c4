"""The backend=nanotron job's stage loop through real torchrun processes, with a CPU stand-in
for nanotron's run_train.py (tests/nanotron_stand_in.py): completion and resume are decided
from the checkpoint folders, growth happens by surgery between stages, and the final
checkpoint loads into the torch model for evaluation."""
import os
from pathlib import Path

import pytest
import torch
import yaml

from jobs.backends import load_model
from jobs.launch import LaunchError
from jobs.model import Decoder
from jobs.nanotron import bridge, render, train
from orchestrator import tracking
from orchestrator.config import RunConfig, compose_run, hydra_session

ROOT = Path(__file__).resolve().parent.parent


def config(*overrides: str) -> RunConfig:
    with hydra_session():
        return compose_run(["size=tiny", "family=lidas", "tracker=none", "backend=nanotron",
                            "model.n_layers=4", "train.steps=12", "train.warmup_steps=2",
                            "train.checkpoint_every=4", "resources.gpus=1",
                            "backend.nanotron.micro_batch_size=4",
                            f"backend.nanotron.run_train={ROOT / 'tests' / 'nanotron_stand_in.py'}",
                            *overrides])


def in_process(entry: list, *, env: dict, on_line, **_) -> None:
    """The stand-in without torchrun, for the legs that do not test the launch itself (each
    torchrun launch costs seconds on these CPUs)."""
    import contextlib
    import io
    import os
    import sys

    import nanotron_stand_in
    out, saved = io.StringIO(), (sys.argv, dict(os.environ))
    sys.argv = entry
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out):
            code = nanotron_stand_in.main()
    finally:
        sys.argv = saved[0]
        os.environ.clear()
        os.environ.update(saved[1])
    for line in out.getvalue().splitlines():
        on_line(line)
    if code:
        raise LaunchError(out.getvalue().splitlines()[-1])


def test_stages_resume_from_their_folders_and_grow_by_surgery(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    cfg, run_dir = config(), tmp_path / "runs" / "abc123"
    assert [(s.end_step, s.n_layers) for s in render.stages(cfg)] == [(4, 2), (12, 4)]

    monkeypatch.setenv("STAND_IN_FAIL_AFTER", "8")               # stage 1 crashes after step 8
    with pytest.raises(LaunchError, match="stand-in crash"):
        train.train_job(cfg, run_dir, None, run=in_process)
    stage1 = yaml.safe_load((render.stage_dir(run_dir, 1) / "config.yaml").read_text())
    assert stage1["checkpoints"]["resume_checkpoint_path"] == str(render.stage_dir(run_dir, 1) / "grown")
    assert stage1["checkpoints"]["load_optimizer"] is False       # fresh moments after growth
    assert stage1["model"]["model_config"]["num_hidden_layers"] == 4
    assert train.stage_start(cfg, run_dir, 0) is None             # stage 0 is done
    assert train.stage_start(cfg, run_dir, 1) == (render.stage_dir(run_dir, 1) / "checkpoints", True)

    monkeypatch.delenv("STAND_IN_FAIL_AFTER")
    progress = []                                  # resumes stage 1 at step 8, through torchrun
    result = train.train_job(cfg, run_dir, progress.append)
    assert [p["step"] for p in progress] == [9, 10, 11, 12]
    assert list(result.history["step"]) == list(range(1, 13))
    assert result.history["loss"].iloc[-1] == pytest.approx(10 / 12, rel=1e-2)
    assert result.curves["ancestors"] == [0, 1, 0, 1]

    # The final weights: stage 0's 4 steps, grown, then 8 more steps, all of +1e-3 each.
    final = bridge.import_model(cfg, render.stage_dir(run_dir, 1) / "checkpoints")
    torch.manual_seed(cfg.seed)
    start = Decoder(cfg.model, 2, [0, 1])
    assert final.depth == 4 and final.ancestors == [0, 1, 0, 1]
    expected = start.layers[1].mlp.down_proj.weight + 12e-3
    assert torch.allclose(final.layers[3].mlp.down_proj.weight, expected, atol=1e-5)
    assert torch.allclose(final.layers[1].mlp.down_proj.weight, expected, atol=1e-5)
    assert load_model(cfg, run_dir).depth == 4        # what evaluations load


def test_command_and_environment_for_an_allocation(monkeypatch):
    cfg = config("resources.nodes=2", "resources.gpus=4", "backend.nanotron.tp=2",
                 "train.batch_size=32", "tracker=wandb", "tracker.enabled=null")
    argv = render.command(cfg, Path("/r/stage0/config.yaml"), node_rank=1, master_addr="10.0.0.5",
                          master_port=29400)
    assert argv[1:] == ["-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=4",
                        "--node_rank=1", "--master_addr=10.0.0.5", "--master_port=29400",
                        "--max_restarts=0", str(ROOT / "tests" / "nanotron_stand_in.py"),
                        "--config-file", "/r/stage0/config.yaml"]
    # The orchestrator sets W&B's variables around the job; each stage's ranks get its own run id.
    wandb_keys = ("WANDB_RUN_ID", "WANDB_RUN_GROUP", "WANDB_TAGS", "WANDB_JOB_TYPE")
    for key in wandb_keys:
        monkeypatch.delenv(key, raising=False)
    with tracking.job_environment(cfg, "abc123", sweep="s1"):
        env = render.environment(cfg, 1)
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and env["LOCAL_WORLD_SIZE"] == "4"
        assert os.environ["WANDB_RUN_GROUP"] == "s1/lidas-tiny" and env["WANDB_RUN_ID"] == "abc123-stage1"
        assert "backend=nanotron" in os.environ["WANDB_TAGS"] and os.environ["WANDB_JOB_TYPE"] == "train"
    assert not any(key in os.environ for key in wandb_keys)   # restored after the job
    assert "WANDB_RUN_ID" not in render.environment(cfg, 1)   # untracked: no stage run id
    doc = render.render_stage(cfg, Path("/r"), 0, "x")
    assert (doc["parallelism"]["dp"], doc["parallelism"]["tp"]) == (4, 2)
    assert doc["tokens"]["batch_accumulation_per_replica"] == 32 // (4 * 4)
