"""The project's typed schema of nanotron's YAML config (git main at NANOTRON_COMMIT).

nanotron parses its YAML with dacite into dataclasses (strict: unknown keys fail), but a
`model_config` that dacite cannot type falls back to a plain dict that nanotron then passes to
Qwen2Config(**dict) unchecked: a string where an int belongs is accepted there and fails (or
misbehaves) only on the GPUs. This schema covers every section and field this project renders,
types each one, refuses unknown and missing keys, and checks what nanotron checks only at start-up
(dp x tp x pp = world size) or not at all (the optimizer's name against its settings), so a bad
render fails here, on a CPU, before any GPU job is queued, with the key in the message. Field
names follow nanotron's own dataclasses (src/nanotron/config/{config,models_config,
parallelism_config}.py). tests/e2e/test_nanotron_loader.py runs nanotron's own loader on every
rendered stage and on mutated ones: this schema never accepts what nanotron refuses, and each
thing it refuses that nanotron's loader accepts is listed there with the reason.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional, Union

from config.backend import ATTN_IMPLEMENTATIONS

NANOTRON_COMMIT = "2411b022a75fb7f7561a1bb4166706da5e1b76de"  # huggingface/nanotron main, 2026-04-07
# A checkout, not just the package: the job runs its run_train.py (backend.nanotron.run_train).
INSTALL_LINE = (f"git clone https://github.com/huggingface/nanotron && git -C nanotron checkout "
                f"{NANOTRON_COMMIT} && pip install -e ./nanotron")


LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "passive")


class SchemaError(ValueError):
    """A rendered nanotron config that nanotron would reject (or misread); one line."""


@dataclass
class General:
    project: str
    run: str
    seed: int
    step: Optional[int]
    consumed_train_samples: Optional[int]
    benchmark_csv_path: Optional[str]
    ignore_sanity_checks: bool


@dataclass
class Parallelism:
    dp: int
    pp: int
    tp: int
    pp_engine: str
    tp_mode: str
    tp_linear_async_communication: bool
    recompute_layer: bool
    tp_recompute_allgather: bool
    expert_parallel_size: int
    context_parallel_size: int


@dataclass
class InitMethod:
    std: float
    scaling_method: str


@dataclass
class Qwen2ModelConfig:
    """nanotron's Qwen2Config with attention bias off: the same Llama-style decoder as jobs/model.py."""
    is_qwen2_config: bool
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_interleaved: bool
    tie_word_embeddings: bool
    hidden_act: str
    attention_bias: bool
    initializer_range: float
    bos_token_id: int
    eos_token_id: int
    pad_token_id: Optional[int]
    rope_scaling: Optional[dict]
    pretraining_tp: int
    use_cache: bool
    z_loss_enabled: bool
    _attn_implementation: str
    _use_doc_masking: bool


@dataclass
class Model:
    dtype: str
    init_method: InitMethod
    make_vocab_size_divisible_by: int
    ddp_bucket_cap_mb: int
    model_config: Qwen2ModelConfig


@dataclass
class Tokenizer:
    tokenizer_name_or_path: Optional[str]
    tokenizer_revision: Optional[str]
    tokenizer_max_length: Optional[int]


@dataclass
class Checkpoints:
    checkpoints_path: str
    checkpoint_interval: int
    save_initial_state: bool
    save_final_state: bool
    resume_checkpoint_path: Optional[str]
    load_lr_scheduler: bool
    load_optimizer: bool
    checkpoints_path_is_shared_file_system: bool


@dataclass
class Logging:
    log_level: str
    log_level_replica: str
    iteration_step_info_interval: int


@dataclass
class Tokens:
    sequence_length: int
    train_steps: int
    micro_batch_size: int
    batch_accumulation_per_replica: int
    val_check_interval: int
    limit_val_batches: int
    limit_test_batches: int


@dataclass
class AdamW:
    name: str
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    torch_adam_is_fused: bool


@dataclass
class LRScheduler:
    learning_rate: float
    lr_warmup_steps: int
    lr_warmup_style: str
    lr_decay_style: str
    lr_decay_steps: int
    lr_decay_starting_step: Optional[int]
    min_decay_lr: float


@dataclass
class Optimizer:
    optimizer_factory: AdamW
    zero_stage: int
    weight_decay: float
    clip_grad: Optional[float]
    accumulate_grad_in_fp32: bool
    learning_rate_scheduler: LRScheduler
    weight_decay_exclude_named_params: list[str]


@dataclass
class HFDataset:
    """A Hugging Face dataset, tokenized by nanotron at start-up (PretrainDatasetsArgs)."""
    hf_dataset_or_datasets: str
    hf_dataset_splits: str
    hf_dataset_config_name: Optional[str]
    text_column_name: str
    dataset_processing_num_proc_per_process: int
    dataset_overwrite_cache: bool


@dataclass
class TokenizedDataset:
    """A folder of already tokenized shards (NanosetDatasetsArgs)."""
    dataset_folder: list[str]
    dataset_weights: Optional[list[float]]
    tokenizer_name: str
    vocab_size: int
    token_size_in_bytes: int


@dataclass
class Data:
    dataset: Optional[Union[HFDataset, TokenizedDataset]]  # null: nanotron's dummy token stream
    seed: int
    num_loading_workers: int


@dataclass
class DataStage:
    name: str
    start_training_step: int
    data: Data
    sequence_length: int


@dataclass
class NanotronConfig:
    general: General
    parallelism: Parallelism
    model: Model
    tokenizer: Tokenizer
    checkpoints: Checkpoints
    logging: Logging
    tokens: Tokens
    optimizer: Optimizer
    data_stages: list[DataStage]
    lighteval: None
    profiler: None


CHOICES = {
    "parallelism.pp_engine": ("1f1b", "afab"),
    "parallelism.tp_mode": ("ALL_REDUCE", "REDUCE_SCATTER"),
    "model.dtype": ("bfloat16", "float32", "float16"),
    "model.init_method.scaling_method": ("NONE", "NUM_LAYERS", "LAYER_INDEX", "MODEL_SCALE"),
    "model.model_config._attn_implementation": ATTN_IMPLEMENTATIONS,
    "logging.log_level": LOG_LEVELS,
    "logging.log_level_replica": LOG_LEVELS,
    "optimizer.learning_rate_scheduler.lr_warmup_style": ("linear", "constant"),
    "optimizer.learning_rate_scheduler.lr_decay_style": ("linear", "cosine", "1-sqrt"),
    "optimizer.optimizer_factory.name": ("adamW",),
}


def _check_value(hint: Any, value: Any, where: str) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None) or hint is None:
        if value is not None:
            raise SchemaError(f"{where}: must be null, got {value!r}")
    elif origin is Union:
        if value is None and type(None) in args:
            return
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                _check_value(option, value, where)
                return
            except SchemaError as e:
                errors.append(str(e))
        raise SchemaError(errors[0] if len(errors) == 1 else f"{where}: matches none of "
                          f"{', '.join(o.__name__ for o in options)} ({'; '.join(errors)})")
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a hint is a class, never an instance
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: must be a mapping ({hint.__name__}), got {value!r}")
        hints = typing.get_type_hints(hint)
        unknown = sorted(set(value) - set(hints))
        missing = [k for k in hints if k not in value]
        if unknown or missing:
            raise SchemaError(f"{where or 'config'}: unknown keys {unknown}, missing keys {missing}")
        for key, sub in hints.items():
            _check_value(sub, value[key], f"{where}.{key}" if where else key)
    elif origin is list:
        if not isinstance(value, list):
            raise SchemaError(f"{where}: must be a list, got {value!r}")
        for i, item in enumerate(value):
            _check_value(args[0], item, f"{where}[{i}]")
    else:
        ok = (isinstance(value, hint) and not (hint is int and isinstance(value, bool))
              or hint is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise SchemaError(f"{where}: expected {hint.__name__}, got {value!r}")
    if where in CHOICES and value not in CHOICES[where]:
        raise SchemaError(f"{where}={value}: nanotron accepts {', '.join(CHOICES[where])}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise SchemaError(message)


def validate(doc: dict, world_size: int) -> None:
    """Types, keys and nanotron's start-up assertions of one rendered config; raises SchemaError."""
    _check_value(NanotronConfig, doc, "")
    par, mc, tok = doc["parallelism"], doc["model"]["model_config"], doc["tokens"]
    product = par["dp"] * par["tp"] * par["pp"]
    _require(product == world_size, f"parallelism: dp {par['dp']} x tp {par['tp']} x pp {par['pp']} "
             f"= {product}, but the job has {world_size} GPUs")
    heads, kv = mc["num_attention_heads"], mc["num_key_value_heads"]
    _require(heads % par["tp"] == 0 and kv % par["tp"] == 0,
             f"parallelism.tp={par['tp']}: must divide num_attention_heads={heads} and "
             f"num_key_value_heads={kv}")
    _require(heads % kv == 0, f"num_key_value_heads={kv}: must divide num_attention_heads={heads}")
    _require(mc["hidden_size"] % heads == 0 and (mc["hidden_size"] // heads) % 2 == 0,
             f"hidden_size={mc['hidden_size']}: must be num_attention_heads x an even head size")
    _require(mc["intermediate_size"] % par["tp"] == 0 and mc["vocab_size"] % par["tp"] == 0,
             f"parallelism.tp={par['tp']}: must divide intermediate_size and vocab_size")
    _require(par["pp"] <= mc["num_hidden_layers"],
             f"parallelism.pp={par['pp']}: more pipeline stages than the {mc['num_hidden_layers']} layers")
    for key in ("train_steps", "micro_batch_size", "batch_accumulation_per_replica", "sequence_length"):
        _require(tok[key] > 0, f"tokens.{key}={tok[key]}: must be > 0")
    _require(tok["sequence_length"] <= mc["max_position_embeddings"],
             f"tokens.sequence_length={tok['sequence_length']}: longer than max_position_embeddings")
    ck = doc["checkpoints"]
    _require(ck["checkpoint_interval"] > 0, "checkpoints.checkpoint_interval: must be > 0")
    stages = doc["data_stages"]
    _require(len(stages) >= 1 and stages[0]["start_training_step"] == 1,
             "data_stages: the first stage must start at training step 1")
    for stage in stages:
        ds = stage["data"]["dataset"] or {}
        weights = ds.get("dataset_weights")
        _require(weights is None or len(weights) == len(ds["dataset_folder"]),
                 f"data_stages[{stage['name']}]: {len(weights or [])} dataset_weights for "
                 f"{len(ds.get('dataset_folder') or [])} dataset_folder entries")
        if "vocab_size" in ds:
            _require(ds["vocab_size"] == mc["vocab_size"] and
                     ds["tokenizer_name"] == doc["tokenizer"]["tokenizer_name_or_path"],
                     f"data_stages[{stage['name']}]: the tokenized data's vocab_size/tokenizer "
                     f"differ from the model's")
