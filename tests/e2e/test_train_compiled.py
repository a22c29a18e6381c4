"""train.compile: torch.compile's inductor builds its kernels in worker processes (tens of seconds).
The eager reference runs and the batches are test_train's."""
import dataclasses

import pytest
import torch

from jobs.backends import load_model
from jobs.checkpoint import latest_checkpoint
from jobs.train import train
from test_model import micro_cfg
from test_train import counting_batches, reference  # noqa: F401 (reference: a fixture)


def test_a_compiled_run_grows_and_matches_the_eager_run(reference, tmp_path):
    """train.compile: a LIDAS run recompiles at each growth step and learns what the eager run
    learns (not bit for bit: fused kernels round differently); its checkpoints load uncompiled."""
    cfg = micro_cfg("lidas")
    cfg.train = dataclasses.replace(cfg.train, compile=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    train(cfg, tmp_path, counting_batches)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs >= 3  # depths 2, 4, 6
    compiled, eager = latest_checkpoint(tmp_path), latest_checkpoint(reference["lidas"])
    assert [r["n_layers"] for r in compiled["history"]] == [r["n_layers"] for r in eager["history"]]
    for a, b in zip(compiled["history"], eager["history"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), a["step"]
    assert compiled["model"].keys() == eager["model"].keys()
    assert load_model(cfg, tmp_path).depth == 6
