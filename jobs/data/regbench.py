"""RegBench-style in-context language learning data (Akyurek et al. 2024).

Each problem instance is a handful of strings sampled from one random probabilistic
finite automaton (PFA); a model must infer the automaton in context to predict the
next symbol. Automata pools depend only on ``data.seed``; training batches are a pure
function of ``(data.seed, run seed, step)``, so every model family trained with the
same seed sees identical data and resuming needs no stream state.

Training data comes in two forms. By default (``data.train_sequences: null``) every row of
every batch is a fresh instance (an infinite stream). With ``data.train_sequences=N`` the run
trains on one fixed set of N instances for as many epochs as the steps need, as the reference
code does (5,000), and reports a validation loss once per epoch on instances of automata of
their own (``data.validation_sequences``), from which the trainer chooses the checkpoint the
evaluations score.

An optional data curriculum (``data.warmup``, null by default) draws the automata of the first
``warmup.steps`` training steps from other generator ranges: automata with one transition per
state make every string a prefix of one walk, so only copying from the context predicts it, and
that makes induction heads form in small CPU models (docs/miniature.md). The warm-up pool never
holds a held-out automaton of the regime.

Optional facts (``data.facts``, null by default; jobs/data/facts.py) replace the last rows of
every batch with rows of fixed key -> value facts, which the ``knowledge`` evaluation recalls
without context; the other rows stay exactly those of the same step without facts.

Instances are never cut silently: planning refuses a context shorter than the regime's
longest instance unless the data option declares ``cut_at_context: true`` (then the last
string is cut at the context's end, which ``regbench_easy`` does by design).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional, Union

import numpy as np
import torch

from config.data import (IGNORE, N_SYMBOLS, PAD, SEP, VALIDATION_SEQUENCES, DataConfig, DataWarmupConfig,
                         RegBenchDataConfig)
from jobs.data import register_stream
from jobs.data.facts import FactRows

VOCAB = 20

# Tags keep the random streams of the different uses apart.
_HELDOUT_POOL, _TRAIN_POOL, _HELDOUT_STRINGS, _TRAIN_STRINGS = range(4)
_VALIDATION_POOL, _VALIDATION_STRINGS, _TRAIN_SET, _TRAIN_ORDER = range(4, 8)
_WARMUP_POOL = 8  # 9, 10: the facts and the fact rows (jobs/data/facts.py)
_SET_CHUNK = 500  # instances generated at a time for a fixed set (bounds memory only)


@register_stream("regbench", RegBenchDataConfig)
def regbench_stream(data_cfg: RegBenchDataConfig, seed: int, batch_size: int) -> Union[TrainStream, FixedSetStream]:
    """The infinite stream (data.train_sequences null) or the fixed training set."""
    if data_cfg.train_sequences is None:
        return TrainStream(data_cfg, seed, batch_size)
    return FixedSetStream(data_cfg, seed, batch_size)


def warmup_view(cfg: RegBenchConfig, warmup: DataWarmupConfig) -> RegBenchConfig:
    """The generator settings of the warm-up steps: the regime's, with the warm-up's ranges."""
    return dataclasses.replace(cfg.automata, **warmup.ranges())


@dataclass(frozen=True)
class RegBenchConfig:
    """Hashable view of a RegBenchDataConfig: the key of the cached automata pools and eval sets."""

    seed: int
    num_states: tuple[int, int]
    alphabet_size: tuple[int, int]
    transitions_per_state: tuple[int, int]
    strings_per_instance: tuple[int, int]
    string_length: tuple[int, int]
    train_automata: int
    heldout_automata: int
    seq_len: int
    train_sequences: Optional[int] = None
    validation_sequences: int = VALIDATION_SEQUENCES

    @classmethod
    def parse(cls, data_cfg: DataSpec) -> RegBenchConfig:
        if isinstance(data_cfg, cls):
            return data_cfg
        ranges = {k: tuple(getattr(data_cfg, k)) for k in (
            "num_states", "alphabet_size", "transitions_per_state", "strings_per_instance", "string_length")}
        return cls(seed=data_cfg.seed, train_automata=data_cfg.train_automata,
                   heldout_automata=data_cfg.heldout_automata, seq_len=data_cfg.seq_len,
                   train_sequences=data_cfg.train_sequences, validation_sequences=data_cfg.validation_sequences,
                   **ranges)

    @property
    def automata(self) -> RegBenchConfig:
        """The part that decides the automata pools and the held-out set (their cache key)."""
        return dataclasses.replace(self, train_sequences=None, validation_sequences=VALIDATION_SEQUENCES)


DataSpec = Union[RegBenchDataConfig, RegBenchConfig]  # what the public functions accept as data_cfg


def regbench_data(data: DataConfig) -> RegBenchDataConfig:
    """A run's data section, of an evaluation declared on regbench data only (config/evals.py):
    planning refused any other data kind (EvalSection.check)."""
    assert isinstance(data, RegBenchDataConfig), f"data.kind={data.kind}: not regbench"
    return data


# ----------------------------------------------------------------------------- automata


# Automata are built one at a time (100,000 for a pool): on tables of at most a few dozen states
# numpy's per-call overhead dominates, so the state-by-state work below is plain Python over
# each state's outgoing transitions, (symbol, target) pairs in ascending symbol order.
Transitions = list[list[tuple[int, int]]]


def _transitions(delta: np.ndarray) -> Transitions:
    return [[(symbol, target) for symbol, target in enumerate(row) if target >= 0]
            for row in np.asarray(delta).tolist()]


def _canonical_table(out: Transitions, start: int) -> np.ndarray:
    """`canonical` of the table whose state s has the transitions out[s]."""
    new_id = {start: 0}
    order = [start]
    for state in order:  # ``order`` grows while we iterate: a BFS queue
        for _, target in out[state]:
            if target not in new_id:
                new_id[target] = len(order)
                order.append(target)
    table = np.full((len(order), N_SYMBOLS), -1, dtype=np.int64)
    for row, state in enumerate(order):
        for symbol, target in out[state]:
            table[row, symbol] = new_id[target]
    return table


def canonical(delta: np.ndarray, start: int = 0) -> np.ndarray:
    """Renumber states in BFS order from ``start`` over ascending symbols, dropping
    unreachable ones. Two trimmed DFAs are isomorphic iff their canonical tables match.

    ``delta[state, symbol]`` is the next state, or -1 where the transition is missing.
    """
    return _canonical_table(_transitions(delta), start)


def _minimal_table(out: Transitions, start: int = 0) -> np.ndarray:
    """`minimise` of the table whose state s has the transitions out[s]."""
    block, count = [0] * len(out), 1
    while True:
        ids: dict[tuple, int] = {}  # a state's block and its successors' blocks by symbol -> new block
        refined = [ids.setdefault((block[s], tuple((a, block[t]) for a, t in moves)), len(ids))
                   for s, moves in enumerate(out)]
        if len(ids) == count:
            break
        block, count = refined, len(ids)
    representative: dict[int, int] = {}  # block -> its first state
    for state, b in enumerate(block):
        representative.setdefault(b, state)
    quotient = [[(a, block[t]) for a, t in out[representative[b]]] for b in range(count)]
    return _canonical_table(quotient, block[start])


def minimise(delta: np.ndarray, start: int = 0) -> np.ndarray:
    """Minimal canonical DFA of a partial DFA whose states all accept.

    Moore partition refinement: missing transitions lead to an implicit rejecting sink,
    so two states are equivalent iff they allow the same symbol sets all the way down.
    """
    return _minimal_table(_transitions(delta), start)


@dataclass(frozen=True)
class Automaton:
    """Minimal DFA in canonical form (start state 0, all states accepting).

    Equality and hashing go through the canonical table, so structurally identical
    automata compare equal. As a PFA, the next symbol is uniform over a state's
    outgoing symbols.
    """

    n_states: int
    table_bytes: bytes = field(repr=False)

    @classmethod
    def from_transitions(cls, delta: np.ndarray) -> Automaton:
        return cls.of_minimal(minimise(np.asarray(delta, dtype=np.int64)))

    @classmethod
    def of_minimal(cls, table: np.ndarray) -> Automaton:
        """From a table that `minimise` returned."""
        table = table.astype(np.int32)
        return cls(len(table), table.tobytes())

    @property
    def delta(self) -> np.ndarray:
        """``[n_states, 18]`` next state, -1 where the symbol is not allowed."""
        return np.frombuffer(self.table_bytes, dtype=np.int32).reshape(self.n_states, N_SYMBOLS)


def random_automaton(rng: np.random.Generator, cfg: RegBenchConfig) -> Automaton:
    """One draw of the RegBench generator: k transitions per state on distinct alphabet
    symbols to distinct other states (k capped at what the automaton allows), then minimised."""
    n = int(rng.integers(cfg.num_states[0], cfg.num_states[1] + 1))
    alphabet = rng.choice(N_SYMBOLS, size=int(rng.integers(cfg.alphabet_size[0], cfg.alphabet_size[1] + 1)),
                          replace=False)
    lo, hi = cfg.transitions_per_state
    k = np.minimum(rng.integers(lo, hi + 1, size=n), min(len(alphabet), n - 1))
    symbols = alphabet[rng.random((n, len(alphabet))).argsort(axis=1)]  # a random order per state
    target_keys = rng.random((n, n))
    np.fill_diagonal(target_keys, np.inf)  # self comes last, never among the first n - 1
    targets = target_keys.argsort(axis=1)
    symbols_of, targets_of = symbols.tolist(), targets.tolist()
    out = [sorted(zip(symbols_of[state][:k_state], targets_of[state][:k_state]))
           for state, k_state in enumerate(k.tolist())]
    return Automaton.of_minimal(_minimal_table(out))


def _sample_distinct(rng: np.random.Generator, cfg: RegBenchConfig, count: int,
                     exclude: frozenset[Automaton]) -> tuple[Automaton, ...]:
    found: dict[Automaton, None] = {}  # insertion-ordered set
    for _ in range(20 * count + 1000):
        if len(found) == count:
            return tuple(found)
        automaton = random_automaton(rng, cfg)
        if automaton not in exclude:
            found[automaton] = None
    raise ValueError(f"could not find {count} distinct automata: the configured space is too small")


@lru_cache(maxsize=4)
def _heldout_pool(cfg: RegBenchConfig) -> tuple[Automaton, ...]:
    """From its own stream: it stays fixed when train_automata changes, and the evaluations, which
    need only it, do not build the training pool (100,000 automata take seconds)."""
    return _sample_distinct(np.random.default_rng([cfg.seed, _HELDOUT_POOL]), cfg, cfg.heldout_automata,
                            frozenset())


@lru_cache(maxsize=4)
def _pools(cfg: RegBenchConfig) -> tuple[tuple[Automaton, ...], tuple[Automaton, ...]]:
    heldout = _heldout_pool(cfg)
    train = _sample_distinct(np.random.default_rng([cfg.seed, _TRAIN_POOL]), cfg,
                             cfg.train_automata, frozenset(heldout))
    return train, heldout


def sample_automata(data_cfg: DataSpec) -> tuple[list[Automaton], list[Automaton]]:
    """(train, held-out) pools of distinct automata, disjoint by canonical form, from data.seed."""
    train, heldout = _pools(RegBenchConfig.parse(data_cfg).automata)
    return list(train), list(heldout)


@lru_cache(maxsize=4)
def _validation_pool(cfg: RegBenchConfig) -> tuple[Automaton, ...]:
    """One automaton per validation instance, disjoint from both other pools; drawn from its own
    stream after them, so adding it changes neither."""
    train, heldout = _pools(cfg.automata)
    return _sample_distinct(np.random.default_rng([cfg.seed, _VALIDATION_POOL]), cfg,
                            cfg.validation_sequences, frozenset(train + heldout))


def validation_automata(data_cfg: DataSpec) -> list[Automaton]:
    return list(_validation_pool(RegBenchConfig.parse(data_cfg)))


# ----------------------------------------------------------------------------- instances


class _PoolTables:
    """Padded transition tables of a pool, flattened to rows ``automaton * width + state``,
    so random walks advance every string of a batch with one gather per step."""

    def __init__(self, automata: tuple[Automaton, ...]):
        self.width = max(a.n_states for a in automata)
        delta = np.full((len(automata), self.width, N_SYMBOLS), -1, dtype=np.int64)
        for i, automaton in enumerate(automata):
            delta[i, :automaton.n_states] = automaton.delta
        self.delta = delta.reshape(-1, N_SYMBOLS)
        self.allowed = self.delta >= 0
        self.out_degree = self.allowed.sum(axis=1)
        # Outgoing symbols first (ascending), so slot j < out_degree picks a symbol.
        self.out_symbols = np.argsort(~self.allowed, axis=1, kind="stable")

    def walk(self, automaton: np.ndarray, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Random walks from the start state: symbols and the state after each, ``[W, length]``."""
        row = automaton * self.width
        uniform = rng.random((length, len(automaton)))
        symbols = np.empty((length, len(automaton)), dtype=np.int64)
        states = np.empty_like(symbols)
        for t in range(length):
            slot = (uniform[t] * self.out_degree[row]).astype(np.int64)
            symbols[t] = self.out_symbols[row, slot]
            states[t] = self.delta[row, symbols[t]]
            row = automaton * self.width + states[t]
        return symbols.T, states.T


def _instances(tables: _PoolTables, automaton: np.ndarray, cfg: RegBenchConfig,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``| s1 | s2 | ... | sn`` per row, cut/padded to seq_len + 1 tokens, with the automaton
    state after each token (start state after a separator, -1 on padding)."""
    n_rows, n_tokens = len(automaton), cfg.seq_len + 1
    n_strings = rng.integers(cfg.strings_per_instance[0], cfg.strings_per_instance[1] + 1, size=n_rows)
    lengths = rng.integers(cfg.string_length[0], cfg.string_length[1] + 1,
                           size=(n_rows, cfg.strings_per_instance[1]))
    starts = np.cumsum(lengths + 1, axis=1) - lengths  # first symbol of string i, after i + 1 separators
    used = (np.arange(lengths.shape[1]) < n_strings[:, None]) & (starts - 1 < n_tokens)
    row, string = np.nonzero(used)

    tokens = np.full((n_rows, n_tokens), PAD, dtype=np.int64)
    states = np.full((n_rows, n_tokens), -1, dtype=np.int64)
    tokens[row, starts[row, string] - 1] = SEP
    states[row, starts[row, string] - 1] = 0

    symbols, after = tables.walk(automaton[row], int(lengths[row, string].max()), rng)
    offset = np.arange(symbols.shape[1])
    position = starts[row, string][:, None] + offset
    inside = (offset < lengths[row, string][:, None]) & (position < n_tokens)
    row_of = np.broadcast_to(row[:, None], position.shape)[inside]
    tokens[row_of, position[inside]] = symbols[inside]
    states[row_of, position[inside]] = after[inside]
    return tokens, states


@lru_cache(maxsize=2)
def _warmup_pool(warmup: RegBenchConfig, regime: RegBenchConfig) -> tuple[Automaton, ...]:
    """The warm-up's training automata, from a stream of their own. Small automata occur in the
    warm-up ranges and in the regime's, so the regime's held-out automata are excluded, as they
    are from its training pool."""
    return _sample_distinct(np.random.default_rng([warmup.seed, _WARMUP_POOL]), warmup, warmup.train_automata,
                            frozenset(_heldout_pool(regime)))


class TrainStream:
    """Training batches as a pure function of (data.seed, seed, step); with a curriculum
    (data.warmup), the steps before warmup.steps come from the warm-up's pool and ranges; with
    facts (data.facts), the last rows of every batch are fact rows."""

    validation = None  # a fresh instance every row: nothing is seen twice, nothing to choose

    def __init__(self, data_cfg: DataSpec, seed: int, batch_size: int):
        self.cfg = RegBenchConfig.parse(data_cfg)
        self.seed, self.batch_size = int(seed), int(batch_size)
        self.tables = _PoolTables(_pools(self.cfg.automata)[0])
        warmup = getattr(data_cfg, "warmup", None)
        self.warmup_steps = warmup.steps if warmup is not None else 0
        self.warmup_cfg = warmup_view(self.cfg, warmup) if warmup is not None else None
        self._warmup_tables: Optional[_PoolTables] = None  # built on first use: evaluations ask for late steps
        facts = getattr(data_cfg, "facts", None)
        self.facts = None if facts is None else FactRows(self.cfg.seed, facts, self.seed, batch_size, self.cfg.seq_len)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` LongTensors ``[B, seq_len]``; targets are -100 where the next
        token is a separator or pad, so the model never learns to predict ``|``."""
        if step < self.warmup_steps:
            assert self.warmup_cfg is not None, "warm-up steps come with data.warmup"
            cfg, tables = self.warmup_cfg, self._warmup()
        else:
            cfg, tables = self.cfg, self.tables
        rng = np.random.default_rng([self.cfg.seed, _TRAIN_STRINGS, self.seed, int(step)])
        tokens, _ = _instances(tables, rng.integers(cfg.train_automata, size=self.batch_size), cfg, rng)
        inputs, targets = inputs_and_targets(tokens)
        if self.facts is None:
            return inputs, targets
        # The last rows become fact rows; the others stay those of the same step without facts.
        keep = self.batch_size - self.facts.rows
        fact_inputs, fact_targets = self.facts.batch(step)
        return torch.cat([inputs[:keep], fact_inputs]), torch.cat([targets[:keep], fact_targets])

    def _warmup(self) -> _PoolTables:
        if self._warmup_tables is None:
            self._warmup_tables = _PoolTables(_warmup_pool(self.warmup_cfg, self.cfg.automata))
        return self._warmup_tables


def inputs_and_targets(tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Instances ``[B, seq_len + 1]`` as LongTensors ``(inputs, targets)`` ``[B, seq_len]``,
    targets -100 where the next token is a separator or pad."""
    tokens = tokens.astype(np.int64)
    targets = np.where(tokens[:, 1:] < N_SYMBOLS, tokens[:, 1:], IGNORE)
    return torch.from_numpy(tokens[:, :-1].copy()), torch.from_numpy(targets)


def _fixed_instances(automata: tuple[Automaton, ...], cfg: RegBenchConfig, count: int,
                     rng: np.random.Generator) -> np.ndarray:
    """``count`` instances ``[count, seq_len + 1]`` (uint8), instance i of ``automata[i % len]``."""
    tables = _PoolTables(automata)
    chunks = [_instances(tables, np.arange(start, min(start + _SET_CHUNK, count)) % len(automata), cfg, rng)[0]
              for start in range(0, count, _SET_CHUNK)]
    tokens = np.concatenate(chunks).astype(np.uint8)
    tokens.setflags(write=False)
    return tokens


def fixed_set_size(cfg: RegBenchConfig) -> int:
    """data.train_sequences, of a run that trains on a fixed set (its validation split and
    `FixedSetStream` exist only then)."""
    assert cfg.train_sequences is not None, "a fixed training set has data.train_sequences"
    return cfg.train_sequences


@lru_cache(maxsize=2)
def training_set(cfg: RegBenchConfig) -> np.ndarray:
    """The fixed training set of ``data.train_sequences`` instances: a function of the data
    settings only (every run seed and family trains on the same instances)."""
    assert cfg.train_sequences is not None
    return _fixed_instances(_pools(cfg.automata)[0], cfg, cfg.train_sequences,
                            np.random.default_rng([cfg.seed, _TRAIN_SET]))


@lru_cache(maxsize=2)
def validation_set(cfg: RegBenchConfig) -> np.ndarray:
    """The validation instances, one per validation automaton."""
    return _fixed_instances(_validation_pool(cfg), cfg, cfg.validation_sequences,
                            np.random.default_rng([cfg.seed, _VALIDATION_STRINGS]))


class Validation:
    """The validation split of a fixed training set: its batches, and when an epoch ends."""

    def __init__(self, cfg: RegBenchConfig, batch_size: int):
        self.cfg, self.batch_size = cfg, batch_size

    def due(self, steps_done: int, total_steps: int) -> bool:
        """Validate after the step that completes a pass over the training set (the reference
        validates once per epoch), and after the last step."""
        n, b = fixed_set_size(self.cfg), self.batch_size
        return steps_done == total_steps or (steps_done * b) // n > ((steps_done - 1) * b) // n

    def batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        tokens = validation_set(self.cfg)
        return [inputs_and_targets(tokens[i:i + self.batch_size]) for i in range(0, len(tokens), self.batch_size)]


class FixedSetStream:
    """Batches from the fixed training set, epoch after epoch, as a pure function of (data
    settings, seed, step): row j of step t is row (t * B + j) of the concatenated epochs, each
    epoch a permutation of the set drawn from (data.seed, seed, epoch)."""

    def __init__(self, data_cfg: DataSpec, seed: int, batch_size: int):
        self.cfg = RegBenchConfig.parse(data_cfg)
        self.seed, self.batch_size = int(seed), int(batch_size)
        self.validation = Validation(self.cfg, self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.cfg.seed, _TRAIN_ORDER, self.seed, int(epoch)]).permutation(
            fixed_set_size(self.cfg))

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.arange(int(step) * self.batch_size, (int(step) + 1) * self.batch_size)
        epoch, index = np.divmod(rows, fixed_set_size(self.cfg))
        picked = np.empty_like(rows)
        for e in np.unique(epoch):
            picked[epoch == e] = self.order(e)[index[epoch == e]]
        return inputs_and_targets(training_set(self.cfg)[picked])


@dataclass(frozen=True)
class EvalSet:
    """Held-out instances with their exact next-symbol distributions (read-only arrays)."""

    inputs: np.ndarray  # [N, T] int64 token ids
    ref: np.ndarray  # [N, T, 18] float32: uniform over the outgoing symbols of the current state
    valid: np.ndarray  # [N, T] bool: input is a symbol or separator (not pad)
    n_context_strings: np.ndarray  # [N, T] int64: complete strings before the position
    valid_next: np.ndarray  # [N, T, 18] bool: symbols the automaton allows next
    scored: np.ndarray  # [N, T] bool: the positions the reference code scores (see build_eval_set)


def build_eval_set(automata: Sequence[Automaton], data_cfg: DataSpec, n_instances: int,
                   rng: np.random.Generator) -> EvalSet:
    """Instances of ``automata[i % len(automata)]`` with their exact next-symbol distributions.

    Scored positions are the reference code's (berlino/seq_icl): its instance is ``s1 | ... | sn``
    without our opening ``|``, its input is the instance without its last token, and it scores
    every input position against the continuation distribution of the current state, also at a
    string's last symbol (where the next token is ``|``). Ours are therefore every position but
    the opening ``|`` (position 0) and the instance's last token (whose next token is pad);
    in an instance cut at the context's end, every position from 1 on."""
    tables = _PoolTables(tuple(automata))
    automaton = np.arange(n_instances) % len(automata)
    tokens, states = _instances(tables, automaton, RegBenchConfig.parse(data_cfg), rng)
    inputs, states = tokens[:, :-1], states[:, :-1]
    valid = inputs != PAD
    scored = valid & (tokens[:, 1:] != PAD) & (np.arange(inputs.shape[1]) >= 1)
    rows = automaton[:, None] * tables.width + np.maximum(states, 0)
    valid_next = tables.allowed[rows] & valid[..., None]
    ref = (valid_next / np.maximum(valid_next.sum(axis=-1, keepdims=True), 1)).astype(np.float32)
    # Separators before the current string = complete strings seen (the opening "|" counts 0).
    n_context_strings = np.cumsum(inputs == SEP, axis=1) - 1
    arrays = dict(inputs=inputs, ref=ref, valid=valid, n_context_strings=n_context_strings, valid_next=valid_next,
                  scored=scored)
    for array in arrays.values():
        array.setflags(write=False)
    return EvalSet(**arrays)


@lru_cache(maxsize=4)
def _heldout_set(cfg: RegBenchConfig, n_instances: int) -> EvalSet:
    return build_eval_set(_heldout_pool(cfg), cfg, n_instances, np.random.default_rng([cfg.seed, _HELDOUT_STRINGS]))


def heldout_walks(data_cfg: DataSpec, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, length]`` symbols: a random walk of held-out automaton i % heldout_automata per row."""
    pool = _heldout_pool(RegBenchConfig.parse(data_cfg).automata)
    return _PoolTables(pool).walk(np.arange(n) % len(pool), length, rng)[0]


def heldout_set(data_cfg: DataSpec, n_instances: int) -> EvalSet:
    """Deterministic from data.seed; instance i uses held-out automaton i % heldout_automata."""
    return _heldout_set(RegBenchConfig.parse(data_cfg).automata, int(n_instances))
