"""Synthetic few-shot tasks a tiny RegBench-trained model can do in context (paper-spec 3.4, 4).

They stand in for the 19 natural-language tasks of the ablation study: each needs the context
(the answer cannot be guessed from the query alone) and the mechanism an induction head provides,
finding an earlier occurrence of the current token and reading what followed it. All prompts use
the RegBench alphabet: symbols 0..17, strings opened by ``|``.

- copy: ``| s | s[:5]`` with s 10 distinct random symbols; answer s[5:9] (continue the repeat).
- recall: six key-value pairs ``| k v`` (distinct keys, values from the other symbols), then
  ``| k`` with one of the keys; answer its value (associative recall).
- successor: four strings of 6 symbols, each a walk of one random permutation of the symbols (an
  in-context bigram table, every symbol has one successor), then ``| x`` with x one of the first
  three symbols of a context string; answer the 3 symbols that follow it there.

The answer is decoded greedily over the 18 symbols (the model never learned to emit ``|``) and
scored by SQuAD-style token F1, the bag-of-tokens overlap; with the answer length given it is the
fraction of answer tokens produced. Prompts are a pure function of (seed, task), so every run of a
data seed sees the same items.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from jobs.data.regbench import N_SYMBOLS, SEP
from jobs.model import Decoder

TASKS = ("copy", "recall", "successor")


@dataclass(frozen=True)
class Task:
    name: str
    prompts: torch.Tensor  # [N, P] token ids
    answers: torch.Tensor  # [N, A] token ids


def _copy(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.argsort(rng.random((n, N_SYMBOLS)), axis=1)[:, :10]
    sep = np.full((n, 1), SEP)
    return np.concatenate([sep, s, sep, s[:, :5]], axis=1), s[:, 5:9]


def _recall(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(rng.random((n, N_SYMBOLS)), axis=1)
    keys, others = order[:, :6], order[:, 6:]
    values = np.take_along_axis(others, rng.integers(others.shape[1], size=(n, 6)), axis=1)
    sep = np.full((n, 6), SEP)
    pairs = np.stack([sep, keys, values], axis=2).reshape(n, -1)
    asked = rng.integers(6, size=n)
    rows = np.arange(n)
    return np.concatenate([pairs, np.full((n, 1), SEP), keys[rows, asked, None]], axis=1), values[rows, asked, None]


def _successor(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    successor = np.argsort(rng.random((n, N_SYMBOLS)), axis=1)  # a random permutation per prompt
    walks = np.empty((n, 4, 6), dtype=np.int64)
    walks[:, :, 0] = rng.integers(N_SYMBOLS, size=(n, 4))
    rows = np.arange(n)[:, None]
    for i in range(1, 6):
        walks[:, :, i] = successor[rows, walks[:, :, i - 1]]
    context = np.concatenate([np.full((n, 4, 1), SEP), walks], axis=2).reshape(n, -1)
    string, start = rng.integers(4, size=n), rng.integers(3, size=n)
    query = walks[np.arange(n), string, start]
    answer = np.stack([walks[np.arange(n), string, start + i] for i in (1, 2, 3)], axis=1)
    return np.concatenate([context, np.full((n, 1), SEP), query[:, None]], axis=1), answer


_BUILDERS = {"copy": _copy, "recall": _recall, "successor": _successor}


def suite(n: int, seed: int) -> list[Task]:
    """`n` prompts of every task, seeded by (seed, task)."""
    tasks = []
    for index, name in enumerate(TASKS):
        prompts, answers = _BUILDERS[name](np.random.default_rng([seed, 7, index]), n)
        tasks.append(Task(name, torch.from_numpy(prompts), torch.from_numpy(answers)))
    return tasks


def token_f1(predicted: list[int], answer: list[int]) -> float:
    """SQuAD-style F1 of the token bags."""
    overlap = sum((Counter(predicted) & Counter(answer)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(predicted), overlap / len(answer)
    return 2 * precision * recall / (precision + recall)


@torch.no_grad()
def greedy_answers(model: Decoder, prompts: torch.Tensor, length: int) -> torch.Tensor:
    """[N, length] greedy continuations over the symbols; the whole prefix is recomputed each
    step, so hooks that act on every position see the same positions as in a single pass."""
    tokens = prompts
    for _ in range(length):
        tokens = torch.cat([tokens, model(tokens)[:, -1, :N_SYMBOLS].argmax(-1, keepdim=True)], dim=1)
    return tokens[:, prompts.shape[1]:]


def task_f1(model: Decoder, task: Task) -> np.ndarray:
    """Per-prompt token F1, [N]."""
    predicted = greedy_answers(model, task.prompts, task.answers.shape[1])
    return np.array([token_f1(p, a) for p, a in zip(predicted.tolist(), task.answers.tolist())])
