"""Through the CLI: a micro run records the environment it ran in (runs/<id>/environment.json:
torch, the CPU kernels, the threads), the report lists it, and `train.cpu_capability` pins the CPU
kernels of every job's process, on Ray (a task's runtime_env) and in `run-one` (a Slurm array
task), without changing the run id."""
import json
import os
import subprocess

import torch
import yaml
from helpers import CLI, state, sweep

from orchestrator.config import compose_run, hydra_session
from orchestrator.identity import run_id

RUN = ["size=micro", "family=dense", "seed=0", "train.steps=10", "eval.jobs=[regbench]", "eval.regbench.instances=20",
       "tracker=none", "cluster.num_cpus=1"]


def environments(root, rid) -> list[dict]:
    return json.loads((root / "runs" / rid / "environment.json").read_text())["environments"]


def test_a_run_names_its_torch_and_cpu_kernels_and_a_pinned_capability_keeps_its_id(tmp_path):
    root = tmp_path / "store"
    done = sweep(root, *RUN, "train.cpu_capability=default", name="env")
    assert done.returncode == 0, done.stdout + done.stderr
    (rid,) = yaml.safe_load((root / "sweeps" / "env" / "sweep.yaml").read_text())["run_ids"]
    with hydra_session():
        assert rid == run_id(compose_run(RUN))  # the id of the same run on each machine's own kernels
    (entry,) = environments(root, rid)  # train and regbench ran in one environment
    env = entry["environment"]
    assert env["torch"] == torch.__version__ and env["cpu_capability"] == "DEFAULT"
    assert env["kernel_env"]["ATEN_CPU_CAPABILITY"] == "default" and env["threads"] == 1 and env["device"] == "cpu"
    assert entry["first_used"]["job"] == "train" and entry["first_used"]["attempt"] == 1
    jobs = state(root, rid)["jobs"]
    assert jobs["train"]["environment"] == jobs["regbench"]["environment"] == entry["id"]
    report = (root / "sweeps" / "env" / "report.md").read_text()
    assert f"- Environments: torch {torch.__version__}, CPU DEFAULT, 1 thread" in report

    # The same run as a Slurm array task runs it (`run-one`, no Ray): pinned, then on this machine's own kernels.
    for capability, expected in (("default", "DEFAULT"), (None, torch.backends.cpu.get_cpu_capability())):
        other = tmp_path / f"run-one-{capability}"
        (other / "runs" / rid).mkdir(parents=True)
        config = yaml.safe_load((root / "runs" / rid / "config.yaml").read_text())
        config["train"]["cpu_capability"] = capability
        (other / "runs" / rid / "config.yaml").write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        ran = subprocess.run([*CLI, "run-one", "--store", str(other), rid], capture_output=True, text=True,
                             timeout=300, env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        (entry,) = environments(other, rid)
        assert entry["environment"]["cpu_capability"] == expected
        assert entry["environment"]["kernel_env"].get("ATEN_CPU_CAPABILITY") == capability
