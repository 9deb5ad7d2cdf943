"""Racing's statistics: the shared example order, the looks, and two exact group-sequential tests.

Racing (:mod:`dspy_opro.extensions.racing`) scores candidate instructions block by block in one order of the
training examples and stops the ones that are clearly worse. This module holds the statistics alone, as pure
functions and a small stateful test; it knows nothing of candidates or of the run.

**The threshold test** (:func:`threshold_table`, binary scores, the common case). Full evaluation ranks
candidates by their training means. A candidate with ``T`` right answers among the ``n`` training examples, visited
in a uniformly random order, has ``X_k`` right answers among its first ``k``: a hypergeometric walk, drawing without
replacement from an urn of ``T`` ones and ``n - T`` zeros. To test ``T >= t`` (its training total reaches the bar
``t``) a dynamic programme over the walk at ``T = t`` gives, at each look, the largest count whose probability of
being reached without an earlier rejection fits the level spent so far; the candidate is stopped when its count is
at or below it. **Guarantee:** for *any* fixed training set and any candidate whose training total is at least
``t``, the probability over the order that it is stopped is at most ``alpha`` (exact: no approximation, no i.i.d.
assumption; a larger ``T`` only makes a stop less likely). The table then replaces each bar's critical count by
the smallest of any higher bar's, so the counts never decrease when the bar rises and a race may raise its bar
between looks: every look's count is then at most the one of the candidate's own total ``T``, so a candidate at
least as good as every bar used is stopped with probability at most ``alpha``.

**Order and schedule.** :func:`example_order` is a permutation of ``range(n)`` fixed by the seed, the same for
every candidate, so every comparison is paired: both instructions ran the same first examples. A
:class:`RacingSchedule` lists the *looks*, the numbers of examples after which a decision is taken: by default a
first look after ``max(5, ceil(n / 20))`` examples, then one every ``ceil(n / 20)`` examples, and none at ``n``
(an instruction that reaches ``n`` is fully scored).

**The sign test** (:class:`SequentialSignTest`, any scores in ``[0, 1]``). On example ``i`` let
``D_i = s_a(i) - s_b(i)`` in ``[-1, 1]`` (scores in ``[0, 1]``). Each difference
is turned into a sign ``T_i`` in ``{-1, 0, +1}`` with ``E[T_i | D_i] = D_i``: ``T_i = sign(D_i)`` with probability
``|D_i|`` and ``0`` otherwise (for binary scores ``T_i = D_i``, without randomness). Among the non-zero signs the
share of ``-1`` is at most ``1/2`` exactly when ``E[s_a] >= E[s_b]``. :class:`SequentialSignTest` is an exact
one-sided sign test of that share, run over the looks: given the numbers of non-zero signs at the looks, the
count of ``-1`` signs is a binomial random walk, and a dynamic programme computes, at share ``1/2``, the exact
probability of crossing each look's critical value without having crossed an earlier one. The critical value at
look ``j`` is the smallest count whose crossing probability stays within the level spent so far,
``alpha * (k_j / k_last) ** power`` (``k_j`` the examples at look ``j``, ``k_last`` at the last planned look):
``power = 1`` spends the level linearly, ``power < 1`` spends more of it early.

**Guarantee.** If the examples are independent draws under which ``E[s_a] >= E[s_b]``, the probability that the
test rejects at any look is at most ``alpha``: the rejection region is an upper set in the counts, so share
``1/2`` is the worst case, where the dynamic programme gives the exact crossing probability, which the spending
keeps within ``alpha``. Stopping before the last planned look (the other instruction stopped) only removes
chances to reject. No normal approximation, no variance estimate, valid for any number of ties.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_ALPHA = 0.05
MIN_FIRST_LOOK = 5
LOOKS_PER_RUN = 20  # one look every n / 20 examples


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer (the number of training examples), got {n!r}")


def check_alpha(alpha: float) -> None:
    """Raise a clear error unless ``alpha`` is a number in ``(0, 1)``.

    Args:
        alpha: The racing level, the bound on the probability of stopping a candidate at least as good as the best.

    Raises:
        ValueError: When ``alpha`` is not a number strictly between 0 and 1.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or math.isnan(alpha) or not 0.0 < alpha < 1.0:
        raise ValueError(f"Racing(alpha=...) must be a number in (0, 1), for example 0.05, got {alpha!r}")


def example_order(n: int, *, seed: int) -> list[int]:
    """The seeded order in which every race visits the training examples.

    Args:
        n: The number of training examples.
        seed: The run's seed; the same seed gives the same order.

    Returns:
        A permutation of ``range(n)``.
    """
    _check_n(n)
    return [int(i) for i in np.random.default_rng([int(seed), 0x0A11CE]).permutation(n)]


@dataclass(frozen=True)
class RacingSchedule:
    """When a race takes decisions: after ``looks[0]``, ``looks[1]``, ... examples of its order.

    Attributes:
        n: The number of training examples.
        looks: Strictly increasing example counts, each in ``[1, n)``; empty when ``n`` is too small to race.
    """

    n: int
    looks: tuple[int, ...]

    @classmethod
    def build(cls, n: int, *, min_examples: int | None = None, block_size: int | None = None) -> RacingSchedule:
        """The schedule with a first look after ``min_examples`` examples, then one every ``block_size``.

        Args:
            n: The number of training examples.
            min_examples: Examples before the first decision; default ``max(5, ceil(n / 20))``.
            block_size: Examples between two looks; default ``ceil(n / 20)``.

        Returns:
            The schedule; its looks stop before ``n`` (a race that reaches ``n`` is complete).

        Raises:
            ValueError: On a non-positive ``n``, ``min_examples`` or ``block_size``.
        """
        _check_n(n)
        block = math.ceil(n / LOOKS_PER_RUN) if block_size is None else block_size
        first = max(MIN_FIRST_LOOK, math.ceil(n / LOOKS_PER_RUN)) if min_examples is None else min_examples
        for name, value in (("min_examples", first), ("block_size", block)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        return cls(n=n, looks=tuple(range(first, n, block)))


def binomial_half_pmf(m: int) -> np.ndarray:
    """The probabilities of ``0..m`` successes in ``m`` fair coin flips."""
    x = np.arange(m + 1)
    log_pmf = math.lgamma(m + 1) - np.array([math.lgamma(v + 1) + math.lgamma(m - v + 1) for v in x])
    return np.exp(log_pmf - m * math.log(2.0))


@dataclass(frozen=True)
class Look:
    """One decision of a test: the counts at a look and the critical value they were tested against.

    Attributes:
        examples: Examples scored at this look (``k_j``).
        worse: Examples whose sign was ``-1`` (the candidate lost).
        better: Examples whose sign was ``+1``.
        critical: The count of ``-1`` signs at or above which the candidate is stopped (``None``: none possible).
        spent: Cumulative level spent up to and including this look (exact, at share ``1/2``).
        stop: Whether this look stopped the candidate.
        against: The id of the instruction compared with, where the caller names one.
    """

    examples: int
    worse: int
    better: int
    critical: int | None
    spent: float
    stop: bool
    against: int | None = None


class SequentialSignTest:
    """An exact group-sequential one-sided sign test with power-family level spending over planned looks.

    Feed it the looks in order with :meth:`look`; it returns whether to reject. The critical values depend only on
    the numbers of non-zero signs seen, never on their direction, which keeps the level exact; so the test of ``a``
    against ``b`` and the test of ``b`` against ``a`` share their critical values.

    Args:
        alpha: The overall level in ``(0, 1)``.
        looks: The planned example counts (from :class:`RacingSchedule`).
        power: The spending exponent: ``alpha * (k_j / k_last) ** power`` is spent by look ``j`` (1: linear).
    """

    def __init__(self, *, alpha: float, looks: Sequence[int], power: float = 1.0) -> None:
        check_alpha(alpha)
        if isinstance(power, bool) or not isinstance(power, (int, float)) or not power > 0.0:
            raise ValueError(f"power must be a positive number (1: linear spending), got {power!r}")
        self.alpha = float(alpha)
        self.looks = tuple(looks)
        self.power = float(power)
        self._mass = np.ones(1)  # P(count of -1 signs = x and not rejected yet), at share 1/2
        self._nonzero = 0
        self._spent = 0.0
        self._index = 0

    def critical(self, *, examples: int, nonzero: int) -> tuple[int | None, float]:
        """Take the next planned look's critical value for ``nonzero`` non-zero signs so far.

        Args:
            examples: The example count of this look; must be the next planned one.
            nonzero: The cumulative number of non-zero signs.

        Returns:
            The critical count of ``-1`` signs (``None``: no rejection possible) and the level spent so far.

        Raises:
            ValueError: On a look out of the planned order or a count that shrinks.
        """
        if self._index >= len(self.looks) or examples != self.looks[self._index]:
            raise ValueError(f"look at {examples} examples is not the next planned look of {self.looks}")
        if nonzero < self._nonzero or nonzero > examples:
            raise ValueError(f"{nonzero} non-zero signs at {examples} examples are not cumulative")
        self._mass = np.convolve(self._mass, binomial_half_pmf(nonzero - self._nonzero))
        self._nonzero = nonzero
        budget = self.alpha * (examples / self.looks[-1]) ** self.power - self._spent
        # tails[c] = P(count >= c); the smallest c whose tail fits the budget is the critical value.
        tails = np.cumsum(self._mass[::-1])[::-1]
        fitting = np.flatnonzero(tails <= budget)
        critical = int(fitting[0]) if fitting.size else None
        if critical is not None and critical == 0:
            critical = None  # only reachable when no mass is left; a count of 0 never stops a candidate
        if critical is not None:
            self._spent += float(tails[critical])
            self._mass[critical:] = 0.0
        self._index += 1
        return critical, self._spent

    def look(self, *, examples: int, worse: int, better: int) -> Look:
        """Take the next planned look.

        Args:
            examples: The example count of this look; must be the next planned one.
            worse: The cumulative number of ``-1`` signs.
            better: The cumulative number of ``+1`` signs.

        Returns:
            The look, with ``stop`` True when the candidate is significantly worse.

        Raises:
            ValueError: On a look out of the planned order or counts that shrink.
        """
        if worse < 0 or better < 0 or worse + better < self._nonzero or worse + better > examples:
            raise ValueError(f"counts worse={worse}, better={better} at {examples} examples are not cumulative")
        critical, spent = self.critical(examples=examples, nonzero=worse + better)
        stop = critical is not None and worse >= critical
        return Look(examples=examples, worse=worse, better=better, critical=critical, spent=spent, stop=stop)


MAX_THRESHOLD_N = 500  # the threshold test's table is (n + 1) x (n + 1); larger training sets use the sign test


@functools.lru_cache(maxsize=16)
def threshold_table(n: int, looks: tuple[int, ...], alpha: float, power: float = 1.0) -> np.ndarray:
    """The threshold test's critical counts for every bar, made monotone in the bar.

    Row ``t`` holds, per look, the most right answers at which a candidate is stopped when the bar is ``t``
    (``-1``: no stop possible): the exact critical count at total ``t``, replaced by the smallest one of any higher
    bar, so that the counts never decrease with the bar and a race may raise its bar between looks.

    Args:
        n: The number of training examples.
        looks: The planned example counts.
        alpha: The level in ``(0, 1)``.
        power: The spending exponent: ``alpha * (k_j / k_last) ** power`` is spent by look ``j`` (1: linear).

    Returns:
        An integer array of shape ``(n + 1, len(looks))``.
    """
    check_alpha(alpha)
    bars = np.arange(n + 1)[:, None]
    ones = np.arange(n + 1)[None, :]
    mass = np.zeros((n + 1, n + 1))
    mass[:, 0] = 1.0  # mass[t, x] = P(x right answers so far and not stopped yet), at training total t
    spent = np.zeros(n + 1)
    table = np.full((n + 1, len(looks)), -1, dtype=int)
    drawn = 0
    for j, look in enumerate(looks):
        while drawn < look:  # after `drawn` draws only the counts 0..drawn have mass
            width = drawn + 2
            moved = mass[:, : width - 1] * np.clip((bars - ones[:, : width - 1]) / (n - drawn), 0.0, 1.0)
            mass[:, : width - 1] -= moved
            mass[:, 1:width] += moved
            drawn += 1
        budget = alpha * (look / looks[-1]) ** power - spent
        cumulative = np.cumsum(mass, axis=1)
        fits = cumulative <= budget[:, None] + 1e-15
        # The largest x that fits (cumulative is non-decreasing in x, so the fitting ones are a prefix).
        critical = fits.sum(axis=1) - 1
        for t in np.flatnonzero(critical >= 0):
            spent[t] += cumulative[t, critical[t]]
            mass[t, : critical[t] + 1] = 0.0
        table[:, j] = critical
    # Monotone in the bar: the smallest critical count over this bar and every higher one.
    return np.minimum.accumulate(table[::-1], axis=0)[::-1].copy()


def threshold_level(n: int, bar: int, looks: tuple[int, ...], alpha: float, power: float = 1.0) -> float:
    """The exact probability that a candidate with training total ``bar`` is stopped by :func:`threshold_table`'s
    critical counts for that bar (at most ``alpha``)."""
    critical = threshold_table(n, looks, alpha, power)[bar]
    mass = np.zeros(bar + 1)
    mass[0] = 1.0
    ones = np.arange(bar + 1)
    stopped, drawn = 0.0, 0
    for look, c in zip(looks, critical, strict=True):
        while drawn < look:
            moved = mass * np.clip((bar - ones) / (n - drawn), 0.0, 1.0)
            mass = mass - moved
            mass[1:] += moved[:-1]
            drawn += 1
        if c >= 0:
            stopped += float(mass[: c + 1].sum())
            mass[: c + 1] = 0.0
    return stopped


__all__ = [
    "DEFAULT_ALPHA",
    "Look",
    "RacingSchedule",
    "SequentialSignTest",
    "binomial_half_pmf",
    "check_alpha",
    "example_order",
    "threshold_level",
    "threshold_table",
]
