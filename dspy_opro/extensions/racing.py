"""Racing: stop scoring a candidate instruction once it is clearly worse than the current best.

OPRO scores every proposal on the whole training set, although most of a step's proposals score well below the
best. Racing scores a new candidate block by block, in one seeded order of the training examples shared by all
candidates, and stops it as soon as a one-sided paired test on the examples scored so far says, at level
``alpha``, that it is worse than the current best. This module holds the decision logic only, as pure functions
and a small stateful :class:`Race` per candidate; it makes no LM call and knows nothing of the run loop.

**Order and schedule.** :func:`example_order` is a permutation of ``range(n)`` fixed by the seed, the same for
every candidate, so every race compares the candidate with the best on the same first examples. A
:class:`RacingSchedule` lists the *looks*: the numbers of examples after which a decision is taken. The default is
a first look after ``max(10, ceil(n / 10))`` examples, then one every ``ceil(n / 10)`` examples, and none at ``n``
(a candidate that reaches ``n`` is fully scored). No decision is ever taken before the first look.

**The test.** On example ``i`` let ``D_i = s_cand(i) - s_best(i)`` in ``[-1, 1]`` (scores in ``[0, 1]``). Each
difference is turned into a sign ``T_i`` in ``{-1, 0, +1}`` with ``E[T_i | D_i] = D_i``: ``T_i = sign(D_i)`` with
probability ``|D_i|`` and ``0`` otherwise. For binary scores (the common case) ``D_i`` is already in
``{-1, 0, 1}`` and ``T_i = D_i`` without any randomness; fractional differences use a uniform number drawn once per
example from ``(seed, stream)``, so the decisions are deterministic. Then ``E[T] = E[D]``, and among the non-zero
signs the share of ``-1`` is ``q = P(T = -1) / P(T != 0)``, which is at most ``1/2`` exactly when
``E[s_cand] >= E[s_best]``. The test is an exact *sign test* of ``q <= 1/2`` against ``q > 1/2``, run as a
group-sequential test over the looks: given the numbers ``m_1 <= m_2 <= ...`` of non-zero signs at the looks, the
count of ``-1`` signs is a binomial random walk, and :class:`SequentialSignTest` computes by dynamic programming,
at ``q = 1/2``, the exact probability of crossing each look's critical value without having crossed an earlier
one. The critical value at look ``j`` is the smallest count whose crossing probability stays within the alpha
spent so far, ``alpha * k_j / k_last`` (``k_j`` the examples at look ``j``, ``k_last`` those at the last look:
linear spending). A tie never counts against a candidate, and ties cost no power: they only leave ``m`` smaller.

**Guarantee.** If the training examples are independent draws from a distribution under which the candidate's
expected score is at least the best's (``E[s_cand] >= E[s_best]``, the best's scores taken as given), the
probability that the race stops the candidate at any of its looks is at most ``alpha``. Proof sketch: given the
non-zero pattern, the signs are i.i.d. with ``P(-1) = q <= 1/2``; the rejection region is an upper set in the
counts, so ``q = 1/2`` is the worst case, and there the dynamic programme gives the exact crossing probability,
which the spending keeps at or below ``alpha``. No normal approximation, no variance estimate, valid for any
scores in ``[0, 1]`` and any number of ties. On a fixed training set shuffled once (sampling without replacement)
the same bound is checked by simulation in ``tests/test_racing.py``. The guarantee is per race; over many
candidates the expected number of wrongly stopped ones is at most ``alpha`` times the number of candidates at
least as good as the best.

A stopped candidate keeps its partial mean over the examples it ran (``"raced out after k of n"``); only fully
scored candidates can be returned. Results may arrive in any order (from any number of threads): a race buffers
them and decides at a look only once every example up to that look is in, so the decisions depend on the scores
alone, never on the arrival order.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dspy_opro.record.state import Candidate, RaceLook, RaceRecord
from dspy_opro.scoring.scorer import PlanDecision

logger = logging.getLogger(__name__)

DEFAULT_ALPHA = 0.05
MIN_FIRST_LOOK = 10

Action = Literal["continue", "stop", "complete"]


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
    """The seeded order in which every candidate's race visits the training examples.

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
            min_examples: Examples before the first decision; default ``max(10, ceil(n / 10))``.
            block_size: Examples between two looks; default ``ceil(n / 10)``.

        Returns:
            The schedule; its looks stop before ``n`` (a race that reaches ``n`` is complete).

        Raises:
            ValueError: On a non-positive ``n``, ``min_examples`` or ``block_size``.
        """
        _check_n(n)
        block = math.ceil(n / 10) if block_size is None else block_size
        first = max(MIN_FIRST_LOOK, math.ceil(n / 10)) if min_examples is None else min_examples
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
    """One decision of a race: the counts at a look and the critical value they were tested against.

    Attributes:
        examples: Examples scored at this look (``k_j``).
        worse: Examples whose sign was ``-1`` (the candidate lost to the best).
        better: Examples whose sign was ``+1``.
        critical: The count of ``-1`` signs at or above which the candidate is stopped (``None``: none possible).
        spent: Cumulative alpha spent up to and including this look (exact, at ``q = 1/2``).
        stop: Whether this look stopped the candidate.
    """

    examples: int
    worse: int
    better: int
    critical: int | None
    spent: float
    stop: bool


class SequentialSignTest:
    """An exact group-sequential one-sided sign test with linear alpha spending over planned looks.

    Feed it the looks in order with :meth:`look`; it returns whether to stop. The critical values depend only on
    the numbers of non-zero signs seen, never on their direction, which keeps the level exact.

    Args:
        alpha: The overall level in ``(0, 1)``.
        looks: The planned example counts (from :class:`RacingSchedule`).
    """

    def __init__(self, *, alpha: float, looks: Sequence[int]) -> None:
        check_alpha(alpha)
        self.alpha = float(alpha)
        self.looks = tuple(looks)
        self._mass = np.ones(1)  # P(count of -1 signs = x and not stopped yet), at q = 1/2
        self._nonzero = 0
        self._spent = 0.0
        self._index = 0

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
        if self._index >= len(self.looks) or examples != self.looks[self._index]:
            raise ValueError(f"look at {examples} examples is not the next planned look of {self.looks}")
        nonzero = worse + better
        if nonzero < self._nonzero or worse < 0 or better < 0 or nonzero > examples:
            raise ValueError(f"counts worse={worse}, better={better} at {examples} examples are not cumulative")
        step = binomial_half_pmf(nonzero - self._nonzero)
        self._mass = np.convolve(self._mass, step)
        self._nonzero = nonzero
        budget = self.alpha * examples / self.looks[-1] - self._spent
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
        stop = critical is not None and worse >= critical
        return Look(examples=examples, worse=worse, better=better, critical=critical, spent=self._spent, stop=stop)


@dataclass(frozen=True)
class Decision:
    """Where a race stands.

    Attributes:
        action: ``"continue"`` (keep scoring), ``"stop"`` (raced out) or ``"complete"`` (all ``n`` scored).
        examples: Examples the decision rests on (the first ``examples`` of the order).
        n: The number of training examples.
        mean: The candidate's mean over those examples (its partial mean when stopped); ``None`` before any look.
    """

    action: Action
    examples: int
    n: int
    mean: float | None

    @property
    def reason(self) -> str | None:
        """``"raced out after k of n"`` for a stopped candidate, else ``None``."""
        return f"raced out after {self.examples} of {self.n}" if self.action == "stop" else None


def _check_score(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{what} must be a number in [0, 1], got {value!r}")
    value = float(value)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be a number in [0, 1] (racing needs bounded scores), got {value!r}")
    return value


class Race:
    """One candidate's race against the current best, fed results in any order.

    Args:
        best_scores: The current best's score on every training example (indexed by example), each in ``[0, 1]``.
        order: The shared example order (:func:`example_order`).
        schedule: The looks (:class:`RacingSchedule`) for ``len(order)`` examples.
        alpha: The level of the test.
        seed: The run's seed, for the rounding of fractional differences.
        stream: A number distinguishing this candidate (for example its id), for the same purpose.
    """

    def __init__(
        self,
        *,
        best_scores: Sequence[float],
        order: Sequence[int],
        schedule: RacingSchedule,
        alpha: float = DEFAULT_ALPHA,
        seed: int = 0,
        stream: int = 0,
    ) -> None:
        n = len(order)
        if schedule.n != n or len(best_scores) != n or sorted(order) != list(range(n)):
            raise ValueError(
                f"order ({n} examples), schedule (n={schedule.n}) and best_scores ({len(best_scores)}) must cover "
                "the same training set; build them from the same n"
            )
        self._best = [_check_score(v, f"best score of example {i}") for i, v in enumerate(best_scores)]
        self._order = list(order)
        self._position = {example: p for p, example in enumerate(self._order)}
        self._test = SequentialSignTest(alpha=alpha, looks=schedule.looks)
        self._looks = schedule.looks
        self._coins = np.random.default_rng([int(seed), int(stream), 0x5160]).random(n)
        self._scores: dict[int, float] = {}
        self._prefix = 0  # examples of the order scored without a gap from the start
        self._worse = 0
        self._better = 0
        self._total = 0.0
        self.looks: list[Look] = []
        self.decision = Decision(action="continue", examples=0, n=n, mean=None)

    @property
    def n(self) -> int:
        """The number of training examples."""
        return len(self._order)

    def needed(self) -> list[int]:
        """The examples, in order, to score up to the next look (all remaining ones after the last look)."""
        if self.decision.action != "continue":
            return []
        upto = next((k for k in self._looks if k > self.decision.examples), self.n)
        return [e for e in self._order[self.decision.examples : upto] if e not in self._scores]

    def record(self, example: int, score: float) -> Decision:
        """Buffer one result and take every look it completes.

        Args:
            example: The training example's index.
            score: The candidate's score on it, in ``[0, 1]``.

        Returns:
            The decision after this result. Results recorded after a stop are ignored.

        Raises:
            ValueError: On an unknown or repeated example, or a score outside ``[0, 1]``.
        """
        if self.decision.action != "continue":
            return self.decision
        if example not in self._position:
            raise ValueError(f"example {example!r} is not one of the {self.n} training examples")
        if example in self._scores:
            raise ValueError(f"example {example} was recorded twice")
        self._scores[example] = _check_score(score, f"score of example {example}")
        while self._prefix < self.n and self._order[self._prefix] in self._scores:
            self._advance(self._order[self._prefix])
            self._prefix += 1
            if self._prefix in self._looks:
                look = self._test.look(examples=self._prefix, worse=self._worse, better=self._better)
                self.looks.append(look)
                action: Action = "stop" if look.stop else "continue"
                mean = self._total / self._prefix
                self.decision = Decision(action=action, examples=self._prefix, n=self.n, mean=mean)
                if look.stop:
                    logger.debug("Race stopped after %d of %d examples: %s", self._prefix, self.n, look)
                    return self.decision
        if self._prefix == self.n:
            self.decision = Decision(action="complete", examples=self.n, n=self.n, mean=self._total / self.n)
        return self.decision

    def _advance(self, example: int) -> None:
        score = self._scores[example]
        self._total += score
        diff = score - self._best[example]
        if diff != 0.0 and self._coins[example] < abs(diff):
            if diff < 0.0:
                self._worse += 1
            else:
                self._better += 1


# ---------------------------------------------------------------------------------------------------------------
# The scoring policy


class RacingPolicy:
    """The scoring policy of ``racing``: a step's new candidates race the best at the start of their step.

    Every candidate runs its examples block by block in the shared seeded order (:func:`example_order`), the next
    block only once the previous look is decided, and a candidate the test finds worse is stopped (``raced_out``)
    with its partial mean. Recorded scores are replayed into each race first, so a resumed race takes the same
    decisions.

    Args:
        alpha: The test's level.
        seed: The run's seed (the example order and the rounding of fractional differences).
    """

    def __init__(self, *, alpha: float, seed: int):
        check_alpha(alpha)
        self.alpha, self.seed = alpha, seed

    def plan(self, candidates: Sequence[Candidate], baseline: Candidate) -> RacingPlan:
        return RacingPlan(candidates, baseline, alpha=self.alpha, seed=self.seed)


class RacingPlan:
    """The races of one phase: one :class:`Race` per candidate against the same baseline."""

    def __init__(self, candidates: Sequence[Candidate], baseline: Candidate, *, alpha: float, seed: int):
        n = len(baseline.scores)
        order = example_order(n, seed=seed)
        schedule = RacingSchedule.build(n)
        baseline_scores = [score for score in baseline.scores if score is not None]
        if len(baseline_scores) != n:
            raise ValueError(f"candidate {baseline.id} is not scored on every training example, so it cannot be raced")
        self._against = baseline.id
        self._races: dict[int, Race] = {}
        for candidate in candidates:
            race = Race(best_scores=baseline_scores, order=order, schedule=schedule, alpha=alpha, seed=seed,
                        stream=candidate.id)
            for index, value in enumerate(candidate.scores):  # a race's decisions do not depend on arrival order
                if value is not None:
                    race.record(index, value)
            self._races[candidate.id] = race

    def next_round(self) -> dict[int, list[int]]:
        return {cid: needed for cid, race in self._races.items() if (needed := race.needed())}

    def record(self, candidate_id: int, index: int, score: float) -> None:
        self._races[candidate_id].record(index, score)

    def decision(self, candidate_id: int) -> PlanDecision | None:
        race = self._races[candidate_id]
        decision = race.decision
        if decision.action == "continue":
            return None
        stopped = decision.action == "stop"
        record = RaceRecord(against=self._against, examples=decision.examples, n=race.n,
                            looks=[RaceLook(**dataclasses.asdict(look)) for look in race.looks],
                            stopped_at=decision.examples if stopped else None)
        return PlanDecision(stopped=stopped, mean=decision.mean, reason=decision.reason, race=record)
