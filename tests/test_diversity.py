"""Tests for the hard-and-diverse exemplar selection (greedy DPP MAP)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from dspy_opro.extensions.hard_diverse import (
    HASHED_BUCKETS,
    DPPSelection,
    QuestionFeatures,
    greedy_dpp_map,
    quality_weights,
    select_hard_diverse,
    similarity_matrix,
)

WORDS = [
    "apple", "banana", "cherry", "delta", "echo", "fox", "golf", "hotel", "india", "juliet", "kilo", "lima",
    "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
]  # fmt: skip


def _random_psd(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    X = rng.normal(size=(n, dim))
    return X @ X.T


def _random_texts(rng: np.random.Generator, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 8)))) for _ in range(n)]


def _logdet(L: np.ndarray, idx: list[int]) -> float:
    if not idx:
        return 0.0
    sign, value = np.linalg.slogdet(L[np.ix_(idx, idx)])
    assert sign > 0
    return float(value)


# --------------------------------------------------------------------------------------------------------------
# greedy_dpp_map


def test_first_pick_is_largest_diagonal_entry():
    rng = np.random.default_rng(0)
    for _ in range(5):
        L = _random_psd(rng, 10, 12)
        sel = greedy_dpp_map(L, 3)
        assert sel.indices[0] == int(np.argmax(np.diag(L)))
        assert sel.gains[0] == pytest.approx(np.log(L[sel.indices[0], sel.indices[0]]), abs=1e-12)


def test_first_pick_tie_goes_to_lowest_index():
    L = np.diag([0.5, 2.0, 1.0, 2.0])
    sel = greedy_dpp_map(L, 4)
    assert sel.indices == [1, 3, 2, 0]
    assert not sel.stopped_early


def test_gains_match_slogdet_differences():
    rng = np.random.default_rng(1)
    kernels = [_random_psd(rng, 12, 15) for _ in range(4)]
    texts = _random_texts(rng, 15)
    S = similarity_matrix(texts)
    r = quality_weights(rng.uniform(0, 1, 15), 15, theta=0.6)
    kernels.append(r[:, None] * S * r[None, :])
    for L in kernels:
        sel = greedy_dpp_map(L, 6)
        for t, gain in enumerate(sel.gains):
            expected = _logdet(L, sel.indices[: t + 1]) - _logdet(L, sel.indices[:t])
            assert abs(gain - expected) < 1e-9


def test_gains_never_increase():
    rng = np.random.default_rng(2)
    for _ in range(6):
        L = _random_psd(rng, 20, 25)
        sel = greedy_dpp_map(L, 15)
        assert len(sel.indices) == 15
        assert all(b <= a + 1e-12 for a, b in zip(sel.gains[:-1], sel.gains[1:], strict=True))


def test_k_at_least_n_returns_all_in_selection_order():
    rng = np.random.default_rng(3)
    L = _random_psd(rng, 5, 8)
    sel = greedy_dpp_map(L, 9)
    assert sorted(sel.indices) == list(range(5))
    assert sel.indices == greedy_dpp_map(L, 5).indices
    assert not sel.stopped_early
    assert greedy_dpp_map(L, 0) == DPPSelection(indices=[], gains=[], stopped_early=False)


def test_rank_collapse_stops_early_and_logs(caplog):
    # Three pairwise-orthogonal texts (disjoint words), each duplicated: rank 3, so at most 3 picks.
    texts = ["alpha beta", "gamma delta", "epsilon zeta"] * 2
    difficulties = [0.9, 0.6, 0.3, 0.8, 0.5, 0.2]
    with caplog.at_level(logging.INFO, logger="dspy_opro.extensions.hard_diverse"):
        sel = select_hard_diverse(texts, difficulties, 5, theta=0.5)
    assert sel.stopped_early
    assert len(sel.indices) == 3
    assert sorted(i % 3 for i in sel.indices) == [0, 1, 2]
    assert sel.indices == [0, 1, 2]  # the harder copy of each text wins
    assert any(
        rec.levelno == logging.INFO and rec.name == "dspy_opro.extensions.hard_diverse"
        and "rank collapse" in rec.getMessage()
        for rec in caplog.records
    )


def test_greedy_rank_collapse_on_low_rank_kernel():
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
    sel = greedy_dpp_map(X @ X.T, 4)
    assert len(sel.indices) == 2
    assert sel.stopped_early


# --------------------------------------------------------------------------------------------------------------
# select_hard_diverse


def test_exact_duplicates_never_both_picked():
    rng = np.random.default_rng(4)
    for case in range(12):
        base = _random_texts(rng, 8)
        dup_of = rng.integers(0, 8, size=6)
        texts = base + [base[i] for i in dup_of]
        order = rng.permutation(len(texts))
        texts = [texts[i] for i in order]
        difficulties = rng.uniform(0, 1, len(texts))
        theta = float(rng.uniform(0, 0.95))
        featurizer = "hashed" if case % 2 else "tfidf"
        sel = select_hard_diverse(texts, difficulties, 10, theta=theta, featurizer=featurizer)
        chosen = [texts[i] for i in sel.indices]
        assert len(chosen) == len(set(chosen)), (case, theta)


def test_theta_one_is_top_k_by_difficulty_with_index_ties():
    texts = ["same text"] * 3 + ["other words", "more words", "different"]
    difficulties = [0.5, 0.9, 0.5, 0.9, 0.1, 0.5]
    sel = select_hard_diverse(texts, difficulties, 4, theta=1.0)
    assert sel.indices == [1, 3, 0, 2]
    assert not sel.stopped_early
    assert len(sel.gains) == 4
    assert sel.gains[2] == sel.gains[3] == -np.inf  # indices 0 and 2 duplicate the text of index 1
    full = select_hard_diverse(texts, difficulties, 10, theta=1.0)
    assert full.indices == [1, 3, 0, 2, 5, 4]


def test_theta_zero_ignores_difficulty():
    rng = np.random.default_rng(5)
    texts = _random_texts(rng, 15)
    a = select_hard_diverse(texts, rng.uniform(0, 1, 15), 6, theta=0.0)
    b = select_hard_diverse(texts, rng.uniform(0, 1, 15), 6, theta=0.0)
    c = select_hard_diverse(texts, None, 6, theta=0.0)
    assert a.indices == b.indices == c.indices
    assert a.indices == greedy_dpp_map(similarity_matrix(texts), 6).indices


def test_default_theta_prefers_hard_examples():
    texts = [f"topic{i} question" for i in range(6)]
    difficulties = [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    sel = select_hard_diverse(texts, difficulties, 2)
    assert sorted(sel.indices) == [2, 4]


def test_empty_input():
    assert select_hard_diverse([], None, 3) == DPPSelection(indices=[], gains=[], stopped_early=False)
    assert similarity_matrix([]).shape == (0, 0)


# --------------------------------------------------------------------------------------------------------------
# quality_weights


def test_uniform_difficulties_give_unit_weights():
    np.testing.assert_array_equal(quality_weights(None, 5), np.ones(5))
    np.testing.assert_array_equal(quality_weights([0.3] * 4, 4), np.ones(4))


def test_quality_weights_formula():
    d = [0.0, 0.2, 0.4, 0.8]
    r = quality_weights(d, 4, theta=0.7, floor=0.05)
    alpha = 0.7 / (2 * 0.3)
    expected = (np.maximum(d, 0.05) / 0.8) ** alpha
    np.testing.assert_allclose(r, expected, rtol=1e-12)
    assert r[0] > 0
    np.testing.assert_array_equal(quality_weights(d, 4, theta=0.0), np.ones(4))
    np.testing.assert_array_equal(quality_weights([0.8, 0.2, 0.8], 3, theta=1.0), [1.0, 0.0, 1.0])


# --------------------------------------------------------------------------------------------------------------
# similarity_matrix


def _assert_valid_similarity(S: np.ndarray, n: int) -> None:
    assert S.shape == (n, n)
    np.testing.assert_array_equal(np.diag(S), np.ones(n))
    np.testing.assert_array_equal(S, S.T)
    assert np.all(S <= 1.0) and np.all(S >= -1.0)


def test_tfidf_similarity_values():
    texts = ["The cat sat", "the CAT sat!", "dogs bark loudly", ""]
    S = similarity_matrix(texts)
    _assert_valid_similarity(S, 4)
    assert S[0, 1] == pytest.approx(1.0)
    assert S[0, 2] == 0.0
    np.testing.assert_array_equal(S[3], [0.0, 0.0, 0.0, 1.0])  # empty text: only similar to itself


def test_tfidf_matches_reference_computation():
    texts = ["a b b c", "b c d", "a a e", "f"]
    vocab = sorted({w for t in texts for w in t.split()})
    tf = np.array([[t.split().count(w) for w in vocab] for t in texts], dtype=float)
    df = (tf > 0).sum(axis=0)
    X = tf * (np.log((1 + 4) / (1 + df)) + 1)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    expected = X @ X.T
    np.fill_diagonal(expected, 1.0)
    np.testing.assert_allclose(similarity_matrix(texts), expected, atol=1e-12)


def test_hashed_featurizer():
    texts = ["red green blue", "blue green red red", "alpha beta", ""]
    S = similarity_matrix(texts, featurizer="hashed")
    _assert_valid_similarity(S, 4)
    assert S[0, 1] > 0.8
    assert S[3, 0] == 0.0
    assert HASHED_BUCKETS == 4096
    np.testing.assert_array_equal(S, similarity_matrix(texts, featurizer="hashed"))  # stable hash


def test_custom_embedder():
    vectors = np.array([[3.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [-2.0, 0.0, 0.0]])
    calls: list[list[str]] = []

    def embed(batch: list[str]) -> np.ndarray:
        calls.append(batch)
        return vectors

    texts = ["a", "b", "c", "d"]
    S = similarity_matrix(texts, embedder=embed)
    _assert_valid_similarity(S, 4)
    assert calls == [texts]
    assert S[0, 1] == pytest.approx(1 / np.sqrt(2))
    assert S[0, 3] == pytest.approx(-1.0)
    np.testing.assert_array_equal(S[2], [0.0, 0.0, 1.0, 0.0])
    sel = select_hard_diverse(texts, None, 4, embedder=embed)
    assert sel.stopped_early and len(sel.indices) == 3  # rows 0 and 3 are parallel


# --------------------------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize("theta", [-0.1, 1.5, float("nan")])
def test_bad_theta(theta):
    with pytest.raises(ValueError, match=r"theta must be a number in \[0, 1\]"):
        select_hard_diverse(["a", "b"], None, 1, theta=theta)
    with pytest.raises(ValueError, match="theta must be"):
        quality_weights(None, 2, theta=theta)


@pytest.mark.parametrize("floor", [0.0, -0.5, 1.5, float("nan")])
def test_bad_floor(floor):
    with pytest.raises(ValueError, match=r"floor must be a number in \(0, 1\]"):
        select_hard_diverse(["a", "b"], None, 1, floor=floor)
    with pytest.raises(ValueError, match="floor must be"):
        quality_weights(None, 2, floor=floor)


def test_negative_k():
    with pytest.raises(ValueError, match="k must be a non-negative integer"):
        select_hard_diverse(["a", "b"], None, -1)
    with pytest.raises(ValueError, match="k must be a non-negative integer"):
        greedy_dpp_map(np.eye(2), -1)


@pytest.mark.parametrize("bad", [1.2, -0.1, float("nan")])
def test_bad_difficulty(bad):
    with pytest.raises(ValueError, match=r"outside \[0, 1\] or NaN; pass 1 - mean score"):
        select_hard_diverse(["a", "b"], [0.5, bad], 1)
    with pytest.raises(ValueError, match="outside"):
        quality_weights([bad], 1)


def test_length_mismatch():
    with pytest.raises(ValueError, match="pass exactly one difficulty per text"):
        select_hard_diverse(["a", "b", "c"], [0.5, 0.5], 1)
    with pytest.raises(ValueError, match="pass exactly one difficulty per text"):
        quality_weights([0.5], 3)


def test_bad_featurizer():
    with pytest.raises(ValueError, match="featurizer must be one of 'tfidf', 'hashed'"):
        select_hard_diverse(["a"], None, 1, featurizer="bm25")
    with pytest.raises(ValueError, match="featurizer must be one of"):
        similarity_matrix(["a"], featurizer="bm25")


@pytest.mark.parametrize(
    "output",
    [np.ones(3), np.ones((2, 4)), np.ones((3, 0)), np.ones((3, 2, 2))],
)
def test_embedder_wrong_shape(output):
    with pytest.raises(ValueError, match=r"it must return one row per text, i.e. an array of shape \(3, dim\)"):
        similarity_matrix(["a", "b", "c"], embedder=lambda texts: output)


def test_embedder_non_finite():
    with pytest.raises(ValueError, match="finite"):
        similarity_matrix(["a", "b"], embedder=lambda texts: np.array([[1.0, np.nan], [0.0, 1.0]]))


def test_bad_kernel():
    with pytest.raises(ValueError, match="square"):
        greedy_dpp_map(np.ones((2, 3)), 1)
    with pytest.raises(ValueError, match=r"symmetrise it with \(L \+ L.T\) / 2"):
        greedy_dpp_map(np.array([[1.0, 0.5], [0.0, 1.0]]), 1)
    with pytest.raises(ValueError, match="NaN or infinite"):
        greedy_dpp_map(np.array([[1.0, np.nan], [np.nan, 1.0]]), 1)
    with pytest.raises(ValueError, match="eps must be"):
        greedy_dpp_map(np.eye(2), 1, eps=-1.0)


# --------------------------------------------------------------------------------------------------------------
# Relative rank-collapse test


@pytest.mark.parametrize("theta", [0.95, 0.99])
def test_high_theta_tiny_weights_are_not_rank_collapse(theta, caplog):
    # At theta >= ~0.885 an easy example's L_ii = 0.05 ** (theta / (1 - theta)) is below 1e-10 by itself; an
    # absolute eps stopped after the two hard examples although the six texts are distinct.
    texts = [f"topic{i} question" for i in range(6)]
    difficulties = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    r = quality_weights(difficulties, 6, theta=theta)
    assert r[2] ** 2 < 1e-10
    with caplog.at_level(logging.INFO, logger="dspy_opro.extensions.hard_diverse"):
        sel = select_hard_diverse(texts, difficulties, 5, theta=theta)
    assert not sel.stopped_early
    assert len(sel.indices) == 5
    assert len(set(sel.indices)) == 5
    assert sorted(sel.indices[:2]) == [0, 1]
    assert sel.indices == [0, 1, 2, 3, 4]
    assert all(b <= a + 1e-12 for a, b in zip(sel.gains[:-1], sel.gains[1:], strict=True))
    L = r[:, None] * similarity_matrix(texts) * r[None, :]
    for t, gain in enumerate(sel.gains):
        expected = _logdet(L, sel.indices[: t + 1]) - _logdet(L, sel.indices[:t])
        assert gain == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert not any("rank collapse" in rec.getMessage() for rec in caplog.records)


def test_high_theta_duplicates_of_easy_examples_still_collapse(caplog):
    texts = ["alpha beta", "gamma delta", "epsilon zeta", "epsilon zeta", "eta theta", "eta theta"]
    difficulties = [1.0, 0.9, 0.0, 0.1, 0.0, 0.0]
    with caplog.at_level(logging.INFO, logger="dspy_opro.extensions.hard_diverse"):
        sel = select_hard_diverse(texts, difficulties, 6, theta=0.99)
    assert sel.stopped_early
    assert sel.indices == [0, 1, 3, 4]  # the harder copy of "epsilon zeta", the lower index of "eta theta"
    assert any("rank collapse" in rec.getMessage() for rec in caplog.records)


def test_greedy_is_invariant_to_kernel_and_item_scaling():
    rng = np.random.default_rng(6)
    L = _random_psd(rng, 8, 10)
    base = greedy_dpp_map(L, 8)
    assert not base.stopped_early
    for c in (1e-200, 1e-20, 1e20):
        scaled = greedy_dpp_map(c * L, 8)
        assert scaled.indices == base.indices
        assert not scaled.stopped_early
        np.testing.assert_allclose(scaled.gains, np.array(base.gains) + np.log(c), rtol=1e-9, atol=1e-9)
    # Shrinking one item's row and column by a tiny weight changes its rank but must not make it collapse.
    w = np.ones(8)
    w[3] = 1e-12
    sel = greedy_dpp_map(w[:, None] * L * w[None, :], 8)
    assert not sel.stopped_early
    assert sorted(sel.indices) == list(range(8))
    assert sel.indices[-1] == 3


def test_zero_diagonal_item_is_collapsed():
    sel = greedy_dpp_map(np.diag([1.0, 0.0, 2.0]), 3)
    assert sel.indices == [2, 0]
    assert sel.stopped_early
    # eps = 0 still never picks an item with no residual left (its gain would be log 0).
    sel = greedy_dpp_map(np.ones((2, 2)), 2, eps=0.0)
    assert sel.indices == [0]
    assert sel.stopped_early


def test_weights_underflowing_to_zero_count_as_collapsed():
    # theta = 0.999 makes 0.05 ** 999 underflow to 0: the easy examples cannot be told apart any more.
    texts = [f"topic{i} question" for i in range(4)]
    sel = select_hard_diverse(texts, [1.0, 0.0, 1.0, 0.0], 4, theta=0.999)
    assert sel.indices == [0, 2]
    assert sel.stopped_early


def test_exact_duplicates_never_both_picked_at_high_theta():
    rng = np.random.default_rng(7)
    for case in range(40):
        base = _random_texts(rng, 8)
        texts = base + [base[i] for i in rng.integers(0, 8, size=6)]
        texts = [texts[i] for i in rng.permutation(len(texts))]
        difficulties = rng.choice([0.0, 0.02, 0.3, 1.0], size=len(texts))
        theta = [0.9, 0.95, 0.99, 0.9958, 0.996, 0.999][case % 6]
        sel = select_hard_diverse(texts, difficulties, 12, theta=theta, featurizer="hashed" if case % 2 else "tfidf")
        chosen = [texts[i] for i in sel.indices]
        assert len(chosen) == len(set(chosen)), (case, theta)
        assert all(b <= a + 1e-12 * max(1.0, abs(a)) for a, b in zip(sel.gains[:-1], sel.gains[1:], strict=True))


# --------------------------------------------------------------------------------------------------------------
# QuestionFeatures: features once, kernel rows on demand


def _full_matrix_selection(texts, difficulties, k, theta, featurizer="tfidf", embedder=None) -> DPPSelection:
    """The selection as computed before QuestionFeatures: the whole n x n kernel, then greedy MAP."""
    n = len(texts)
    r = quality_weights(difficulties, n, theta=theta)
    S = similarity_matrix(texts, featurizer=featurizer, embedder=embedder)
    return greedy_dpp_map(r[:, None] * S * r[None, :], k)


def test_row_kernel_selections_equal_full_matrix_selections():
    rng = np.random.default_rng(8)
    for case in range(60):
        base = _random_texts(rng, 30)
        texts = base + [base[i] for i in rng.integers(0, 30, size=10)] + [""]
        difficulties = rng.choice([0.0, 0.1, 0.5, 0.9, 1.0], size=len(texts))
        theta = [0.0, 0.3, 0.7, 0.9, 0.99][case % 5]
        featurizer = "hashed" if case % 2 else "tfidf"
        k = int(rng.integers(1, 12))
        new = select_hard_diverse(texts, difficulties, k, theta=theta, featurizer=featurizer)
        old = _full_matrix_selection(texts, difficulties, k, theta, featurizer)
        assert new.indices == old.indices, case
        assert new.stopped_early == old.stopped_early
        np.testing.assert_allclose(new.gains, old.gains, rtol=1e-9, atol=1e-9)


def test_row_kernel_with_embedder_equals_full_matrix():
    rng = np.random.default_rng(9)
    vectors = rng.normal(size=(25, 6))
    vectors[4] = 0.0
    vectors[7] = 2 * vectors[3]
    texts = [f"t{i}" for i in range(25)]
    difficulties = rng.uniform(0, 1, 25)
    new = select_hard_diverse(texts, difficulties, 10, embedder=lambda batch: vectors)
    old = _full_matrix_selection(texts, difficulties, 10, 0.7, embedder=lambda batch: vectors)
    assert new.indices == old.indices
    np.testing.assert_allclose(new.gains, old.gains, rtol=1e-9, atol=1e-9)


def test_similarity_rows_match_the_matrix_and_are_exactly_symmetric():
    rng = np.random.default_rng(10)
    texts = _random_texts(rng, 40) + ["", "apple apple"]
    for featurizer in ("tfidf", "hashed"):
        features = QuestionFeatures.build(texts, featurizer=featurizer)
        rows = np.array([features.similarity_rows(tuple(range(42))).row(j) for j in range(42)])
        np.testing.assert_array_equal(rows, rows.T)
        np.testing.assert_allclose(rows, similarity_matrix(texts, featurizer=featurizer), rtol=0, atol=1e-12)


def test_subset_selection_equals_selection_on_the_subset_texts():
    rng = np.random.default_rng(11)
    texts = _random_texts(rng, 50)
    features = QuestionFeatures.build(texts)
    for case in range(20):
        subset = sorted(rng.choice(50, size=int(rng.integers(5, 50)), replace=False).tolist())
        difficulties = rng.uniform(0, 1, len(subset)) if case % 3 else None
        got = features.select(difficulties, 4, subset=subset, theta=0.6)
        expected = select_hard_diverse([texts[i] for i in subset], difficulties, 4, theta=0.6)
        assert got.indices == expected.indices, case
        np.testing.assert_allclose(got.gains, expected.gains, rtol=1e-12, atol=1e-12)


def test_features_are_built_once_and_reused_across_steps():
    calls: list[int] = []
    vectors = np.random.default_rng(12).normal(size=(20, 4))

    def embed(batch: list[str]) -> np.ndarray:
        calls.append(len(batch))
        return vectors

    features = QuestionFeatures.build([f"q{i}" for i in range(20)], embedder=embed)
    first = features.select(None, 3, subset=list(range(20)))
    for _ in range(5):
        assert features.select(None, 3, subset=list(range(20))) == first
    features.select(None, 3, subset=list(range(2, 20)))
    assert calls == [20]  # embedded once for the whole compile
    cached = features.similarity_rows(tuple(range(2, 20)))
    assert features.similarity_rows(tuple(range(2, 20))) is cached  # the same subset reuses its weighted features


def test_memory_grows_with_n_times_k_not_n_squared():
    import tracemalloc

    rng = np.random.default_rng(13)
    texts = _random_texts(rng, 3000)
    features = QuestionFeatures.build(texts)
    difficulties = rng.uniform(0, 1, 3000)
    tracemalloc.start()
    try:
        features.select(difficulties, 3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * 1024**2  # the n x n matrix alone would be 3000 * 3000 * 8 bytes = 72 MB


def test_bad_subset():
    features = QuestionFeatures.build(["a", "b", "c"])
    with pytest.raises(ValueError, match=r"subset must hold distinct example indices in \[0, 3\)"):
        features.select(None, 1, subset=[0, 3])
    with pytest.raises(ValueError, match="subset must hold distinct"):
        features.select(None, 1, subset=[1, 1])
    with pytest.raises(ValueError, match="pass exactly one difficulty per text"):
        features.select([0.5, 0.5], 1, subset=[0])
