"""Adding an evaluation is one file: one registered from outside the project runs in a real sweep
(driver and Ray workers), appears in the report with its declared label and direction, and
changes no run id, so adding it to a finished sweep retrains nothing; changing its settings
reruns it alone."""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

PLUGINS = Path(__file__).parent.parent / "plugins"
GRID = ["size=micro", "family=dense,lidas", "seed=0", "tracker=none", "train.steps=8", "train.warmup_steps=1",
        "train.log_every=2", "train.checkpoint_every=4"]


def sweep(root: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORCHESTRATOR_PLUGINS": "weight_norm",
           "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "orchestrator", "sweep", *GRID, *overrides, f"store.root={root}",
                           "--name", "ext"], capture_output=True, text=True, timeout=600, env=env)


def states(root: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in root.glob("runs/*/state.json")}


def test_a_plugin_evaluation_runs_and_is_reported_without_retraining(tmp_path):
    root = tmp_path / "store"
    first = sweep(root, "eval.jobs=[regbench]")
    assert first.returncode == 0, first.stdout + first.stderr
    ids = set(yaml.safe_load((root / "sweeps" / "ext" / "sweep.yaml").read_text())["run_ids"])

    added = sweep(root, "eval.jobs=[regbench,weight_norm]")
    assert added.returncode == 0, added.stdout + added.stderr
    assert set(yaml.safe_load((root / "sweeps" / "ext" / "sweep.yaml").read_text())["run_ids"]) == ids
    for rid, state in states(root).items():
        assert state["jobs"]["train"]["attempts"] == 1  # not retrained
        assert state["jobs"]["weight_norm"]["status"] == "done" and state["jobs"]["weight_norm"]["settings"]
        recorded = json.loads((root / "runs" / rid / "metrics.json").read_text())
        assert recorded["specs"]["embedding_norm"] == {"label": "embedding norm (scaled)", "higher_is_better": False,
                                                       "section": "Weight norm"}
        assert recorded["metrics"]["embedding_norm"] > 0
    report = (root / "sweeps" / "ext" / "report.md").read_text()
    weight_norm = report.split("\n## Weight norm\n")[1].split("\n## ")[0]  # its own section, titled where registered
    assert "<summary>embedding norm (scaled) (<code>embedding_norm</code>, lower is better)</summary>" in weight_norm
    assert "**embedding norm (scaled) against dense** (exploratory, Benjamini-Hochberg):" in weight_norm

    before = {rid: json.loads((root / "runs" / rid / "metrics.json").read_text())["metrics"]["embedding_norm"]
              for rid in ids}
    scaled = sweep(root, "eval.jobs=[regbench,weight_norm]", "eval.weight_norm.scale=2")
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    for rid, state in states(root).items():
        assert state["jobs"]["train"]["attempts"] == 1 and state["jobs"]["regbench"]["attempts"] == 1
        assert state["jobs"]["weight_norm"]["attempts"] == 2  # its settings changed: it alone reran
        after = json.loads((root / "runs" / rid / "metrics.json").read_text())["metrics"]["embedding_norm"]
        assert after == 2 * before[rid]
