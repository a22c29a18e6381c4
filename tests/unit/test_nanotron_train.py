"""The backend=nanotron job's launch: the torchrun command and environment of an allocation, with
a CPU stand-in for nanotron's run_train.py (tests/nanotron_stand_in.py). The stage loop through
real torchrun processes: tests/e2e/test_nanotron_train_torchrun.py."""
import os
from pathlib import Path

from jobs.nanotron import render
from orchestrator import tracking
from orchestrator.config import RunConfig, compose_run, hydra_session

ROOT = Path(__file__).resolve().parents[2]  # the repository


def config(*overrides: str) -> RunConfig:
    with hydra_session():
        return compose_run(["size=tiny", "family=lidas", "tracker=none", "backend=nanotron",
                            "model.n_layers=4", "family.growth.initial_blocks=1", "data.warmup=null",
                            "train.steps=12", "train.warmup_steps=2",
                            "train.checkpoint_every=4", "resources.gpus=1",
                            "backend.nanotron.micro_batch_size=4",
                            f"backend.nanotron.run_train={ROOT / 'tests' / 'nanotron_stand_in.py'}",
                            *overrides])


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
