"""The clairvoyant bound of benchmarks/racing_variants.py is a valid level-alpha test: a proposal at the bar's total
is dropped in at most alpha of the orders, whatever alternative the test is told; a clearly worse one stops early."""

from __future__ import annotations

import math

import numpy as np

from dspy_opro.extensions.racing import example_order
from tests.benchmark_modules import load_benchmark

variants = load_benchmark("racing_variants")
# Drops of a proposal whose total is the bar's (70 of 100) in 2,000 seeded orders, per alternative the test is told.
DROPS_AT_THE_BAR = {55: 55, 60: 68, 66: 47}


def _scores(n: int, total: int) -> np.ndarray:
    scores = np.zeros(n)
    scores[:total] = 1.0
    return scores


def _closed_form_stop(scores: np.ndarray, order: list[int], *, total: int, bar: int, alpha: float) -> int:
    """The same test from the likelihood of the whole prefix: falling factorials of the urn, not draw by draw."""
    n, right = len(scores), 0
    for seen, example in enumerate(order, start=1):
        right += int(scores[example])
        wrong = seen - right
        if wrong > n - bar or right > bar:
            return seen
        log_ratio = (_falling(total, right) + _falling(n - total, wrong) - _falling(bar, right)
                     - _falling(n - bar, wrong))
        if log_ratio >= math.log(1 / alpha):
            return seen
    return n


def _falling(a: int, b: int) -> float:
    return math.lgamma(a + 1) - math.lgamma(a - b + 1)


def test_a_proposal_at_the_bar_is_dropped_in_at_most_alpha_of_the_orders():
    at_bar = _scores(100, 70)
    drops = {alternative: sum(variants.likelihood_ratio_stop(at_bar, example_order(100, seed=trial),
                                                             total=alternative, bar=70, alpha=0.05) < 100
                              for trial in range(2000))
             for alternative in (55, 60, 66)}
    assert drops == DROPS_AT_THE_BAR
    assert max(drops.values()) <= 100  # alpha = 5% of 2,000 orders (Ville's inequality)


def test_the_clairvoyant_stops_where_the_likelihood_of_the_prefix_says():
    rng = np.random.default_rng(3)
    for trial in range(20):
        worse = np.zeros(100)
        worse[rng.choice(100, size=30, replace=False)] = 1.0
        order = example_order(100, seed=trial)
        taken = variants.likelihood_ratio_stop(worse, order, total=30, bar=80, alpha=0.05)
        assert taken == _closed_form_stop(worse, order, total=30, bar=80, alpha=0.05) < 30
    # Its 30 right answers first: no ratio reaches 20 before the 21st wrong answer, impossible at a total of 80.
    assert variants.likelihood_ratio_stop(_scores(100, 30), list(range(100)), total=30, bar=80, alpha=0.05) == 51
    assert variants.likelihood_ratio_stop(_scores(100, 80), list(range(100)), total=80, bar=80, alpha=0.05) == 100
