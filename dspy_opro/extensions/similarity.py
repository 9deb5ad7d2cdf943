"""Text similarity for exemplar selection: featurize questions once, then cosine-similarity rows on demand.

The hard-and-diverse selection of :mod:`dspy_opro.extensions.hard_diverse` needs to know how alike two training
questions are. This module answers that, and nothing else: it turns texts into features (TF-IDF over lowercase ``\\w+``
tokens, a bag of words hashed with CRC-32 into ``2**12`` buckets, or a user embedder's vectors) and gives their cosine
similarity, either as a full ``n x n`` matrix (:func:`similarity_matrix`) or one row at a time for a subset of the
examples (:meth:`TextFeatures.similarity_rows`), so that a selection that picks ``k`` of ``n`` examples never builds
more than ``k`` rows. No language-model calls are made.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from dspy_opro.checks import require_choice

__all__ = ["FEATURIZERS", "HASHED_BUCKETS", "CosineRows", "TextFeatures", "check_featurizer", "similarity_matrix"]

FEATURIZERS = ("tfidf", "hashed")
HASHED_BUCKETS = 2**12

_Features = TypeVar("_Features", bound="TextFeatures")

_TOKEN_RE = re.compile(r"\w+")
# Vocabulary columns densified at a time when building the TF-IDF similarity (bounds memory to n * block).
_COLUMN_BLOCK = 4096


def check_featurizer(featurizer: str) -> None:
    """Raise ``ValueError`` unless ``featurizer`` is one of :data:`FEATURIZERS`."""
    require_choice("featurizer", featurizer, FEATURIZERS, meaning=" (or pass embedder=... for your own embeddings)")


def _tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text.lower())


def _finalize_similarity(S: np.ndarray, zero_rows: np.ndarray) -> np.ndarray:
    """Symmetrise, clip to [-1, 1], isolate all-zero rows and set the diagonal to exactly 1."""
    S = (S + S.T) / 2.0
    np.clip(S, -1.0, 1.0, out=S)
    S[zero_rows, :] = 0.0
    S[:, zero_rows] = 0.0
    np.fill_diagonal(S, 1.0)
    return S


def _cosine_from_entries(n: int, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, width: int) -> np.ndarray:
    """Cosine similarity of the rows of a sparse ``n x width`` matrix given by unique ``(row, col, val)`` entries."""
    norms = np.sqrt(np.bincount(rows, weights=vals * vals, minlength=n)) if rows.size else np.zeros(n)
    zero_rows = norms == 0.0
    S = np.zeros((n, n), dtype=float)
    if rows.size:
        vals = vals / norms[rows]
        order = np.argsort(cols, kind="stable")
        rows, cols, vals = rows[order], cols[order], vals[order]
        for start in range(0, width, _COLUMN_BLOCK):
            stop = min(start + _COLUMN_BLOCK, width)
            lo, hi = np.searchsorted(cols, [start, stop])
            if lo == hi:
                continue
            block = np.zeros((n, stop - start), dtype=float)
            block[rows[lo:hi], cols[lo:hi] - start] = vals[lo:hi]
            S += block @ block.T
    return _finalize_similarity(S, zero_rows)


def _tfidf_similarity(texts: Sequence[str]) -> np.ndarray:
    n = len(texts)
    counts = [Counter(_tokens(t)) for t in texts]
    vocab = {w: j for j, w in enumerate(sorted(set().union(*counts)))} if counts else {}
    df = np.zeros(len(vocab), dtype=float)
    rows: list[int] = []
    cols: list[int] = []
    tf: list[float] = []
    for i, c in enumerate(counts):
        for w, cnt in c.items():
            j = vocab[w]
            df[j] += 1.0
            rows.append(i)
            cols.append(j)
            tf.append(float(cnt))
    idf = np.log((1.0 + n) / (1.0 + df)) + 1.0
    col_arr = np.asarray(cols, dtype=np.int64)
    vals = np.asarray(tf, dtype=float) * idf[col_arr] if col_arr.size else np.zeros(0)
    return _cosine_from_entries(n, np.asarray(rows, dtype=np.int64), col_arr, vals, len(vocab))


def _hashed_bucket(token: str) -> int:
    return zlib.crc32(token.encode("utf-8")) % HASHED_BUCKETS


def _hashed_similarity(texts: Sequence[str]) -> np.ndarray:
    n = len(texts)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i, t in enumerate(texts):
        buckets = Counter(_hashed_bucket(w) for w in _tokens(t))
        for b, cnt in buckets.items():
            rows.append(i)
            cols.append(b)
            vals.append(float(cnt))
    return _cosine_from_entries(
        n,
        np.asarray(rows, dtype=np.int64),
        np.asarray(cols, dtype=np.int64),
        np.asarray(vals, dtype=float),
        HASHED_BUCKETS,
    )


def _embeddings(texts: Sequence[str], embedder: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    """The embedder's ``(n, dim)`` array for the texts, checked."""
    n = len(texts)
    try:
        E = np.asarray(embedder(list(texts)), dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"embedder must return a numeric array of shape (len(texts), dim): {exc}") from exc
    if E.ndim != 2 or E.shape[0] != n or E.shape[1] < 1:
        raise ValueError(
            f"embedder returned shape {E.shape} for {n} texts; it must return one row per text, "
            f"i.e. an array of shape ({n}, dim) with dim >= 1"
        )
    if not np.all(np.isfinite(E)):
        raise ValueError("embedder returned NaN or infinite values; make it return finite embeddings")
    return E


def _embedder_similarity(texts: Sequence[str], embedder: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    n = len(texts)
    if n == 0:
        return np.zeros((0, 0), dtype=float)
    E = _embeddings(texts, embedder)
    norms = np.linalg.norm(E, axis=1)
    zero_rows = norms == 0.0
    En = E / np.where(zero_rows, 1.0, norms)[:, None]
    return _finalize_similarity(En @ En.T, zero_rows)


def similarity_matrix(
    texts: Sequence[str],
    *,
    featurizer: str = "tfidf",
    embedder: Callable[[list[str]], np.ndarray] | None = None,
) -> np.ndarray:
    """Cosine similarity of the texts, symmetric, in ``[-1, 1]`` and with a unit diagonal.

    Args:
        texts: The examples' input texts.
        featurizer: ``"tfidf"`` (lowercase ``\\w+`` tokens, raw term counts times the smooth idf
            ``log((1 + n) / (1 + df)) + 1``) or ``"hashed"`` (a bag of words hashed with CRC-32 into
            ``2**12`` buckets). Ignored when ``embedder`` is given.
        embedder: Optional callable mapping the list of texts to an ``(n, dim)`` array; its rows are
            L2-normalised here.

    Returns:
        An ``(n, n)`` float array. A text without features (for example an empty one) is similar only to
        itself: its row and column are zero except for the 1 on the diagonal.

    Raises:
        ValueError: On an unknown featurizer, or an embedder returning the wrong shape or non-finite values.
    """
    check_featurizer(featurizer)
    texts = [str(t) for t in texts]
    if embedder is not None:
        return _embedder_similarity(texts, embedder)
    if featurizer == "hashed":
        return _hashed_similarity(texts)
    return _tfidf_similarity(texts)


@dataclass(frozen=True)
class CosineRows:
    """The cosine similarity of a subset of examples, one row at a time.

    Sparse features are stored as entries ``(row, col, val)`` sorted by row then column, with rows L2-normalised;
    dense features (an embedder's) as a normalised matrix. Row ``j`` is the dot product of example ``j`` with
    every example, clipped to ``[-1, 1]``, with a 1 on the diagonal; an example without features is similar only to
    itself. Dot products sum the shared features in column order, so ``row(i)[j] == row(j)[i]`` exactly for
    sparse features.
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
        np.clip(out, -1.0, 1.0, out=out)
        out[j] = 1.0
        return out


class TextFeatures:
    """The examples' features, computed once per compile; the cosine similarity of any subset, row by row.

    Tokenising (or embedding) every training question is the per-example work; this object does it once.
    :meth:`similarity_rows` then weighs the features of a subset of the examples (TF-IDF's idf is computed over
    that subset, as :func:`similarity_matrix` computes it over its texts) and returns their similarity as rows on
    demand. The weighted features of the last subset are kept, so consecutive calls on the same examples reuse
    them.

    Build it with :meth:`build`.
    """

    def __init__(
        self,
        *,
        n: int,
        featurizer: str,
        rows: np.ndarray | None = None,
        cols: np.ndarray | None = None,
        counts: np.ndarray | None = None,
        width: int = 0,
        embeddings: np.ndarray | None = None,
    ) -> None:
        self.n = n
        self.featurizer = featurizer
        self._rows, self._cols, self._counts, self._width = rows, cols, counts, width
        self._embeddings = embeddings
        self._cached: tuple[tuple[int, ...], CosineRows] | None = None

    @classmethod
    def build(
        cls: type[_Features],
        texts: Sequence[str],
        *,
        featurizer: str = "tfidf",
        embedder: Callable[[list[str]], np.ndarray] | None = None,
    ) -> _Features:
        """Tokenise (or embed) the texts once.

        Args:
            texts: Every example's input text, in training-set order.
            featurizer: ``"tfidf"`` or ``"hashed"`` (see :func:`similarity_matrix`); ignored with ``embedder``.
            embedder: Optional callable mapping the list of texts to an ``(n, dim)`` array; called once, here.

        Returns:
            The features.

        Raises:
            ValueError: On an unknown featurizer, or an embedder returning the wrong shape or non-finite values.
        """
        check_featurizer(featurizer)
        texts = [str(t) for t in texts]
        n = len(texts)
        if embedder is not None:
            embeddings = _embeddings(texts, embedder) if n else np.zeros((0, 1), dtype=float)
            return cls(n=n, featurizer="embedder", embeddings=embeddings)
        rows: list[int] = []
        cols: list[int] = []
        counts: list[float] = []
        if featurizer == "hashed":
            width = HASHED_BUCKETS
            per_text = [Counter(_hashed_bucket(w) for w in _tokens(t)) for t in texts]
        else:
            token_counts = [Counter(_tokens(t)) for t in texts]
            vocab = {w: j for j, w in enumerate(sorted(set().union(*token_counts)))} if token_counts else {}
            width = len(vocab)
            per_text = [Counter({vocab[w]: c for w, c in tc.items()}) for tc in token_counts]
        for i, c in enumerate(per_text):
            for col in sorted(c):
                rows.append(i)
                cols.append(col)
                counts.append(float(c[col]))
        return cls(
            n=n,
            featurizer=featurizer,
            rows=np.asarray(rows, dtype=np.int64),
            cols=np.asarray(cols, dtype=np.int64),
            counts=np.asarray(counts, dtype=float),
            width=width,
        )

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
