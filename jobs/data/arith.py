"""Synthetic grade-school arithmetic in GSM8K's format, for text models that train on a CPU.

One- and two-step addition / subtraction word problems with small numbers, written like
GSM8K's solutions (`3 + 4 = <<3+4=7>>7` ... `#### 7`). The test and train splits depend only on
`data.seed` and never share a question. Training rows are what an 8-shot prompt looks like (BOS,
then `Question: ...\\nAnswer: ...\\n\\n` examples of the train split, cut to seq_len + 1), so a
model trained on them can be prompted in context; the batch at a step is a pure function of
(data.seed, run seed, step), as for RegBench.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from config.data import ArithDataConfig
from jobs import tokenizer
from jobs.data import register_stream
from jobs.data.gsm8k import Problem, shot, write_jsonl

NAMES = ("Ann", "Bob", "Sam", "Eve", "Tom", "Mia", "Leo", "Ivy")
ITEMS = ("apples", "pens", "cards", "eggs", "books", "shells", "stamps", "coins")
_TEST, _TRAIN, _STREAM = range(3)  # tags that keep the random streams apart


@register_stream("arith", ArithDataConfig)
def arith_stream(data_cfg: ArithDataConfig, seed: int, batch_size: int) -> TrainStream:
    return TrainStream(data_cfg, seed, batch_size)


@dataclass(frozen=True)
class ArithConfig:
    """Hashable view of an ArithDataConfig: the key of the cached problem splits."""

    seed: int
    seq_len: int
    max_number: int
    two_step: float
    train_problems: int
    test_problems: int

    @classmethod
    def parse(cls, data_cfg: ArithDataConfig) -> ArithConfig:
        a = data_cfg.arith
        return cls(data_cfg.seed, data_cfg.seq_len, a.max_number, a.two_step, a.train_problems, a.test_problems)


def problem(rng: np.random.Generator, max_number: int, two_step: float) -> Problem:
    """One word problem with its worked answer; every number is in [1, max_number] and no result
    is negative. Short templates, so that eight worked examples fit a 1,024-byte context."""
    name = NAMES[rng.integers(len(NAMES))]
    items = ITEMS[rng.integers(len(ITEMS))]
    a, b, c = (int(x) for x in rng.integers(1, max_number + 1, size=3))
    if rng.random() < two_step:
        total = a + b
        c = min(c, total)
        return {"question": f"{name} has {a} {items}, buys {b} more and gives {c} away. How many {items} now?",
                "answer": f"{a} + {b} = <<{a}+{b}={total}>>{total}\n"
                          f"{total} - {c} = <<{total}-{c}={total - c}>>{total - c}\n#### {total - c}"}
    if rng.random() < 0.5:
        return {"question": f"{name} has {a} {items} and buys {b} more. How many {items} now?",
                "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"}
    a, b = max(a, b), min(a, b)
    return {"question": f"{name} has {a} {items} and gives {b} away. How many {items} are left?",
            "answer": f"{a} - {b} = <<{a}-{b}={a - b}>>{a - b}\n#### {a - b}"}


def _unique(rng: np.random.Generator, cfg: ArithConfig, n: int, exclude: set[str]) -> list[Problem]:
    out: list[Problem] = []
    seen = set(exclude)
    for _ in range(50 * n):
        if len(out) == n:
            return out
        p = problem(rng, cfg.max_number, cfg.two_step)
        if p["question"] not in seen:
            seen.add(p["question"])
            out.append(p)
    raise ValueError(f"data.arith: only {len(out)} distinct problems of {n} found with max_number="
                     f"{cfg.max_number}; raise data.arith.max_number or ask for fewer problems")


@lru_cache(maxsize=4)
def _splits(cfg: ArithConfig) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    test = _unique(np.random.default_rng([cfg.seed, _TEST]), cfg, cfg.test_problems, set())
    train = _unique(np.random.default_rng([cfg.seed, _TRAIN]), cfg, cfg.train_problems,
                    {p["question"] for p in test})
    return tuple(train), tuple(test)


def splits(data_cfg: ArithDataConfig) -> dict[str, list[Problem]]:
    """`{"train": [...], "test": [...]}`, deterministic from data.seed, disjoint by question."""
    train, test = _splits(ArithConfig.parse(data_cfg))
    return {"train": list(train), "test": list(test)}


def write_fixture(data_cfg: ArithDataConfig, directory: str | Path) -> dict[str, Path]:
    """`train.jsonl` and `test.jsonl` in GSM8K's format (read with `eval.gsm8k.path=<dir>/{split}.jsonl`)."""
    return {split: write_jsonl(rows, Path(directory) / f"{split}.jsonl") for split, rows in splits(data_cfg).items()}


@lru_cache(maxsize=4)
def _encoded_shots(cfg: ArithConfig) -> tuple[np.ndarray, ...]:
    return tuple(np.array(tokenizer.encode(shot(p)), dtype=np.int64) for p in _splits(cfg)[0])


class TrainStream:
    """Training batches as a pure function of (data.seed, seed, step): rows of train-split
    examples after a BOS, every token a target."""

    def __init__(self, data_cfg: ArithDataConfig, seed: int, batch_size: int):
        self.cfg = ArithConfig.parse(data_cfg)
        self.seed, self.batch_size = int(seed), int(batch_size)
        self.shots = _encoded_shots(self.cfg)
        shortest = min(len(s) for s in self.shots)
        self.per_row = self.cfg.seq_len // shortest + 1  # enough examples to fill any row

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`(inputs, targets)` LongTensors `[B, seq_len]`."""
        rng = np.random.default_rng([self.cfg.seed, _STREAM, self.seed, int(step)])
        picks = rng.integers(len(self.shots), size=(self.batch_size, self.per_row))
        width = self.cfg.seq_len + 1
        rows = np.stack([np.concatenate([[tokenizer.BOS], *(self.shots[i] for i in row)])[:width] for row in picks])
        return torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())
