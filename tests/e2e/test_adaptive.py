"""Adaptive seeding through a real sweep (driver, Ray, store): a comparison the rule settles keeps
its verdict at later looks, recorded in sweep.yaml with the look that settled it, and its arm gets
no new seeds; the open arm and its baseline do. The statistics of the rule are tested in
tests/unit/test_sequential*.py; the evaluation here plants results with a known outcome."""
import os
import subprocess
import sys
from pathlib import Path

import yaml

PLUGINS = Path(__file__).parent.parent / "plugins"


def test_a_settled_arm_gets_no_more_seeds_and_keeps_its_verdict(tmp_path):
    env = {**os.environ, "ORCHESTRATOR_PLUGINS": "planted",
           "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "sweep", "size=micro", "family=dense,lidas,looped", "tracker=none",
         "train.steps=4", "train.warmup_steps=1", "train.log_every=2", "train.checkpoint_every=4",
         "eval.jobs=[planted]", "adaptive.metric=planted_score", "adaptive.looks=[3]", "adaptive.max_seeds=5",
         f"store.root={tmp_path}", "--name", "adaptive"],
        capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    sweep = yaml.safe_load((tmp_path / "sweeps" / "adaptive" / "sweep.yaml").read_text())
    first, second = sweep["looks"]
    assert first["verdicts"] == {"lidas/micro": "better", "looped/micro": "continue"}
    assert first["decision"] == "continue" and first["n_more"] == 2
    assert {(a["family"], a["size"]) for a in first["plan"]["open_arms"]} == {("looped", "micro"), ("dense", "micro")}
    lidas = [c for c in second["plan"]["comparisons"] if c["family"] == "lidas"]
    assert [(c["verdict"], c["settled_at_look"]) for c in lidas] == [("better", 1)]  # kept, not re-tested
    assert second["verdicts"]["looped/micro"] == "better" and second["decision"] == "stop: decisive"
    assert second["runs_saved"] == 0 and first["runs_saved"] == 2

    configs = [yaml.safe_load(p.read_text()) for p in tmp_path.glob("runs/*/config.yaml")]
    seeds = {f: sorted(c["seed"] for c in configs if c["family"]["name"] == f) for f in ("dense", "lidas", "looped")}
    assert seeds == {"dense": [0, 1, 2, 3, 4], "lidas": [0, 1, 2], "looped": [0, 1, 2, 3, 4]}
    report = (tmp_path / "sweeps" / "adaptive" / "report.md").read_text()
    assert "lidas/micro: better (settled at look 1)" in report and "2 runs were not started" in report
