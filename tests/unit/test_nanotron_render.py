"""backend=nanotron config: per-stage YAML, its schema, the planning checks and --dry-run."""
import copy
import functools
import re
from pathlib import Path

import pytest
import yaml

from jobs.families import family_of
from jobs.nanotron import render, schema
from orchestrator.cli import main
from orchestrator.config import ConfigError, RunConfig, compose_run, hydra_session


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]) -> RunConfig:
    with hydra_session():
        return compose_run(["backend=nanotron", "size=360m", "tracker=none", *overrides])


def config(*overrides: str) -> RunConfig:
    return copy.deepcopy(_composed(overrides))


def test_each_lidas_stage_renders_the_size_at_its_depth():
    cfg = config("family=lidas")
    schedule = family_of(cfg.family).stages(cfg.model, cfg.train.steps)
    docs = [render.render_stage(cfg, Path("/runs/x"), i, f"x-{i}") for i in range(len(schedule))]
    assert [d["model"]["model_config"]["num_hidden_layers"] for d in docs] == [4, 8, 12, 16, 20, 24, 28, 32]
    assert [d["tokens"]["train_steps"] for d in docs] == [s.end_step for s in schedule]
    mc, m = docs[-1]["model"]["model_config"], cfg.model
    assert (mc["hidden_size"], mc["num_attention_heads"], mc["num_key_value_heads"], mc["intermediate_size"],
            mc["vocab_size"], mc["tie_word_embeddings"]) == (960, 15, 5, 2560, 49152, True) == (
            m.d_model, m.n_heads, m.n_kv_heads, m.d_ff, m.vocab_size, m.tie_embeddings)
    par, tok = docs[0]["parallelism"], docs[0]["tokens"]
    assert par["dp"] * par["tp"] * par["pp"] == 8
    assert par["dp"] * tok["micro_batch_size"] * tok["batch_accumulation_per_replica"] == cfg.train.batch_size
    lr = docs[3]["optimizer"]["learning_rate_scheduler"]            # one schedule over all stages
    assert lr["lr_decay_steps"] == cfg.train.steps - cfg.train.warmup_steps
    assert docs[2]["checkpoints"]["checkpoints_path"] == "/runs/x/nanotron/stage2/checkpoints"
    assert docs[0]["data_stages"][0]["data"]["dataset"]["hf_dataset_or_datasets"] == "HuggingFaceTB/smollm-corpus"
    tokenized = config("family=dense", "backend.nanotron.dataset=null", "backend.nanotron.tokenized_path=/data/tok")
    dataset = render.render_stage(tokenized, Path("/r"), 0, "r")["data_stages"][0]["data"]["dataset"]
    assert dataset["dataset_folder"] == ["/data/tok"] and dataset["vocab_size"] == 49152


@pytest.mark.parametrize("path, value, needle", [
    (("model", "model_config", "hidden_sise"), 960, "unknown keys ['hidden_sise']"),
    (("model", "model_config", "hidden_size"), "960", "model.model_config.hidden_size: expected int"),
    (("tokens", "micro_batch_size"), True, "tokens.micro_batch_size: expected int"),
    (("parallelism", "dp"), 4, "dp 4 x tp 1 x pp 1 = 4, but the job has 8 GPUs"),
    (("parallelism", "tp"), 2, "dp 8 x tp 2"),
    (("model", "dtype"), "bf16", "model.dtype=bf16: nanotron accepts"),
    (("optimizer", "learning_rate_scheduler", "lr_decay_style"), "cos", "lr_decay_style=cos"),
])
def test_schema_refuses_what_nanotron_would_reject_or_misread(path, value, needle):
    doc = copy.deepcopy(render.render_stage(config("family=dense"), Path("/r"), 0, "r"))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if path[-1] not in node:
        del node["hidden_size"]
    node[path[-1]] = value
    with pytest.raises(schema.SchemaError, match=re.escape(needle)):
        schema.validate(doc, 8)


@pytest.mark.parametrize("overrides, needle", [
    (["family=looped"], "family=looped: nanotron has no weight-shared layers; use backend=torch"),
    (["backend.nanotron.tp=3"], "tp=3 x pp=1 must divide the 8 GPUs"),
    (["backend.nanotron.micro_batch_size=5"], "must be a multiple of dp 8 x backend.nanotron.micro_batch_size=5"),
    (["backend.nanotron.tokenized_path=/d"], "set exactly one of dataset"),
    (["resources.gpus=0"], "backend=nanotron trains on whole CUDA GPUs only"),
])
def test_planning_refuses_bad_nanotron_configs(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        config(*overrides)


def test_dry_run_prints_valid_yaml_and_torchrun_per_stage(tmp_path, capsys):
    # Ray started on this machine with 8 (fake) GPUs and jobs small enough for its CPUs and memory:
    # the dry run passes the same preflight as the sweep it shows.
    argv = ["sweep", "--dry-run", "backend=nanotron", "size=360m", "family=lidas,dense", "seed=0",
            "cluster.num_gpus=8", "resources.cpus=1", "resources.memory_gb=1", f"store.root={tmp_path / 'store'}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    blocks = re.findall(r"^# stage \d+: (\d+) layers.*?\n(.*?)\n# command:\n(.*?)$", out, re.S | re.M)
    assert [int(b[0]) for b in blocks] == [4, 8, 12, 16, 20, 24, 28, 32, 32]
    for layers, text, line in blocks:
        doc = yaml.safe_load(text)
        schema.validate(doc, 8)
        assert doc["model"]["model_config"]["num_hidden_layers"] == int(layers)
        assert line.startswith("CUDA_DEVICE_MAX_CONNECTIONS=1 LOCAL_WORLD_SIZE=8 ")
        assert "-m torch.distributed.run --nnodes=1 --nproc_per_node=8" in line
        stage_dir = doc['checkpoints']['checkpoints_path'][:-len('checkpoints')]
        assert line.endswith(f"run_train.py --config-file {stage_dir}config.yaml")
    assert not (tmp_path / "store").exists()
