"""Training and evaluation data. A data kind (`data.kind`) is a config class registered under
its kind in this package (regbench.py, arith.py); it builds the training stream, whose batch at
a step is a pure function of (data.seed, run seed, step), so resuming needs no stream state."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from common.registry import Registry
from common.settings import require, setting


class TrainStream(Protocol):
    """A stream may also carry `validation` (jobs/train.py's Validation: `due(steps_done,
    total_steps)` and `batches()`), a split the trainer scores to choose the evaluated weights;
    None or absent: the final weights are evaluated."""

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) LongTensors [B, seq_len]; targets -100 where not scored."""


@dataclass
class DataConfig:
    """What every data kind has. `name` is the conf/data option, `kind` the generator."""
    name: str = setting()
    kind: str = setting()
    vocab_size: int = setting(gt=0)
    seed: int = setting(ge=0, what="a non-negative integer")  # the data, never the run seed
    seq_len: int = setting(gt=0)

    def check(self, run: Any) -> None:
        m = run.model
        require(m.vocab_size >= self.vocab_size,
                f"model.vocab_size={m.vocab_size}: smaller than data.vocab_size={self.vocab_size}")
        require(self.seq_len <= m.max_seq_len,
                f"data.seq_len={self.seq_len}: longer than model.max_seq_len={m.max_seq_len}")

    def train_stream(self, seed: int, batch_size: int) -> TrainStream:
        raise NotImplementedError


DATA_KINDS: Registry[type[DataConfig]] = Registry("data kind", "jobs.data", "data.kind")
