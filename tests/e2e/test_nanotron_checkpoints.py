"""The checkpoint bridge (jobs/nanotron/bridge.py) against nanotron's own checkpoint code.

nanotron's Qwen2ForTraining is built on CPU in the side environment (tests/nanotron_side.py,
tests/nanotron_env/checkpoints.py) over two gloo ranks, as tp=2, as pp=2 (the tied embedding and
output head on different pipeline ranks) and as dp=2 untied; nanotron's own load_weights reads
what the bridge wrote, its save_weights writes what the bridge must read, its load_meta reads the
bridge's metadata. The names, files, shard headers and values are compared here.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import nanotron_side
from jobs.families import build_model
from jobs.nanotron import bridge, render
from orchestrator.config import RunConfig, compose_run, hydra_session

STEP = 7


def config(tied: bool, *overrides: str) -> RunConfig:
    with hydra_session():  # tp=2 needs heads and KV heads divisible by 2; 3 layers split over pp=2
        return compose_run(["size=tiny", "family=dense", "tracker=none", "backend=nanotron",
                            "resources.gpus=1", "backend.nanotron.micro_batch_size=4",
                            "model.n_heads=4", "model.n_kv_heads=2", "model.n_layers=3",
                            f"model.tie_embeddings={str(tied).lower()}", *overrides])


def exported(cfg: RunConfig, folder: Path) -> tuple[dict, Path, Path]:
    """A torch model with distinct random weights, exported by the bridge; its tensors by
    nanotron name (the reference), the reference file and the bridge's step folder."""
    torch.manual_seed(11)
    model = build_model(cfg.family, cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    step_dir = bridge.export(model, cfg, folder / "bridge", STEP)
    reference = {k: v.contiguous().clone() for k, v in bridge.to_nanotron(model).items()}
    save_file(reference, str(folder / "reference.safetensors"))
    return reference, folder / "reference.safetensors", step_dir


@pytest.fixture(scope="module")
def nanotron_checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nanotron-checkpoints")
    tied_cfg, untied_cfg = config(True), config(False)
    tied, tied_file, tied_step = exported(tied_cfg, folder / "tied")
    untied, untied_file, untied_step = exported(untied_cfg, folder / "untied")
    untied_mc = render.model_config(config(False, "backend.nanotron.attn_implementation=sdpa"), 3)
    assert untied_mc == {**render.model_config(untied_cfg, 3), "_attn_implementation": "sdpa"}
    layouts = [
        {"name": "tp2", "tp": 2, "pp": 1, "dp": 1},
        {"name": "pp2", "tp": 1, "pp": 2, "dp": 1},
        {"name": "dp2-untied-sdpa", "tp": 1, "pp": 1, "dp": 2, "attention": True,
         "override": {"model_config": untied_mc, "reference": str(untied_file),
                      "bridge_step": str(untied_step)}},
    ]
    answer = nanotron_side.run("checkpoints.py", {
        "world": 2, "model_config": render.model_config(tied_cfg, 3), "reference": str(tied_file),
        "bridge_step": str(tied_step), "out": str(folder / "nanotron"), "layouts": layouts})
    return {"ranks": answer["ranks"], "out": folder / "nanotron",
            "reference": {"tp2": tied, "pp2": tied, "dp2-untied-sdpa": untied},
            "cfg": {"tp2": tied_cfg, "pp2": tied_cfg, "dp2-untied-sdpa": untied_cfg},
            "bridge_step": {"tp2": tied_step, "pp2": tied_step, "dp2-untied-sdpa": untied_step}}


LAYOUTS = ["tp2", "pp2", "dp2-untied-sdpa"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nanotrons_parameter_names_are_the_bridges(nanotron_checkpoints, layout):
    """Every parameter nanotron's serializer names (tied ones under the tie's name, over all ranks)
    is a tensor the bridge writes, and the bridge shards exactly those nanotron shards."""
    ranks = nanotron_checkpoints["ranks"]
    names = {}
    for rank in ranks:
        names.update(rank[layout]["names"])
    reference, cfg = nanotron_checkpoints["reference"][layout], nanotron_checkpoints["cfg"][layout]
    assert sorted(names) == sorted(reference)
    for name, unsharded in names.items():
        split, _ = bridge.split_of(name, reference[name], cfg.model)
        assert (unsharded is not None) == (split is not None), name
        if unsharded is not None:
            assert unsharded == str(tuple(reference[name].shape)), name


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nanotron_loads_what_the_bridge_wrote(nanotron_checkpoints, layout):
    """nanotron's load_weights on the bridge's tp=pp=1 files: the same files at dp=2, and at tp=2
    and pp=2 its topology-change path through the bridge's shard headers; every local shard
    equals the bridge's tensor. Its load_meta reads the bridge's checkpoint_metadata.json."""
    for rank in nanotron_checkpoints["ranks"]:
        found = rank[layout]
        assert found["load_mismatches"] == []
        assert found["meta"] == {"version": "1.5", "last_train_step": STEP,
                                 "consumed_train_samples": STEP * nanotron_checkpoints["cfg"][layout].train.batch_size}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_bridge_reads_what_nanotron_wrote(nanotron_checkpoints, layout):
    """nanotron's save_weights (rank-suffixed shards at tp=2 and pp=2, only dp rank 0 at dp=2,
    a tied head stored once): the bridge merges them into exactly the tensors nanotron held."""
    got = bridge.read_tensors(nanotron_checkpoints["out"] / layout / "model")
    reference = nanotron_checkpoints["reference"][layout]
    assert sorted(got) == sorted(reference)
    assert all(torch.equal(got[name], reference[name]) for name in reference)
    files = [p.name for p in (nanotron_checkpoints["out"] / layout).rglob("*.safetensors")]
    if layout == "tp2":
        assert "model_weight_pp-rank-0-of-1_tp-rank-1-of-2.safetensors" in files
    if layout == "pp2":
        assert "model_weight_pp-rank-1-of-2_tp-rank-0-of-1.safetensors" in files


def _header(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
    if "unsharded_shape" in meta:  # nanotron under numpy 2 writes np.int64(N) for fused rows
        meta["unsharded_shape"] = re.sub(r"np\.int64\((\d+)\)", r"\1", meta["unsharded_shape"])
    return meta


def test_the_bridge_writes_the_files_nanotron_writes(nanotron_checkpoints):
    """At tp = pp = 1 (dp=2: rank 0 writes) nanotron's save_weights and the bridge produce the
    same file names, the same tensors and the same shard headers (version, unsharded shape,
    slices of the fused q|k|v and gate|up chunks)."""
    theirs_root = nanotron_checkpoints["out"] / "dp2-untied-sdpa" / "model"
    ours_root = nanotron_checkpoints["bridge_step"]["dp2-untied-sdpa"] / "model"
    theirs = sorted(p.relative_to(theirs_root) for p in theirs_root.rglob("*.safetensors"))
    ours = sorted(p.relative_to(ours_root) for p in ours_root.rglob("*.safetensors"))
    assert theirs == ours
    for relative in ours:
        assert _header(theirs_root / relative) == _header(ours_root / relative), relative


def test_sdpa_still_calls_flash_attn_at_the_pinned_commit(nanotron_checkpoints):
    """backend.nanotron.attn_implementation=sdpa reaches nanotron, but its Qwen2 attention takes the
    packed-qkv path and calls flash-attn's varlen kernel regardless: sdpa does not make nanotron
    run without flash-attn at this commit (jobs/nanotron/schema.py)."""
    reached = {rank["dp2-untied-sdpa"]["attention_reaches"] for rank in nanotron_checkpoints["ranks"]}
    assert reached == {"flash_attn.modules.mha.flash_attn_varlen_kvpacked_func"}

