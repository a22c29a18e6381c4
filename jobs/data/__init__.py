"""Training and evaluation data. A data kind (`data.kind`, its config in config/data.py) builds
its training stream with a function registered under its kind in this package (regbench.py,
arith.py); a stream's batch at a step is a pure function of (data.seed, run seed, step), so
resuming needs no stream state. The run seed a trainer passes is the run's data seed
(`data_seed`, null: `seed`; config/run.py); the model's initialisation follows `init_seed`."""
from __future__ import annotations

from typing import Callable, Protocol, TypeVar

import torch

from common.registry import Registry
from config.data import DataConfig


class TrainStream(Protocol):
    """A stream may also carry `validation` (jobs/train.py's Validation: `due(steps_done,
    total_steps)` and `batches()`), a split the trainer scores to choose the evaluated weights;
    None or absent: the final weights are evaluated."""

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) LongTensors [B, seq_len]; targets -100 where not scored."""


# (the kind's data config, run seed, batch size) -> the training stream
StreamFactory = Callable[[DataConfig, int, int], TrainStream]
STREAMS: Registry[StreamFactory] = Registry("data kind", "jobs.data", "data.kind")

Data = TypeVar("Data", bound=DataConfig)


def register_stream(kind: str, config: type[Data]) -> Callable[[Callable[[Data, int, int], TrainStream]],
                                                               Callable[[Data, int, int], TrainStream]]:
    """Register a factory of data kind `kind`'s stream, which takes the kind's own config class
    (`config`, DATA_CONFIGS[kind]). STREAMS holds it as a factory over any DataConfig, narrowed
    here: `train_stream` picks it by data.kind, so the section it passes is of that class."""
    def register(factory: Callable[[Data, int, int], TrainStream]) -> Callable[[Data, int, int], TrainStream]:
        def of_kind(data: DataConfig, seed: int, batch_size: int) -> TrainStream:
            assert isinstance(data, config), f"data.kind={kind} is configured by {config.__name__}"
            return factory(data, seed, batch_size)
        STREAMS.register(kind)(of_kind)
        return factory
    return register


def train_stream(data: DataConfig, seed: int, batch_size: int) -> TrainStream:
    """The training stream of the run's data section, by its kind."""
    return STREAMS[data.kind](data, seed, batch_size)
