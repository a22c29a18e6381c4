"""The nanotron backend's checks that need no side environment: what a machine without the pinned
nanotron is told, and the attention implementation (rendered and validated). nanotron's own loader
on our rendered configs: tests/e2e/test_nanotron_loader.py."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import nanotron_side
from jobs.nanotron import render, schema
from orchestrator.config import ConfigError, RunConfig, compose_run, hydra_session

RUN_DIR = Path("/store/runs")


def compose(cell: str, *overrides: str) -> RunConfig:
    """The nanotron run of `cell` (family-size), as tests/e2e/test_nanotron_loader.py composes it."""
    family, size = cell.split("-")
    with hydra_session():
        return compose_run(["backend=nanotron", "tracker=none", "seed=3", f"family={family}", f"size={size}",
                            *overrides])


def test_a_machine_without_the_pinned_nanotron_is_told_how_to_get_it(monkeypatch, tmp_path):
    """No side environment and no wheel (no ../shared): a skip saying what is missing and the
    line that gets it, outside CI; a failure in CI, which always has ../shared. A wheel without
    the environment: a failure naming `make nanotron-env`."""
    monkeypatch.setattr(nanotron_side, "STAMP", tmp_path / "no-venv" / ".installed")
    monkeypatch.setattr(nanotron_side, "WHEEL", tmp_path / "no-shared" / "nanotron-0.4-py3-none-any.whl")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        nanotron_side.side_python()
    line = str(skipped.value)
    assert "\n" not in line and "nanotron at the pinned commit is missing" in line
    assert f"get it: pip wheel --no-deps -w {nanotron_side.VENDOR} git+https://github.com/huggingface/" \
           f"nanotron@{schema.NANOTRON_COMMIT} && make nanotron-env" in line
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI always has ../shared"):
        nanotron_side.side_python()
    nanotron_side.WHEEL.parent.mkdir()
    nanotron_side.WHEEL.write_bytes(b"")
    with pytest.raises(pytest.fail.Exception, match="run `make nanotron-env`"):
        nanotron_side.side_python()


def test_attn_implementation_is_rendered_and_validated():
    cfg = compose("dense-360m")
    assert cfg.backend.nanotron.attn_implementation == "flash_attention_2"    # conf/'s default
    assert render.model_config(cfg, 2)["_attn_implementation"] == "flash_attention_2"
    assert render.model_config(compose("dense-360m", "backend.nanotron.attn_implementation=sdpa"),
                               2)["_attn_implementation"] == "sdpa"
    with pytest.raises(ConfigError, match=re.escape(
            "backend.nanotron.attn_implementation=xformers: not allowed; choose one of: "
            "flash_attention_2, sdpa, flex_attention")):
        compose("dense-360m", "backend.nanotron.attn_implementation=xformers")
    # Past composition (a config built by hand), the render refuses it.
    nanotron = dataclasses.replace(cfg.backend.nanotron, attn_implementation="xformers")
    cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, nanotron=nanotron))
    with pytest.raises(schema.SchemaError, match=re.escape(
            "model.model_config._attn_implementation=xformers: nanotron accepts flash_attention_2, sdpa, "
            "flex_attention")):
        render.render_stage(cfg, RUN_DIR, 0, "r")
