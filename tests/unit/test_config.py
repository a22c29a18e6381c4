"""Composition, typed validation and grid expansion through Hydra's own grammar."""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from common.settings import defaults, to_dict
from config.backend import BACKEND_CONFIGS
from config.cluster import CLUSTER_CONFIGS
from config.data import DATA_CONFIGS
from config.evals import EVAL_CONFIGS
from config.family import FAMILY_CONFIGS
from config.run import JobConfig, job_dict, load_job_config
from jobs.backends import BACKENDS
from jobs.data import STREAMS
from jobs.evals import EVALUATIONS
from jobs.families import FAMILIES, family_of
import orchestrator.config
from orchestrator import grid
from orchestrator.config import (CONF_DIR, ConfigError, RunConfig, apply_value_overrides, compose_run, compose_runs,
                                 hydra_session, load_run_config, typed_run)
from orchestrator.executors import EXECUTORS
from orchestrator.identity import run_id, semantic_config

FORMAT1 = Path(__file__).parent.parent / "data" / "format1_configs.json"
# tiny on regbench_easy as format 1 composed it, before the default regime (docs/miniature.md)
TINY_FORMAT1 = ["train.steps=1500", "train.batch_size=32"]
TINY_EASY_FORMAT1 = ["data.train_automata=2000", "data.warmup=null"]
# What the error messages list, from the registries and conf/: adding a family or a size changes no test.
FAMILY_NAMES = ", ".join(FAMILIES.names())
SIZE_NAMES = ", ".join(sorted(path.stem for path in (CONF_DIR / "size").glob("*.yaml")))
EVALUATION_NAMES = ", ".join(EVALUATIONS.names())


def expand(*overrides):
    points, name = grid.expand(list(overrides))
    return [p.config for p in points], name


def test_default_grid_is_the_nine_run_demo():
    cfgs, name = expand()
    assert sorted((c.family.name, c.seed) for c in cfgs) == sorted(
        (f, s) for f in ("dense", "lidas", "looped") for s in (0, 1, 2))
    assert {c.model.name for c in cfgs} == {"tiny"}
    assert name == "family-dense-lidas-looped"


def test_sweep_grammar_range_glob_plain_values():
    cfgs, name = expand("family=glob(l*)", "seed=range(0,4)", "train.steps=200")
    assert len(cfgs) == 8
    assert {c.family.name for c in cfgs} == {"lidas", "looped"}
    assert sorted({c.seed for c in cfgs}) == [0, 1, 2, 3]
    assert {c.train.steps for c in cfgs} == {200}
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
    points, _ = grid.expand(overrides)
    assert len(points) == 24 and len({run_id(p.config) for p in points}) == 24
    with hydra_session():
        for p in points:
            alone = typed_run(compose("config", overrides=list(p.overrides)))
            assert p.config == alone, p.overrides


def test_a_composition_is_reused_until_a_config_file_changes(tmp_path, monkeypatch):
    """Grids of one process share the typed composition of each set of group choices; a changed
    byte anywhere in conf/ (same size, same instant) composes again."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    composed = []
    hydra_compose = orchestrator.config.compose
    monkeypatch.setattr(orchestrator.config, "compose",
                        lambda *a, **k: composed.append(k["overrides"]) or hydra_compose(*a, **k))
    point = ["size=micro", "family=dense", "seed=0", "train.lr=0.003"]
    for lr in ("0.003", "0.004"):
        with hydra_session(conf):
            assert compose_run([*point[:3], f"train.lr={lr}"]).train.lr == float(lr)
    assert composed == [["size=micro", "family=dense"]]
    micro = conf / "size" / "micro.yaml"
    steps = int(re.search(r"\n  steps: (\d+)\n", micro.read_text()).group(1))  # type: ignore[union-attr]
    other = steps + 1 if len(str(steps + 1)) == len(str(steps)) else steps - 1  # a file of the same size
    micro.write_text(micro.read_text().replace(f"\n  steps: {steps}\n", f"\n  steps: {other}\n"))
    with hydra_session(conf):
        assert compose_run(point).train.steps == other
    assert len(composed) == 2


def test_group_choices_and_derived_family_values():
    cfgs, _ = expand("family=looped,lidas", "size=micro", "seed=0")
    by = {c.family.name: c for c in cfgs}
    assert dataclasses.asdict(by["looped"].family.loop) == {"prelude_layers": 0, "block_layers": 1,
                                                            "loops": 4, "coda_layers": 0}
    assert by["lidas"].family.growth.block_layers == 1
    assert not hasattr(by["lidas"].family, "loop") and not hasattr(by["looped"].family, "growth")


@pytest.mark.parametrize("size", ["micro", "tiny", "small", "360m", "1b7", "3b"])
@pytest.mark.parametrize("family", ["dense", "lidas", "looped"])
def test_every_size_composes_and_validates(size, family):
    cfgs, _ = expand(f"size={size}", f"family={family}", "seed=0")
    assert cfgs[0].model.name == size


def test_paper_sizes_have_the_smollm_shapes():
    (c,), _ = expand("size=360m", "family=dense", "seed=0")
    m = c.model
    assert (m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.d_ff) == (960, 32, 15, 5, 2560)
    (c,), _ = expand("size=360m", "family=looped", "seed=0")
    assert dataclasses.asdict(c.family.loop) == {"prelude_layers": 2, "block_layers": 4, "loops": 7, "coda_layers": 2}


def test_run_id_ignores_where_and_how_but_not_what():
    (a,), _ = expand("family=dense", "seed=0")
    (b,), _ = expand("family=dense", "seed=0", "cluster.num_cpus=7", "store.root=/elsewhere",
                     "train.max_retries=5", "train.checkpoint_every=7", "resources.cpus=2")
    (c,), _ = expand("family=dense", "seed=1")
    (d,), _ = expand("family=dense", "seed=0", "train.lr=0.001")
    assert run_id(a) == run_id(b)
    assert len({run_id(a), run_id(c), run_id(d)}) == 3
    plain = to_dict(a)
    reordered = {k: plain[k] for k in reversed(list(plain))}
    assert run_id(reordered) == run_id(a)


@pytest.mark.parametrize("overrides, needle", [
    (["family=foo"], f"choose one of: {FAMILY_NAMES}"),
    (["size=huge"], f"choose one of: {SIZE_NAMES}"),
    (["seed=-1"], "non-negative"),
    (["data.seed=-3"], "data.seed=-3: must be a non-negative integer"),
    (["train.lr=1e400"], "train.lr=inf: must be a finite number"),
    (["train.lr=nan"], "train.lr=nan: must be a finite number"),
    (["cluster.num_cpus=0"], "cluster.num_cpus=0: must be > 0"),
    (["train.warmup_steps=-1"], "train.warmup_steps=-1: must be >= 0"),
    (["family=lidas", "family.growth.alpha=inf"], "family.growth.alpha=inf: must be a finite number"),
    (["model.n_heads=0"], "model.n_heads=0: must be > 0"),
    (["train.beta2=1.0"], "train.beta2=1: must be < 1"),
    (["train.grad_clip=0"], "train.grad_clip=0: must be > 0"),
    (["eval.gsm8k.shot_seed=-1"], "eval.gsm8k.shot_seed=-1: must be a non-negative integer"),
    (["data.num_states=[1,4]"], "data.num_states=[1,4]: must be [low, high] with 2 <= low <= high"),
    (["data.string_length=[5,2]"], "data.string_length=[5,2]: [low, high] with 1 <= low <= high"),
    (["adaptive.alpha=1.5"], "adaptive.alpha=1.5: must be < 1"),
    (["tracker.mode=sometimes"], "tracker.mode=sometimes: not allowed; choose one of: offline, online"),
    (["backend=nanotron", "size=360m", "backend.nanotron.dtype=fp8"], "backend.nanotron.dtype=fp8: not allowed"),
    (["family.name=lidas"], "family: its kind changed by a value override; choose it with the config group"),
    (["seed=abc"], "expected integer"),
    (["train.stepz=3"], "train.stepz: unknown key"),
    (["+train.stepz=3"], "train.stepz: unknown key"),
    (["seed=[1,"], "malformed override"),
    (["seed=range(3,3)"], "sweep is empty"),
    (["model.n_heads=5"], "must divide model.d_model"),
    (["family=looped", "family.loop.loops=0"], "loops >= 2"),
    (["family=lidas", "family.growth.initial_blocks=3"], "does not grow"),
    (["family=lidas", "family.growth.initial_blocks=1", "train.steps=2", "train.warmup_steps=0"],
     "fewer than the 3 growth stages"),
    (["family=looped", "family.loop.block_layers=7"], "exceed model.n_layers"),
    (["eval.jobs=[nope]"],
     f"eval.jobs=nope: no such evaluation (did you mean noop?); choose one of: {EVALUATION_NAMES}"),
    (["data.alphabet_size=[4,30]"], "more than data.n_symbols"),
])
def test_bad_input_is_one_clear_line(overrides, needle):
    with pytest.raises(ConfigError) as e:
        expand(*overrides)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_run_ids_of_format_1_are_kept():
    """Configs and run ids computed by the store's first format (one schema for every component):
    the typed configs of today give every one of them the same id, so runs of existing stores are
    found; and a stored format-1 config.yaml still loads."""
    cases = json.loads(FORMAT1.read_text())
    points = []
    with hydra_session():
        for case in cases:
            overrides = case["overrides"]
            data = case["config"]["data"]
            if data["kind"] == "regbench" and data["name"] != "regbench_easy" \
                    and data["strings_per_instance"][1] * (data["string_length"][1] + 1) > data["seq_len"] + 1:
                # Format 1 cut such instances at the context's end silently; planning now refuses
                # them unless the cut is declared, and declared, the same run is found again.
                with pytest.raises(ConfigError, match="shorter than the longest instance"):
                    compose_run(overrides)
                overrides = [*overrides, "data.cut_at_context=true"]
            if case["config"]["model"]["name"] == "tiny" and data["kind"] == "regbench":
                # tiny's defaults changed since (the default regime, docs/miniature.md); restated,
                # format 1's defaults are the same runs
                overrides = [*overrides, *TINY_FORMAT1]
                if data["name"] == "regbench_easy":
                    overrides += TINY_EASY_FORMAT1
            if case["config"]["model"]["name"] == "tiny" and case["config"]["family"]["name"] == "lidas":
                overrides.append("family.growth.initial_blocks=1")
            points.append(overrides)
        composed = compose_runs(points)  # one grid: each distinct set of group choices composed once
    for case, overrides, cfg in zip(cases, points, composed):
        assert run_id(cfg) == case["run_id"], overrides
        assert run_id(case["config"]) == case["run_id"]
    stored = next(c["config"] for c in cases if c["config"]["family"]["name"] == "lidas")
    assert run_id(load_run_config(stored)) == run_id(stored)


def test_adding_an_evaluation_does_not_change_run_ids(monkeypatch):
    """An evaluation registered later is not part of the id: its settings are recorded with it."""
    from orchestrator.identity import semantic_config

    with hydra_session():
        before = compose_run(["family=dense", "size=micro", "seed=0"])
    assert set(semantic_config(before)["eval"]) == {"regbench", "induction", "ablation", "gsm8k"}


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group, registry, key", [("family", FAMILY_CONFIGS, "name"),
                                                  ("backend", BACKEND_CONFIGS, "name"),
                                                  ("cluster", CLUSTER_CONFIGS, "name")])
def test_every_conf_option_has_a_registered_class_and_the_defaults_agree(group, registry, key):
    """conf/ holds the defaults; a default a class declares itself must never disagree with it."""
    with hydra_session():
        for option in _choices(group):
            composed = OmegaConf.to_container(compose("config", overrides=[f"{group}={option}"]), resolve=True)
            section = composed[group]
            cls = registry[section[key]]
            for name, value in defaults(cls).items():
                if name in section and not isinstance(value, dict):
                    assert section[name] == value, (group, option, name)


def test_declared_defaults_agree_with_conf_everywhere():
    """Every section of the default composition, and each data option and evaluation's section."""
    with hydra_session():
        composed = OmegaConf.to_container(compose("config"), resolve=True)
        run = compose_run([])
    for section in ("model", "train", "store", "adaptive", "tracker", "resources"):
        for name, value in defaults(type(getattr(run, section))).items():
            assert composed[section].get(name, value) == value, (section, name)
    for name, declared in EVAL_CONFIGS.items():
        if declared.settings is not None:
            for key, value in defaults(declared.settings).items():
                assert composed["eval"].get(name, {}).get(key, value) == value, (name, key)
    assert set(DATA_CONFIGS.names()) == {"arith", "regbench"}


@pytest.mark.parametrize("configs, behaviours", [(FAMILY_CONFIGS, FAMILIES), (DATA_CONFIGS, STREAMS),
                                                 (BACKEND_CONFIGS, BACKENDS), (CLUSTER_CONFIGS, EXECUTORS),
                                                 (EVAL_CONFIGS, EVALUATIONS)])
def test_every_configured_component_has_its_behaviour_under_the_same_name(configs, behaviours):
    assert configs.names() == behaviours.names()


def test_hydra_value_overrides_are_applied_by_its_own_function():
    """The one private Hydra function this project uses: if Hydra renames or changes it, this fails
    loudly (see orchestrator/config.apply_value_overrides)."""
    with hydra_session():
        node = OmegaConf.create({"a": {"b": 1}, "c": [1]})
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        apply_value_overrides(node, parser.parse_overrides(["a.b=2", "+a.d=3", "~c"]))
    assert OmegaConf.to_container(node) == {"a": {"b": 2, "d": 3}}


def test_typed_configs_reach_jobs_as_objects():
    with hydra_session():
        cfg = compose_run(["family=lidas", "size=micro", "seed=3"])
    assert isinstance(cfg, RunConfig)
    assert family_of(cfg.family).stages(cfg.model, cfg.train.steps)[-1].n_layers == cfg.model.n_layers
    assert cfg.eval.regbench.instances > 0 and cfg.backend.name == "torch"


def test_the_fixed_training_set_is_part_of_the_id_the_stream_and_the_cut_flag_are_not():
    """Data settings added since format 1 leave the ids of configs that behave as format 1 did."""
    with hydra_session():
        stream = compose_run(["size=micro"])
        fixed = compose_run(["size=micro", "data.train_sequences=64"])
        other_split = compose_run(["size=micro", "data.train_sequences=64", "data.validation_sequences=8"])
        split_only = compose_run(["size=micro", "data.validation_sequences=8"])
        large = compose_run(["size=360m", "data.cut_at_context=false"])
    assert stream.data.train_sequences is None and stream.data.cut_at_context is True
    assert len({run_id(stream), run_id(fixed), run_id(other_split)}) == 3
    assert run_id(split_only) == run_id(stream)  # the split matters only with a fixed set
    with hydra_session():
        assert run_id(large) == run_id(compose_run(["size=360m"]))  # the flag never changes the data


def test_a_revision_of_an_evaluation_is_recorded_and_reruns_it():
    from orchestrator.identity import settings_digest
    from orchestrator.plan import done

    with hydra_session():
        cfg = compose_run(["size=micro"])
    digest = settings_digest(cfg, "regbench")
    assert EVALUATIONS["regbench"].revision > 1 and digest is not None
    assert settings_digest(cfg, "gsm8k") is None and settings_digest(cfg, "train") is None  # revision 1
    recorded = {"jobs": {"regbench": {"status": "done"}, "gsm8k": {"status": "done"}, "train": {"status": "done"}}}
    assert not done(recorded, "regbench", cfg)  # recorded by revision 1, without a digest
    assert done(recorded, "gsm8k", cfg) and done(recorded, "train", cfg)
    recorded["jobs"]["regbench"]["settings"] = digest
    assert done(recorded, "regbench", cfg)


def test_a_data_curriculum_is_part_of_the_id_only_when_set():
    """data.warmup (null by default) leaves the ids of every config without a curriculum; the
    miniature preset sets it, LIDAS's start only for LIDAS, and a bad warm-up is refused."""
    with hydra_session():
        plain = compose_run(["size=micro"])
        warm = compose_run(["size=micro", "+data.warmup.steps=5"])
        preset = {f: compose_run([f"family={f}", "experiment=miniature"]) for f in ("lidas", "looped", "dense")}
        with pytest.raises(ConfigError, match="fewer than train.steps"):
            compose_run(["size=micro", f"+data.warmup.steps={plain.train.steps}"])
        with pytest.raises(ConfigError, match=r"data.warmup.num_states=\[1,3\]"):
            compose_run(["size=micro", "+data.warmup.steps=5", "+data.warmup.num_states=[1,3]"])
    assert plain.data.warmup is None and "warmup" not in semantic_config(plain)["data"]
    assert run_id(warm) != run_id(plain)
    assert {cfg.data.warmup.steps for cfg in preset.values()} == {2500}
    assert preset["lidas"].family.growth.initial_blocks == 2


def test_the_default_regime_and_a_warmup_given_as_a_share():
    """tiny on regbench_easy (the demo) trains with a curriculum of 55% of its steps, 100,000
    automata and LIDAS from 2 blocks; a share gives its steps (the id sees only the steps), steps
    given win, and a warm-up of no length is refused. Other sizes and data keep their defaults."""
    with hydra_session():
        demo = {f: compose_run([f"family={f}"]) for f in ("lidas", "looped", "dense")}
        short = compose_run(["train.steps=200"])
        as_steps = compose_run(["data.warmup.steps=605"])
        steps_win = compose_run(["data.warmup.steps=300"])
        micro, arith = compose_run(["size=micro", "family=lidas"]), compose_run(["data=arith"])
        with pytest.raises(ConfigError, match="give its length"):
            compose_run(["size=micro", "+data.warmup.num_states=[6,12]"])
    warmup = demo["dense"].data.warmup
    assert (warmup.share, warmup.steps, demo["dense"].train.steps) == (0.55, 605, 1100)
    assert demo["dense"].data.train_automata == 100_000 and demo["dense"].train.batch_size == 64
    assert demo["lidas"].family.growth.initial_blocks == 2
    assert short.data.warmup.steps == 110 and steps_win.data.warmup.steps == 300
    assert run_id(as_steps) == run_id(demo["dense"]) and "share" not in semantic_config(as_steps)["data"]["warmup"]
    assert micro.data.warmup is None and micro.family.growth.initial_blocks == 1
    assert arith.data.kind == "arith"


def test_the_config_package_imports_without_torch_jobs_or_the_orchestrator():
    """analysis and tools read run configs: `config` is data only (the layer contract says so too)."""
    code = ("import sys; from config import RunConfig; "
            "print(sorted(m for m in ('torch', 'jobs', 'orchestrator') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_planned_configs_are_frozen_and_reach_the_job_unchanged():
    with hydra_session():
        cfg = compose_run(["family=lidas", "size=micro", "seed=3"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.steps = 1  # type: ignore[misc]
    job = load_job_config(job_dict(cfg))  # what a torchrun rank reads
    assert all(getattr(job, f.name) == getattr(cfg, f.name) for f in dataclasses.fields(JobConfig))


@pytest.mark.parametrize("reach, message", [
    ("assign", r"^family: its derive\(\) assigned a value \(cannot assign to field 'n_layers'\)"),
    ("return", r"^family: its derive\(\) returned n_layers, which are not fields of family")])
def test_a_derive_that_writes_another_section_is_refused(tmp_path, reach, message):
    """A section's derive returns its own new values; a plugin family's that reaches into `model`
    is refused when the run is planned (in a process of its own: the plugin stays registered)."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "family" / "greedy.yaml").write_text("name: greedy\n")
    code = ("from orchestrator.config import ConfigError, compose_run, hydra_session\n"
            "with hydra_session():\n"
            "    try:\n"
            f"        compose_run(['family=greedy', 'family.reach={reach}', 'size=micro'])\n"
            "    except ConfigError as e:\n"
            "        print(e)\n")
    plugins = str(Path(__file__).parents[1] / "plugins")
    env = {**os.environ, "ORCHESTRATOR_PLUGINS": "greedy_family", "ORCHESTRATOR_CONF_DIR": str(conf),
           "PYTHONPATH": os.pathsep.join([plugins, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert re.match(message, out.stdout), out.stdout + out.stderr
