"""Helpers of the tests that drive the real CLI on a real local Ray: sweeps as subprocesses, the
store's files, and waiting on the store's state (never on fixed sleeps)."""
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, TypeVar

import pandas as pd

from store.store import Store

CLI = [sys.executable, "-m", "orchestrator"]
T = TypeVar("T")


def sweep(root: Path, *overrides: str, name: str = "e2e", **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "sweep", *overrides, f"store.root={root}", "--name", name],
                          capture_output=True, text=True, timeout=600, **kw)


def start_sweep(root: Path, *overrides: str, name: str = "e2e", **kw) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "sweep", *overrides, f"store.root={root}", "--name", name],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def metrics(root: Path, run_id: str) -> dict:
    return json.loads((root / "runs" / run_id / "metrics.json").read_text())["metrics"]


def state(root: Path, run_id: str) -> dict:
    return json.loads((root / "runs" / run_id / "state.json").read_text())


def history(root: Path, run_id: str) -> pd.DataFrame:
    return pd.read_parquet(root / "runs" / run_id / "history.parquet")


def wait_for(probe: Callable[[], Optional[T]], timeout: float = 300.0,
             process: Optional[subprocess.Popen] = None) -> T:
    """Poll until `probe` returns something truthy and return it; fails at once if `process`
    (the sweep being watched) exits first."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if process is not None and process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode} first:\n{process.communicate()[0]}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def running_train(root: Path, min_layers: int = 1, min_checkpoints: int = 1) -> Optional[tuple]:
    """(run id, pid, progress) of a train job running with at least `min_checkpoints`
    checkpoints whose progress reports at least `min_layers` layers, else None."""
    for state_file in sorted(root.glob("runs/*/state.json")):
        try:
            train = json.loads(state_file.read_text())["jobs"]["train"]
            progress = json.loads((state_file.parent / "progress.json").read_text())
        except (OSError, ValueError, KeyError):
            continue
        # complete checkpoints: the digest sidecar is written after the file
        checkpoints = list((state_file.parent / "checkpoints").glob("step_*.pt.sha256"))
        if (train["status"] == "running" and len(checkpoints) >= min_checkpoints
                and progress.get("job") == "train" and progress.get("n_layers", 0) >= min_layers
                and progress.get("step", 0) < progress.get("total_steps", 0)):
            return state_file.parent.name, train["pid"], progress
    return None


def resumes_after_interrupt(root: Path, *overrides: str) -> None:
    """The store's one run was interrupted in training, and the same command resumes it: done,
    with a second attempt of its train job."""
    (state_file,) = root.glob("runs/*/state.json")
    assert json.loads(state_file.read_text())["jobs"]["train"]["status"] == "interrupted"
    resumed = sweep(root, *overrides)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    state = json.loads(state_file.read_text())
    assert state["status"] == "done" and state["jobs"]["train"]["attempts"] == 2


def claims_free(root: Path) -> bool:
    store = Store(root)
    return not any(store.is_claimed(rid) for rid in store.run_ids())
