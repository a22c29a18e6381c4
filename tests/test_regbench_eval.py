import numpy as np
import pytest
import torch

from jobs.data.regbench import N_SYMBOLS, PAD, SEP, VOCAB, RegBenchDataConfig, heldout_set
from jobs.evals.regbench import ITEM_METRICS, METRICS, RegBenchSettings, evaluate, ngram_distributions

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
    assert result.metrics["regbench_tvd"] == pytest.approx(0, abs=1e-6)
    assert result.metrics["regbench_l1_ref"] == pytest.approx(0, abs=1e-6)
    assert result.metrics["regbench_acc"] == 1


def test_uniform_model_matches_analytic_values(eval_set):
    result = evaluate(DATA, EVAL, lambda inputs: torch.zeros(*inputs.shape, VOCAB))
    k = eval_set.valid_next.sum(axis=-1)[eval_set.valid]  # allowed symbols per valid position
    # TVD of uniform-over-18 vs uniform-over-k is 1 - k/18; over 20 with no mass due at |, pad: 2 - 2k/20.
    assert result.metrics["regbench_tvd"] == pytest.approx(np.mean(1 - k / 18))
    assert result.metrics["regbench_l1_ref"] == pytest.approx(np.mean(2 - 2 * k / 20))
    assert result.metrics["regbench_acc"] == pytest.approx(np.mean(k / 20))  # all 20 tied


def test_ngram_counts_match_hand_computation():
    inputs = np.array([[SEP, 0, 1, SEP, 0, 2, SEP, 0, PAD]])  # | a b | a c | a .
    smooth = lambda counts: (np.array(counts, float) + ALPHA) / (sum(counts) + N_SYMBOLS * ALPHA)
    expected = lambda counts: smooth(list(counts) + [0] * (N_SYMBOLS - len(counts)))
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


def test_ngram_estimator_as_a_model_reproduces_its_reference_row(eval_set):
    bigram = ngram_distributions(np.asarray(eval_set.inputs), 2, ALPHA)
    result = evaluate(DATA, EVAL, lookup_logits(symbol_logits(bigram)))
    for score in ("tvd", "l1_ref", "acc"):
        assert result.metrics[f"regbench_{score}"] == pytest.approx(result.metrics[f"ngram2_{score}"])


def test_reference_rows_bounded_and_bigram_beats_unigram():
    metrics = evaluate(DATA, EVAL, lambda inputs: torch.zeros(*inputs.shape, VOCAB)).metrics
    assert 0 < metrics["ngram2_tvd"] < metrics["ngram1_tvd"] < 1 and 0 < metrics["ngram3_tvd"] < 1
    assert metrics["ngram1_l1_ref"] == pytest.approx(2 * metrics["ngram1_tvd"])


def test_curves_items_and_directions_are_consistent(eval_set):
    result = evaluate(DATA, EVAL, lambda inputs: torch.randn(*inputs.shape, VOCAB,
                                                             generator=torch.Generator().manual_seed(0)))
    curve = result.curves["tvd_by_context"]
    weights = np.array(curve["n_positions"])
    assert weights.sum() == eval_set.valid.sum()
    assert curve["n_context_strings"] == sorted(set(eval_set.n_context_strings[eval_set.valid].tolist()))
    for name in ("regbench_tvd", "ngram1_tvd", "ngram2_tvd", "ngram3_tvd"):
        assert np.average(curve[name], weights=weights) == pytest.approx(result.metrics[name])

    items = result.items
    assert list(items.columns) == ["item_id", "metric", "score", "weight"]
    assert len(items) == 24 * len(ITEM_METRICS) and set(items.metric) == set(ITEM_METRICS)
    for name, group in items.groupby("metric"):
        assert np.average(group.score, weights=group.weight) == pytest.approx(result.metrics[name])

    assert set(result.metrics) <= set(METRICS)  # every recorded metric is declared, with its direction
    assert all(METRICS[name].higher_is_better == name.endswith("_acc") for name in result.metrics)
    assert {name for name in result.metrics if METRICS[name].reference} == {
        name for name in result.metrics if name.startswith("ngram")}
