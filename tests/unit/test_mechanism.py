"""The mechanism over training: heads followed through growth (lineage), duplicated layers and their
divergence from their sources, the top heads kept since formation on hand-built head tables, and
per-step metrics as the job contract declares them."""
import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from config.evals import InductionSettings, MechanismSettings
from jobs.checkpoint import snapshots
from jobs.evals import EVALUATIONS
from jobs.evals.induction import top_heads
from jobs.evals.mechanism import Heads, kept_in_top, layer_divergence, score, snapshot_model
from jobs.families import family_of
from jobs.train import train
from test_induction import DATA
from test_model import grow, micro_cfg, trained_lidas
from test_train import counting_batches

EVAL = SimpleNamespace(induction=InductionSettings(sequences=8, length=6, top_k=4, ancestors_m=2),
                       mechanism=MechanismSettings(divergence_batch=4))


def mechanism_cfg(family: str) -> SimpleNamespace:
    """micro_cfg over the RegBench vocabulary, with what the evaluation reads."""
    cfg = micro_cfg(family)
    cfg.model = dataclasses.replace(cfg.model, vocab_size=DATA.vocab_size)
    cfg.data, cfg.eval = DATA, EVAL
    return cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    runs = {}
    for family in ("dense", "lidas", "looped"):
        runs[family] = tmp_path_factory.mktemp(family)
        train(mechanism_cfg(family), runs[family], counting_batches)
    return runs


def test_lineage_and_duplicates_follow_the_modules_through_three_growths():
    """Each layer is made distinct before each growth; after it, every layer equals the layer of the
    earlier network that `lineage` names, and each pair of `duplicates` holds the same two modules
    as when the growth that made it ran, however often the network grew since."""
    cfg = micro_cfg("lidas")
    cfg.model = dataclasses.replace(cfg.model, n_layers=8)
    family = family_of(cfg.family)
    model, optimizer = trained_lidas(cfg, steps=0)
    made: list[tuple[int, int]] = []  # the modules of each pair, oldest pair first
    for _ in range(3):
        with torch.no_grad():
            for i, layer in enumerate(model.layers):
                layer.mlp.down_proj.weight.add_(i + 1.0)
        before = [layer.mlp.down_proj.weight.clone() for layer in model.layers]
        optimizer = grow(model, optimizer, cfg)
        depth = len(model.layers)
        for layer, source in zip(model.layers, family.lineage(len(before), depth)):
            assert torch.equal(layer.mlp.down_proj.weight, before[source])
        pairs = family.duplicates(depth)
        modules = [(id(model.layers[copy_]), id(model.layers[source])) for copy_, source in pairs]
        assert len(pairs) == depth - 2 and modules[:len(made)] == made
        for copy_, source in pairs[len(made):]:  # this growth's: exact copies
            assert torch.equal(model.layers[copy_].mlp.down_proj.weight, model.layers[source].mlp.down_proj.weight)
        made = modules
    assert family.lineage(2, 8) == [0, 1, 0, 1, 0, 1, 0, 1] == family.ancestors(cfg.model, 30, 8)
    assert family.duplicates(2) == [] and family_of(micro_cfg("dense").family).duplicates(6) == []
    with pytest.raises(ValueError):
        family.lineage(2, 5)


def test_divergence_is_zero_right_after_a_growth_and_grows_with_training(trained):
    cfg = mechanism_cfg("lidas")
    result = score(cfg, snapshots(trained["lidas"]))
    m = result.metrics
    assert m["layer_divergence_weight_step5"] == 0 and m["layer_divergence_output_step5"] == 0  # the growth at 5
    assert m["layer_divergence_weight_step7"] > 0 and m["layer_divergence_output_step7"] > 0
    assert m["layer_divergence_weight"] == m["layer_divergence_weight_step30"] > m["layer_divergence_weight_step7"]
    # at 15 the network grew again: its new pairs are exact copies, the pair made at 5 has moved
    state = next(s for s in snapshots(trained["lidas"]) if s["step"] == 15)
    model, batch = snapshot_model(cfg, state), torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(0))
    new, old = family_of(cfg.family).duplicates(6)[2:], family_of(cfg.family).duplicates(6)[:2]
    assert layer_divergence(model, new, batch) == (0.0, 0.0) and min(layer_divergence(model, old, batch)) > 0
    assert result.curves["layer_divergence_weight_by_step"]["step"] == [5, 7, 15, 22, 30]
    assert "ancestry_p_step5" in m and "ancestry_p_step30" in m


def test_what_every_family_records_at_its_snapshots(trained):
    """Per-step induction_max for every family; a dense run records no ancestry and no divergence;
    heads that never formed leave top_kept NaN (a micro model on counting sequences forms none)."""
    dense = score(mechanism_cfg("dense"), snapshots(trained["dense"]))
    assert sorted(k for k in dense.metrics if k.startswith("induction_max_step")) == [
        f"induction_max_step{t}" for t in (15, 22, 30, 7)]
    assert not any(k.startswith(("ancestry", "layer_divergence")) for k in dense.metrics)
    assert dense.metrics["induction_max_step30"] < 0.5 and math.isnan(dense.metrics["induction_formed_step"])
    assert math.isnan(dense.metrics["induction_top_kept"]) and math.isnan(dense.metrics["induction_top_kept_p"])
    heads = pd.DataFrame(dense.curves["heads_by_step"])
    assert len(heads) == 4 * 6 * 4 and heads.groupby("step")["top"].sum().tolist() == [4] * 4
    assert set(dense.curves) == {"induction_by_step", "heads_by_step"}
    specs, _ = EVALUATIONS["mechanism"].specs_of(dense)
    assert specs["induction_max_step22"]["label"] == "best induction-head score at step 22"
    assert specs["induction_max_step22"]["step"] == 22 and "step" not in specs["induction_top_kept"]
    assert score(mechanism_cfg("dense"), []).metrics == {}  # no snapshots (nanotron, or switched off)
    looped = score(mechanism_cfg("looped"), snapshots(trained["looped"]))  # heads per application
    assert pd.DataFrame(looped.curves["heads_by_step"])["iteration"].max() == 1
    assert "induction_max_step30" in looped.metrics and not any(k.startswith("layer_div") for k in looped.metrics)


def test_an_undeclared_or_malformed_per_step_name_is_refused():
    job = EVALUATIONS["mechanism"]
    assert job.spec_of("induction_max_step0").label == "best induction-head score at step 0"
    for name in ("induction_max_step", "induction_max_stepx", "induction_max_step-1", "induction_mean_step5"):
        assert job.spec_of(name) is None
    with pytest.raises(ValueError, match="without declaring"):
        job.specs_of(SimpleNamespace(metrics={"induction_max_stepx": 1.0}, curves={}))
    assert not any("{step}" in name for name in job.outcomes())


def _heads(step: int, layers: int, scores: list[float], k: int = 4) -> Heads:
    """A head table of `layers` layers of 2 heads (plan = layers), with these scores."""
    table = pd.DataFrame({"layer": np.repeat(np.arange(layers), 2), "iteration": 0,
                          "head": np.tile([0, 1], layers), "score": scores})
    return Heads(step, layers, table, top_heads(table, k))


def test_top_kept_on_hand_built_tables_of_a_network_that_does_not_grow():
    dense = family_of(micro_cfg("dense").family)
    formed = _heads(100, 6, [.9, .8, .7, .6, 0, 0, 0, 0, 0, 0, 0, 0])
    same = _heads(300, 6, [.95, .85, .75, .65, 0, 0, 0, 0, 0, 0, 0, 0.1])
    share, chance, p = kept_in_top(dense, formed, same, seed=0)
    assert (share, p) == (1.0, 1 / math.comb(12, 4)) and math.isclose(chance, 4 / 12)
    half = _heads(300, 6, [.95, .85, 0, 0, .75, .65, 0, 0, 0, 0, 0, 0])
    share, chance, p = kept_in_top(dense, formed, half, seed=0)
    at_least_two = sum(math.comb(4, i) * math.comb(8, 4 - i) for i in (2, 3, 4)) / math.comb(12, 4)
    assert share == 0.5 and math.isclose(p, at_least_two)


def test_top_kept_follows_heads_through_a_growth():
    """Formed in the 4-layer network (top: layers 1 and 3), kept by the 6-layer one through its
    copies: layer 3 is the copy of layer 1, layer 5 is the old layer 3; layer 4 (a copy of layer
    2, not top when heads formed) is not kept."""
    lidas = family_of(micro_cfg("lidas", initial_blocks=2).family)
    formed = _heads(100, 4, [0, 0, .9, .8, 0, 0, .7, .6])
    later = _heads(300, 6, [0, 0, .9, 0, 0, 0, .8, 0, .7, 0, .6, 0])  # L1.H0, L3.H0, L4.H0, L5.H0
    share, chance, p = kept_in_top(lidas, formed, later, seed=0)
    assert share == 0.75
    continuing = 2 + 2 + 2  # heads of layers 1, 3 (copy of 1) and 5 (old 3) continue a top head
    assert math.isclose(chance, continuing / 12)
    assert 0 < p < 1
