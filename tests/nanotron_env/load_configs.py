"""Run in .venv-nanotron (tests/nanotron_side.py): nanotron's own loader on rendered stage YAMLs.

stdin: {"configs": [{"path": yaml, "lr_steps": [scheduler step, ...]}, ...]}. stdout, one JSON line:
{"results": [one per path], "nanotron": facts about the installed nanotron}. A result is either
{"ok": true, "config": nanotron's own serialization of what it parsed, "derived": values nanotron
computes from it, "model_config_strict": null or why Qwen2Config refuses the model_config under
dacite's strict typing} or {"ok": false, "error": {"type", "message"}} with nanotron's exception.
"""
import dataclasses
import json
import sys
import tempfile
import typing

import dacite
import torch
import yaml

import standins

standins.activate()

# nanotron only after the stand-ins are on the path
from nanotron.config import Config, Qwen2Config, get_config_from_file  # noqa: E402
from nanotron.config.utils_config import serialize  # noqa: E402
from nanotron.constants import CHECKPOINT_VERSION  # noqa: E402
from nanotron.helpers import lr_scheduler_builder  # noqa: E402
from nanotron.nn.attention import ALL_ATTENTION_FUNCTIONS  # noqa: E402


def strict_model_config(mc: dict):
    """get_config_from_file turns a model_config that dacite cannot type into a plain
    Qwen2Config(**dict), unchecked; this says whether it is well typed."""
    try:
        dacite.from_dict(Qwen2Config, mc, config=dacite.Config(strict=True))
        return None
    except Exception as e:  # noqa: BLE001 - reported, not handled
        return f"{type(e).__name__}: {e}"


class _Optimizer:
    def __init__(self, lr: float):
        self.base = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)

    def get_base_optimizer(self):
        return self.base


def learning_rates(cfg: Config, steps: list[int]) -> dict:
    """nanotron's own scheduler (helpers.lr_scheduler_builder): the rate of each 0-based
    scheduler step (nanotron's optimizer step k runs at scheduler step k - 1)."""
    args = cfg.optimizer.learning_rate_scheduler
    scheduler = lr_scheduler_builder(_Optimizer(args.learning_rate), args, cfg.tokens.train_steps)
    return {str(s): scheduler.lr_lambdas[0](s) * args.learning_rate for s in steps}


def load(path: str, lr_steps: list[int]) -> dict:
    try:
        cfg = get_config_from_file(path)
    except Exception as e:  # noqa: BLE001 - nanotron's verdict is the result
        return {"ok": False, "error": {"type": type(e).__name__, "message": str(e)}}
    mc = cfg.model.model_config
    with open(path) as f:
        raw = yaml.safe_load(f)
    return {"ok": True, "config": serialize(cfg),
            "derived": {"model_config_class": type(mc).__name__,
                        "global_batch_size": cfg.global_batch_size,
                        "global_batch_size_in_tokens": cfg.global_batch_size_in_tokens,
                        "dtype": str(cfg.model.dtype),
                        "pp_engine": type(cfg.parallelism.pp_engine).__name__,
                        "tp_mode": cfg.parallelism.tp_mode.name,
                        "init_scaling": cfg.model.init_method.scaling_method.name,
                        "checkpoints_path_type": type(cfg.checkpoints.checkpoints_path).__name__,
                        "learning_rates": learning_rates(cfg, lr_steps)},
            "model_config_strict": strict_model_config(raw["model"]["model_config"])}


def fields(cls) -> dict:
    hints = typing.get_type_hints(cls)
    return {f.name: str(hints[f.name]) for f in dataclasses.fields(cls)}


def facts() -> dict:
    import nanotron.config.config as c
    sections = {"general": c.GeneralArgs, "parallelism": c.ParallelismArgs, "model": c.ModelArgs,
                "model_config": Qwen2Config, "init_method": c.RandomInit, "tokenizer": c.TokenizerArgs,
                "checkpoints": c.CheckpointsArgs, "logging": c.LoggingArgs, "tokens": c.TokensArgs,
                "optimizer": c.OptimizerArgs, "optimizer_factory": c.AdamWOptimizerArgs,
                "learning_rate_scheduler": c.LRSchedulerArgs, "data_stage": c.DatasetStageArgs,
                "data": c.DataArgs, "hf_dataset": c.PretrainDatasetsArgs,
                "tokenized_dataset": c.NanosetDatasetsArgs, "config": Config}
    return {"checkpoint_version": str(CHECKPOINT_VERSION),
            "attention_implementations": sorted(ALL_ATTENTION_FUNCTIONS),
            "fields": {name: fields(cls) for name, cls in sections.items()}}


def main() -> None:
    request = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as tmp:  # nanotron's log_rank needs a process group
        torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous",
                                             rank=0, world_size=1)
        results = [load(item["path"], item.get("lr_steps", [])) for item in request["configs"]]
        torch.distributed.destroy_process_group()
    print(json.dumps({"results": results, "nanotron": facts()}, default=str))


if __name__ == "__main__":
    main()
