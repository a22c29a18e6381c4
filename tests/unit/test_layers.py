"""The house rules that a linter of imports cannot see: no package reaches into another one's
private names, and jobs and analysis read typed configs, never `cfg[...]` lookups. (The layers
themselves are import-linter's contracts in pyproject.toml, run by `make test`.)"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "jobs", "analysis", "orchestrator")


def modules(*packages: str):
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path, ast.parse(path.read_text(), str(path))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_another_ones_private_names(package):
    found = []
    for _, path, tree in modules(package):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                top = node.module.split(".")[0]
                private = [a.name for a in node.names if a.name.startswith("_")]
                hidden = [part for part in node.module.split(".")[1:] if part.startswith("_")]
                if top in PACKAGES and top != package and (private or hidden):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module} {private or hidden}")
    assert not found, found


@pytest.mark.parametrize("package", ["jobs", "analysis"])
def test_jobs_and_analysis_read_typed_configs(package):
    lookups = [f"{path.relative_to(ROOT)}:{node.lineno}" for _, path, tree in modules(package)
               for node in ast.walk(tree)
               if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "cfg"]
    assert not lookups, lookups
