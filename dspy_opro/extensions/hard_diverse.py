"""Hard-and-diverse exemplar selection: greedy MAP inference of a quality-weighted determinantal point process.

OPRO shows the optimizer model ``k`` training problems at every step. Drawing them uniformly wastes the few
slots the meta-prompt has. This module picks them so that they are both *hard* and *diverse*:

* **Hard.** The optimizer model learns most from problems the current instructions fail: a problem every
  scored instruction already solves says nothing about what to change. The caller therefore passes a
  difficulty ``d_i = 1 - mean score of example i`` over the instructions scored so far (or ``None`` before any
  instruction is scored, which makes every example equally hard).
* **Diverse.** Three near-duplicate failures teach one lesson, not three. Problems whose input texts are alike
  should not crowd out problems that fail for other reasons.

Both wishes meet in a determinantal point process (DPP) with the kernel ``L = diag(r) S diag(r)``:
``S`` is the cosine similarity of the examples' input texts (TF-IDF by default, a hashed bag of words, or a
user embedder), and ``r`` is a quality weight, ``r_i = (max(d_i, floor) / max_j max(d_j, floor)) ** alpha`` with
``alpha = theta / (2 (1 - theta))``. The probability of a subset ``Y`` is proportional to ``det(L_Y)``, which is
the squared volume spanned by the chosen examples' feature vectors scaled by their quality: it grows with
difficulty and shrinks as the chosen examples become alike, dropping to zero for exact duplicates. ``theta``
trades the two: ``theta = 0`` (``alpha = 0``) ignores difficulty and maximises diversity only, ``theta = 1``
(``alpha = inf``) is exactly top-``k`` by difficulty, and the default ``0.7`` leans to hard problems while still
refusing duplicates. The ``floor`` (default ``0.05``) keeps solved problems from getting zero weight, so they
can still fill the slots once the hard ones run out.

Finding the most probable subset of size ``k`` is NP-hard, so :func:`greedy_dpp_map` adds, one at a time, the
example with the largest log-determinant gain ``log det(L_{Y+i}) - log det(L_Y)``. The gains come from the
incremental Cholesky update of Chen, Zhang and Zhou (2018, "Fast greedy MAP inference for determinantal point
process to improve recommendation diversity"): the gain of item ``i`` is ``log d_i^2``, where ``d_i^2`` is the
squared residual of item ``i`` after projecting out the picks so far, and each pick updates every residual in
``O(k)``. Because residuals only shrink, the gains never increase along the picks. Item ``i`` counts as *collapsed*
-- numerically in the span of the picked ones, for example a duplicate of a pick -- when its residual falls below
``eps`` times its own diagonal entry, ``d_i^2 < eps * L_ii``. An item whose ``L_ii`` is zero (or subnormal) is
collapsed from the start; with the default floor that happens to the easiest examples only when ``theta`` exceeds
about 0.9958 and their weight underflows. The test is relative on purpose: at a high ``theta`` an easy example's
weight ``L_ii`` is itself tiny (``0.05 ** 19 ~ 2e-25`` at ``theta = 0.95``), which says nothing about collapse.
Collapsed items are never picked; only when every remaining item is collapsed does the selection stop early,
returning fewer than ``k`` indices and logging the fact at INFO.

Cost: the selection never builds the ``n x n`` matrix ``S``. :class:`QuestionFeatures` tokenises (or embeds) the
examples once; each selection then computes only the kernel rows of its picks, each a sparse product in
``O(nnz)`` (``O(n * dim)`` with an embedder), and the greedy updates cost ``O(n * k)`` per pick: time
``O(k * (nnz + n * k))`` and memory ``O(nnz + n * k)`` per selection. :func:`similarity_matrix` still builds the
full matrix for whoever wants it. No language-model calls are made.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dspy_opro.checks import is_bool, require_number
from dspy_opro.extensions.similarity import (
    FEATURIZERS,
    HASHED_BUCKETS,
    TextFeatures,
    check_featurizer,
    similarity_matrix,
)
from dspy_opro.record.state import RunState
from dspy_opro.task.data import RunData

__all__ = [
    "FEATURIZERS",
    "HASHED_BUCKETS",
    "DPPSelection",
    "HardDiverseExemplars",
    "QuestionFeatures",
    "greedy_dpp_map",
    "quality_weights",
    "select_hard_diverse",
    "similarity_matrix",
]

logger = logging.getLogger(__name__)

# Relative tolerance under which two gains count as tied (so the lower index wins despite rounding noise).
_TIE_RTOL = 1e-12


@dataclass(frozen=True)
class DPPSelection:
    """The outcome of a greedy DPP selection.

    Attributes:
        indices: Positions into the given texts (rows of ``L``), in pick order.
        gains: The log-determinant gain (natural log) of each pick, aligned with ``indices``.
        stopped_early: Whether rank collapse ended the selection before ``min(k, n)`` picks.
    """

    indices: list[int]
    gains: list[float]
    stopped_early: bool


# --------------------------------------------------------------------------------------------------------------
# Validation


def _check_theta(theta: float) -> None:
    require_number("theta", theta, low=0, high=1, meaning=" (0 = diversity only, 1 = top-k by difficulty)")


def _check_floor(floor: float) -> None:
    require_number("floor", floor, low=0, high=1, low_open=True, meaning=" (for example 0.05)")


def _check_k(k: int) -> None:
    # Not require_int: callers match this wording, which says what k means.
    if is_bool(k) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be a non-negative integer (the number of exemplars to pick), got {k!r}")


def _difficulty_array(difficulties: Sequence[float] | np.ndarray | None, n: int) -> np.ndarray:
    """Validate difficulties against ``n`` and return them as floats (all ones when ``None``)."""
    if is_bool(n) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative integer (the number of examples), got {n!r}")
    if difficulties is None:
        return np.ones(n, dtype=float)
    try:
        d = np.asarray(list(difficulties), dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"difficulties must be a sequence of numbers in [0, 1] (1 - mean score): {exc}") from exc
    if d.ndim != 1 or d.shape[0] != n:
        raise ValueError(
            f"got {d.shape[0] if d.ndim == 1 else d.shape} difficulties for {n} examples; "
            "pass exactly one difficulty per text (or None for uniform difficulties)"
        )
    bad = np.flatnonzero(np.isnan(d) | (d < 0.0) | (d > 1.0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"difficulty {d[i]!r} at position {i} is outside [0, 1] or NaN; pass 1 - mean score in [0, 1] "
            "(or None before any instruction is scored)"
        )
    return d


# Quality


def quality_weights(
    difficulties: Sequence[float] | np.ndarray | None, n: int, *, theta: float = 0.7, floor: float = 0.05
) -> np.ndarray:
    """The DPP quality weights ``r_i = (max(d_i, floor) / max_j max(d_j, floor)) ** alpha``.

    ``alpha = theta / (2 (1 - theta))``, so that ``L_ii = r_i ** 2`` grows as ``(d_i / d_max) ** (theta / (1 -
    theta))``. ``theta = 0`` gives all ones; ``theta = 1`` (``alpha = inf``) gives the limit: 1 for the hardest
    examples and 0 for the rest.

    Args:
        difficulties: ``1 - mean score`` per example, each in ``[0, 1]``; ``None`` means uniform (all 1.0).
        n: The number of examples.
        theta: Hardness-versus-diversity trade-off in ``[0, 1]``.
        floor: Lower bound in ``(0, 1]`` applied to difficulties so easy examples keep a little weight.

    Returns:
        An array of ``n`` weights in ``[0, 1]`` whose maximum is 1 (when ``n > 0``).

    Raises:
        ValueError: On theta outside ``[0, 1]``, floor outside ``(0, 1]``, a length mismatch, or a
            difficulty outside ``[0, 1]`` or NaN.
    """
    _check_theta(theta)
    _check_floor(floor)
    d = _difficulty_array(difficulties, n)
    if n == 0:
        return np.zeros(0, dtype=float)
    clipped = np.maximum(d, floor)
    rel = clipped / clipped.max()
    if theta == 0.0:
        return np.ones(n, dtype=float)
    if theta == 1.0:
        return (rel == 1.0).astype(float)
    alpha = theta / (2.0 * (1.0 - theta))
    return rel**alpha


# --------------------------------------------------------------------------------------------------------------
# Greedy MAP


def _argmax_lowest(values: np.ndarray, available: np.ndarray) -> int:
    """Index of the largest available value; near-ties (relative 1e-12) go to the lowest index."""
    masked = np.where(available, values, -np.inf)
    best = masked.max()
    tol = _TIE_RTOL * max(abs(best), np.finfo(float).tiny)
    return int(np.flatnonzero(masked >= best - tol)[0])


def greedy_dpp_map(L: np.ndarray, k: int, *, eps: float = 1e-10) -> DPPSelection:
    """Greedy MAP inference for a DPP with kernel ``L`` (Chen, Zhang and Zhou, 2018).

    Each step adds the item with the largest gain ``log det(L_{Y+i}) - log det(L_Y) = log d_i^2``, where the
    squared residuals ``d_i^2`` start at ``L_ii`` and are updated by an incremental Cholesky factorisation in
    ``O(n * |Y|)`` per step. Ties go to the lowest index, so the first pick is the first largest diagonal entry.

    An item is *collapsed* when its residual is below ``eps`` relative to its own diagonal entry,
    ``d_i^2 < eps * L_ii``, when the residual is not positive, or when ``L_ii`` is zero (or below the smallest
    normal float, too small to measure a residual against): it lies numerically in the span of the picks, e.g. it
    duplicates one. Collapsed items
    are skipped, and since residuals only shrink they stay collapsed. The selection stops early only when every
    remaining item is collapsed. Because the test is relative, scaling ``L`` by a positive constant, or an item's
    row and column by a positive weight, does not by itself make items collapse.

    Args:
        L: A symmetric positive semi-definite ``(n, n)`` kernel.
        k: The number of items wanted; ``k >= n`` selects (up to) all items, in selection order.
        eps: Relative rank-collapse threshold: item ``i`` is collapsed when ``d_i^2 < eps * L_ii``.

    Returns:
        The picks, their log-det gains (non-increasing) and whether rank collapse stopped the selection
        before ``min(k, n)`` picks (logged at INFO).

    Raises:
        ValueError: On a non-square, non-finite or asymmetric ``L``, a negative ``k`` or a bad ``eps``.
    """
    _check_k(k)
    _check_eps(eps)
    L = np.asarray(L, dtype=float)
    if L.ndim != 2 or L.shape[0] != L.shape[1]:
        raise ValueError(f"L must be a square (n, n) matrix, got shape {L.shape}")
    if not np.all(np.isfinite(L)):
        raise ValueError("L contains NaN or infinite entries; build it from finite similarities and weights")
    if not np.allclose(L, L.T, rtol=1e-8, atol=1e-10):
        raise ValueError("L must be symmetric; symmetrise it with (L + L.T) / 2")
    return _greedy_on_rows(np.diag(L).copy(), lambda j: L[j, :], k, eps)


def _check_eps(eps: float) -> None:
    require_number("eps", eps, low=0, high=math.inf, meaning=" (for example 1e-10)")


def _greedy_on_rows(diag: np.ndarray, row: Callable[[int], np.ndarray], k: int, eps: float) -> DPPSelection:
    """:func:`greedy_dpp_map` given the kernel's diagonal and a function returning its row ``j``.

    Only the rows of the picks are ever asked for, so memory grows with ``n * k``, not ``n * n``.
    """
    n = diag.shape[0]
    target = min(int(k), n)
    indices: list[int] = []
    gains: list[float] = []
    if target == 0:
        return DPPSelection(indices=indices, gains=gains, stopped_early=False)

    threshold = eps * diag  # item i is collapsed once its residual falls below eps * L_ii
    # A zero (or subnormal) diagonal entry leaves no precision to tell a residual from rounding noise.
    unmeasurable = diag < np.finfo(float).tiny
    cis = np.zeros((target, n), dtype=float)  # rows of the incremental Cholesky factor, one per pick
    d2 = diag.copy()  # squared residual of every item given the picks so far
    available = np.ones(n, dtype=bool)
    while True:
        candidates = available & ~unmeasurable & (d2 >= threshold) & (d2 > 0.0)
        if not candidates.any():
            remaining = available & ~unmeasurable
            best_ratio = float(np.max(d2[remaining] / diag[remaining])) if remaining.any() else 0.0
            logger.info(
                "DPP selection stopped early after %d of %d picks: rank collapse (every remaining item's "
                "residual is below eps %.3g times its diagonal entry, best ratio %.3g; the remaining items lie in "
                "the span of the picked ones, e.g. duplicates)",
                len(indices),
                target,
                eps,
                best_ratio,
            )
            return DPPSelection(indices=indices, gains=gains, stopped_early=True)
        j = _argmax_lowest(d2, candidates)
        m = len(indices)
        indices.append(j)
        gains.append(math.log(d2[j]))
        available[j] = False
        if m + 1 == target:
            return DPPSelection(indices=indices, gains=gains, stopped_early=False)
        e = (row(j) - cis[:m, j] @ cis[:m, :]) / math.sqrt(d2[j])
        cis[m, :] = e
        d2 = d2 - e * e


def _sequence_gains(
    diag: np.ndarray, row: Callable[[int], np.ndarray], order: Sequence[int], eps: float
) -> list[float]:
    """Log-det gains of adding ``order`` one by one under ``K``; ``-inf`` for a collapsed pick (a duplicate).

    ``K`` is given by its diagonal and a function returning its row ``j``. A pick is collapsed, as in
    :func:`greedy_dpp_map`, when its residual is below ``eps`` times its diagonal entry.
    """
    m_total = len(order)
    cis = np.zeros((m_total, diag.shape[0]), dtype=float)
    d2 = diag.copy()
    gains: list[float] = []
    for m, j in enumerate(order):
        if diag[j] <= 0.0 or d2[j] < eps * diag[j]:
            gains.append(-math.inf)
            continue
        gains.append(math.log(d2[j]))
        e = (row(j) - cis[:m, j] @ cis[:m, :]) / math.sqrt(d2[j])
        cis[m, :] = e
        d2 = d2 - e * e
    return gains


def select_hard_diverse(
    texts: Sequence[str],
    difficulties: Sequence[float] | None,
    k: int,
    *,
    theta: float = 0.7,
    floor: float = 0.05,
    featurizer: str = "tfidf",
    embedder: Callable[[list[str]], np.ndarray] | None = None,
) -> DPPSelection:
    """Pick ``k`` exemplars that are hard for the current instructions and unlike each other.

    Runs :func:`greedy_dpp_map` on ``L = diag(r) S diag(r)`` from :func:`quality_weights` and the similarity
    of :func:`similarity_matrix`, computing only the rows of ``L`` it picks (through :class:`QuestionFeatures`).
    With ``theta = 1`` the result is exactly top-``k`` by difficulty (ties by lower index); its ``gains`` are
    then the log-det gains of that order under ``S`` alone (``-inf`` for a pick that duplicates an earlier one)
    and ``stopped_early`` is False.

    Args:
        texts: The candidate examples' input texts.
        difficulties: ``1 - mean score`` per example in ``[0, 1]``, or ``None`` before any instruction is scored.
        k: How many exemplars to pick; ``k >= len(texts)`` orders all of them.
        theta: Hardness-versus-diversity trade-off in ``[0, 1]`` (0 = diversity only, 1 = top-k by difficulty).
        floor: Difficulty floor in ``(0, 1]`` so easy examples keep a little weight.
        featurizer: ``"tfidf"`` or ``"hashed"``; ignored when ``embedder`` is given.
        embedder: Optional callable mapping texts to an ``(n, dim)`` embedding array.

    Returns:
        The selection; it holds fewer than ``min(k, n)`` indices only when ``stopped_early`` is True.

    Raises:
        ValueError: On any invalid argument (see :func:`quality_weights`, :func:`similarity_matrix`).
    """
    _check_k(k)
    _check_theta(theta)
    _check_floor(floor)
    check_featurizer(featurizer)
    texts = list(texts)
    _difficulty_array(difficulties, len(texts))  # a bad difficulty fails before any embedder call
    features = QuestionFeatures.build(texts, featurizer=featurizer, embedder=embedder)
    return features.select(difficulties, k, theta=theta, floor=floor)


class QuestionFeatures(TextFeatures):
    """The examples' features (:class:`~dspy_opro.extensions.similarity.TextFeatures`) and the hard-and-diverse pick.

    Each :meth:`select` weighs the features of the examples it may choose from and runs the greedy DPP MAP asking
    only for the kernel rows of its picks: memory grows with ``n * k``, never with ``n * n``.

    Build it with :meth:`build`.
    """

    def select(
        self,
        difficulties: Sequence[float] | None,
        k: int,
        *,
        subset: Sequence[int] | None = None,
        theta: float = 0.7,
        floor: float = 0.05,
    ) -> DPPSelection:
        """Pick ``k`` hard and diverse examples, as :func:`select_hard_diverse` does for the subset's texts.

        Args:
            difficulties: ``1 - mean score`` per example of ``subset`` (aligned with it), or ``None``.
            k: How many examples to pick.
            subset: The example indices to choose from, in order; default all ``n``.
            theta: Hardness-versus-diversity trade-off in ``[0, 1]``.
            floor: Difficulty floor in ``(0, 1]``.

        Returns:
            The selection; its ``indices`` are positions into ``subset`` (into the texts when ``subset`` is None).

        Raises:
            ValueError: On any invalid argument, or a subset index outside ``range(n)`` or repeated.
        """
        _check_k(k)
        _check_theta(theta)
        _check_floor(floor)
        chosen = tuple(range(self.n)) if subset is None else tuple(int(i) for i in subset)
        if any(not 0 <= i < self.n for i in chosen) or len(set(chosen)) != len(chosen):
            raise ValueError(f"subset must hold distinct example indices in [0, {self.n}), got {list(chosen)!r}")
        m = len(chosen)
        d = _difficulty_array(difficulties, m)
        similarity = self.similarity_rows(chosen)
        if theta == 1.0:
            order = sorted(range(m), key=lambda i: (-d[i], i))[: min(int(k), m)]
            gains = _sequence_gains(np.ones(m), similarity.row, order, 1e-10)
            return DPPSelection(indices=order, gains=gains, stopped_early=False)
        r = quality_weights(d, m, theta=theta, floor=floor)
        return _greedy_on_rows(r * r, lambda j: r[j] * similarity.row(j) * r, k, 1e-10)


class HardDiverseExemplars:
    """The exemplar policy of ``exemplar_selection="hard_diverse"``: the problems the instructions fail, spread out.

    A problem's difficulty is one minus its mean score over the scored candidates (every problem is equally hard at
    step 0); the questions' features are built once per compile.

    Args:
        theta: 0 picks for diversity alone, 1 for difficulty alone.
    """

    def __init__(self, *, theta: float):
        _check_theta(theta)
        self.theta = theta
        self._features: QuestionFeatures | None = None

    def draw(self, step: int, k: int, eligible: list[int], state: RunState, data: RunData) -> list[int]:
        difficulties = None
        scored = [c for c in state.scored() if c.scores]
        if step > 0 and scored:
            difficulties = []
            for i in eligible:
                values = [score for c in scored if (score := c.scores[i]) is not None]
                difficulties.append(1.0 - sum(values) / len(values) if values else 1.0)
        if self._features is None:
            self._features = QuestionFeatures.build([data.question(i) for i in range(len(data.trainset))])
        picked = self._features.select(difficulties, k, subset=eligible, theta=self.theta)
        return sorted(eligible[j] for j in picked.indices)
