"""nanotron's own loader (get_config_from_file, at the pinned commit) on every rendered stage.

Runs in the side environment .venv-nanotron (tests/nanotron_side.py), one subprocess for the whole
module: every stage YAML of family=lidas,dense at size=360m,1b7,3b and at the GPU check's micro
(bench/gpu_smoke.sh), a few layouts and data variants, and mutated YAMLs that nanotron or our
schema (jobs/nanotron/schema.py) refuses. What nanotron parsed is compared with what the run's
config means, independently of the renderer.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
import typing
from pathlib import Path

import pytest
import yaml

import nanotron_side
from jobs.families import family_of
from jobs.nanotron import render, schema
from jobs.optim import learning_rate
from orchestrator.config import RunConfig, compose_run, hydra_session

RUN_DIR = Path("/store/runs")
# The GPU check's nanotron run (bench/gpu_smoke.sh), family added per cell.
GPU_CHECK = ["size=micro", "model.n_layers=2", "resources.gpus=1", "resources.cpus=4",
             "resources.memory_gb=16", "backend.nanotron.dataset=null",
             "backend.nanotron.dummy_data=true", "backend.nanotron.micro_batch_size=8",
             "cluster.num_gpus=1"]
# cell -> its overrides (the attention too: backend.nanotron.attn_implementation, conf/backend/nanotron.yaml).
CELLS: dict[str, list[str]] = {
    **{f"{family}-{size}": [f"family={family}", f"size={size}"]
       for size in ("360m", "1b7", "3b") for family in ("lidas", "dense")},
    **{f"{family}-micro-gpu-check": [f"family={family}", *GPU_CHECK] for family in ("lidas", "dense")},
    "dense-1b7-tp2-pp2": ["family=dense", "size=1b7", "backend.nanotron.tp=2", "backend.nanotron.pp=2"],
    "dense-3b-tp4": ["family=dense", "size=3b", "backend.nanotron.tp=4"],
    "dense-360m-tokenized": ["family=dense", "size=360m", "backend.nanotron.dataset=null",
                             "backend.nanotron.tokenized_path=/data/tokenized"],
    "dense-360m-sdpa": ["family=dense", "size=360m", "backend.nanotron.attn_implementation=sdpa"],
    "lidas-micro-flex": ["family=lidas", *GPU_CHECK, "backend.nanotron.attn_implementation=flex_attention"],
}

DELETE = object()
# (name, base cell, path, value, nanotron's verdict, our schema's verdict): a verdict is None
# (accepted) or a fragment of the refusal's message. Where nanotron's loader accepts and our schema
# refuses, the reason is the name. No row may have our schema accept what nanotron refuses.
MUTATIONS = [
    # both refuse; nanotron's message and ours
    ("unknown model_config key", "dense-360m", ("model", "model_config", "hidden_sise"), 960,
     "unexpected keyword argument 'hidden_sise'", "unknown keys ['hidden_sise']"),
    ("unknown section", "dense-360m", ("bogus",), {}, 'can not match "bogus"', "unknown keys ['bogus']"),
    ("missing key", "dense-360m", ("tokens", "train_steps"), DELETE,
     'missing value for field "tokens.train_steps"', "missing keys ['train_steps']"),
    ("string for an int", "dense-360m", ("tokens", "micro_batch_size"), "8",
     'wrong value type for field "tokens.micro_batch_size"', "tokens.micro_batch_size: expected int"),
    ("string seed", "dense-360m", ("general", "seed"), "0", 'wrong value type for field "general.seed"',
     "general.seed: expected int"),
    ("dtype", "dense-360m", ("model", "dtype"), "bf16", "dtype should be a string selected in",
     "model.dtype=bf16: nanotron accepts"),
    ("decay style", "dense-360m", ("optimizer", "learning_rate_scheduler", "lr_decay_style"), "cos",
     "lr_decay_style should be a string selected in", "lr_decay_style=cos"),
    ("pipeline engine", "dense-360m", ("parallelism", "pp_engine"), "1F1B",
     "pp_engine should be a string selected in", "parallelism.pp_engine=1F1B"),
    ("attention", "dense-360m", ("model", "model_config", "_attn_implementation"), "bogus",
     "Invalid attention implementation: bogus", "_attn_implementation=bogus"),
    ("log level", "dense-360m", ("logging", "log_level"), "verbose",
     "log_level should be a string selected in", "logging.log_level=verbose"),
    ("replica log level", "dense-360m", ("logging", "log_level_replica"), "loud",
     "log_level_replica should be a string selected in", "logging.log_level_replica=loud"),
    ("init scaling", "dense-360m", ("model", "init_method", "scaling_method"), "bogus",
     'to any type of "model.init_method"', "scaling_method=bogus"),
    ("AdamW without eps", "dense-360m", ("optimizer", "optimizer_factory", "adam_eps"), DELETE,
     '"optimizer.optimizer_factory" union', "missing keys ['adam_eps']"),
    ("heads not divisible by tp", "dense-360m", ("parallelism", "tp"), 2,
     "num_attention_heads (15) must be divisible by tp (2)", "dp 8 x tp 2"),
    ("KV heads", "dense-360m", ("model", "model_config", "num_key_value_heads"), 4,
     "must be divisible by num_key_value_heads (4)", "num_key_value_heads=4: must divide"),
    ("first data stage", "dense-360m", ("data_stages", 0, "start_training_step"), 2,
     "You must have a training stage starting at 1", "the first stage must start at training step 1"),
    ("lighteval", "dense-360m", ("lighteval",), {"x": 1}, 'can not match "x"', "lighteval: must be null"),
    ("checkpoint path", "dense-360m", ("checkpoints", "checkpoints_path"), 5,
     "expected str, bytes or os.PathLike object", "checkpoints.checkpoints_path: expected str"),
    ("dataset weights", "dense-360m-tokenized", ("data_stages", 0, "data", "dataset", "dataset_weights"),
     [0.5, 0.5], 'to any type of "data_stages.data.dataset" union',  # its ValueError, lost in the union
     "2 dataset_weights for 1 dataset_folder entries"),
    ("tokenized vocabulary", "dense-360m-tokenized", ("data_stages", 0, "data", "dataset", "vocab_size"),
     50000, "Model's vocab_size (49152) does not match dataset's", "vocab_size/tokenizer differ"),
    # both accept
    ("sdpa", "dense-360m", ("model", "model_config", "_attn_implementation"), "sdpa", None, None),
    ("flex attention", "dense-360m", ("model", "model_config", "_attn_implementation"), "flex_attention",
     None, None),
    ("an int where a float belongs", "dense-360m", ("model", "model_config", "rope_theta"), 10000, None, None),
    # nanotron's loader accepts, our schema refuses (the name says why)
    ("a string hidden size goes into Qwen2Config unchecked", "dense-360m",
     ("model", "model_config", "hidden_size"), "960", None, "model.model_config.hidden_size: expected int"),
    ("a float layer count goes into Qwen2Config unchecked", "dense-360m",
     ("model", "model_config", "num_hidden_layers"), 32.0, None, "num_hidden_layers: expected int"),
    ("a string flag goes into Qwen2Config unchecked", "dense-360m",
     ("model", "model_config", "tie_word_embeddings"), "yes", None, "tie_word_embeddings: expected bool"),
    ("dacite takes a bool for an int", "dense-360m", ("tokens", "micro_batch_size"), True, None,
     "tokens.micro_batch_size: expected int"),
    ("dp x tp x pp is checked against the GPUs only at start-up", "dense-360m", ("parallelism", "dp"), 4,
     None, "dp 4 x tp 1 x pp 1 = 4, but the job has 8 GPUs"),
    ("tp=5 divides the heads but not the 8 GPUs: a start-up failure", "dense-360m",
     ("parallelism", "tp"), 5, None, "dp 8 x tp 5 x pp 1 = 40"),
    ("name sgd with AdamW's settings would build SGD and drop the betas", "dense-360m",
     ("optimizer", "optimizer_factory", "name"), "sgd", None, "optimizer.optimizer_factory.name=sgd"),
    ("ring attention needs context parallelism this project does not set up", "dense-360m",
     ("model", "model_config", "_attn_implementation"), "ring", None, "_attn_implementation=ring"),
    ("float64 weights: not a training dtype here", "dense-360m", ("model", "dtype"), "float64", None,
     "model.dtype=float64"),
    ("nanotron upper-cases tp_mode; the renderer writes it upper-case", "dense-360m",
     ("parallelism", "tp_mode"), "all_reduce", None, "parallelism.tp_mode=all_reduce"),
]


def compose(cell: str, *overrides: str) -> RunConfig:
    with hydra_session():
        return compose_run(["backend=nanotron", "tracker=none", "seed=3", *CELLS[cell], *overrides])


def stage_schedule(cfg: RunConfig) -> list:
    """The run's stages as its family defines them (not through the renderer)."""
    return family_of(cfg.family).stages(cfg.model, cfg.train.steps)


def render_cell(cell: str, cfg: RunConfig) -> list[dict]:
    """Every stage of the cell as the job renders it (resume and optimizer as --dry-run shows)."""
    run_dir = RUN_DIR / cell
    return [render.render_stage(cfg, run_dir, i, f"{cell}-stage{i}",
                                None if i == 0 else render.stage_dir(run_dir, i) / "grown",
                                load_optimizer=i == 0)
            for i in range(len(stage_schedule(cfg)))]


def lr_steps(cfg: RunConfig) -> list[int]:
    t = cfg.train
    w, n = t.warmup_steps, t.steps
    return sorted({0, 1, 2, w - 1, w, w + 1, (w + n) // 2, n - 2, n - 1})


def mutate(doc: dict, path: tuple, value) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def our_verdict(doc: dict, world: int) -> str | None:
    try:
        schema.validate(doc, world)
    except schema.SchemaError as e:
        return str(e)
    return None


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """cell -> (cfg, [(doc, nanotron's result) per stage]); mutation name -> (doc, result)."""
    folder = tmp_path_factory.mktemp("nanotron-yaml")
    cfgs = {cell: compose(cell) for cell in CELLS}
    docs = {cell: render_cell(cell, cfg) for cell, cfg in cfgs.items()}
    requests, keys = [], []
    for cell, stages in docs.items():
        for i, doc in enumerate(stages):
            path = folder / f"{cell}-stage{i}.yaml"
            path.write_text(render.to_yaml(doc))
            requests.append({"path": str(path), "lr_steps": lr_steps(cfgs[cell])})
            keys.append(("stage", cell, i))
    for n, (name, base, where, value, *_) in enumerate(MUTATIONS):
        path = folder / f"mutation{n}.yaml"
        path.write_text(render.to_yaml(mutate(docs[base][0], where, value)))
        requests.append({"path": str(path)})
        keys.append(("mutation", name, base))
    answer = nanotron_side.run("load_configs.py", {"configs": requests})
    out = {"cells": {cell: (cfgs[cell], []) for cell in CELLS}, "mutations": {},
           "nanotron": answer["nanotron"]}
    for key, request, result in zip(keys, requests, answer["results"]):
        doc = yaml.safe_load(Path(request["path"]).read_text())
        if key[0] == "stage":
            out["cells"][key[1]][1].append((doc, result))
        else:
            out["mutations"][key[1]] = (doc, cfgs[key[2]], result)
    return out


def refused(result: dict) -> str | None:
    """nanotron's refusal as 'Type: message', or None when its loader accepted the config."""
    return None if result["ok"] else f"{result['error']['type']}: {result['error']['message']}"


def check_parsed(cell: str, cfg: RunConfig, i: int, result: dict) -> list[str]:
    """What nanotron parsed from stage i of the cell against what the run's config means; the
    differences, each 'cell stage i: key: nanotron has X, we meant Y'."""
    if not result["ok"]:
        return [f"{cell} stage {i}: nanotron refused it: {refused(result)}"]
    got, derived = result["config"], result["derived"]
    m, t, nt, r = cfg.model, cfg.train, cfg.backend.nanotron, cfg.resources
    stage = stage_schedule(cfg)[i]
    mc, par, tok, ck = got["model"]["model_config"], got["parallelism"], got["tokens"], got["checkpoints"]
    lr, data_stage = got["optimizer"]["learning_rate_scheduler"], got["data_stages"][0]
    stage_root = RUN_DIR / cell / "nanotron" / f"stage{i}"
    dataset = data_stage["data"]["dataset"]
    meant = {
        "model_config class": ("Qwen2Config", derived["model_config_class"]),
        "model_config under strict typing": (None, result["model_config_strict"]),
        "layers": (stage.n_layers, mc["num_hidden_layers"]),
        "hidden size": (m.d_model, mc["hidden_size"]),
        "heads": (m.n_heads, mc["num_attention_heads"]),
        "KV heads": (m.n_kv_heads, mc["num_key_value_heads"]),
        "MLP size": (m.d_ff, mc["intermediate_size"]),
        "vocabulary": (m.vocab_size, mc["vocab_size"]),
        "positions": (m.max_seq_len, mc["max_position_embeddings"]),
        "tied embeddings": (m.tie_embeddings, mc["tie_word_embeddings"]),
        "norm eps": (float(m.norm_eps), mc["rms_norm_eps"]),
        "rope theta": (float(m.rope_theta), mc["rope_theta"]),
        "rope on channel halves": (False, mc["rope_interleaved"]),
        "no attention bias": (False, mc["attention_bias"]),
        "RoPE in every layer": (None, mc["no_rope_layer"]),
        "attention": (nt.attn_implementation, mc["_attn_implementation"]),
        "fused qkv (the bridge's layout)": (True, mc["_use_qkv_packed"]),
        "dtype": (f"torch.{nt.dtype}", derived["dtype"]),
        "init std": (float(m.init_std), got["model"]["init_method"]["std"]),
        "sequence length": (m.max_seq_len, tok["sequence_length"]),
        "data stage sequence length": (m.max_seq_len, data_stage["sequence_length"]),
        "GPUs = dp x tp x pp": (r.nodes * r.gpus, par["dp"] * par["tp"] * par["pp"]),
        "tp": (nt.tp, par["tp"]),
        "pp": (nt.pp, par["pp"]),
        "micro batch": (nt.micro_batch_size, tok["micro_batch_size"]),
        "global batch (nanotron's own arithmetic)": (t.batch_size, derived["global_batch_size"]),
        "tokens per step": (t.batch_size * m.max_seq_len, derived["global_batch_size_in_tokens"]),
        "train steps (the stage's end)": (stage.end_step, tok["train_steps"]),
        "peak learning rate": (float(t.lr), lr["learning_rate"]),
        "warm-up steps": (t.warmup_steps, lr["lr_warmup_steps"]),
        "warm-up style": ("linear", lr["lr_warmup_style"]),
        "decay": ("cosine", lr["lr_decay_style"]),
        "decay steps (over the whole run)": (t.steps - t.warmup_steps, lr["lr_decay_steps"]),
        "decay start": (None, lr["lr_decay_starting_step"]),
        "floor": (float(t.lr) * t.min_lr_ratio, lr["min_decay_lr"]),
        "weight decay": (float(t.weight_decay), got["optimizer"]["weight_decay"]),
        "clip": (float(t.grad_clip), got["optimizer"]["clip_grad"]),
        "betas": ((t.beta1, t.beta2), (got["optimizer"]["optimizer_factory"]["adam_beta1"],
                                             got["optimizer"]["optimizer_factory"]["adam_beta2"])),
        "checkpoints path": (str(stage_root / "checkpoints"), ck["checkpoints_path"]),
        "resume path": (None if i == 0 else str(stage_root / "grown"), ck["resume_checkpoint_path"]),
        "checkpoint interval": (t.checkpoint_every, ck["checkpoint_interval"]),
        "optimizer state loaded (stage 0 only; fresh after growth)": (i == 0, ck["load_optimizer"]),
        "schedule continues": (True, ck["load_lr_scheduler"]),
        "final state saved": (True, ck["save_final_state"]),
        "seed": (cfg.seed, got["general"]["seed"]),
        "data seed": (cfg.seed, data_stage["data"]["seed"]),
        "run name": (f"{cell}-stage{i}", got["general"]["run"]),
        "data": ((None if nt.dummy_data else
                  [nt.tokenized_path] if nt.tokenized_path else nt.dataset),
                 None if dataset is None else dataset.get("dataset_folder", dataset.get("hf_dataset_or_datasets"))),
        "tokenizer": (None if nt.dummy_data else nt.tokenizer, got["tokenizer"]["tokenizer_name_or_path"]),
    }
    if i == len(stage_schedule(cfg)) - 1:
        meant["last stage ends the run"] = (t.steps, tok["train_steps"])
    # nanotron's own scheduler: the torch backend's schedule (jobs/train.learning_rate), one step
    # later: nanotron's optimizer step k runs at scheduler step k-1, so its first step has rate 0.
    for step, rate in derived["learning_rates"].items():
        want = 0.0 if int(step) == 0 else learning_rate(int(step) - 1, t)
        meant[f"learning rate at scheduler step {step}"] = (want, rate)
    return [f"{cell} stage {i}: {what}: nanotron has {have!r}, we meant {want!r}"
            for what, (want, have) in meant.items()
            if not (want == have or isinstance(want, float) and isinstance(have, float)
                    and math.isclose(want, have, rel_tol=1e-9))]


def test_nanotron_parses_every_rendered_stage_as_we_meant_it(loaded):
    problems, counted = [], {}
    for cell, (cfg, stages) in loaded["cells"].items():
        counted[cell] = [doc["model"]["model_config"]["num_hidden_layers"] for doc, _ in stages]
        for i, (_, result) in enumerate(stages):
            problems += check_parsed(cell, cfg, i, result)
    assert not problems, "\n".join(problems)
    assert counted["lidas-360m"] == [4, 8, 12, 16, 20, 24, 28, 32] and counted["dense-360m"] == [32]
    assert counted["lidas-1b7"] == [4, 8, 12, 16, 20, 24] and counted["lidas-3b"] == list(range(4, 37, 4))
    assert counted["lidas-micro-gpu-check"] == [1, 2] and counted["dense-micro-gpu-check"] == [2]
    assert sum(map(len, counted.values())) == 35


def test_a_config_nanotron_refuses_fails_with_nanotrons_message(loaded):
    """The check above surfaces nanotron's own refusal: a stage mutated into a decay style nanotron
    does not know fails with nanotron's ValueError text."""
    cfg, stages = loaded["cells"]["dense-360m"]
    _, _, result = loaded["mutations"]["decay style"]
    problems = check_parsed("dense-360m", cfg, 0, result)
    assert problems == ["dense-360m stage 0: nanotron refused it: ValueError: lr_decay_style should be "
                        "a string selected in ['linear', 'cosine', '1-sqrt'] and not cos"]
    with pytest.raises(AssertionError, match=re.escape("lr_decay_style should be a string selected in")):
        assert not problems, "\n".join(problems)


@pytest.mark.parametrize("row", MUTATIONS, ids=[row[0] for row in MUTATIONS])
def test_our_schema_never_accepts_what_nanotron_refuses(loaded, row):
    """Mutated stages: nanotron's verdict and ours, as the table says. Both refuse, or both accept,
    or nanotron's loader accepts something our schema refuses for the reason the row names; never
    the other way round."""
    name, _, _, _, nanotron_says, we_say = row
    doc, cfg, result = loaded["mutations"][name]
    theirs, ours = refused(result), our_verdict(doc, render.layout(cfg).world)
    assert not (theirs and not ours), f"our schema accepts what nanotron refuses: {theirs}"
    if nanotron_says is None:
        assert theirs is None, f"nanotron now refuses it: {theirs}"
    else:
        assert theirs is not None and nanotron_says in theirs, theirs
    if we_say is None:
        assert ours is None, ours
    else:
        assert ours is not None and we_say in ours, ours


def test_our_schema_accepts_every_rendered_stage_nanotron_accepts(loaded):
    for cell, (cfg, stages) in loaded["cells"].items():
        world = render.layout(cfg).world
        for i, (doc, result) in enumerate(stages):
            assert result["ok"] and our_verdict(doc, world) is None, (cell, i, refused(result))


SECTIONS = {  # our schema's dataclass -> nanotron's (tests/nanotron_env/load_configs.py facts)
    schema.General: "general", schema.Parallelism: "parallelism", schema.Model: "model",
    schema.Qwen2ModelConfig: "model_config", schema.InitMethod: "init_method",
    schema.Tokenizer: "tokenizer", schema.Checkpoints: "checkpoints", schema.Logging: "logging",
    schema.Tokens: "tokens", schema.Optimizer: "optimizer", schema.AdamW: "optimizer_factory",
    schema.LRScheduler: "learning_rate_scheduler", schema.DataStage: "data_stage",
    schema.Data: "data", schema.HFDataset: "hf_dataset", schema.TokenizedDataset: "tokenized_dataset",
    schema.NanotronConfig: "config",
}


def test_every_field_of_our_schema_is_nanotrons(loaded):
    """Our schema's fields are a subset of nanotron's dataclasses' (nanotron has more, with
    defaults), and every attention implementation we allow is one nanotron knows."""
    fields = loaded["nanotron"]["fields"]
    unknown = {cls.__name__: sorted(set(typing.get_type_hints(cls)) - set(fields[name]))
               for cls, name in SECTIONS.items()}
    assert not any(unknown.values()), unknown
    assert {f.name for f in dataclasses.fields(schema.NanotronConfig)} <= set(fields["config"])
    assert set(schema.ATTN_IMPLEMENTATIONS) <= set(loaded["nanotron"]["attention_implementations"])
    assert loaded["nanotron"]["checkpoint_version"] == "1.5"
