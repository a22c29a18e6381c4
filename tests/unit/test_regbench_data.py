import copy
import dataclasses
import hashlib

import numpy as np
import pytest
import torch

from config.data import DataWarmupConfig, RegBenchDataConfig, longest_instance
from jobs.data import train_stream
from jobs.data.regbench import (IGNORE, N_SYMBOLS, PAD, SEP, Automaton, RegBenchConfig, TrainStream, build_eval_set,
                                canonical, heldout_set, minimise, sample_automata, warmup_view)
from jobs.data.regbench import _warmup_pool

SMALL = RegBenchDataConfig(name="regbench", kind="regbench", vocab_size=20, n_symbols=18, seed=7,
                           num_states=[3, 5], alphabet_size=[3, 6], transitions_per_state=[1, 3],
                           strings_per_instance=[5, 8], string_length=[1, 8],
                           train_automata=60, heldout_automata=12, seq_len=96)
A, B, C = 0, 1, 2


def table(n_states, transitions):
    """Transition table from {(state, symbol): target}."""
    delta = np.full((n_states, N_SYMBOLS), -1)
    for (state, symbol), target in transitions.items():
        delta[state, symbol] = target
    return delta


def accepts(automaton, string):
    state = 0
    for symbol in string:
        state = automaton.delta[state, symbol]
        if state < 0:
            return False
    return True


def test_minimise_merges_equivalent_states():
    # States 1 and 2 both allow only c, to state 3; state 3 allows only a, back to 0.
    delta = table(4, {(0, A): 1, (0, B): 2, (1, C): 3, (2, C): 3, (3, A): 0})
    expected = table(3, {(0, A): 1, (0, B): 1, (1, C): 2, (2, A): 0})
    np.testing.assert_array_equal(minimise(delta), expected)


def test_minimise_keeps_states_that_differ_deeper():
    # 1 and 2 allow the same symbol now, but their successors allow different ones.
    delta = table(5, {(0, A): 1, (0, B): 2, (1, C): 3, (2, C): 4, (3, A): 0, (4, B): 0})
    assert len(minimise(delta)) == 5


def test_trimming_drops_unreachable_states():
    delta = table(4, {(0, A): 2, (2, B): 0, (1, C): 3, (3, A): 1})  # 1 and 3 unreachable from 0
    np.testing.assert_array_equal(canonical(delta), table(2, {(0, A): 1, (1, B): 0}))
    assert Automaton.from_transitions(delta).n_states == 2


def test_canonical_form_is_invariant_under_relabelling():
    delta = table(4, {(0, A): 1, (0, C): 3, (1, B): 2, (2, A): 3, (3, B): 0, (3, C): 1})
    perm = np.array([2, 0, 3, 1])  # old state s becomes perm[s]
    relabelled = np.full_like(delta, -1)
    relabelled[perm] = np.where(delta >= 0, perm[delta], -1)
    np.testing.assert_array_equal(canonical(relabelled, start=int(perm[0])), canonical(delta))
    # Automata compare by canonical form; a different start state is a different language.
    assert Automaton.from_transitions(delta) == Automaton.from_transitions(canonical(relabelled, int(perm[0])))
    assert Automaton.from_transitions(delta) != Automaton.from_transitions(canonical(delta, start=1))


def test_pools_distinct_disjoint_and_deterministic():
    train, heldout = sample_automata(SMALL)
    assert (len(train), len(heldout)) == (60, 12)
    assert len(set(train)) == 60 and len(set(heldout)) == 12
    assert not set(train) & set(heldout)
    assert sample_automata(copy.deepcopy(SMALL)) == (train, heldout)
    # Held-out pool does not depend on the training pool size.
    assert sample_automata(dataclasses.replace(SMALL, train_automata=30))[1] == heldout
    assert sample_automata(dataclasses.replace(SMALL, seed=8))[1] != heldout
    for automaton in train + heldout:
        delta = automaton.delta
        assert 1 <= automaton.n_states <= 5 and (delta >= 0).any(axis=1).all()  # no dead ends
        assert len(np.flatnonzero((delta >= 0).any(axis=0))) <= 6
        np.testing.assert_array_equal(minimise(delta), delta)  # stored minimal and canonical


def test_pools_are_the_automata_they_always_were():
    """Pools are data: a faster generator must draw exactly the same automata (digests of pools
    drawn before the generator's state-by-state work moved from numpy to plain Python)."""
    wide = dataclasses.replace(SMALL, num_states=[2, 12], alphabet_size=[4, 18], transitions_per_state=[1, 4],
                               train_automata=3000)
    for cfg, expected in ((SMALL, "4bb40f92db4fcb5b"), (wide, "0bb24e3c650f749a")):
        train, heldout = sample_automata(cfg)
        pools = b"".join(bytes([a.n_states]) + a.table_bytes for a in train + heldout)
        assert hashlib.sha256(pools).hexdigest()[:16] == expected


def test_train_stream_deterministic_and_stateless():
    stream = TrainStream(SMALL, seed=0, batch_size=8)
    x5, y5 = stream.batch(5)
    stream.batch(3)
    fresh = TrainStream(SMALL, seed=0, batch_size=8)
    for first, second in zip((x5, y5), fresh.batch(5)):
        assert torch.equal(first, second)
    assert not torch.equal(x5, stream.batch(6)[0])
    assert not torch.equal(x5, TrainStream(SMALL, seed=1, batch_size=8).batch(5)[0])
    assert x5.shape == y5.shape == (8, 96) and x5.dtype == y5.dtype == torch.int64


def test_train_targets_shifted_and_masked():
    inputs, targets = TrainStream(SMALL, seed=3, batch_size=16).batch(0)
    following = torch.cat([inputs[:, 1:], targets[:, -1:]], dim=1)
    symbol = targets != IGNORE
    assert torch.equal(targets[symbol], following[symbol])
    assert (targets[symbol] < N_SYMBOLS).all()
    # Masked exactly where the next token is a separator or pad.
    assert torch.isin(inputs[:, 1:][~symbol[:, :-1]], torch.tensor([SEP, PAD])).all()
    assert (inputs[:, 0] == SEP).all()


def test_instances_are_walks_with_configured_counts_and_lengths():
    cfg = dataclasses.replace(SMALL, seq_len=200)  # long enough that nothing is truncated
    eval_set = heldout_set(cfg, 24)
    heldout = sample_automata(cfg)[1]
    for i, row in enumerate(eval_set.inputs):
        text = row[row != PAD]
        assert text[0] == SEP and (row[len(text):] == PAD).all()
        strings = np.split(text[1:], np.flatnonzero(text[1:] == SEP))
        strings = [s[s != SEP] for s in strings]
        assert 5 <= len(strings) <= 8
        assert all(1 <= len(s) <= 8 and accepts(heldout[i % 12], s) for s in strings)


def test_eval_set_reference_on_hand_built_automaton():
    # 0 --a--> 1, 0 --b--> 2, 1 --c--> 0, 2 --a--> 0, 2 --c--> 1
    delta = table(3, {(0, A): 1, (0, B): 2, (1, C): 0, (2, A): 0, (2, C): 1})
    automaton = Automaton.from_transitions(delta)
    np.testing.assert_array_equal(automaton.delta, delta)  # already minimal and in BFS order
    eval_set = build_eval_set([automaton], SMALL, 6, np.random.default_rng(0))
    allowed = {0: {A, B}, 1: {C}, 2: {A, C}}
    for row in range(6):
        state, strings_done = 0, -1
        for t, token in enumerate(eval_set.inputs[row]):
            if token == PAD:
                assert not eval_set.valid[row, t] and not eval_set.valid_next[row, t].any()
                continue
            if token == SEP:
                state, strings_done = 0, strings_done + 1
            else:
                state = automaton.delta[state, token]
            expected = np.zeros(N_SYMBOLS)
            expected[list(allowed[int(state)])] = 1
            assert eval_set.valid[row, t]
            np.testing.assert_array_equal(eval_set.valid_next[row, t], expected > 0)
            np.testing.assert_allclose(eval_set.ref[row, t], expected / expected.sum())
            assert eval_set.n_context_strings[row, t] == strings_done


def test_heldout_set_deterministic_and_read_only():
    first, second = heldout_set(SMALL, 10), heldout_set(copy.deepcopy(SMALL), 10)
    np.testing.assert_array_equal(first.inputs, second.inputs)
    assert first.inputs.shape == (10, 96) and first.ref.shape == (10, 96, N_SYMBOLS)
    with pytest.raises(ValueError):
        first.inputs[0, 0] = 0


def test_a_space_too_small_for_the_pools_is_refused():
    """Ranges are checked at planning (tests/unit/test_config.py); an automaton space too small for the
    pools asked for is found only when sampling."""
    with pytest.raises(ValueError, match="could not find 40 distinct automata"):
        sample_automata(dataclasses.replace(SMALL, num_states=[2, 2], alphabet_size=[1, 1], heldout_automata=40))


def test_the_hashable_view_keys_the_caches():
    view = RegBenchConfig.parse(SMALL)
    assert RegBenchConfig.parse(view) is view and hash(view) == hash(RegBenchConfig.parse(copy.deepcopy(SMALL)))


# ----------------------------------------------------------------------------- the fixed training set

FIXED = dataclasses.replace(SMALL, train_sequences=20, validation_sequences=6, seq_len=200)


def test_fixed_set_epochs_cover_every_instance_once():
    """With data.train_sequences=N, consecutive rows go through the N instances epoch by epoch,
    each epoch in its own order; every run seed and family trains on the same instances."""
    stream = train_stream(FIXED, seed=0, batch_size=8)
    rows = torch.cat([torch.cat([x, y[:, -1:]], dim=1) for x, y in (stream.batch(step) for step in range(10))])
    assert len(rows) == 80  # four epochs of 20
    epochs = [{tuple(r.tolist()) for r in rows[i:i + 20]} for i in range(0, 80, 20)]
    assert all(len(epoch) == 20 for epoch in epochs) and all(epoch == epochs[0] for epoch in epochs)
    assert not torch.equal(rows[:20], rows[20:40])  # reshuffled
    other_seed = train_stream(FIXED, seed=1, batch_size=8)
    seen = {tuple(torch.cat([x, y[:, -1:]], dim=1)[i].tolist()) for x, y in [other_seed.batch(0)] for i in range(8)}
    assert seen <= epochs[0] and not torch.equal(other_seed.batch(0)[0], stream.batch(0)[0])
    for first, second in zip(stream.batch(7), train_stream(FIXED, seed=0, batch_size=8).batch(7)):
        assert torch.equal(first, second)  # a pure function of the step


def test_fixed_set_instances_and_targets_as_in_the_stream():
    inputs, targets = train_stream(FIXED, seed=3, batch_size=16).batch(2)
    following = torch.cat([inputs[:, 1:], targets[:, -1:]], dim=1)
    symbol = targets != IGNORE
    assert torch.equal(targets[symbol], following[symbol]) and (inputs[:, 0] == SEP).all()
    assert inputs.dtype == targets.dtype == torch.int64 and inputs.shape == (16, 200)


def test_validation_split_has_automata_of_its_own_and_is_due_once_per_epoch():
    from jobs.data.regbench import RegBenchConfig, validation_automata, validation_set

    train, heldout = sample_automata(FIXED)
    validation = validation_automata(FIXED)
    assert len(set(validation)) == 6 and not set(validation) & (set(train) | set(heldout))
    assert sample_automata(SMALL) == (train, heldout)  # the other pools do not change
    tokens = validation_set(RegBenchConfig.parse(FIXED))
    assert tokens.shape == (6, 201) and (tokens[:, 0] == SEP).all()
    split = train_stream(FIXED, seed=0, batch_size=8).validation
    assert sum(len(x) for x, _ in split.batches()) == 6
    # 20 instances, 8 rows a step: passes end within steps 3, 5, 8, 10, ...; and after the last step
    assert [step for step in range(1, 13) if split.due(step, 12)] == [3, 5, 8, 10, 12]
    assert TrainStream(SMALL, seed=0, batch_size=8).validation is None  # the stream: nothing to choose


def test_the_longest_instance_must_fit_the_context_unless_cutting_is_declared():
    from types import SimpleNamespace

    from common.settings import ConfigError

    assert longest_instance(SMALL) == 8 * 9  # 8 strings of up to 8 symbols, each after its |
    run = SimpleNamespace(model=SimpleNamespace(vocab_size=20, max_seq_len=512),
                          backend=SimpleNamespace(name="torch", trains_on_data=True))
    dataclasses.replace(SMALL, seq_len=71).check(run)  # 72 tokens: inputs 71 + the last target
    with pytest.raises(ConfigError, match=r"data.seq_len=70: shorter than the longest instance .* 72 tokens"):
        dataclasses.replace(SMALL, seq_len=70).check(run)
    dataclasses.replace(SMALL, seq_len=70, cut_at_context=True).check(run)
    nanotron = SimpleNamespace(model=run.model, backend=SimpleNamespace(name="nanotron", trains_on_data=False))
    with pytest.raises(ConfigError, match="data.train_sequences=20: backend=nanotron trains on its own dataset"):
        FIXED.check(nanotron)


def strings_of(row):
    """The strings of one instance (input row), without separators and padding."""
    text = "".join(chr(97 + int(t)) if t < N_SYMBOLS else "|" for t in row if t != PAD)
    return [s for s in text.split("|") if s]


def one_walk(row) -> bool:
    """Whether every string of the instance is a prefix of its longest one (one path per automaton)."""
    strings = strings_of(row)
    longest = max(strings, key=len)
    return all(longest.startswith(s) for s in strings)


def test_a_curriculum_draws_its_first_steps_from_the_warmup_ranges_then_the_regime():
    warmup = DataWarmupConfig(steps=3, num_states=[6, 8], alphabet_size=[8, 10], transitions_per_state=[1, 1])
    cfg = dataclasses.replace(SMALL, warmup=warmup)
    stream, plain = TrainStream(cfg, seed=1, batch_size=16), TrainStream(SMALL, seed=1, batch_size=16)
    for step in range(3):  # deterministic automata: every string is a prefix of the one walk
        inputs, _ = stream.batch(step)
        assert all(one_walk(row) for row in inputs.numpy())
        assert not torch.equal(inputs, plain.batch(step)[0])
    assert not all(one_walk(row) for step in (3, 4) for row in stream.batch(step)[0].numpy())
    for step in (3, 7):  # after the warm-up: exactly the regime's stream
        for mine, theirs in zip(stream.batch(step), plain.batch(step)):
            assert torch.equal(mine, theirs)
    view = warmup_view(RegBenchConfig.parse(cfg), warmup)
    assert (view.num_states, view.transitions_per_state, view.string_length) == ((6, 8), (1, 1), (1, 8))
    # The warm-up pool never holds one of the regime's held-out automata.
    _, heldout = sample_automata(SMALL)
    assert not set(_warmup_pool(view, RegBenchConfig.parse(SMALL).automata)) & set(heldout)
