"""The nanotron checkpoint bridge and growth surgery, on CPU (nanotron itself needs CUDA)."""
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from jobs.families import build_model, family_of
from jobs.nanotron import bridge, surgery
from jobs.optim import build_optimizer
from orchestrator.config import RunConfig, compose_run, hydra_session


def config(*overrides: str) -> RunConfig:
    with hydra_session():
        # LIDAS from one block (2 -> 4 -> 6 layers), and no data curriculum (nanotron trains on its
        # own dataset): not the demo's regime (conf/size/data, conf/size/family), the bridge's cases.
        return compose_run(["size=tiny", "family=lidas", "tracker=none", "backend=nanotron",
                            "family.growth.initial_blocks=1", "data.warmup=null",
                            "resources.gpus=1", "backend.nanotron.micro_batch_size=4",
                            "model.n_kv_heads=1", *overrides])  # grouped-query: q, k, v differ in size


def grow(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: RunConfig) -> torch.optim.Optimizer:
    """One LIDAS growth step in process, as the torch backend grows."""
    return family_of(cfg.family).grow(model, optimizer, lambda m: build_optimizer(m, cfg.train))


def grown_model(cfg: RunConfig, growths: int) -> torch.nn.Module:
    """A LIDAS model after `growths` in-process growth steps, with distinct random weights."""
    torch.manual_seed(cfg.seed + 7)
    model = build_model(cfg.family, cfg.model)
    optimizer = build_optimizer(model, cfg.train)
    for _ in range(growths):
        optimizer = grow(model, optimizer, cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("tied", [True, False])
def test_export_then_import_gives_bit_identical_logits(tmp_path, tied):
    cfg = config(f"model.tie_embeddings={str(tied).lower()}")
    model = grown_model(cfg, growths=1)                       # 4 layers, ancestors [0, 1, 0, 1]
    step_dir = bridge.export(model, cfg, tmp_path / "ck", step=37)
    back = bridge.import_model(cfg, tmp_path / "ck")
    tokens = torch.randint(0, cfg.model.vocab_size, (3, 17))
    with torch.no_grad():
        assert torch.equal(model(tokens), back(tokens))
    assert back.ancestors == model.ancestors == [0, 1, 0, 1]
    assert (back.lm_head.weight is back.embed.weight) == tied

    # nanotron's layout: fused qkv / gate_up with tp/pp suffixes, norms without, metadata files
    layer = step_dir / "model" / "model" / "decoder" / "3" / "pp_block"
    qkv = layer / "attn" / "qkv_proj" / "model_weight_pp-rank-0-of-1_tp-rank-0-of-1.safetensors"
    with safe_open(str(qkv), framework="pt") as f:
        d, hd, kv = cfg.model.d_model, cfg.model.d_model // cfg.model.n_heads, cfg.model.n_kv_heads
        assert f.get_tensor("data").shape == (d + 2 * kv * hd, d)
        assert f.metadata()["unsharded_shape"] == f"({d + 2 * kv * hd}, {d})"
        assert f.metadata()["local_global_slices_pairs"].count(";") == 2   # q | k | v
    assert (layer / "input_layernorm" / "model_weight.safetensors").is_file()
    assert (layer / "mlp" / "gate_up_proj" / "model_weight_pp-rank-0-of-1_tp-rank-0-of-1.safetensors").is_file()
    head = step_dir / "model" / "model" / "lm_head" / "pp_block"
    assert head.exists() != tied                                # a tied head is stored once
    assert (tmp_path / "ck" / "latest.txt").read_text() == "37"
    meta = json.loads((step_dir / "checkpoint_metadata.json").read_text())
    assert meta["metas"]["last_train_step"] == 37 and meta["tp"] == 1
    assert json.loads((step_dir / "model_config.json").read_text())["num_hidden_layers"] == 4


def test_surgery_yields_exactly_the_in_process_growth(tmp_path):
    cfg = config()                                             # tiny: 2 -> 4 -> 6 layers, block 2
    model = grown_model(cfg, growths=1)
    bridge.export(model, cfg, tmp_path / "stage1", step=500)
    step = surgery.grow_checkpoint(cfg, tmp_path / "stage1", tmp_path / "grown", "# next stage\n")
    grow(model, build_optimizer(model, cfg.train), cfg)       # the torch backend, same weights
    expected = bridge.to_nanotron(model)
    got = bridge.read_tensors(tmp_path / "grown" / str(step) / "model")
    assert step == 500 and sorted(got) == sorted(expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    assert bridge.import_model(cfg, tmp_path / "grown").ancestors == model.ancestors == [0, 1, 0, 1, 0, 1]
    saved = json.loads((tmp_path / "grown" / "500" / "model_config.json").read_text())
    assert saved["num_hidden_layers"] == 6
    assert (tmp_path / "grown" / "500" / "config.yaml").read_text() == "# next stage\n"


def test_reading_merges_tensor_parallel_shards(tmp_path):
    """A tp=2 checkpoint's fused qkv: each rank holds half of q, of k and of v."""
    full = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)    # q rows 0-1, k 2-3, v 4-5
    folder = tmp_path / "model" / "model" / "decoder" / "0" / "pp_block" / "attn" / "qkv_proj"
    folder.mkdir(parents=True)
    for rank in range(2):
        rows = [2 * c + rank for c in range(3)]
        pairs = ";".join(f"{c},{c + 1},None|None,None,None#{2 * c + rank},{2 * c + rank + 1},None|None,None,None"
                         for c in range(3))
        save_file({"data": full[rows]}, str(folder / f"model_weight_pp-rank-0-of-1_tp-rank-{rank}-of-2.safetensors"),
                  metadata={"version": "1.5", "unsharded_shape": "(6, 4)", "local_global_slices_pairs": pairs})
    merged = bridge.read_tensors(tmp_path / "model")
    assert list(merged) == ["model.decoder.0.pp_block.attn.qkv_proj.weight"]
    assert torch.equal(merged["model.decoder.0.pp_block.attn.qkv_proj.weight"], full)


def test_completion_needs_latest_and_its_metadata(tmp_path):
    cfg = config()
    assert bridge.completed_step(tmp_path) is None
    bridge.export(grown_model(cfg, 0), cfg, tmp_path, step=20)
    assert bridge.completed_step(tmp_path) == 20
    (tmp_path / "latest.txt").write_text("40")                 # a step whose save did not finish
    (tmp_path / "40" / "model").mkdir(parents=True)
    assert bridge.completed_step(tmp_path) is None
    with pytest.raises(bridge.CheckpointError, match="no completed nanotron checkpoint"):
        bridge.import_model(cfg, tmp_path)
    with pytest.raises(bridge.CheckpointError, match="differs from the run's model"):
        bridge.import_model(config("model.d_model=128"), tmp_path, step=20)
