"""Init and data-order seeds: `init_seed` and `data_seed` (null: `seed`) in the config, the run id,
the jobs (initial weights against training batches), the analysis (seed axes, not cells; pairing on
both) and the variance decomposition of the report."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from analysis import analyse, compare, load, write_report
from analysis.stats import cell_keys, seed_sources, variance_components
from orchestrator import grid
from orchestrator.config import ConfigError, compose_run, compose_runs, hydra_session
from orchestrator.identity import run_id, run_ids, run_label
from test_analysis_load import new_store, write_run, write_sweep

# Run ids computed on main before init_seed and data_seed existed: they must never change (the tiny
# default's regime changed since, so its run is pinned through experiment=miniature, which kept its ids).
IDS_BEFORE = {("family=dense", "size=micro", "seed=0"): "f7e14d267636",
              ("family=dense", "size=micro", "seed=1"): "71556efff668",
              ("family=lidas", "size=tiny", "seed=2", "experiment=miniature"): "7c758dffdd29",
              ("family=looped", "size=micro", "seed=7", "data=arith"): "94de6979daca"}


@pytest.fixture
def hydra():
    with hydra_session():
        yield


def test_default_seed_keys_keep_every_id_of_before(hydra):
    for overrides, before in IDS_BEFORE.items():
        cfg = compose_run(list(overrides))
        assert cfg.init_seed is None and cfg.data_seed is None
        assert cfg.effective_init_seed == cfg.effective_data_seed == cfg.seed
        assert run_id(cfg) == before, overrides
        seed = cfg.seed  # spelled out as equal to the seed: the effective seeds are the same, so is the run
        assert run_id(compose_run([*overrides, f"init_seed={seed}", f"data_seed={seed}"])) == before
        assert run_id(compose_run([*overrides, f"init_seed={seed}"])) == before


def test_settings_added_to_a_format1_evaluation_keep_every_id_and_rerun_only_it(hydra):
    """eval.ablation.ks came after format 1: no value of it changes a run id; it is recorded with
    the ablation's result instead, so changing it reruns that evaluation alone."""
    from orchestrator.identity import outside_run_id, semantic_config, settings_digest

    for overrides, before in IDS_BEFORE.items():
        for ks in ([1, 2, 4, 8], [2], [1, 16, 1024]):
            cfg = compose_run([*overrides, f"eval.ablation.ks=[{','.join(map(str, ks))}]"])
            assert cfg.eval.ablation.ks == ks and run_id(cfg) == before, (overrides, ks)
    default, other = (compose_run(["family=dense", "size=micro", *extra]) for extra in ([], ["eval.ablation.ks=[2]"]))
    assert "ks" not in semantic_config(default)["eval"]["ablation"]
    assert settings_digest(default, "ablation") != settings_digest(other, "ablation")
    assert all(settings_digest(default, job) == settings_digest(other, job) for job in ("regbench", "induction"))
    assert outside_run_id("eval.ablation.ks") and not outside_run_id("eval.ablation.fraction")
    assert not outside_run_id("eval.ablation") and outside_run_id("eval.noop.anything")


def test_init_and_data_seeds_are_each_in_the_id_when_they_differ(hydra):
    base = ["family=dense", "size=micro", "seed=0"]
    ids = {run_id(compose_run([*base, f"init_seed={i}", f"data_seed={d}"])) for i in (0, 1) for d in (0, 1)}
    assert len(ids) == 4
    # the same effective seeds, spelled two ways, are one run: init 1 and data 0 at seed 0
    assert run_id(compose_run([*base, "init_seed=1"])) == run_id(compose_run([*base, "init_seed=1", "data_seed=0"]))
    # evaluations follow `seed`: the same init and data seeds at another seed are another run
    assert run_id(compose_run([*base, "init_seed=1", "data_seed=1"])) != run_id(compose_run(["family=dense",
                                                                                             "size=micro", "seed=1"]))
    with pytest.raises(ConfigError, match="init_seed"):
        compose_run([*base, "init_seed=-1"])


def test_a_grid_of_init_by_data_seeds_plans_four_runs_in_the_sweep_of_its_seeds():
    points, name = grid.expand(["family=dense", "size=micro", "init_seed=0,1", "data_seed=0,1"])
    configs = [p.config for p in points]
    assert sorted((c.seed, c.init_seed, c.data_seed) for c in configs) == [(0, i, d) for i in (0, 1) for d in (0, 1)]
    assert len({run_id(c) for c in configs}) == 4
    assert IDS_BEFORE[("family=dense", "size=micro", "seed=0")] in {run_id(c) for c in configs}
    assert name == grid.expand(["family=dense", "size=micro", "seed=0,1"])[1] == "family-dense_size-micro"
    crossed, _ = grid.expand(["family=dense", "size=micro", "seed=0,1", "init_seed=0,1"])  # seed given: crossed
    assert len(crossed) == 4


def test_ids_of_a_batch_are_those_of_each_config(hydra):
    """run_ids renders groups of seed variants once; whether an init or data seed is in the id
    depends on the seed, so those render whole and still agree with run_id."""
    configs = compose_runs([["family=dense", "size=micro", f"seed={s}", f"init_seed={i}"]
                            for s in (0, 1, 2) for i in (0, 1)])
    configs += compose_runs([["family=dense", "size=micro", f"seed={s}"] for s in (0, 1, 2)])
    assert run_ids(configs) == [run_id(c) for c in configs]
    assert run_label(configs[1]) == "dense-micro-s0-i1" and run_label(configs[0]) == "dense-micro-s0"


def _first_batch_and_weights(monkeypatch, tmp_path: Path, overrides: list[str]) -> tuple[torch.Tensor, dict]:
    """What the torch backend trains from: the first batch of the stream it builds and the model's
    initial parameters (jobs/train.py `restore` on an empty run directory)."""
    import jobs.backends.torch as backend
    from jobs.train import restore
    seen: dict = {}

    def fake_train(cfg, run_dir, batches, progress, validation=None):
        seen["batch"] = batches(0)[0]
        model, _, _ = restore(cfg, run_dir, torch.device("cpu"))
        seen["weights"] = {k: v.clone() for k, v in model.state_dict().items()}
        return {"history": [], "ancestors": {}}
    monkeypatch.setattr(backend, "train", fake_train)
    with hydra_session():
        cfg = compose_run(["family=dense", "size=micro", *overrides])
    run_dir = tmp_path / "_".join(overrides)
    run_dir.mkdir()
    backend.TorchBackend().train(cfg, run_dir, None)
    return seen["batch"], seen["weights"]


def _same_weights(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_init_seed_moves_the_weights_and_data_seed_the_batches(monkeypatch, tmp_path):
    batch, weights = _first_batch_and_weights(monkeypatch, tmp_path, ["seed=0"])
    batch_i, weights_i = _first_batch_and_weights(monkeypatch, tmp_path, ["seed=0", "init_seed=1"])
    batch_d, weights_d = _first_batch_and_weights(monkeypatch, tmp_path, ["seed=0", "data_seed=1"])
    batch_s, weights_s = _first_batch_and_weights(monkeypatch, tmp_path, ["seed=1"])
    assert torch.equal(batch_i, batch) and not _same_weights(weights_i, weights)
    assert not torch.equal(batch_d, batch) and _same_weights(weights_d, weights)
    # init seed 1 starts where seed 1 starts; data seed 1 reads what seed 1 reads
    assert _same_weights(weights_i, weights_s) and torch.equal(batch_d, batch_s)


# ---- analysis ----------------------------------------------------------------------------------

INIT_EFFECT = {0: 0.0, 1: 0.2}
DATA_EFFECT = {0: 0.0, 1: 0.05, 2: -0.03}


def _crossed_store(root: Path, families=("dense", "lidas"), gap: float = -0.1) -> Path:
    """Each family at seed 0 with init seeds {0, 1} x data seeds {0, 1, 2}; lidas is dense + gap on
    every (init, data) pair, so pairing on both seeds gives differences without spread."""
    new_store(root)
    ids = []
    for family in families:
        for i in INIT_EFFECT:
            for d in DATA_EFFECT:
                rid = f"{family[0]}{i}{d}"
                value = 0.5 + INIT_EFFECT[i] + DATA_EFFECT[d] + 0.01 * i * d + (gap if family == "lidas" else 0.0)
                write_run(root, rid, family, "tiny", 0, {"regbench_tvd": value})
                config = root / "runs" / rid / "config.yaml"
                resolved = yaml.safe_load(config.read_text()) | {"init_seed": i, "data_seed": d}
                config.write_text(yaml.safe_dump(resolved))
                ids.append(rid)
    write_sweep(root, "x", ids, "2025-01-01T00:00:00", ["family=dense,lidas", "init_seed=0,1", "data_seed=0,1,2"])
    return root


def test_init_and_data_seeds_are_seed_axes_and_pairing_is_on_both(tmp_path):
    root = _crossed_store(tmp_path / "s")
    values = load(root, "x")
    assert {"init_seed", "data_seed", "config_seed"} <= set(values.columns)
    assert cell_keys(values) == []
    # a unit per (init, data): the run whose init and data seeds are its seed keeps it, the others follow
    units = values[values["family"] == "dense"].set_index(["init_seed", "data_seed"])["seed"]
    assert units[(0, 0)] == 0 and sorted(units) == list(range(6))
    assert (values.groupby(["init_seed", "data_seed"])["seed"].nunique() == 1).all()  # same unit in both families
    comparison = compare(values, "dense", "paired", ["regbench_tvd"]).iloc[0]
    assert comparison["n_pairs"] == 6
    assert comparison["raw_diff"] == pytest.approx(-0.1) and comparison["diff_std"] == pytest.approx(0, abs=1e-12)


def test_a_run_spelling_its_seeds_as_the_seed_is_a_plain_seed(tmp_path):
    """Mixed in a selection: plain runs (seeds 0..2, no init or data seed, or one equal to the seed)
    keep their seed; a crossed run is numbered after them."""
    root = new_store(tmp_path / "s")
    for s in range(3):
        write_run(root, f"d{s}", "dense", "tiny", s, {"regbench_tvd": 0.5})
    for rid, seed, init in (("e", 1, 1), ("f", 0, 4)):
        write_run(root, rid, "dense", "tiny", seed, {"regbench_tvd": 0.5})
        config = root / "runs" / rid / "config.yaml"
        config.write_text(yaml.safe_dump(yaml.safe_load(config.read_text()) | {"init_seed": init, "data_seed": None}))
    write_sweep(root, "m", ["d0", "d1", "d2", "e", "f"], "2025-01-01T00:00:00", ["family=dense"])
    values = load(root, "m").set_index("run_id")
    assert [values.loc[r, "seed"] for r in ("d0", "d1", "d2", "e", "f")] == [0, 1, 2, 1, 3]
    assert list(values.loc["f", ["config_seed", "init_seed", "data_seed"]]) == [0, 4, 0]
    with pytest.raises(ValueError, match="several runs"):  # e and d1 are one replicate: the same seeds
        compare(load(root, "m"), "dense")
    plain = new_store(tmp_path / "p")
    write_run(plain, "d0", "dense", "tiny", 0, {"regbench_tvd": 0.5})
    write_sweep(plain, "p", ["d0"], "2025-01-01T00:00:00", ["family=dense"])
    assert "init_seed" not in load(plain, "p").columns  # a store without them reads as before


def test_the_report_splits_the_seed_variance_by_source(tmp_path):
    root = _crossed_store(tmp_path / "s")
    analysis = analyse(root, "x")
    sources = analysis.seed_sources.set_index("family")
    assert list(sources["metric"]) == ["regbench_tvd", "regbench_tvd"]
    expected = variance_components([0.5 + INIT_EFFECT[i] + DATA_EFFECT[d] + 0.01 * i * d for i in (0, 1)
                                    for d in (0, 1, 2)], [0, 0, 0, 1, 1, 1], [0, 1, 2] * 2)
    assert sources.loc["dense", "var_init"] == pytest.approx(expected["var_init"])
    assert sources.loc["dense", "n_init"] == 2 and sources.loc["dense", "n_data"] == 3
    report = write_report(root, "x").read_text()
    assert "Where the seed spread comes from" in report
    assert "| dense | " in report.split("Where the seed spread comes from")[1]
    written = pd.read_parquet(root / "sweeps" / "x" / "results" / "seed_sources.parquet")
    assert len(written) == 2 and set(written["sweep"]) == {"x"}


# ---- the decomposition -------------------------------------------------------------------------

def _grid(rng, a: int, b: int, s_init: float, s_data: float, s_res: float) -> tuple[np.ndarray, list, list]:
    y = rng.normal(0, s_init, a)[:, None] + rng.normal(0, s_data, b)[None, :] + rng.normal(0, s_res, (a, b))
    init, data = np.meshgrid(range(a), range(b), indexing="ij")
    return y.ravel(), list(init.ravel()), list(data.ravel())


def test_variance_components_recover_known_components_on_average():
    rng = np.random.default_rng(7)
    estimates = pd.DataFrame([variance_components(*_grid(rng, 6, 5, 2.0, 1.0, 0.5)) for _ in range(2000)])
    # the ANOVA estimators are unbiased before truncation; here truncation is rare
    assert estimates["var_init"].mean() == pytest.approx(4.0, rel=0.1)
    assert estimates["var_data"].mean() == pytest.approx(1.0, rel=0.1)
    assert estimates["var_residual"].mean() == pytest.approx(0.25, rel=0.05)


def test_a_negative_component_is_truncated_and_said_so():
    # init explains nothing, the residual much: MS_init below MS_res
    y = np.array([[0.0, 1.0], [1.0, 0.0]]).ravel()
    parts = variance_components(y, [0, 0, 1, 1], [0, 1, 0, 1])
    assert parts["init_truncated"] and parts["data_truncated"]
    assert parts["var_init"] == parts["var_data"] == 0 and parts["share_residual"] == 1.0
    exact = variance_components([0.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], [0, 1, 0, 1])  # all init
    assert exact["share_init"] == 1.0 and exact["var_residual"] == 0 and not exact["init_truncated"]


def test_variance_components_need_a_complete_grid():
    with pytest.raises(ValueError, match="complete grid"):
        variance_components([1.0, 2.0, 3.0], [0, 0, 1], [0, 1, 0])
    with pytest.raises(ValueError, match="several runs"):
        variance_components([1.0, 2.0, 3.0, 4.0, 5.0], [0, 0, 1, 1, 1], [0, 1, 0, 1, 1])
    with pytest.raises(ValueError, match="complete grid"):
        variance_components([1.0, 2.0], [0, 1], [0, 0])
    table = pd.DataFrame({"family": "dense", "size": "tiny", "metric": "regbench_tvd", "value": [1.0, 2.0, 3.0],
                          "seed": [0, 1, 2], "init_seed": [0, 0, 1], "data_seed": [0, 1, 0]})
    assert seed_sources(table).empty  # an incomplete grid: no decomposition, no error


def test_json_of_the_new_keys_round_trips(hydra):
    """A stored config without the keys (planned before them) reads with both null."""
    from orchestrator.config import load_run_config
    from orchestrator.identity import config_dict
    stored = config_dict(compose_run(["family=dense", "size=micro", "seed=3"]))
    for key in ("init_seed", "data_seed"):
        stored.pop(key)
    cfg = load_run_config(json.loads(json.dumps(stored)))
    assert cfg.init_seed is None and cfg.data_seed is None and cfg.effective_init_seed == 3
