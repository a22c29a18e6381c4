"""Composition, validation and grid expansion through Hydra's own grammar."""
import pytest

from orchestrator import grid
from hydra import compose

from orchestrator.config import ConfigError, _resolved, _typed, hydra_session
from orchestrator.identity import run_id

EVALS = {"train": frozenset({"final_loss"}), "regbench": frozenset({"regbench_tvd"}),
         "induction": frozenset({"induction_max"}), "ablation": frozenset({"ablation_drop_f1"})}


def expand(*overrides):
    points, name = grid.expand(list(overrides), EVALS)
    return [p.config for p in points], name


def test_default_grid_is_the_nine_run_demo():
    cfgs, name = expand()
    assert sorted((c["family"]["name"], c["seed"]) for c in cfgs) == sorted(
        (f, s) for f in ("dense", "lidas", "looped") for s in (0, 1, 2))
    assert {c["model"]["name"] for c in cfgs} == {"tiny"}
    assert name == "family-dense-lidas-looped"


def test_sweep_grammar_range_glob_plain_values():
    cfgs, name = expand("family=glob(l*)", "seed=range(0,4)", "train.steps=200")
    assert len(cfgs) == 8
    assert {c["family"]["name"] for c in cfgs} == {"lidas", "looped"}
    assert sorted({c["seed"] for c in cfgs}) == [0, 1, 2, 3]
    assert {c["train"]["steps"] for c in cfgs} == {200}
    assert "seed" not in name and "train.steps-200" in name


def test_command_line_replaces_default_axis_and_seeds_do_not_rename():
    a, name_a = expand("family=dense", "seed=0")
    b, name_b = expand("family=dense", "seed=3,4")
    assert len(a) == 1 and len(b) == 2 and name_a == name_b == "family-dense"


def test_a_grid_composes_as_hydra_composes_each_point_on_its_own():
    """The grid composes each set of group choices once and applies the values to copies; every
    point must equal Hydra composing its whole override list."""
    overrides = ["family=dense,lidas,looped", "size=micro,tiny", "seed=0,1", "train.lr=0.001,0.002",
                 "eval.jobs=[regbench]", "model.rope_theta=500000", "tracker=none"]
    points, _ = grid.expand(overrides, EVALS)
    assert len(points) == 24 and len({run_id(p.config) for p in points}) == 24
    with hydra_session():
        for p in points:
            alone = _resolved(_typed(compose("config", overrides=list(p.overrides))), EVALS)
            assert p.config == alone, p.overrides


def test_group_choices_and_derived_family_values():
    cfgs, _ = expand("family=looped,lidas", "size=micro", "seed=0")
    by = {c["family"]["name"]: c for c in cfgs}
    assert by["looped"]["family"]["loop"] == {"prelude_layers": 0, "block_layers": 1,
                                              "loops": 4, "coda_layers": 0}
    assert by["lidas"]["family"]["growth"]["block_layers"] == 1
    assert by["lidas"]["family"]["loop"] is None and by["looped"]["family"]["growth"] is None


@pytest.mark.parametrize("size", ["micro", "tiny", "small", "360m", "1b7", "3b"])
@pytest.mark.parametrize("family", ["dense", "lidas", "looped"])
def test_every_size_composes_and_validates(size, family):
    cfgs, _ = expand(f"size={size}", f"family={family}", "seed=0")
    assert cfgs[0]["model"]["name"] == size


def test_paper_sizes_have_the_smollm_shapes():
    (c,), _ = expand("size=360m", "family=dense", "seed=0")
    m = c["model"]
    assert (m["d_model"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["d_ff"]) == (960, 32, 15, 5, 2560)
    (c,), _ = expand("size=360m", "family=looped", "seed=0")
    assert c["family"]["loop"] == {"prelude_layers": 2, "block_layers": 4, "loops": 7, "coda_layers": 2}


def test_run_id_ignores_where_and_how_but_not_what():
    (a,), _ = expand("family=dense", "seed=0")
    (b,), _ = expand("family=dense", "seed=0", "cluster.num_cpus=7", "store.root=/elsewhere",
                     "train.max_retries=5", "train.checkpoint_every=7", "resources.cpus=2")
    (c,), _ = expand("family=dense", "seed=1")
    (d,), _ = expand("family=dense", "seed=0", "train.lr=0.001")
    assert run_id(a) == run_id(b)
    assert len({run_id(a), run_id(c), run_id(d)}) == 3
    reordered = {k: a[k] for k in reversed(list(a))}
    assert run_id(reordered) == run_id(a)


@pytest.mark.parametrize("overrides, needle", [
    (["family=foo"], "choose one of: dense, lidas, looped"),
    (["size=huge"], "choose one of: 1b7, 360m, 3b, micro, small, tiny"),
    (["seed=-1"], "non-negative"),
    (["seed=abc"], "expected integer"),
    (["train.stepz=3"], "train.stepz: unknown key"),
    (["+train.stepz=3"], "train.stepz: unknown key"),
    (["seed=[1,"], "malformed override"),
    (["seed=range(3,3)"], "sweep is empty"),
    (["model.n_heads=5"], "must divide model.d_model"),
    (["family=looped", "family.loop.loops=0"], "loops >= 2"),
    (["family=lidas", "family.growth.initial_blocks=3"], "does not grow"),
    (["family=lidas", "train.steps=2", "train.warmup_steps=0"], "fewer than the 3 growth stages"),
    (["family=looped", "family.loop.block_layers=7"], "exceed model.n_layers"),
    (["eval.jobs=[nope]"], "choose one of: ablation, induction, regbench"),
    (["data.alphabet_size=[4,30]"], "more than data.n_symbols"),
])
def test_bad_input_is_one_clear_line(overrides, needle):
    with pytest.raises(ConfigError) as e:
        expand(*overrides)
    assert needle in str(e.value) and "\n" not in str(e.value)
