"""data: what a run trains and is evaluated on (conf/data/*.yaml), by `data.kind`. How a kind
generates its training stream is its behaviour (jobs/data/, registered under the same kind)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol, TypedDict

from common.registry import Registry
from common.settings import require, section, setting

if TYPE_CHECKING:
    from config.run import JobConfig

N_SYMBOLS = 18  # regbench: a..r = token ids 0..17
SEP = 18  # regbench: "|" separates strings and opens every instance
PAD = 19  # regbench: "." fills the instance up to seq_len + 1 tokens
IGNORE = -100  # target id skipped by cross-entropy
VALIDATION_SEQUENCES = 250  # regbench: the reference code's validation split, half of its 500 test automata
BYTE_VOCAB_SIZE = 259  # arith: byte-level text, 256 bytes + BOS, EOS, pad (jobs/tokenizer.py)

_RANGE = "[low, high] with 1 <= low <= high"


@dataclass(frozen=True)
class DataConfig:
    """What every data kind has. `name` is the conf/data option, `kind` the generator."""
    name: str = setting()
    kind: str = setting()
    vocab_size: int = setting(gt=0)
    seed: int = setting(ge=0, what="a non-negative integer")  # the data, never the run seed
    seq_len: int = setting(gt=0)

    def check(self, run: JobConfig) -> None:
        m = run.model
        require(m.vocab_size >= self.vocab_size,
                f"model.vocab_size={m.vocab_size}: smaller than data.vocab_size={self.vocab_size}")
        require(self.seq_len <= m.max_seq_len,
                f"data.seq_len={self.seq_len}: longer than model.max_seq_len={m.max_seq_len}")


DATA_CONFIGS: Registry[type[DataConfig]] = Registry("data kind", "config.data", "data.kind")


class InstanceRanges(Protocol):
    """What the length of an instance depends on (a RegBenchDataConfig, or a view of one)."""
    @property
    def strings_per_instance(self) -> tuple[int, int] | list[int]: ...
    @property
    def string_length(self) -> tuple[int, int] | list[int]: ...


def longest_instance(ranges: InstanceRanges) -> int:
    """Tokens of the longest regbench instance the ranges allow: every string after its ``|``."""
    return ranges.strings_per_instance[1] * (ranges.string_length[1] + 1)


class WarmupRanges(TypedDict, total=False):
    """The generator ranges a data warm-up replaces, keyed by field of the regime's generator
    settings (jobs/data/regbench.py's RegBenchConfig), so they can be passed to it as keywords."""
    num_states: tuple[int, int]
    alphabet_size: tuple[int, int]
    transitions_per_state: tuple[int, int]
    string_length: tuple[int, int]


@dataclass(frozen=True)
class DataWarmupConfig:
    """data.warmup: a data curriculum. The first `steps` training steps draw their automata (as
    many as data.train_automata, from a pool of their own) and strings from these ranges; null
    keeps the regime's own range. Later steps are the regime itself. `share` instead of `steps`:
    that share of train.steps (rounded), so that a shorter or longer run keeps its proportions;
    `steps`, when set, wins."""
    steps: Optional[int] = setting(None, gt=0)
    share: Optional[float] = setting(None, gt=0, lt=1)
    num_states: Optional[list[int]] = setting(None, length=2, ascending=True, ge=2,
                                              what="[low, high] with 2 <= low <= high (no self-loops)")
    alphabet_size: Optional[list[int]] = setting(None, length=2, ascending=True, ge=1, what=_RANGE)
    transitions_per_state: Optional[list[int]] = setting(None, length=2, ascending=True, ge=1, what=_RANGE)
    string_length: Optional[list[int]] = setting(None, length=2, ascending=True, ge=1, what=_RANGE)

    def ranges(self) -> WarmupRanges:
        """The ranges it replaces, by field of the regime's generator settings."""
        ranges: WarmupRanges = {}
        if self.num_states is not None:
            ranges["num_states"] = (self.num_states[0], self.num_states[1])
        if self.alphabet_size is not None:
            ranges["alphabet_size"] = (self.alphabet_size[0], self.alphabet_size[1])
        if self.transitions_per_state is not None:
            ranges["transitions_per_state"] = (self.transitions_per_state[0], self.transitions_per_state[1])
        if self.string_length is not None:
            ranges["string_length"] = (self.string_length[0], self.string_length[1])
        return ranges


@dataclass(frozen=True)
class FactsConfig:
    """data.facts: facts to store in the weights (jobs/data/facts.py). `count` fixed key -> value
    mappings, keys of `key_length` symbols (distinct), values of `value_length` symbols, drawn
    from data.seed and these settings only, never from a run's seeds: the same facts for every
    run of the data setting. `share` of each batch's rows (rounded) are fact rows, `| | key
    value` repeated, a row's facts distinct; the other rows are the regime's, exactly those of
    the same step without facts. Only the value tokens are trained on."""
    count: int = setting(gt=0)
    share: float = setting(gt=0, lt=1)
    key_length: int = setting(ge=1, le=4)
    value_length: int = setting(ge=1, le=4)

    def rows(self, batch_size: int) -> int:
        """Fact rows per batch."""
        return round(self.share * batch_size)


@DATA_CONFIGS.register("regbench")
@dataclass(frozen=True)
class RegBenchDataConfig(DataConfig):
    """data.kind=regbench (conf/data/regbench*.yaml): RegBench-style in-context language learning
    (jobs/data/regbench.py). Ranges are inclusive [low, high]."""
    n_symbols: int = setting(choices=(N_SYMBOLS,))
    num_states: list[int] = setting(length=2, ascending=True, ge=2,
                                    what="[low, high] with 2 <= low <= high (no self-loops)")
    alphabet_size: list[int] = setting(length=2, ascending=True, ge=1, what=_RANGE)
    transitions_per_state: list[int] = setting(length=2, ascending=True, ge=1, what=_RANGE)
    strings_per_instance: list[int] = setting(length=2, ascending=True, ge=1, what=_RANGE)
    string_length: list[int] = setting(length=2, ascending=True, ge=1, what=_RANGE)
    train_automata: int = setting(gt=0)
    heldout_automata: int = setting(gt=0)
    # Not set in conf/data/ (the defaults are here): null = a fresh instance per row (the infinite
    # stream, the default); N = one fixed set of N instances, instance i of training automaton
    # i % train_automata, trained on for as many epochs as train.steps need (the reference: 5000).
    train_sequences: Optional[int] = setting(None, gt=0)
    # With a fixed set: validation instances, one per automaton of a pool disjoint from the
    # training and held-out pools (the reference: 250); the lowest validation loss chooses the
    # checkpoint that the evaluations score.
    validation_sequences: int = setting(VALIDATION_SEQUENCES, gt=0)
    # true: the data option declares that its instances may be longer than the context and are
    # cut at its end (regbench_easy: as many strings as fit); false: such a context is refused.
    cut_at_context: bool = setting(False)
    # Not set in conf/data/ (conf/size/data/tiny_regbench_easy.yaml and conf/experiment/miniature.yaml
    # set it): null = no curriculum.
    warmup: Optional[DataWarmupConfig] = setting(None)
    # Not set in conf/data/ (the preset conf/experiment/knowledge.yaml sets it): null = no facts,
    # the regime's rows only.
    facts: Optional[FactsConfig] = setting(None)

    def derive(self, run: JobConfig) -> dict[str, object]:
        """A warm-up given as a share of train.steps gets its steps."""
        if self.warmup is None or self.warmup.steps is not None or self.warmup.share is None:
            return {}
        return {"warmup": dataclasses.replace(self.warmup, steps=max(1, round(self.warmup.share * run.train.steps)))}

    def check(self, run: JobConfig) -> None:
        super().check(run)
        require(self.alphabet_size[1] <= self.n_symbols,
                f"data.alphabet_size={self.alphabet_size}: more than data.n_symbols={self.n_symbols}")
        require(self.vocab_size == self.n_symbols + 2,
                f"data.vocab_size={self.vocab_size}: must be n_symbols + 2 (separator and pad)")
        strings, length = self.strings_per_instance[1], self.string_length[1]
        longest = longest_instance(self)
        require(self.cut_at_context or longest <= self.seq_len + 1,
                f"data.seq_len={self.seq_len}: shorter than the longest instance of data={self.name} "
                f"({strings} strings of up to {length} symbols, each after a |: {longest} tokens, so "
                f"data.seq_len >= {longest - 1}); use a size with model.max_seq_len >= {longest - 1}, "
                f"shorter instances (data.strings_per_instance, data.string_length), or "
                f"data.cut_at_context=true to cut them at the context's end")
        require(self.train_sequences is None or run.backend.trains_on_data,
                f"data.train_sequences={self.train_sequences}: backend={run.backend.name} trains on "
                f"its own dataset, not on data.*; drop data.train_sequences or use backend=torch")
        if self.warmup is not None:
            self._check_warmup(self.warmup, run)
        if self.facts is not None:
            self._check_facts(self.facts, run)

    def _check_warmup(self, warmup: DataWarmupConfig, run: JobConfig) -> None:
        require(warmup.steps is not None, "data.warmup: give its length, data.warmup.steps or data.warmup.share")
        assert warmup.steps is not None  # for the type checker: require raised otherwise
        require(warmup.steps < run.train.steps,
                f"data.warmup.steps={warmup.steps}: must be fewer than train.steps={run.train.steps}, "
                f"or the regime itself is never trained on")
        require(warmup.alphabet_size is None or warmup.alphabet_size[1] <= self.n_symbols,
                f"data.warmup.alphabet_size={warmup.alphabet_size}: more than data.n_symbols={self.n_symbols}")
        self._check_in_stream("warmup", "a curriculum draws fresh instances", run)
        longest = self.strings_per_instance[1] * ((warmup.string_length or self.string_length)[1] + 1)
        require(self.cut_at_context or longest <= self.seq_len + 1,
                f"data.warmup.string_length={warmup.string_length}: its instances are longer than "
                f"data.seq_len={self.seq_len} + 1 and data={self.name} does not cut at the context")

    def _check_facts(self, facts: FactsConfig, run: JobConfig) -> None:
        rows = facts.rows(run.train.batch_size)
        require(0 < rows < run.train.batch_size,
                f"data.facts.share={facts.share}: gives {rows} fact rows of train.batch_size="
                f"{run.train.batch_size}; give a share that leaves at least one fact row and one row of the regime")
        require(facts.count <= self.n_symbols ** facts.key_length,
                f"data.facts.count={facts.count}: more than the {self.n_symbols ** facts.key_length} distinct "
                f"keys of data.facts.key_length={facts.key_length} symbols")
        require(facts.key_length + facts.value_length + 2 <= self.seq_len + 1,
                f"data.facts: a fact (| | key value, {facts.key_length + facts.value_length + 2} tokens) does "
                f"not fit data.seq_len={self.seq_len} + 1")
        self._check_in_stream("facts", "facts are mixed into the stream", run)

    def _check_in_stream(self, key: str, why: str, run: JobConfig) -> None:
        """data.<key> changes the generated stream: refused with a fixed training set (`why`) and
        with a backend that trains on its own dataset."""
        require(self.train_sequences is None,
                f"data.{key} with data.train_sequences={self.train_sequences}: {why}; use one of the two")
        require(run.backend.trains_on_data,
                f"data.{key}: backend={run.backend.name} trains on its own dataset, not on data.*; "
                f"drop data.{key} or use backend=torch")


@dataclass(frozen=True)
class ArithSettings:
    max_number: int = setting(ge=1)
    two_step: float = setting(ge=0, le=1)  # share of two-step (add, then subtract) problems
    train_problems: int = setting(ge=1)
    test_problems: int = setting(ge=1)


@DATA_CONFIGS.register("arith")
@dataclass(frozen=True)
class ArithDataConfig(DataConfig):
    """data.kind=arith (conf/data/arith.yaml): byte-level text of word problems (jobs/data/arith.py)."""
    arith: ArithSettings = section(ArithSettings)

    def check(self, run: JobConfig) -> None:
        super().check(run)
        require(self.vocab_size == BYTE_VOCAB_SIZE, f"data.vocab_size={self.vocab_size}: byte-level "
                f"text needs {BYTE_VOCAB_SIZE} (256 bytes + BOS, EOS, pad)")
        require(self.seq_len >= 128, f"data.seq_len={self.seq_len}: text rows need >= 128 bytes "
                f"(a worked example is ~110); raise model.max_seq_len")
