"""Hard-and-diverse exemplar selection: greedy MAP inference of a quality-weighted determinantal point process.

OPRO shows the optimizer model ``k`` training problems at every step. Drawing them uniformly wastes the few
slots the meta-prompt has. This module picks them so that they are both *hard* and *diverse*:

* **Hard.** The optimizer model learns most from problems the current instructions fail: a problem every
  scored instruction already solves says nothing about what to change. The caller therefore passes a
  difficulty ``d_i = 1 - mean score of example i`` over the instructions scored so far (or ``None`` before any
  instruction is scored, which makes every example equally hard).
* **Diverse.** Three near-duplicate failures teach one lesson, not three. Problems whose input texts are alike
  should not crowd out problems that fail for other reasons.

Both wishes meet in a determinantal point process (DPP) with the kernel ``L = diag(r) S diag(r)``: ``S`` is the
cosine similarity of the examples' input texts -- as TF-IDF over lowercase ``\\w+`` tokens (raw counts times the
smooth idf ``log((1 + n) / (1 + df)) + 1``), a bag of words hashed with CRC-32 into ``2**12`` buckets, or a user
embedder's vectors; a text without features is similar only to itself -- and ``r`` is a quality weight,
``r_i = (max(d_i, floor) / max_j max(d_j, floor)) ** alpha`` with ``alpha = theta / (2 (1 - theta))``. The
probability of a subset ``Y`` is proportional to ``det(L_Y)``, the squared volume spanned by the chosen examples'
feature vectors scaled by their quality: it grows with difficulty and shrinks as the chosen examples become alike,
dropping to zero for exact duplicates. ``theta = 0`` ignores difficulty and maximises diversity only, ``theta = 1``
(``alpha = inf``) is exactly top-``k`` by difficulty, and the default ``0.7`` leans to hard problems while still
refusing duplicates. The ``floor`` (default ``0.05``) keeps solved problems from getting zero weight, so they can
still fill the slots once the hard ones run out.

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

Cost: :class:`QuestionFeatures` tokenises (or embeds) the examples once; each selection then computes only the
kernel rows of its picks, each a sparse product in ``O(nnz)`` (``O(n * dim)`` with an embedder), never the
``n x n`` matrix: time ``O(k * (nnz + n * k))`` and memory ``O(nnz + n * k)``. No language-model calls are made.
"""

from __future__ import annotations

import logging
import math
import re
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dspy_opro.checks import is_bool, require_choice, require_number
from dspy_opro.state import RunState
from dspy_opro.task.data import RunData

logger = logging.getLogger(__name__)

FEATURIZERS = ("tfidf", "hashed")
HASHED_BUCKETS = 2**12
_TOKEN_RE = re.compile(r"\w+")
_NOT_A_FEATURIZER = " (or pass embedder=... for your own embeddings)"


@dataclass(frozen=True)
class DPPSelection:
    """A greedy DPP selection: positions into the texts (rows of ``L``) in pick order, the log-determinant gain
    (natural log) of each pick, and whether rank collapse ended it before ``min(k, n)`` picks."""

    indices: list[int]
    gains: list[float]
    stopped_early: bool


def _check_weighting(theta: float, floor: float) -> None:
    require_number("theta", theta, low=0, high=1, meaning=" (0 = diversity only, 1 = top-k by difficulty)")
    require_number("floor", floor, low=0, high=1, low_open=True, meaning=" (for example 0.05)")


def _difficulty_array(difficulties: Sequence[float] | np.ndarray | None, n: int) -> np.ndarray:
    """Check the difficulties against ``n``; return them as floats (all ones for None)."""
    if is_bool(n) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative integer (the number of examples), got {n!r}")
    if difficulties is None:
        return np.ones(n, dtype=float)
    try:
        d = np.asarray(list(difficulties), dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"difficulties must be a sequence of numbers in [0, 1] (1 - mean score): {exc}") from exc
    if d.ndim != 1 or d.shape[0] != n:
        raise ValueError(f"got {d.shape[0] if d.ndim == 1 else d.shape} difficulties for {n} examples; "
                         "pass exactly one difficulty per text (or None for uniform difficulties)")
    bad = np.flatnonzero(np.isnan(d) | (d < 0.0) | (d > 1.0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"difficulty {d[i]!r} at position {i} is outside [0, 1] or NaN; pass 1 - mean score in "
                         "[0, 1] (or None before any instruction is scored)")
    return d


def _check_k(k: int) -> None:
    if is_bool(k) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be a non-negative integer (the number of exemplars to pick), got {k!r}")


def quality_weights(
    difficulties: Sequence[float] | np.ndarray | None, n: int, *, theta: float = 0.7, floor: float = 0.05
) -> np.ndarray:
    """The DPP quality weights ``r_i = (max(d_i, floor) / max_j max(d_j, floor)) ** alpha``, in ``[0, 1]``.

    ``alpha = theta / (2 (1 - theta))``, so that ``L_ii = r_i ** 2`` grows as ``(d_i / d_max) ** (theta / (1 -
    theta))``. ``theta = 0`` gives all ones; ``theta = 1`` (``alpha = inf``) gives the limit: 1 for the hardest
    examples and 0 for the rest. ``difficulties`` are ``1 - mean score`` per example (None: uniform); ``floor`` in
    ``(0, 1]`` keeps easy examples a little weight. ``ValueError`` on any argument out of range or a length mismatch.
    """
    _check_weighting(theta, floor)
    d = _difficulty_array(difficulties, n)
    if n == 0 or theta == 0.0:
        return np.ones(n, dtype=float)
    clipped = np.maximum(d, floor)
    rel = clipped / clipped.max()
    if theta == 1.0:
        return (rel == 1.0).astype(float)
    return rel ** (theta / (2.0 * (1.0 - theta)))


def greedy_dpp_map(L: np.ndarray, k: int, *, eps: float = 1e-10) -> DPPSelection:
    """Greedy MAP inference for a DPP with the symmetric positive semi-definite ``(n, n)`` kernel ``L`` (Chen,
    Zhang and Zhou, 2018): up to ``k`` picks (all items, in selection order, for ``k >= n``).

    Each step adds the item with the largest gain ``log d_i^2``, ties to the lowest index, so the first pick is the
    first largest diagonal entry. An item is collapsed when ``d_i^2 < eps * L_ii``, when its residual is not
    positive, or when ``L_ii`` is below the smallest normal float (too small to measure a residual against); since
    residuals only shrink, it stays collapsed. Because the test is relative, scaling ``L`` by a positive constant,
    or an item's row and column by a positive weight, does not by itself make items collapse. ``ValueError`` on a
    non-square, non-finite or asymmetric ``L``, a negative ``k`` or a bad ``eps``.
    """
    _check_k(k)
    require_number("eps", eps, low=0, high=math.inf, meaning=" (for example 1e-10)")
    L = np.asarray(L, dtype=float)
    if L.ndim != 2 or L.shape[0] != L.shape[1]:
        raise ValueError(f"L must be a square (n, n) matrix, got shape {L.shape}")
    if not np.all(np.isfinite(L)):
        raise ValueError("L contains NaN or infinite entries; build it from finite similarities and weights")
    if not np.allclose(L, L.T, rtol=1e-8, atol=1e-10):
        raise ValueError("L must be symmetric; symmetrise it with (L + L.T) / 2")
    return _greedy_on_rows(np.diag(L).copy(), lambda j: L[j, :], k, eps)


def _greedy_on_rows(diag: np.ndarray, row: Callable[[int], np.ndarray], k: int, eps: float,
                    order: Sequence[int] | None = None) -> DPPSelection:
    """:func:`greedy_dpp_map` given the kernel's diagonal and its rows, asking only for the rows of the picks
    (memory ``n * k``). With ``order``, the picks are those, and a collapsed one gains ``-inf`` (a duplicate)."""
    n = diag.shape[0]
    target = min(int(k), n) if order is None else len(order)
    indices: list[int] = []
    gains: list[float] = []
    threshold = eps * diag  # item i is collapsed once its residual falls below eps * L_ii
    # A zero (or subnormal) diagonal entry leaves no precision to tell a residual from rounding noise.
    unmeasurable = diag < np.finfo(float).tiny
    cis = np.zeros((target, n), dtype=float)  # rows of the incremental Cholesky factor, one per pick
    d2 = diag.copy()  # squared residual of every item given the picks so far
    available = np.ones(n, dtype=bool)
    for m in range(target):
        candidates = available & ~unmeasurable & (d2 >= threshold) & (d2 > 0.0)
        if order is not None:
            j = order[m]
        elif candidates.any():
            masked = np.where(candidates, d2, -np.inf)  # near-ties (relative 1e-12) go to the lowest index
            best = masked.max()
            j = int(np.flatnonzero(masked >= best - 1e-12 * max(abs(best), np.finfo(float).tiny))[0])
        else:
            remaining = available & ~unmeasurable
            best_ratio = float(np.max(d2[remaining] / diag[remaining])) if remaining.any() else 0.0
            logger.info("DPP selection stopped early after %d of %d picks: rank collapse (every remaining item's "
                        "residual is below eps %.3g times its diagonal entry, best ratio %.3g; the remaining items "
                        "lie in the span of the picked ones, e.g. duplicates)", m, target, eps, best_ratio)
            return DPPSelection(indices=indices, gains=gains, stopped_early=True)
        indices.append(j)
        available[j] = False
        if not candidates[j]:
            gains.append(-math.inf)
            continue
        gains.append(math.log(d2[j]))
        if m + 1 < target:
            e = (row(j) - cis[:m, j] @ cis[:m, :]) / math.sqrt(d2[j])
            cis[m, :] = e
            d2 = d2 - e * e
    return DPPSelection(indices=indices, gains=gains, stopped_early=False)


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
    """Pick ``k`` of the ``texts`` that are hard for the current instructions and unlike each other.

    Runs :func:`greedy_dpp_map` on ``L = diag(r) S diag(r)`` from :func:`quality_weights` and the similarity
    of :func:`similarity_matrix`, computing only the rows of ``L`` it picks (through :class:`QuestionFeatures`).
    The selection holds fewer than ``min(k, n)`` indices only when ``stopped_early`` is True. With ``theta = 1``
    the result is exactly top-``k`` by difficulty (ties by lower index); its ``gains`` are then the log-det gains
    of that order under ``S`` alone (``-inf`` for a pick that duplicates an earlier one) and ``stopped_early`` is
    False. ``difficulties`` (``1 - mean score`` per text, None before any instruction is scored), ``theta`` and
    ``floor`` are those of :func:`quality_weights`; ``featurizer`` and ``embedder`` those of
    :meth:`QuestionFeatures.build`. ``ValueError`` on any invalid argument, before any embedder call.
    """
    _check_k(k)
    _check_weighting(theta, floor)
    require_choice("featurizer", featurizer, FEATURIZERS, meaning=_NOT_A_FEATURIZER)
    texts = list(texts)
    _difficulty_array(difficulties, len(texts))  # a bad difficulty fails before any embedder call
    features = QuestionFeatures.build(texts, featurizer=featurizer, embedder=embedder)
    return features.select(difficulties, k, theta=theta, floor=floor)


def similarity_matrix(texts: Sequence[str], *, featurizer: str = "tfidf",
                      embedder: Callable[[list[str]], np.ndarray] | None = None) -> np.ndarray:
    """Cosine similarity of the texts (see :meth:`QuestionFeatures.build`): ``(n, n)``, symmetric, in ``[-1, 1]``,
    with a unit diagonal; a text without features (an empty one) has a zero row and column but for its 1."""
    rows = QuestionFeatures.build(texts, featurizer=featurizer, embedder=embedder)
    cosine = rows.similarity_rows(tuple(range(rows.n)))
    S = np.array([cosine.row(j) for j in range(rows.n)], dtype=float).reshape(rows.n, rows.n)
    return (S + S.T) / 2.0


@dataclass(frozen=True)
class CosineRows:
    """The cosine similarity of a subset of examples, one row at a time.

    Sparse features are stored as entries ``(row, col, val)`` sorted by row then column, with rows L2-normalised;
    dense features (an embedder's) as a normalised matrix. Row ``j`` is the dot product of example ``j`` with
    every example, clipped to ``[-1, 1]``, with a 1 on the diagonal. Dot products sum the shared features in column
    order, so ``row(i)[j] == row(j)[i]`` exactly for sparse features.
    """

    n: int
    rows: np.ndarray | None = None
    cols: np.ndarray | None = None
    vals: np.ndarray | None = None
    width: int = 0
    dense: np.ndarray | None = None

    def row(self, j: int) -> np.ndarray:
        if self.dense is not None:
            out = self.dense @ self.dense[j]
        else:
            assert self.rows is not None and self.cols is not None and self.vals is not None  # sparse rows
            lo, hi = np.searchsorted(self.rows, [j, j + 1])
            pick = np.zeros(self.width, dtype=float)
            pick[self.cols[lo:hi]] = self.vals[lo:hi]
            out = np.bincount(self.rows, weights=self.vals * pick[self.cols], minlength=self.n)
            out = out.astype(float, copy=False)  # integers when no example has a feature
        np.clip(out, -1.0, 1.0, out=out)
        out[j] = 1.0
        return out


class QuestionFeatures:
    """The examples' features, computed once per compile, and the hard-and-diverse pick among any subset of them.

    Tokenising (or embedding) every training question is the per-example work; this object does it once (build it
    with :meth:`build`). :meth:`similarity_rows` then weighs the features of a subset of the examples (TF-IDF's idf
    is computed over that subset) and returns their similarity as rows on demand; the weighted features of the last
    subset are kept, so consecutive calls on the same examples reuse them. Each :meth:`select` runs the greedy DPP
    MAP asking only for the kernel rows of its picks: memory grows with ``n * k``, never with ``n * n``.
    """

    def __init__(self, *, n: int, featurizer: str, rows: np.ndarray | None = None, cols: np.ndarray | None = None,
                 counts: np.ndarray | None = None, width: int = 0, embeddings: np.ndarray | None = None) -> None:
        self.n, self.featurizer = n, featurizer
        self._rows, self._cols, self._counts, self._width = rows, cols, counts, width
        self._embeddings = embeddings
        self._cached: tuple[tuple[int, ...], CosineRows] | None = None

    @classmethod
    def build(cls, texts: Sequence[str], *, featurizer: str = "tfidf",
              embedder: Callable[[list[str]], np.ndarray] | None = None) -> QuestionFeatures:
        """Tokenise the texts once: ``featurizer`` ``"tfidf"`` or ``"hashed"``, ignored when ``embedder`` (a callable
        mapping the list of texts to an ``(n, dim)`` array, called once, here) is given. ``ValueError`` on an
        unknown featurizer, or an embedder returning the wrong shape or non-finite values."""
        require_choice("featurizer", featurizer, FEATURIZERS, meaning=_NOT_A_FEATURIZER)
        texts = [str(t) for t in texts]
        n = len(texts)
        if embedder is not None:
            try:
                E = np.asarray(embedder(list(texts)), dtype=float) if n else np.zeros((0, 1), dtype=float)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"embedder must return a numeric array of shape (len(texts), dim): {exc}") from exc
            if E.ndim != 2 or E.shape[0] != n or E.shape[1] < 1:
                raise ValueError(f"embedder returned shape {E.shape} for {n} texts; it must return one row per text, "
                                 f"i.e. an array of shape ({n}, dim) with dim >= 1")
            if not np.all(np.isfinite(E)):
                raise ValueError("embedder returned NaN or infinite values; make it return finite embeddings")
            return cls(n=n, featurizer="embedder", embeddings=E)
        tokens = [_TOKEN_RE.findall(t.lower()) for t in texts]
        if featurizer == "hashed":
            width = HASHED_BUCKETS
            per_text = [Counter(zlib.crc32(w.encode("utf-8")) % HASHED_BUCKETS for w in ws) for ws in tokens]
        else:
            token_counts = [Counter(ws) for ws in tokens]
            vocab = {w: j for j, w in enumerate(sorted(set().union(*token_counts)))} if token_counts else {}
            width = len(vocab)
            per_text = [Counter({vocab[w]: c for w, c in tc.items()}) for tc in token_counts]
        entries = [(i, col, float(c[col])) for i, c in enumerate(per_text) for col in sorted(c)]
        return cls(n=n, featurizer=featurizer, rows=np.asarray([e[0] for e in entries], dtype=np.int64),
                   cols=np.asarray([e[1] for e in entries], dtype=np.int64),
                   counts=np.asarray([e[2] for e in entries], dtype=float), width=width)

    def similarity_rows(self, subset: tuple[int, ...]) -> CosineRows:
        """The cosine similarity of the examples in ``subset`` (positions into it), computed row by row."""
        if self._cached is not None and self._cached[0] == subset:
            return self._cached[1]
        m = len(subset)
        if self._embeddings is not None:
            sub = self._embeddings[list(subset)]
            norms = np.linalg.norm(sub, axis=1)
            similarity = CosineRows(n=m, dense=sub / np.where(norms == 0.0, 1.0, norms)[:, None])
        else:
            assert self._rows is not None and self._cols is not None and self._counts is not None  # token features
            local = np.full(self.n, -1, dtype=np.int64)
            local[list(subset)] = np.arange(m)
            keep = local[self._rows] >= 0
            rows, cols, vals = local[self._rows[keep]], self._cols[keep], self._counts[keep]
            order = np.lexsort((cols, rows))  # rows in subset order, columns ascending within a row
            rows, cols, vals = rows[order], cols[order], vals[order]
            if self.featurizer == "tfidf" and vals.size:
                df = np.bincount(cols, minlength=self._width).astype(float)  # one entry per (example, token)
                vals = vals * (np.log((1.0 + m) / (1.0 + df)) + 1.0)[cols]
            norms = np.sqrt(np.bincount(rows, weights=vals * vals, minlength=m)) if rows.size else np.zeros(m)
            vals = vals / norms[rows] if rows.size else vals
            similarity = CosineRows(n=m, rows=rows, cols=cols, vals=vals, width=self._width)
        self._cached = (subset, similarity)
        return similarity

    def select(self, difficulties: Sequence[float] | None, k: int, *, subset: Sequence[int] | None = None,
               theta: float = 0.7, floor: float = 0.05) -> DPPSelection:
        """Pick ``k`` hard and diverse examples of ``subset`` (default all ``n``), as :func:`select_hard_diverse`
        does for the subset's texts; ``difficulties`` are aligned with ``subset``, and so are the ``indices``."""
        _check_k(k)
        _check_weighting(theta, floor)
        chosen = tuple(range(self.n)) if subset is None else tuple(int(i) for i in subset)
        if any(not 0 <= i < self.n for i in chosen) or len(set(chosen)) != len(chosen):
            raise ValueError(f"subset must hold distinct example indices in [0, {self.n}), got {list(chosen)!r}")
        m = len(chosen)
        d = _difficulty_array(difficulties, m)
        similarity = self.similarity_rows(chosen)
        if theta == 1.0:
            order = sorted(range(m), key=lambda i: (-d[i], i))[: min(int(k), m)]
            return _greedy_on_rows(np.ones(m), similarity.row, len(order), 1e-10, order=order)
        r = quality_weights(d, m, theta=theta, floor=floor)
        return _greedy_on_rows(r * r, lambda j: r[j] * similarity.row(j) * r, k, 1e-10)


class HardDiverseExemplars:
    """The exemplar policy of ``exemplar_selection="hard_diverse"``: the problems the instructions fail, spread out.

    A problem's difficulty is one minus its mean score over the scored candidates (every problem is equally hard at
    step 0); the questions' features are built once per compile. ``theta`` is checked by ``HardDiverse``.
    """

    def __init__(self, *, theta: float):
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
