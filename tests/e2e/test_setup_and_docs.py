"""`make setup` takes torch from TORCH_INDEX (the CPU build's index, say) and everything else from
the default index; the manual is built into site/ and reads from file:// (page.html links, the
offline search index)."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]  # the repository


def pip_installs(*variables: str) -> list[str]:
    """The pip install lines `make setup` would run (make -n: nothing runs)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    out = subprocess.run(["make", "-n", "-B", "setup", *variables], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if "pip install" in line and "--upgrade pip" not in line]


def test_torch_index_reaches_the_torch_install_only():
    cpu = "https://download.pytorch.org/whl/cpu"
    torch, project = pip_installs(f"TORCH_INDEX={cpu}")
    assert re.search(rf"--index-url {re.escape(cpu)} torch==", torch)
    assert "index-url" not in project and "-c requirements.lock" in project
    assert not any("index-url" in line for line in pip_installs())  # empty: the default index


def test_the_docs_site_is_built_into_site_and_works_from_files():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["site_dir"] == "site" and config["use_directory_urls"] is False
    assert "offline" in config["plugins"]
    assert "site/" in (ROOT / ".gitignore").read_text().splitlines()
