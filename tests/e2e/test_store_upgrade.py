"""A store written by the code before format 4 (tests/data/store_v3, its README says which commit)
is read as it is, upgraded in place by the first command that writes, and loses nothing."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import analysis
from analysis.load import load_history
from orchestrator.cli import main
from orchestrator.upgrade import upgrade
from store.layout import FORMAT_VERSION, OWNER
from store.store import Store

FIXTURE = Path(__file__).parent.parent / "data" / "store_v3"
SWEEP = "fixture"


@pytest.fixture
def v3(tmp_path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(FIXTURE, root)
    return root


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def tables(root: Path) -> dict[str, pd.DataFrame]:
    return {"values": analysis.load(root, SWEEP), "runs": analysis.load_runs(root, SWEEP),
            "items": analysis.load_items(root, SWEEP), "history": load_history(root, SWEEP)}


def test_upgrade_rewrites_only_store_json_and_the_analysis_reads_the_same_rows(v3):
    before, files_before = tables(v3), files(v3)
    assert len(before["values"]) and set(before["runs"]["status"]) == {"done"}
    store = Store(v3)
    assert store.check() == 3
    assert upgrade(store) is True
    assert json.loads((v3 / "store.json").read_text()) == {"store": OWNER, "format_version": FORMAT_VERSION}
    assert store.check() == FORMAT_VERSION and upgrade(store) is False  # idempotent
    after = files(v3)
    assert {k: v for k, v in after.items() if k != "store.json"} == \
        {k: v for k, v in files_before.items() if k != "store.json"}
    for name, table in tables(v3).items():
        pd.testing.assert_frame_equal(table, before[name], obj=name)


def test_status_reads_a_format_3_store_without_writing(v3, capsys):
    before = files(v3)
    assert main(["status", SWEEP, "--store", str(v3)]) == 0
    assert "done 4" in capsys.readouterr().out
    assert files(v3) == before


def test_report_upgrades_a_format_3_store_and_reports_it(v3, capsys):
    assert main(["report", SWEEP, "--store", str(v3)]) == 0
    assert "report:" in capsys.readouterr().out
    assert json.loads((v3 / "store.json").read_text())["store"] == OWNER
    assert (v3 / "sweeps" / SWEEP / "report.md").is_file()
