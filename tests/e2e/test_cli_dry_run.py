"""The command line as a process: --dry-run lists the runs and writes nothing."""
import subprocess
import sys


def test_dry_run_lists_runs_and_writes_nothing(tmp_path):
    root = tmp_path / "store"
    out = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "--dry-run",
                          f"store.root={root}"], capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if line.strip().endswith(("new", "cached"))]
    assert len(lines) == 9 and all(line.split()[-1] == "new" for line in lines)
    assert {line.split()[1] for line in lines} == {"dense", "lidas", "looped"}
    assert all("cpu=1 gpu=0" in line for line in lines)
    assert not root.exists()
