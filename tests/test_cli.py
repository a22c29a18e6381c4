"""The command line: bad input fails with one line and exit 2 before anything is written."""
import subprocess
import sys

import pytest

from orchestrator.cli import main


@pytest.mark.parametrize("argv, needle", [
    (["sweep", "family=foo"], "family=foo: no such family; choose one of: dense, lidas, looped"),
    (["sweep", "seed=-2"], "seed=-2: must be a non-negative integer"),
    (["sweep", "train.steps=abc"], "train.steps=abc: expected integer"),
    (["sweep", "model.n_kv_heads=3"], "must divide model.n_heads"),
    (["sweep", "seed=$(touch pwned)"], "malformed override"),
    (["sweep", "--dry-run", "family=dense", "seed=x,1"], "expected integer"),
])
def test_bad_sweep_exits_2_with_one_line_and_writes_nothing(argv, needle, tmp_path, capsys):
    root = tmp_path / "store"
    assert main(argv + [f"store.root={root}"]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error:") and needle in out and len(out.splitlines()) == 1
    assert not root.exists() and not (tmp_path / "pwned").exists()


def test_status_and_report_on_an_empty_store_exit_1(tmp_path, capsys):
    assert main(["status", "--store", str(tmp_path / "nothing")]) == 1
    assert "no sweeps in" in capsys.readouterr().out
    assert main(["report", "nope", "--store", str(tmp_path / "nothing")]) == 1
    assert "no sweep named 'nope'" in capsys.readouterr().out


def test_dry_run_lists_runs_and_writes_nothing(tmp_path):
    root = tmp_path / "store"
    out = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "--dry-run",
                          f"store.root={root}"], capture_output=True, text=True, check=True).stdout
    lines = [l for l in out.splitlines() if l.strip().endswith(("new", "cached"))]
    assert len(lines) == 9 and all(l.split()[-1] == "new" for l in lines)
    assert {l.split()[1] for l in lines} == {"dense", "lidas", "looped"}
    assert all("cpu=1 gpu=0" in l for l in lines)
    assert not root.exists()
