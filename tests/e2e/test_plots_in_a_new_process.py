"""The report's figures are the same bytes when a new process draws them again. The fake store is
test_plots'."""
import subprocess
import sys
from pathlib import Path

from test_plots import SWEEP, fake_store, plot_dir

from analysis import write_report


def test_plots_are_byte_identical_on_rerun_and_in_a_new_process(tmp_path):
    root = fake_store(tmp_path / "store")
    write_report(root, SWEEP)
    first = {p.name: p.read_bytes() for p in plot_dir(root).iterdir()}
    write_report(root, SWEEP)
    assert {p.name: p.read_bytes() for p in plot_dir(root).iterdir()} == first
    subprocess.run([sys.executable, "-c", f"from analysis import write_report; write_report({str(root)!r}, {SWEEP!r})"],
                   check=True, cwd=Path(__file__).parents[2])  # the repository
    assert {p.name: p.read_bytes() for p in plot_dir(root).iterdir()} == first
    assert b"dc:date" not in first["forest.svg"]
