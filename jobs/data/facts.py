"""Facts to store in the weights (`data.facts`): fixed key -> value mappings seen only in training
and recalled closed-book by the `knowledge` evaluation (jobs/evals/knowledge.py).

A fact is a key of `key_length` symbols and a value of `value_length` symbols, written
``| | key value`` in training and in the query alike. The empty string ``| |`` never occurs in
RegBench data (every string has at least one symbol), so it says "closed-book query" without a
token of its own: the vocabulary stays the one of data without facts, and so does every model.

A fact row holds as many facts as fit the context, each at most once, so a value can never be
copied from the row's context: only the weights hold it. Only the value tokens are trained on:
a key is a uniform draw from the fact set, so predicting it teaches nothing about recall and only
adds noise to the loss, and the separators are not trained on, as in the regime's rows.

The facts are the world's: drawn from data.seed and the fact settings, never from a run's seeds,
so every run of a data setting learns the same facts. The keys are a random order of all keys of
their length and each has one value drawn with it, so `count` facts are the first `count` of that
order: a larger fact set holds a smaller one.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from config.data import IGNORE, N_SYMBOLS, PAD, SEP, FactsConfig

MARK = 2  # tokens before the key: the empty string | |
# Tags of the random streams of the facts and of the fact rows, after jobs/data/regbench.py's 0-8.
_FACTS, _FACT_ROWS = 9, 10


@dataclass(frozen=True)
class Facts:
    """The facts of a data setting (read-only arrays)."""

    keys: np.ndarray  # [count, key_length] symbols; no two rows alike
    values: np.ndarray  # [count, value_length] symbols

    @property
    def length(self) -> int:
        """Tokens of one fact, ``| | key value``."""
        return MARK + self.keys.shape[1] + self.values.shape[1]

    def tokens(self) -> np.ndarray:
        """``[count, length]``: each fact as it is written, ``| | key value``."""
        mark = np.full((len(self.keys), MARK), SEP, dtype=np.int64)
        return np.concatenate([mark, self.keys, self.values], axis=1)


@lru_cache(maxsize=4)
def facts_of(world_seed: int, cfg: FactsConfig) -> Facts:
    """The facts of the data setting whose data.seed is `world_seed` (not a run's data_seed)."""
    rng = np.random.default_rng([world_seed, _FACTS, cfg.key_length, cfg.value_length])
    n_keys = N_SYMBOLS ** cfg.key_length
    order = rng.permutation(n_keys)
    values = rng.integers(N_SYMBOLS, size=(n_keys, cfg.value_length))
    keys = np.stack(np.unravel_index(order[:cfg.count], (N_SYMBOLS,) * cfg.key_length), axis=1)
    facts = Facts(keys=keys.astype(np.int64), values=values[:cfg.count].astype(np.int64))
    for array in (facts.keys, facts.values):
        array.setflags(write=False)
    return facts


class FactRows:
    """The fact rows of a run's batches, a pure function of (data.seed = `world_seed`, data.facts,
    the run's data seed `seed`, step): `rows` per batch of ``| | key value`` as many times as fit
    ``seq_len + 1`` tokens, the facts of a row distinct, pad after them."""

    def __init__(self, world_seed: int, cfg: FactsConfig, seed: int, batch_size: int, seq_len: int):
        self.facts = facts_of(world_seed, cfg)
        self.world_seed, self.seed, self.seq_len = world_seed, seed, seq_len
        self.rows = cfg.rows(batch_size)
        self.per_row = min(cfg.count, (seq_len + 1) // self.facts.length)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` LongTensors ``[rows, seq_len]``; targets are -100 but where the
        next token is a value symbol."""
        rng = np.random.default_rng([self.world_seed, _FACT_ROWS, self.seed, int(step)])
        count, length, used = len(self.facts.keys), self.facts.length, self.per_row * self.facts.length
        chosen = np.stack([rng.choice(count, self.per_row, replace=False) for _ in range(self.rows)])
        tokens = np.full((self.rows, self.seq_len + 1), PAD, dtype=np.int64)
        tokens[:, :used] = self.facts.tokens()[chosen].reshape(self.rows, used)
        value = np.zeros(self.seq_len + 1, dtype=bool)
        value[:used] = np.tile(np.arange(length) >= length - self.facts.values.shape[1], self.per_row)
        targets = np.where(value[1:], tokens[:, 1:], IGNORE)
        return torch.from_numpy(tokens[:, :-1].copy()), torch.from_numpy(targets)
