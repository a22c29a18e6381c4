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


def test_dry_run_of_init_by_data_seeds_plans_four_distinct_runs(tmp_path):
    """init_seed=0,1 data_seed=0,1 replaces the default seed axis: 4 runs at seed 0, the one whose
    seeds are all 0 with the id it had before these keys existed (docs/sweeps.md "Seeds")."""
    out = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "family=dense", "size=micro",
                          "init_seed=0,1", "data_seed=0,1", "--dry-run", f"store.root={tmp_path / 'store'}"],
                         capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if line.strip().endswith(("new", "cached"))]
    assert len(lines) == 4 and len({line.split()[0] for line in lines}) == 4
    assert {tuple(line.split()[3:6]) for line in lines} == {
        ("seed=0", f"init_seed={i}", f"data_seed={d}") for i in (0, 1) for d in (0, 1)}
    assert "f7e14d267636" in {line.split()[0] for line in lines}
    assert "sweep family-dense_size-micro: 4 runs" in out
