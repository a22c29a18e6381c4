"""The command line as a process: --dry-run lists the runs and writes nothing."""
import subprocess
import sys


def test_dry_run_lists_runs_and_writes_nothing(tmp_path):
    root = tmp_path / "store"
    out = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "--dry-run",
                          f"store.root={root}"], capture_output=True, text=True, check=True).stdout
    lines = [l for l in out.splitlines() if l.strip().endswith(("new", "cached"))]
    assert len(lines) == 9 and all(l.split()[-1] == "new" for l in lines)
    assert {l.split()[1] for l in lines} == {"dense", "lidas", "looped"}
    assert all("cpu=1 gpu=0" in l for l in lines)
    assert not root.exists()
