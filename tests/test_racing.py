"""Tests for racing's sign test: order, schedule, the sequential sign test and one candidate's race.

The threshold test, leaders and the race of a whole step are tested in ``tests/test_racing_step.py``.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import math

import numpy as np
import pytest

from dspy_opro.extensions.racing import (
    DEFAULT_ALPHA,
    Decision,
    Look,
    RacingSchedule,
    SequentialSignTest,
    StepRace,
    binomial_half_pmf,
    example_order,
)


class Race:
    """One candidate's race with the paired sign test against a fixed best (``best_scores``, by example), fed
    results in any order: a :class:`StepRace` of one, whose id ``stream`` seeds the rounding of its differences."""

    def __init__(self, *, best_scores, order, schedule: RacingSchedule, alpha: float = DEFAULT_ALPHA, seed: int = 0,
                 stream: int = 0) -> None:
        self._stream = stream
        self._race = StepRace(incumbent=best_scores, entrants=[stream], order=order, schedule=schedule, alpha=alpha,
                              seed=seed, incumbent_id=-1 if stream != -1 else -2, test="sign")

    @property
    def decision(self) -> Decision:
        return self._race.decision(self._stream)

    @property
    def looks(self) -> list[Look]:
        return self._race.looks(self._stream)

    def needed(self) -> list[int]:
        return self._race.needed(self._stream)

    def record(self, example: int, score: float) -> Decision:
        """Buffer one result and take every look it completes; results after a stop are ignored."""
        if self.decision.action == "continue":
            self._race.record(self._stream, example, score)
        return self.decision


def _run(race: Race, scores: np.ndarray, arrival: list[int]) -> Decision:
    decision = race.decision
    for example in arrival:
        decision = race.record(example, float(scores[example]))
    return decision


def _race(best: np.ndarray, *, seed: int = 0, stream: int = 0, alpha: float = 0.05) -> Race:
    n = len(best)
    return Race(best_scores=best, order=example_order(n, seed=seed), schedule=RacingSchedule.build(n), alpha=alpha,
                seed=seed, stream=stream)  # the paired sign test (a Race's default); spends alpha * (k / k_last) ** 0.5


def _landscape(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Example difficulties and a best scoring 0/1 with true accuracy 0.7 on them."""
    rng = np.random.default_rng(seed)
    difficulty = rng.random(n)
    return difficulty, (difficulty < 0.7).astype(float)


# --------------------------------------------------------------------------------------------------------------
# Order and schedule


def test_example_order_is_a_seeded_permutation():
    a = example_order(50, seed=3)
    assert sorted(a) == list(range(50))
    assert a == example_order(50, seed=3)
    assert a != example_order(50, seed=4)
    assert a != list(range(50))


def test_default_schedule():
    assert RacingSchedule.build(100).looks == tuple(range(5, 100, 5))
    assert RacingSchedule.build(5000).looks == tuple(range(250, 5000, 250))
    assert RacingSchedule.build(30).looks == tuple(range(5, 30, 2))  # never before 5 examples
    assert RacingSchedule.build(5).looks == ()  # too small to race: full evaluation
    assert RacingSchedule.build(100, min_examples=25, block_size=30).looks == (25, 55, 85)


@pytest.mark.parametrize("kwargs", [{"min_examples": 0}, {"block_size": -1}, {"block_size": 2.5}])
def test_bad_schedule(kwargs):
    with pytest.raises(ValueError, match="must be a positive integer"):
        RacingSchedule.build(100, **kwargs)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        RacingSchedule.build(0)


# --------------------------------------------------------------------------------------------------------------
# The sequential sign test


def test_binomial_half_pmf_is_exact():
    for m in (0, 1, 7, 40):
        expected = [math.comb(m, x) / 2**m for x in range(m + 1)]
        np.testing.assert_allclose(binomial_half_pmf(m), expected, rtol=1e-12)


def test_single_look_critical_value_is_the_exact_binomial_quantile():
    # P(X >= 9 | 10 fair flips) = 11/1024 <= 0.05 < P(X >= 8) = 56/1024.
    look = SequentialSignTest(alpha=0.05, looks=(20,)).look(examples=20, worse=8, better=2)
    assert look.critical == 9
    assert look.spent == pytest.approx(11 / 1024, rel=1e-12)
    assert not look.stop
    assert SequentialSignTest(alpha=0.05, looks=(20,)).look(examples=20, worse=9, better=1).stop


def test_early_looks_spend_alpha_linearly():
    test = SequentialSignTest(alpha=0.05, looks=(10, 20, 30))
    first = test.look(examples=10, worse=6, better=0)
    # Budget 0.05 / 3 = 0.0167: 6 of 6 has probability 1/64 = 0.0156.
    assert first.critical == 6 and first.stop
    assert first.spent == pytest.approx(1 / 64)


def test_total_crossing_probability_is_exactly_what_was_spent_and_at_most_alpha():
    # Enumerate every sign sequence of the non-zero differences: the exact level of the whole procedure.
    looks, nonzero, alpha = (10, 20, 30), (4, 9, 14), 0.2
    probe = SequentialSignTest(alpha=alpha, looks=looks)
    criticals = []
    for k, m in zip(looks, nonzero, strict=True):
        look = probe.look(examples=k, worse=0, better=m)  # directions do not move the critical values
        criticals.append(look.critical)
    stopped = 0
    for signs in itertools.product((0, 1), repeat=nonzero[-1]):
        worse = [sum(signs[:m]) for m in nonzero]
        stopped += any(c is not None and w >= c for w, c in zip(worse, criticals, strict=True))
    level = stopped / 2 ** nonzero[-1]
    assert level == pytest.approx(look.spent, rel=1e-12)
    assert level <= alpha
    assert criticals == [4, 7, 10]
    assert level == 0.15557861328125  # 2549 of 16384 sequences


def test_no_differences_never_stop():
    test = SequentialSignTest(alpha=0.05, looks=(10, 20))
    assert test.look(examples=10, worse=0, better=0).critical is None
    assert not test.look(examples=20, worse=0, better=0).stop


def test_looks_must_follow_the_plan():
    test = SequentialSignTest(alpha=0.05, looks=(10, 20))
    with pytest.raises(ValueError, match="not the next planned look"):
        test.look(examples=20, worse=0, better=0)
    test.look(examples=10, worse=3, better=3)
    with pytest.raises(ValueError, match="not cumulative"):
        test.look(examples=20, worse=1, better=1)


@pytest.mark.parametrize("alpha", [0, 1, -0.1, float("nan"), True, "0.05"])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match=r"Racing\(alpha=\.\.\.\) must be a number in \(0, 1\)"):
        SequentialSignTest(alpha=alpha, looks=(10,))


# --------------------------------------------------------------------------------------------------------------
# Races


def test_clearly_worse_candidate_stops_early_with_its_partial_mean():
    _, best = _landscape(100, 0)
    candidate = best.copy()
    candidate[best == 1.0] = np.resize([1.0, 0.0, 0.0], int(best.sum()))  # loses two thirds of the best's wins
    race = _race(best)
    decision = _run(race, candidate, example_order(100, seed=0))
    assert decision.action == "stop"
    assert decision.examples == 15
    assert decision.reason == "raced out after 15 of 100"
    first = example_order(100, seed=0)[:15]
    assert decision.mean == pytest.approx(candidate[first].mean())
    assert [(look.examples, look.worse, look.better, look.critical) for look in race.looks] == [
        (5, 2, 0, None), (10, 5, 0, None), (15, 6, 0, 6)]
    assert race.record(example_order(100, seed=0)[30], 1.0) == decision  # ignored after stop
    assert race.needed() == []


def test_clearly_worse_candidates_stop_after_a_fifth_of_the_examples_on_average():
    _, best = _landscape(100, 1)
    stops = []
    for trial in range(200):
        candidate = (np.random.default_rng(trial).random(100) < 0.3).astype(float)
        stops.append(_run(_race(best, stream=trial), candidate, example_order(100, seed=0)).examples)
    assert max(stops) == 65
    assert np.mean(stops) == pytest.approx(21.375)  # 30.85 with the 0.2 schedule (linear, looks every n / 10)


def test_the_best_itself_is_never_stopped():
    for seed in range(20):
        _, best = _landscape(60, seed)
        decision = _run(_race(best, seed=seed), best, example_order(60, seed=seed))
        assert decision == Decision(action="complete", examples=60, n=60, mean=pytest.approx(best.mean()))


@pytest.mark.parametrize("edge", [0.0, 0.05])
def test_candidates_at_least_as_good_are_rarely_stopped(edge):
    # 4000 races, each a fresh landscape with a known best (true accuracy 0.7) and a candidate with true
    # accuracy 0.7 + edge whose errors are independent of the best's. Bound: alpha (0.05) + 3 standard errors.
    stopped = 0
    trials = 4000
    for trial in range(trials):
        difficulty, best = _landscape(100, trial)
        rng = np.random.default_rng(10_000 + trial)
        candidate = (rng.random(100) < 0.7 + edge).astype(float)
        order = example_order(100, seed=trial)
        race = Race(best_scores=best, order=order, schedule=RacingSchedule.build(100), seed=trial, stream=1)
        stopped += _run(race, candidate, order).action == "stop"
    rate = stopped / trials
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    assert rate == {0.0: 0.0485, 0.05: 0.01175}[edge]


def test_equal_training_mean_on_a_fixed_training_set_is_rarely_stopped():
    # Finite population: the candidate's training mean equals the best's exactly (a shuffle of its scores);
    # only the order of the shared examples is random.
    _, best = _landscape(100, 7)
    stopped = 0
    for trial in range(2000):
        candidate = best[np.random.default_rng(trial).permutation(100)]
        order = example_order(100, seed=trial)
        race = Race(best_scores=best, order=order, schedule=RacingSchedule.build(100), seed=trial)
        stopped += _run(race, candidate, order).action == "stop"
    assert stopped / 2000 <= 0.05
    assert stopped == 16


def test_fractional_scores_use_seeded_rounding_with_the_right_mean():
    n = 200
    best = np.full(n, 0.6)
    equal = np.full(n, 0.6)
    worse = np.full(n, 0.2)
    order = example_order(n, seed=0)
    assert _run(Race(best_scores=best, order=order, schedule=RacingSchedule.build(n)), equal, order).action == (
        "complete")
    race = Race(best_scores=best, order=order, schedule=RacingSchedule.build(n), seed=0, stream=5)
    decision = _run(race, worse, order)
    again = Race(best_scores=best, order=order, schedule=RacingSchedule.build(n), seed=0, stream=5)
    assert _run(again, worse, order) == decision
    assert again.looks == race.looks
    assert decision.action == "stop"
    assert decision.mean == pytest.approx(0.2)
    # Every difference is -0.4: a -1 sign with probability 0.4, never a +1 sign.
    assert all(look.better == 0 for look in race.looks)
    assert race.looks[0].worse == 6  # of 10 examples
    # Equal means with fractional scores (candidate 0.8 where best is 0.4, and the other way) stop rarely.
    stopped = 0
    for trial in range(1000):
        rng = np.random.default_rng(trial)
        best = rng.choice([0.4, 0.8], size=100)
        candidate = best[rng.permutation(100)]
        order = example_order(100, seed=trial)
        race = Race(best_scores=best, order=order, schedule=RacingSchedule.build(100), seed=trial, stream=trial)
        stopped += _run(race, candidate, order).action == "stop"
    assert stopped / 1000 <= 0.05


def test_decisions_do_not_depend_on_arrival_order_or_thread_count():
    _, best = _landscape(100, 3)
    order = example_order(100, seed=3)
    outcomes = []
    for trial in range(30):
        candidate = (np.random.default_rng(trial).random(100) < [0.3, 0.6, 0.7][trial % 3]).astype(float)
        runs = []
        for arrival in (order, order[::-1], [order[i] for i in np.random.default_rng(trial).permutation(100)]):
            race = _race(best, seed=3, stream=trial)
            runs.append((_run(race, candidate, arrival), race.looks))
        for threads in (1, 8):
            race = _race(best, seed=3, stream=trial)
            with cf.ThreadPoolExecutor(threads) as pool:
                futures = [pool.submit(float, candidate[e]) for e in order]
                index = {f: e for f, e in zip(futures, order, strict=True)}
                for future in cf.as_completed(futures):  # completion order, recorded on this thread
                    race.record(index[future], future.result())
            runs.append((race.decision, race.looks))
        assert all(run == runs[0] for run in runs), trial
        outcomes.append(runs[0][0].action)
    assert outcomes.count("stop") == 12 and outcomes.count("complete") == 18


def test_a_result_past_a_gap_waits_for_the_gap():
    best = np.ones(40)
    order = example_order(40, seed=0)
    race = Race(best_scores=best, order=order, schedule=RacingSchedule.build(40, min_examples=10, block_size=10))
    for e in order[1:10]:
        assert race.record(e, 0.0).examples == 0  # example order[0] is missing: no look yet
    assert race.needed() == [order[0]]
    decision = race.record(order[0], 0.0)
    assert decision.examples == 10 and race.looks[0].worse == 10
    assert decision.action == "stop"  # 10 of 10 lost: 1/1024 < 0.05 * 10 / 30


def test_needed_lists_the_next_block():
    best = np.full(100, 0.5)
    order = example_order(100, seed=2)
    race = Race(best_scores=best, order=order, schedule=RacingSchedule.build(100))
    assert race.needed() == order[:5]
    race.record(order[3], 0.5)
    assert race.needed() == order[:3] + order[4:5]
    for e in order[:5]:
        if e != order[3]:
            race.record(e, 0.5)
    assert race.needed() == order[5:10]


def test_bad_race_inputs():
    order = example_order(20, seed=0)
    schedule = RacingSchedule.build(20)
    with pytest.raises(ValueError, match="must cover the same training set"):
        Race(best_scores=[0.5] * 19, order=order, schedule=schedule)
    with pytest.raises(ValueError, match=r"incumbent score of example 2 must be a number in \[0, 1\]"):
        Race(best_scores=[0.5, 0.5, 1.5] + [0.5] * 17, order=order, schedule=schedule)
    race = Race(best_scores=[0.5] * 20, order=order, schedule=schedule)
    with pytest.raises(ValueError, match="racing needs bounded scores"):
        race.record(order[0], float("nan"))
    with pytest.raises(ValueError, match="is not one of the 20 training examples"):
        race.record(20, 0.5)
    race.record(order[0], 0.5)
    with pytest.raises(ValueError, match="recorded twice"):
        race.record(order[0], 0.5)
