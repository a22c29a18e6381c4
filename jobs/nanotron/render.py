"""One nanotron YAML per training stage, rendered from the run's resolved config, and the exact
`torchrun` command that trains it.

A dense run is one stage; a LIDAS run has one stage per depth (its family's `stages`),
each a nanotron run of that depth that trains up to the stage's end step and resumes from the
previous stage's checkpoint grown by surgery (jobs/nanotron/surgery.py). The model keeps the
size's hyper-parameters exactly; only the depth changes between stages.

Files of stage i live in run_dir/nanotron/stage<i>/: config.yaml (this render), checkpoints/
(nanotron's own) and, for i > 0, grown/ (the previous stage's final checkpoint, one block deeper).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from config.backend import NanotronSettings
from config.run import JobConfig
from jobs.families import Stage, family_of
from jobs.launch import torchrun_command
from jobs.nanotron.schema import NANOTRON_COMMIT, validate


NORM_PARAMS = [".*layernorm.*", ".*final_layer_norm.*"]  # no weight decay on norms, as jobs/optim.py


@dataclass(frozen=True)
class Layout:
    """Where the job's ranks are: nodes x GPUs per node, split as dp x tp x pp."""
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)


def settings(cfg: JobConfig) -> NanotronSettings:
    return cfg.backend.nanotron  # type: ignore[attr-defined]  # backend=nanotron's section


def layout(cfg: JobConfig) -> Layout:
    nt, r = settings(cfg), cfg.resources
    return Layout(r.nodes, int(r.gpus), nt.tp, nt.pp)


CONFIG_FILE = "config.yaml"  # nanotron's name for its config: in a stage directory and in each checkpoint


def stage_dir(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / "nanotron" / f"stage{index}"


def stages(cfg: JobConfig) -> list[Stage]:
    """The run's training stages (one for dense)."""
    return family_of(cfg.family).stages(cfg.model, cfg.train.steps)


def model_config(cfg: JobConfig, n_layers: int) -> dict:
    """nanotron's Qwen2 model_config for the size at depth `n_layers` (attention bias off, RoPE
    on channel halves as jobs/model.py, SwiGLU, RMSNorm)."""
    m = cfg.model
    return {
        "is_qwen2_config": True, "hidden_size": m.d_model, "num_hidden_layers": n_layers,
        "num_attention_heads": m.n_heads, "num_key_value_heads": m.n_kv_heads,
        "intermediate_size": m.d_ff, "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_seq_len, "rms_norm_eps": float(m.norm_eps),
        "rope_theta": float(m.rope_theta), "rope_interleaved": False,
        "tie_word_embeddings": m.tie_embeddings, "hidden_act": "silu", "attention_bias": False,
        "initializer_range": float(m.init_std), "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": None, "rope_scaling": None, "pretraining_tp": 1, "use_cache": True,
        "z_loss_enabled": False, "_attn_implementation": settings(cfg).attn_implementation,
        "_use_doc_masking": False,
    }


def _dataset(cfg: JobConfig) -> Optional[dict]:
    nt = settings(cfg)
    if nt.dummy_data:
        return None
    if nt.tokenized_path is not None:
        return {"dataset_folder": [nt.tokenized_path], "dataset_weights": None,
                "tokenizer_name": nt.tokenizer, "vocab_size": cfg.model.vocab_size,
                "token_size_in_bytes": nt.token_size_in_bytes}
    return {"hf_dataset_or_datasets": nt.dataset, "hf_dataset_splits": nt.dataset_split,
            "hf_dataset_config_name": nt.dataset_config, "text_column_name": nt.text_column,
            "dataset_processing_num_proc_per_process": 1, "dataset_overwrite_cache": False}


def render_stage(cfg: JobConfig, run_dir: Path, index: int, run_name: str,
                 resume: Optional[Path] = None, load_optimizer: bool = True) -> dict:
    """The nanotron config of stage `index`; `resume` is the checkpoints folder (with latest.txt)
    it continues from, decided by the caller from what is on disk (nanotron would silently start
    from scratch when it finds nothing). Validated against jobs/nanotron/schema.py."""
    stage = stages(cfg)[index]
    t, m, nt, lay = cfg.train, cfg.model, settings(cfg), layout(cfg)
    accumulation = t.batch_size // (lay.dp * nt.micro_batch_size)
    doc = {
        "general": {"project": nt.project, "run": run_name, "seed": cfg.effective_init_seed,
                    "step": None, "consumed_train_samples": None, "benchmark_csv_path": None,
                    "ignore_sanity_checks": True},
        "parallelism": {"dp": lay.dp, "pp": lay.pp, "tp": lay.tp, "pp_engine": "1f1b",
                        "tp_mode": "REDUCE_SCATTER" if lay.tp > 1 else "ALL_REDUCE",
                        "tp_linear_async_communication": lay.tp > 1, "recompute_layer": False,
                        "tp_recompute_allgather": True, "expert_parallel_size": 1,
                        "context_parallel_size": 1},
        "model": {"dtype": nt.dtype,
                  "init_method": {"std": float(m.init_std), "scaling_method": "NONE"},
                  "make_vocab_size_divisible_by": 1, "ddp_bucket_cap_mb": 25,
                  "model_config": model_config(cfg, stage.n_layers)},
        "tokenizer": {"tokenizer_name_or_path": None if nt.dummy_data else nt.tokenizer,
                      "tokenizer_revision": None,
                      "tokenizer_max_length": None},
        "checkpoints": {"checkpoints_path": str(stage_dir(run_dir, index) / "checkpoints"),
                        "checkpoint_interval": t.checkpoint_every, "save_initial_state": False,
                        "save_final_state": True,
                        "resume_checkpoint_path": None if resume is None else str(resume),
                        "load_lr_scheduler": True, "load_optimizer": load_optimizer,
                        "checkpoints_path_is_shared_file_system": True},
        "logging": {"log_level": "info", "log_level_replica": "info",
                    "iteration_step_info_interval": t.log_every},
        "tokens": {"sequence_length": m.max_seq_len, "train_steps": stage.end_step,
                   "micro_batch_size": nt.micro_batch_size,
                   "batch_accumulation_per_replica": accumulation, "val_check_interval": -1,
                   "limit_val_batches": 0, "limit_test_batches": 0},
        "optimizer": {
            "optimizer_factory": {"name": "adamW", "adam_beta1": float(t.beta1),
                                  "adam_beta2": float(t.beta2), "adam_eps": 1e-8,
                                  "torch_adam_is_fused": True},
            "zero_stage": nt.zero_stage, "weight_decay": float(t.weight_decay),
            "clip_grad": float(t.grad_clip), "accumulate_grad_in_fp32": True,
            "learning_rate_scheduler": {
                "learning_rate": float(t.lr), "lr_warmup_steps": t.warmup_steps,
                "lr_warmup_style": "linear", "lr_decay_style": "cosine",
                "lr_decay_steps": max(1, t.steps - t.warmup_steps),
                "lr_decay_starting_step": None, "min_decay_lr": float(t.lr * t.min_lr_ratio)},
            "weight_decay_exclude_named_params": list(NORM_PARAMS)},
        "data_stages": [{"name": "train", "start_training_step": 1,
                         "data": {"dataset": _dataset(cfg), "seed": cfg.effective_data_seed,
                                  "num_loading_workers": 1},
                         "sequence_length": m.max_seq_len}],
        "lighteval": None,
        "profiler": None,
    }
    validate(doc, lay.world)
    return doc


def to_yaml(doc: Mapping) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False)


def entry(cfg: JobConfig, config_file: Path) -> list[str]:
    """What torchrun starts on every GPU: nanotron's trainer on the stage's YAML."""
    return [settings(cfg).run_train, "--config-file", str(config_file)]


def command(cfg: JobConfig, config_file: Path, *, node_rank: int = 0,
            master_addr: str = "127.0.0.1", master_port: int | str = 29500) -> list[str]:
    """The torchrun command of one node for one stage (jobs/launch.py's static rendezvous), as
    jobs/nanotron/train.py runs it; a str port prints a placeholder (the dry run)."""
    lay = layout(cfg)
    return torchrun_command(entry(cfg, config_file), nnodes=lay.nodes,
                            nproc_per_node=lay.gpus_per_node, node_rank=node_rank,
                            master_addr=master_addr, master_port=master_port)  # type: ignore[arg-type]


def environment(cfg: JobConfig, stage: int) -> dict[str, str]:
    """What nanotron's ranks need besides the command: one CUDA connection (its TP overlap relies
    on it), the real LOCAL_WORLD_SIZE (nanotron assumes 8 above 8 GPUs), and, when the run is
    tracked (the orchestrator sets W&B's variables for the job), the stage's own W&B run id
    `<run id>-stage<i>` (resumed by a retry); the run id itself stays the orchestrator's run,
    which holds the metrics and evaluations."""
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "LOCAL_WORLD_SIZE": str(layout(cfg).gpus_per_node)}
    if run_id := os.environ.get("WANDB_RUN_ID"):
        env["WANDB_RUN_ID"] = f"{run_id}-stage{stage}"
    return env


def dry_run_text(cfg: JobConfig, run_id: str, run_dir: Path) -> str:
    """What `--dry-run` prints for a nanotron run: each stage's YAML and its torchrun line."""
    lay = layout(cfg)
    where = ("" if lay.nodes == 1 else
             f" (on node rank r of {lay.nodes}: --node_rank=r, --master_addr=<node 0's address>)")
    out = [f"# run {run_id}: nanotron@{NANOTRON_COMMIT[:12]}, dp={lay.dp} tp={lay.tp} pp={lay.pp}"
           f" on {lay.nodes} x {lay.gpus_per_node} GPUs"]
    for i, stage in enumerate(stages(cfg)):
        resume = None if i == 0 else stage_dir(run_dir, i) / "grown"
        doc = render_stage(cfg, run_dir, i, f"{run_id}-stage{i}", resume, load_optimizer=i == 0)
        config_file = stage_dir(run_dir, i) / CONFIG_FILE
        argv = command(cfg, config_file, master_port="$MASTER_PORT")
        env = " ".join(f"{k}={v}" for k, v in environment(cfg, i).items())
        out += [f"# stage {i}: {stage.n_layers} layers, steps {stage.start_step}..{stage.end_step}"
                f" -> {config_file}", to_yaml(doc).rstrip(),
                f"# command{where}:", f"{env} {' '.join(argv)}"]
    return "\n".join(out)
