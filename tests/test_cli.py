"""The command line (bad input, one line per case with its exit code: tests/test_bad_input.py)."""
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


def test_every_store_command_takes_store_root_as_sweep_does(tmp_path, capsys):
    from orchestrator.cli import main
    from orchestrator.store import Store

    store = Store(tmp_path / "s")
    store.create()
    store.record_sweep("one", ["seed=0"], [])
    for argv in (["status", f"store.root={store.root}"], ["status", "one", "--store", str(store.root)],
                 ["cancel", "one", f"store.root={store.root}"]):
        assert main(argv) == 0, argv
        assert "sweep one" in capsys.readouterr().out
    assert main(["report", "one", f"store.root={store.root}"]) == 1  # found; nothing finished yet
    assert "no finished runs yet" in capsys.readouterr().out
    assert main(["status", f"store.root={tmp_path / 'nowhere'}"]) == 1
    assert "no sweeps in" in capsys.readouterr().out
