"""LIDAS growth between nanotron stages, done on the checkpoint files.

The layers of the finished stage's last checkpoint are rearranged by the same operator as the
torch backend's in-process growth (jobs/families.growth_sources: the block at the middle is
inserted again right after itself); the later layers are renumbered, and the deeper
model_config, the next stage's config and the ancestry are written with it. The next stage
resumes from this folder. Its optimizer moments start fresh (nanotron's optimizer state is
pickled and is not rewritten here), whatever family.growth.optimizer_state says; the step
counter, the data position and the learning-rate schedule continue.
"""
from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from torch import Tensor

from jobs.families.lidas import LidasConfig, growth_sources
from jobs.nanotron.bridge import (LAYER, CheckpointError, ancestors_at, completed_step,
                                  read_metadata, read_tensors, write_step)
from jobs.nanotron.render import model_config

if TYPE_CHECKING:  # type hints only: jobs.config imports the packages that define the sections
    from jobs.config import JobConfig

CARRIED = ("lr_scheduler", "random")  # copied file for file: the schedule and RNG continue


def grow_tensors(tensors: Mapping[str, Tensor], block: int) -> dict[str, Tensor]:
    """nanotron tensors one LIDAS step deeper: new layer j holds old layer sources[j]'s tensors."""
    layers: dict[int, dict[str, Tensor]] = {}
    out = {}
    for name, tensor in tensors.items():
        m = LAYER.fullmatch(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        else:
            out[name] = tensor
    if sorted(layers) != list(range(len(layers))):
        raise CheckpointError(f"decoder layers {sorted(layers)} are not numbered 0..n-1")
    for new, old in enumerate(growth_sources(len(layers), block)):
        for leaf, tensor in layers[old].items():
            out[f"model.decoder.{new}.pp_block.{leaf}"] = tensor.clone()
    return out


def grow_checkpoint(cfg: JobConfig, source: Path, target: Path, config_yaml: Optional[str] = None) -> int:
    """Grow the last completed checkpoint of folder `source` into folder `target` (same step);
    returns the step. `config_yaml` is the next stage's rendered config, kept with it."""
    step = completed_step(source)
    if step is None:
        raise CheckpointError(f"{source}: no completed nanotron checkpoint to grow")
    step_dir = Path(source) / str(step)
    if not isinstance(cfg.family, LidasConfig):
        raise CheckpointError(f"family={cfg.family.name} does not grow; only lidas runs have stages to grow between")
    block = cfg.family.growth.block
    tensors = read_tensors(step_dir / "model")
    n_old = sum(1 for name in tensors if name.endswith("input_layernorm.weight"))
    grown = grow_tensors(tensors, block)
    metadata = read_metadata(step_dir)
    custom = dict(metadata.get("custom_metas") or {})  # nanotron's own checkpoints have none
    ancestors = custom.get("ancestors") or ancestors_at(cfg, n_old)
    custom.update(ancestors=[ancestors[i] for i in growth_sources(n_old, block)],
                  grown_from=str(step_dir))
    metadata = {**metadata, "custom_metas": custom}
    n_layers = n_old + block
    if Path(target).exists():
        shutil.rmtree(target)  # a surgery interrupted earlier: start it over
    for folder in CARRIED:
        if (step_dir / folder).is_dir():
            shutil.copytree(step_dir / folder, Path(target) / str(step) / folder)
    write_step(target, step, grown, cfg.model, model_config(cfg, n_layers), metadata, config_yaml)
    return step
