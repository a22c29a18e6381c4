"""nanotron's checkpoint layout <-> the torch model (jobs/model.py).

A nanotron checkpoint folder (`checkpoints_path`) holds latest.txt (the last completed step,
written last) and one folder per saved step:

    <step>/checkpoint_metadata.json   version, tp, dp, cp, training metadata (last step, samples)
    <step>/model_config.json          the Qwen2 model_config (jobs/nanotron/render.py)
    <step>/config.yaml                the full nanotron config (optional here)
    <step>/model/model/<module path>/model_<leaf>[_pp-rank-P-of-N_tp-rank-T-of-M].safetensors

one safetensors file per tensor under the key `data`; tensor-parallel shards carry their slice
of the full tensor in the header. q, k and v are fused in attn.qkv_proj (rows q | k | v), gate
and up in mlp.gate_up_proj (rows gate | up); a tied output head is stored once, as the embedding.
Reading merges shards of any tp/pp split; writing produces tp = pp = 1. Nothing is unpickled.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from common.atomic import write_text
from config.model import ModelConfig
from config.run import JobConfig
from jobs.families import build_model, family_of
from jobs.model import Decoder
from jobs.nanotron.render import CONFIG_FILE, model_config, stage_dir


CHECKPOINT_VERSION = "1.5"  # nanotron's CHECKPOINT_VERSION at the pinned commit
SHARD = re.compile(r"_pp-rank-(\d+)-of-(\d+)_tp-rank-(\d+)-of-(\d+)")
EMBED = "model.token_position_embeddings.pp_block.token_embedding.weight"
FINAL_NORM = "model.final_layer_norm.pp_block.weight"
LM_HEAD = "model.lm_head.pp_block.weight"
LAYER = re.compile(r"model\.decoder\.(\d+)\.pp_block\.(.+)")
# Per layer: nanotron's name -> the torch model's names fused into it (rows in this order), and
# the dimension along which tensor parallelism splits it (None: replicated, no rank suffix).
LAYER_TENSORS = {
    "input_layernorm.weight": (["attn_norm.weight"], None),
    "attn.qkv_proj.weight": (["attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"], 0),
    "attn.o_proj.weight": (["attn.o_proj.weight"], 1),
    "post_attention_layernorm.weight": (["mlp_norm.weight"], None),
    "mlp.gate_up_proj.weight": (["mlp.gate_proj.weight", "mlp.up_proj.weight"], 0),
    "mlp.down_proj.weight": (["mlp.down_proj.weight"], 1),
}


class CheckpointError(ValueError):
    """A nanotron checkpoint that is missing, incomplete or does not fit the run's model."""


# ---------------------------------------------------------------------------------------------
# Tensor files

def tensor_path(model_dir: Path, name: str, split_dim: Optional[int]) -> Path:
    """Where nanotron keeps tensor `name` at tp = pp = 1 (replicated tensors carry no suffix)."""
    *modules, leaf = name.split(".")
    suffix = "" if split_dim is None else "_pp-rank-0-of-1_tp-rank-0-of-1"
    return model_dir.joinpath(*modules, f"model_{leaf}{suffix}.safetensors")


def _slices_text(chunks: list[int], shape: tuple[int, ...], split_dim: int) -> str:
    """nanotron's slice header of an unsplit tensor (tp = 1), as its own
    create_sharded_parameter_from_config writes it: 'start,stop,step' per dimension, '|' between
    dimensions, '#' between local and global, ';' between pairs. A fused tensor (q|k|v,
    gate|up) has one pair per chunk, local = global; any other one pair whose local side is
    the whole tensor (None,None,None in every dimension)."""
    def dims(start: Optional[int], stop: Optional[int]) -> str:
        return "|".join(f"{start},{stop},None" if d == split_dim else "None,None,None"
                        for d in range(len(shape)))
    if len(chunks) == 1:
        return dims(None, None) + "#" + dims(0, chunks[0])
    pairs, start = [], 0
    for size in chunks:
        pairs.append(dims(start, start + size) + "#" + dims(start, start + size))
        start += size
    return ";".join(pairs)


def write_tensor(model_dir: Path, name: str, tensor: Tensor, split_dim: Optional[int],
                 chunks: Optional[list[int]] = None) -> None:
    path = tensor_path(model_dir, name, split_dim)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = None
    if split_dim is not None:
        shape = tuple(tensor.shape)
        metadata = {"version": CHECKPOINT_VERSION, "unsharded_shape": str(shape),
                    "local_global_slices_pairs": _slices_text(chunks or [shape[split_dim]], shape, split_dim)}
    save_file({"data": tensor.detach().contiguous().cpu()}, str(path), metadata=metadata)


def _parse_slice(text: str) -> slice:
    return slice(*(None if x == "None" else int(x) for x in text.split(",")))


def _shape(text: str) -> tuple[int, ...]:
    """nanotron's unsharded_shape header: '(64, 32)', or '(np.int64(64), 32)' as nanotron writes
    a fused tensor's under numpy >= 2 (its own reader accepts both)."""
    return tuple(int(re.sub(r"^np\.int\d*\((\d+)\)$", r"\1", x.strip()))
                 for x in text.strip().removeprefix("(").removesuffix(")").split(",") if x.strip())


def read_tensors(model_dir: Path) -> dict[str, Tensor]:
    """Every tensor under `model_dir`, by nanotron's dotted name, shards merged into full tensors."""
    shards: dict[str, list[Path]] = {}
    for path in sorted(Path(model_dir).rglob("*.safetensors")):
        relative = path.relative_to(model_dir).with_suffix("")
        leaf = SHARD.sub("", relative.name)
        if not leaf.startswith("model_"):
            raise CheckpointError(f"{path}: not a model tensor file (model_<name>[...].safetensors)")
        name = ".".join([*relative.parent.parts, leaf[len("model_"):]])
        shards.setdefault(name, []).append(path)
    tensors: dict[str, Tensor] = {}
    for name, paths in shards.items():
        full: Optional[Tensor] = None
        for path in paths:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                data, header = f.get_tensor("data"), f.metadata() or {}
            if "local_global_slices_pairs" not in header:
                full = data
                continue
            shape = _shape(header["unsharded_shape"])
            full = torch.empty(shape, dtype=data.dtype) if full is None else full
            for pair in header["local_global_slices_pairs"].split(";"):
                local, glob = (tuple(map(_parse_slice, side.split("|"))) for side in pair.split("#"))
                full[glob] = data[local]
        assert full is not None  # every name has at least one shard file
        tensors[name] = full
    return tensors


# ---------------------------------------------------------------------------------------------
# Torch model <-> nanotron names

def _fused_rows(model_cfg: ModelConfig) -> dict[str, list[int]]:
    head_dim = model_cfg.d_model // model_cfg.n_heads
    return {"attn.qkv_proj.weight": [model_cfg.n_heads * head_dim,
                                     model_cfg.n_kv_heads * head_dim,
                                     model_cfg.n_kv_heads * head_dim],
            "mlp.gate_up_proj.weight": [model_cfg.d_ff, model_cfg.d_ff]}


def split_of(name: str, tensor: Tensor, model_cfg: ModelConfig) -> tuple[Optional[int], list[int]]:
    """(dimension tensor parallelism splits, fused chunk sizes along it) of nanotron tensor `name`."""
    if name == FINAL_NORM:
        return None, []
    m = LAYER.fullmatch(name)
    if m is None:  # embedding and output head: rows (vocabulary) split
        return 0, [tensor.shape[0]]
    _, dim = LAYER_TENSORS[m.group(2)]
    return dim, [] if dim is None else _fused_rows(model_cfg).get(m.group(2), [tensor.shape[dim]])


def to_nanotron(model: Decoder) -> dict[str, Tensor]:
    """nanotron name -> tensor of a torch model's weights (fused as nanotron stores them)."""
    if model.plan != list(range(len(model.layers))):
        raise CheckpointError("a looped model has shared layers, which nanotron cannot hold")
    state = model.state_dict()
    out = {EMBED: state["embed.weight"], FINAL_NORM: state["norm.weight"]}
    if model.lm_head.weight is not model.embed.weight:
        out[LM_HEAD] = state["lm_head.weight"]
    for i in range(len(model.layers)):
        for name, (parts, _) in LAYER_TENSORS.items():
            out[f"model.decoder.{i}.pp_block.{name}"] = torch.cat([state[f"layers.{i}.{p}"] for p in parts], 0)
    return out


def to_torch(tensors: Mapping[str, Tensor], model_cfg: ModelConfig) -> dict[str, Tensor]:
    """The torch model's state dict from nanotron's tensors (float32, as the torch model trains)."""
    rows = _fused_rows(model_cfg)
    state = {"embed.weight": tensors[EMBED], "norm.weight": tensors[FINAL_NORM],
             "lm_head.weight": tensors.get(LM_HEAD, tensors[EMBED])}
    for name, tensor in tensors.items():
        m = LAYER.fullmatch(name)
        if not m:
            continue
        parts, _ = LAYER_TENSORS[m.group(2)]
        pieces = torch.split(tensor, rows[m.group(2)], 0) if len(parts) > 1 else [tensor]
        for part, piece in zip(parts, pieces):
            state[f"layers.{m.group(1)}.{part}"] = piece
    return {k: v.float() for k, v in state.items()}


# ---------------------------------------------------------------------------------------------
# Checkpoint folders

def completed_step(checkpoints_path: Path) -> Optional[int]:
    """The last completed step: latest.txt says N and <N>/checkpoint_metadata.json exists (a
    crash can leave a newer step folder without both). None when there is none."""
    latest = Path(checkpoints_path) / "latest.txt"
    try:
        step = int(latest.read_text().strip())
    except (OSError, ValueError):
        return None
    return step if (Path(checkpoints_path) / str(step) / "checkpoint_metadata.json").is_file() else None


def read_metadata(step_dir: Path) -> dict:
    return json.loads((Path(step_dir) / "checkpoint_metadata.json").read_text())


def write_step(checkpoints_path: Path, step: int, tensors: Mapping[str, Tensor], model_cfg: ModelConfig,
               model_cfg_doc: dict, metadata: dict, config_yaml: Optional[str] = None) -> Path:
    """Write <step>/ (tensors, model_config.json, checkpoint_metadata.json, config.yaml), then
    latest.txt last, atomically, so a reader never sees latest.txt before the step is whole."""
    step_dir = Path(checkpoints_path) / str(step)
    for name, tensor in tensors.items():
        write_tensor(step_dir / "model", name, tensor, *split_of(name, tensor, model_cfg))
    write_text(step_dir / "model_config.json", json.dumps(model_cfg_doc, indent=2, sort_keys=True))
    if config_yaml is not None:
        write_text(step_dir / CONFIG_FILE, config_yaml)
    write_text(step_dir / "checkpoint_metadata.json", json.dumps(metadata, indent=2, sort_keys=True))
    write_text(Path(checkpoints_path) / "latest.txt", str(step))
    return step_dir


def training_metadata(step: int, samples: int, seq_len: int, **custom) -> dict:
    """checkpoint_metadata.json of a tp = dp = cp = 1 checkpoint after `step` steps. nanotron's
    load_meta requires consumed_tokens_total to equal the sum of the per-dataset-folder token
    counts, which are not known here (they key nanoset folders): null, which nanotron fills in
    from that sum. The data position that resuming uses is consumed_train_samples."""
    return {"version": CHECKPOINT_VERSION, "tp": 1, "dp": 1, "cp": 1,
            "custom_metas": custom or None,
            "metas": {"consumed_train_samples": samples, "last_train_step": step,
                      "consumed_tokens_total": None, "last_stage_idx": 0,
                      "data_stages": [{"name": "train", "start_training_step": 1,
                                       "consumed_train_samples": samples, "sequence_length": seq_len,
                                       "consumed_tokens_per_dataset_folder": {}}]}}


def export(model: Decoder, cfg: JobConfig, checkpoints_path: Path, step: int) -> Path:
    """A torch model as nanotron checkpoint `step` (tp = pp = 1), with its ancestry recorded."""
    samples = step * cfg.train.batch_size
    meta = training_metadata(step, samples, cfg.model.max_seq_len, ancestors=list(model.ancestors))
    return write_step(checkpoints_path, step, to_nanotron(model), cfg.model,
                      model_config(cfg, len(model.layers)), meta)


def ancestors_at(cfg: JobConfig, n_layers: int) -> list[int]:
    """The ancestry of the family's network at depth n_layers (for LIDAS: the growth operator
    applied stage by stage from the initial layers, as the torch backend grows in-process)."""
    return family_of(cfg.family).ancestors(cfg.model, cfg.train.steps, n_layers)


def import_model(cfg: JobConfig, checkpoints_path: Path, step: Optional[int] = None) -> Decoder:
    """The torch model of nanotron checkpoint `step` (default: the last completed one)."""
    step = completed_step(checkpoints_path) if step is None else step
    if step is None:
        raise CheckpointError(f"{checkpoints_path}: no completed nanotron checkpoint (latest.txt "
                              f"and <step>/checkpoint_metadata.json)")
    step_dir = Path(checkpoints_path) / str(step)
    saved = json.loads((step_dir / "model_config.json").read_text())
    n_layers = saved["num_hidden_layers"]
    expected = model_config(cfg, n_layers)
    differ = sorted(k for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                "intermediate_size", "vocab_size", "tie_word_embeddings",
                                "rope_theta", "rms_norm_eps", "rope_interleaved")
                    if saved.get(k) != expected[k])
    if differ:
        raise CheckpointError(f"{step_dir}: model_config differs from the run's model in {differ}")
    custom = read_metadata(step_dir).get("custom_metas") or {}
    ancestors = custom.get("ancestors") or ancestors_at(cfg, n_layers)
    model = build_model(cfg.family, cfg.model, ancestors)
    if len(model.layers) != n_layers:
        raise CheckpointError(f"{step_dir}: {n_layers} layers, the run's model has {len(model.layers)}")
    model.load_state_dict(to_torch(read_tensors(step_dir / "model"), cfg.model))
    return model


def final_model(cfg: JobConfig, run_dir: Path) -> Decoder:
    """The finished nanotron run's torch model (what its evaluations load); refuses a run whose
    last stage has not saved step train.steps."""
    steps = cfg.train.steps
    last = stage_dir(run_dir, len(family_of(cfg.family).stages(cfg.model, steps)) - 1) / "checkpoints"
    step = completed_step(last)
    if step != steps:
        raise FileNotFoundError(f"{run_dir} has no final nanotron checkpoint (step {steps} in "
                                f"{last}); found {'none' if step is None else f'step {step}'}")
    return import_model(cfg, last, step)
