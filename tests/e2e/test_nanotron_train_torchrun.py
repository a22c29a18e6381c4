"""The backend=nanotron job's stage loop through real torchrun processes, with a CPU stand-in
for nanotron's run_train.py (tests/nanotron_stand_in.py): completion and resume are decided
from the checkpoint folders, growth happens by surgery between stages, and the final
checkpoint loads into the torch model for evaluation. The config is test_nanotron_train's."""
import pytest
import torch
import yaml

from jobs.backends import load_model
from jobs.launch import LaunchError
from jobs.model import Decoder
from jobs.nanotron import bridge, render, train
from test_nanotron_train import ROOT, config


def in_process(entry: list, *, env: dict, on_line, **_) -> None:
    """The stand-in without torchrun, for the legs that do not test the launch itself (each
    torchrun launch costs seconds on these CPUs)."""
    import contextlib
    import io
    import os
    import sys

    import nanotron_stand_in
    out, saved = io.StringIO(), (sys.argv, dict(os.environ))
    sys.argv = entry
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out):
            code = nanotron_stand_in.main()
    finally:
        sys.argv = saved[0]
        os.environ.clear()
        os.environ.update(saved[1])
    for line in out.getvalue().splitlines():
        on_line(line)
    if code:
        raise LaunchError(out.getvalue().splitlines()[-1])


def test_stages_resume_from_their_folders_and_grow_by_surgery(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    cfg, run_dir = config(), tmp_path / "runs" / "abc123"
    assert [(s.end_step, s.n_layers) for s in render.stages(cfg)] == [(4, 2), (12, 4)]

    monkeypatch.setenv("STAND_IN_FAIL_AFTER", "8")               # stage 1 crashes after step 8
    with pytest.raises(LaunchError, match="stand-in crash"):
        train.train_job(cfg, run_dir, None, run=in_process)
    stage1 = yaml.safe_load((render.stage_dir(run_dir, 1) / "config.yaml").read_text())
    assert stage1["checkpoints"]["resume_checkpoint_path"] == str(render.stage_dir(run_dir, 1) / "grown")
    assert stage1["checkpoints"]["load_optimizer"] is False       # fresh moments after growth
    assert stage1["model"]["model_config"]["num_hidden_layers"] == 4
    assert train.stage_start(cfg, run_dir, 0) is None             # stage 0 is done
    assert train.stage_start(cfg, run_dir, 1) == (render.stage_dir(run_dir, 1) / "checkpoints", True)

    monkeypatch.delenv("STAND_IN_FAIL_AFTER")
    progress = []                                  # resumes stage 1 at step 8, through torchrun
    result = train.train_job(cfg, run_dir, progress.append)
    assert [p["step"] for p in progress] == [9, 10, 11, 12]
    assert list(result.history["step"]) == list(range(1, 13))
    assert result.history["loss"].iloc[-1] == pytest.approx(10 / 12, rel=1e-2)
    assert result.curves["ancestors"] == [0, 1, 0, 1]

    # The final weights: stage 0's 4 steps, grown, then 8 more steps, all of +1e-3 each.
    final = bridge.import_model(cfg, render.stage_dir(run_dir, 1) / "checkpoints")
    torch.manual_seed(cfg.seed)
    start = Decoder(cfg.model, 2, [0, 1])
    assert final.depth == 4 and final.ancestors == [0, 1, 0, 1]
    expected = start.layers[1].mlp.down_proj.weight + 12e-3
    assert torch.allclose(final.layers[3].mlp.down_proj.weight, expected, atol=1e-5)
    assert torch.allclose(final.layers[1].mlp.down_proj.weight, expected, atol=1e-5)
    assert load_model(cfg, run_dir).depth == 4        # what evaluations load
