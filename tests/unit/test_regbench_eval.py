import numpy as np
import pytest
import torch

from collections import Counter

from jobs.data.regbench import N_SYMBOLS, PAD, SEP, VOCAB, RegBenchDataConfig, heldout_set
from jobs.evals.regbench import (ITEM_METRICS, METRICS, RegBenchSettings, backoff_distributions, evaluate,
                                 ngram_distributions, position_scores, symbols_tvd)

DATA = RegBenchDataConfig(name="regbench", kind="regbench", vocab_size=20, n_symbols=18, seed=11,
                          num_states=[3, 6], alphabet_size=[3, 8], transitions_per_state=[1, 3],
                          strings_per_instance=[6, 12], string_length=[1, 10],
                          train_automata=40, heldout_automata=10, seq_len=80)
EVAL = RegBenchSettings(instances=24, ngram_alpha=0.1, batch_size=7)
ALPHA = 0.1
NEG = -1e9


def lookup_logits(table: np.ndarray):
    """A logits_fn that returns precomputed per-position logits for the held-out rows it is given."""
    eval_set = heldout_set(DATA, EVAL.instances)
    by_row = {row.tobytes(): i for i, row in enumerate(eval_set.inputs)}
    return lambda inputs: torch.as_tensor(table[[by_row[row.numpy().tobytes()] for row in inputs]])


def symbol_logits(p_symbols: np.ndarray) -> np.ndarray:
    """Logits putting distribution ``p_symbols`` on the symbols and nothing on | and pad."""
    with np.errstate(divide="ignore"):
        logits = np.where(p_symbols > 0, np.log(p_symbols), NEG)
    return np.concatenate([logits, np.full(logits.shape[:-1] + (VOCAB - N_SYMBOLS,), NEG)], axis=-1)


@pytest.fixture(scope="module")
def eval_set():
    return heldout_set(DATA, EVAL.instances)


def test_perfect_model_scores_zero(eval_set):
    result = evaluate(DATA, EVAL, lookup_logits(symbol_logits(eval_set.ref.astype(np.float64))))
    for name in ("regbench_tvd", "regbench_tvd_symbols", "regbench_l1_ref"):
        assert result.metrics[name] == pytest.approx(0, abs=1e-6)
    assert result.metrics["regbench_acc"] == 1


def test_paper_tvd_by_hand():
    """The paper's TVD counts the mass on | and pad as error; the symbol-renormalised one does not."""
    ref = np.zeros(N_SYMBOLS)
    ref[[0, 1]] = 0.5  # a or b, evenly
    p = np.zeros(VOCAB)
    p[0], p[1], p[SEP] = 0.5, 0.3, 0.2
    allowed = ref > 0
    scores = position_scores(p, ref, allowed)
    assert scores["tvd"] == pytest.approx(0.5 * (0.0 + 0.2 + 0.2))  # a exact, b short by 0.2, | 0.2 too many
    assert scores["l1_ref"] == pytest.approx(0.4)
    assert scores["acc"] == 1  # a is the argmax
    renormalised = p[:N_SYMBOLS] / p[:N_SYMBOLS].sum()  # a 0.625, b 0.375
    assert symbols_tvd(renormalised, ref) == pytest.approx(0.125)
    # An estimator's missing mass (here 0.4 dropped) counts only through the symbols' terms.
    q = np.zeros(VOCAB)
    q[0], q[2] = 0.4, 0.2
    assert position_scores(q, ref, allowed)["tvd"] == pytest.approx(0.5 * (0.1 + 0.5 + 0.2))


def test_uniform_model_matches_analytic_values(eval_set):
    result = evaluate(DATA, EVAL, lambda inputs: torch.zeros(*inputs.shape, VOCAB))
    k = eval_set.valid_next.sum(axis=-1)[eval_set.scored]  # allowed symbols per scored position
    # Uniform over 20 against uniform over k: 1/2 (k (1/k - 1/20) + (20 - k) / 20) = 1 - k/20.
    assert result.metrics["regbench_tvd"] == pytest.approx(np.mean(1 - k / 20))
    assert result.metrics["regbench_l1_ref"] == pytest.approx(np.mean(2 - 2 * k / 20))
    # Given the string continues: uniform over 18 against uniform over k, 1 - k/18.
    assert result.metrics["regbench_tvd_symbols"] == pytest.approx(np.mean(1 - k / 18))
    assert result.metrics["regbench_acc"] == pytest.approx(np.mean(k / 20))  # all 20 tied


def test_scored_positions_are_the_reference_codes(eval_set):
    """The reference scores every input position of its instance (ours without the opening |),
    its input being the instance without its last token."""
    cut = 0
    for inputs, scored, valid in zip(eval_set.inputs, eval_set.scored, eval_set.valid):
        n_tokens = int(valid.sum())  # our instance, up to the pad or to the end of the context
        assert not scored[0] and scored[1:n_tokens - 1].all() and not scored[n_tokens:].any()
        if n_tokens < len(inputs):  # the instance's last token: its next one is pad
            assert not scored[n_tokens - 1]
        else:  # cut at the context's end (this data's instances may be longer): its next token is a real one
            cut += int(scored[n_tokens - 1])
    assert 0 < cut < len(eval_set.inputs)


def test_ngram_counts_match_hand_computation():
    inputs = np.array([[SEP, 0, 1, SEP, 0, 2, SEP, 0, PAD]])  # | a b | a c | a .
    def expected(counts: list[int]) -> np.ndarray:  # add-ALPHA smoothing of the counts of symbols 0, 1, ...
        padded = np.array(list(counts) + [0] * (N_SYMBOLS - len(counts)), float)
        return (padded + ALPHA) / (sum(counts) + N_SYMBOLS * ALPHA)
    unigram, bigram, trigram = (ngram_distributions(inputs, order, ALPHA)[0] for order in (1, 2, 3))
    np.testing.assert_allclose(unigram[7], expected([3, 1, 1]))  # a a a, b, c up to position 7
    np.testing.assert_allclose(bigram[7], expected([0, 1, 1]))  # a -> b, a -> c
    np.testing.assert_allclose(bigram[6], expected([2]))  # | -> a twice (the opening | included)
    np.testing.assert_allclose(bigram[1], expected([]))  # the target itself is never counted
    np.testing.assert_allclose(bigram[4], expected([0, 1]))  # a -> b only; a -> c is the target
    # Contexts stop at the separator: after "|" the trigram context is (|, |), seen once with a.
    np.testing.assert_allclose(trigram[3], expected([1]))
    np.testing.assert_allclose(trigram[7], expected([0, 1, 1]))  # (|, a) -> b, c
    np.testing.assert_allclose(trigram[5], expected([]))  # (a, c) is new


A, B, C = 0, 1, 2


def row(**probs: float) -> np.ndarray:
    out = np.zeros(N_SYMBOLS)
    for name, p in probs.items():
        out["abc".index(name)] = p
    return out


def test_backoff_bigram_by_hand():
    # | a b | a c | a   (the reference code's text "ab|ac|a"); row p has read tokens 1..p
    got = backoff_distributions(np.array([[SEP, A, B, SEP, A, C, SEP, A]]), 2)[0]
    np.testing.assert_allclose(got[0], 0)  # nothing read yet
    np.testing.assert_allclose(got[1], row(a=1))  # a never followed: back-off to the unigram {a}
    np.testing.assert_allclose(got[2], row(a=.5, b=.5))  # b never followed: unigram a 1, b 1
    # at |: C(_) = 2 strings (the current, empty one included), C(_a) = 1 -> a 1/2; b gets the rest
    np.testing.assert_allclose(got[3], row(a=.5, b=.5))
    np.testing.assert_allclose(got[4], row(a=.5, b=.5))  # C(a) = 2 (p itself included), C(ab) = 1; a the rest
    np.testing.assert_allclose(got[5], row(a=.5, b=.25, c=.25))  # c never followed: unigram 2:1:1
    np.testing.assert_allclose(got[6], row(a=2 / 3, b=1 / 6, c=1 / 6))  # C(_) = 3, C(_a) = 2
    np.testing.assert_allclose(got[7], row(a=1 / 3, b=1 / 3, c=1 / 3))  # C(a) = 3, C(ab) = C(ac) = 1


def test_backoff_trigram_mixes_levels_by_hand():
    # | c a | b c b c b | c   (text "ca|bcbcb|c"), the prediction after the last c
    got = backoff_distributions(np.array([[SEP, C, A, SEP, B, C, B, C, B, SEP, C, PAD]]), 3)[0]
    # order 3, context (_, c): C(_c) = 2, C(_ca) = 1 -> a 1/2; b, c share the other 1/2 by order 2:
    # context (c): C(c) = 4, C(ca) = 1, C(cb) = 2 -> a 1/4, b 1/2, c gets the rest 1/4
    # -> b = 1/2 * (1/2) / (1/2 + 1/4) = 1/3, c = 1/2 * (1/4) / (3/4) = 1/6
    np.testing.assert_allclose(got[10], row(a=1 / 2, b=1 / 3, c=1 / 6))
    np.testing.assert_allclose(got[11], 0)  # pad: nothing read


def test_backoff_trigram_at_a_separator_by_hand():
    # | a b c |   (text "abc|"): context (_, _): C(__) = 2 strings, C(__a) = 1 -> a 1/2; b, c share the
    # other 1/2 by order 2 with context (_): C(_) = 4 (two per padded string), C(_a) = 1, b and c unseen:
    # they share 3/4 by the unigram (1:1), 3/8 each -> 1/4 each of the 1/2
    got = backoff_distributions(np.array([[SEP, A, B, C, SEP]]), 3)[0]
    np.testing.assert_allclose(got[4], row(a=1 / 2, b=1 / 4, c=1 / 4))


def test_backoff_leaves_mass_out_when_every_symbol_was_seen():
    # | b a a b | b a   (text "baab|ba"): C(a) = 3, C(aa) = 1, C(ab) = 1 -> 1/3 each, 1/3 dropped
    got = backoff_distributions(np.array([[SEP, B, A, A, B, SEP, B, A]]), 2)[0]
    np.testing.assert_allclose(got[7], row(a=1 / 3, b=1 / 3))


def test_unigram_is_the_frequency_of_the_symbols_seen():
    got = backoff_distributions(np.array([[SEP, A, B, SEP, A, C, SEP, A]]), 1)[0]
    np.testing.assert_allclose(got[7], row(a=3 / 5, b=1 / 5, c=1 / 5))
    np.testing.assert_allclose(got[3], row(a=.5, b=.5))


def slow_backoff(tokens, order: int) -> np.ndarray:
    """The back-off estimator written out with string counters, position by position."""
    out = np.zeros((len(tokens), N_SYMBOLS))
    counts = Counter()
    strings: list[list] = [[]]
    for p in range(1, len(tokens)):
        if tokens[p] == PAD:
            break
        if tokens[p] == SEP:
            strings.append([])
        else:
            strings[-1].append(int(tokens[p]))
        counts = Counter()
        for string in strings:
            padded = ["_"] * (order - 1) + string
            for n in range(1, order + 1):
                for end in range(n, len(padded) + 1):
                    counts[tuple(padded[end - n:end])] += 1
        vocab = sorted({c for string in strings for c in string})

        def level(context: tuple, n: int, counts: Counter = counts, vocab: list = vocab) -> dict:
            if n == 1:
                total = sum(counts[(c,)] for c in vocab)
                return {c: counts[(c,)] / total for c in vocab}
            probs = {c: counts[context + (c,)] / counts[context] for c in vocab if counts[context + (c,)]}
            unseen = [c for c in vocab if c not in probs]
            if unseen:
                lower = level(context[1:], n - 1)
                norm = sum(lower[c] for c in unseen)
                probs |= {c: (1 - sum(probs.values())) * lower[c] / norm for c in unseen}
            return probs

        padded = ["_"] * (order - 1) + strings[-1]
        for c, prob in level(tuple(padded[len(padded) - order + 1:]) if order > 1 else (), order).items():
            out[p, c] = prob
    return out


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_backoff_matches_the_counts_written_out(eval_set, order):
    inputs = np.asarray(eval_set.inputs[:8])
    got = backoff_distributions(inputs, order)
    for tokens, fast, valid in zip(inputs, got, eval_set.valid[:8]):
        np.testing.assert_allclose(fast[valid], slow_backoff(tokens, order)[valid], atol=1e-12)


def test_ngram_estimator_as_a_model_reproduces_its_reference_row(eval_set):
    bigram = ngram_distributions(np.asarray(eval_set.inputs), 2, ALPHA)
    result = evaluate(DATA, EVAL, lookup_logits(symbol_logits(bigram)))
    for score in ("tvd", "l1_ref", "acc"):
        assert result.metrics[f"regbench_{score}"] == pytest.approx(result.metrics[f"ngram2_add_{score}"])
    assert result.metrics["regbench_tvd_symbols"] == pytest.approx(result.metrics["ngram2_add_tvd"])


def test_the_context_criterion_is_failed_by_the_bigram_it_is_measured_against(eval_set):
    """Counting gains from context (the old criterion is passed by the bigram estimator), so the
    criterion is the gain beyond the bigram's own: the back-off bigram run as a model (its missing
    mass spread by the softmax, so not exactly the reference row) gains from context as much as
    the reference row does, within a fifth, so its gain beyond the bigram is about zero."""
    bigram = backoff_distributions(np.asarray(eval_set.inputs), 2)
    metrics = evaluate(DATA, EVAL, lookup_logits(symbol_logits(bigram))).metrics
    gain, beyond = metrics["regbench_context_gain"], metrics["regbench_context_gain_over_bigram"]
    assert gain > 0 and metrics["ngram2_context_gain"] > 0
    assert abs(beyond) < 0.2 * gain
    assert beyond == pytest.approx(gain - metrics["ngram2_context_gain"])


def test_reference_rows_bounded_and_bigram_beats_unigram():
    metrics = evaluate(DATA, EVAL, lambda inputs: torch.zeros(*inputs.shape, VOCAB)).metrics
    for infix in ("", "_add"):
        assert 0 < metrics[f"ngram2{infix}_tvd"] < metrics[f"ngram1{infix}_tvd"] < 1
        assert 0 < metrics[f"ngram3{infix}_tvd"] < 1
        assert metrics[f"ngram1{infix}_l1_ref"] == pytest.approx(2 * metrics[f"ngram1{infix}_tvd"])
    assert metrics["regbench_l1_ref"] == pytest.approx(2 * metrics["regbench_tvd"])


def test_curves_items_and_directions_are_consistent(eval_set):
    result = evaluate(DATA, EVAL, lambda inputs: torch.randn(*inputs.shape, VOCAB,
                                                             generator=torch.Generator().manual_seed(0)))
    curve = result.curves["tvd_by_context"]
    weights = np.array(curve["n_positions"])
    assert weights.sum() == eval_set.scored.sum()
    assert curve["n_context_strings"] == sorted(set(eval_set.n_context_strings[eval_set.scored].tolist()))
    for name in ("regbench_tvd", "ngram1_tvd", "ngram2_tvd", "ngram3_tvd", "ngram2_add_tvd"):
        assert np.average(curve[name], weights=weights) == pytest.approx(result.metrics[name])

    items = result.items
    assert list(items.columns) == ["item_id", "metric", "score", "weight"]
    assert len(items) == 24 * len(ITEM_METRICS) and set(items.metric) == set(ITEM_METRICS)
    for name, group in items.groupby("metric"):
        assert np.average(group.score, weights=group.weight) == pytest.approx(result.metrics[name])

    assert set(result.metrics) == set(METRICS)  # every recorded metric is declared, with its direction
    assert METRICS["regbench_l1_ref"].higher_is_better is None  # 2 x regbench_tvd: descriptive
    assert all(METRICS[name].higher_is_better == name.endswith(("_acc", "_gain", "_gain_over_bigram"))
               for name in result.metrics if not name.endswith("_context_gain") or name.startswith("regbench")
               if name not in ("regbench_l1_ref", "regbench_tvd_2strings", "regbench_tvd_6plus_strings"))
    assert result.metrics["regbench_context_gain"] == pytest.approx(
        result.metrics["regbench_tvd_2strings"] - result.metrics["regbench_tvd_6plus_strings"])
    # counting gains from context too, so the criterion is the gain beyond the bigram's own
    assert result.metrics["regbench_context_gain_over_bigram"] == pytest.approx(
        result.metrics["regbench_context_gain"] - result.metrics["ngram2_context_gain"])
    tvd = METRICS["regbench_tvd"]
    assert tvd.references == ("ngram1_tvd", "ngram2_tvd", "ngram3_tvd") and tvd.claim and tvd.paper
    assert {name for name in result.metrics if METRICS[name].reference} == {
        name for name in result.metrics if name.startswith("ngram")}
