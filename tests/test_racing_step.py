"""Tests for racing's threshold test, its leaders and the race of a whole step (:class:`StepRace`)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dspy_opro.extensions.racing import (
    LEAD_AFTER,
    MAX_THRESHOLD_N,
    RacingSchedule,
    StepRace,
    example_order,
    threshold_table,
)


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


def run_step(incumbent: np.ndarray, candidates: dict[int, np.ndarray], *, seed: int = 0,
             arrival_seed: int | None = None, **options) -> StepRace:
    """Run a step's race to its end, round by round, each round's results in a seeded shuffled order."""
    n = len(incumbent)
    race = StepRace(incumbent=list(incumbent), entrants=sorted(candidates), order=example_order(n, seed=seed),
                    schedule=RacingSchedule.build(n), seed=seed, incumbent_id=0, **options)
    rng = np.random.default_rng(arrival_seed) if arrival_seed is not None else None
    while rounds := race.next_round():
        results = [(cid, e) for cid, examples in rounds.items() for e in examples]
        if rng is not None:
            results = [results[i] for i in rng.permutation(len(results))]
        for cid, e in results:
            if race.decision(cid).action == "continue":
                race.record(cid, e, float(candidates[cid][e]))
    return race


def with_total(n: int, total: int, rng: np.random.Generator) -> np.ndarray:
    scores = np.zeros(n)
    scores[rng.choice(n, size=total, replace=False)] = 1.0
    return scores


# --------------------------------------------------------------------------------------------------------------
# The threshold test


def test_threshold_level_is_exact_by_enumeration_and_at_most_alpha():
    # Every arrangement of a training set of 12 with 6 right answers, looks after 4 and 8, alpha 0.2.
    n, bar, looks, alpha = 12, 6, (4, 8), 0.2
    critical = threshold_table(n, looks, alpha, 1.0)[bar]
    stopped = total = 0
    for right in itertools.combinations(range(n), bar):
        scores = np.zeros(n)
        scores[list(right)] = 1.0
        total += 1
        stopped += any(c >= 0 and scores[:k].sum() <= c for k, c in zip(looks, critical, strict=True))
    assert total == math.comb(12, 6)
    assert stopped / total == pytest.approx(threshold_level(n, bar, looks, alpha, 1.0), rel=1e-12)
    assert stopped / total <= alpha
    assert list(critical) == [0, 2]
    assert stopped == 50  # of 924 arrangements: none right of the first 4, or at most 2 of the first 8


@pytest.mark.parametrize("n", [20, 100, 200])
def test_threshold_table_is_monotone_in_the_bar_and_within_alpha_at_every_bar(n):
    looks = RacingSchedule.build(n).looks
    table = threshold_table(n, looks, 0.05, 0.5)
    assert table.shape == (n + 1, len(looks))
    assert (np.diff(table, axis=0) >= 0).all()  # a higher bar never stops fewer candidates
    assert (table[0] == -1).all()  # a bar of 0 right answers stops nobody
    levels = [threshold_level(n, bar, looks, 0.05, 0.5) for bar in range(n + 1)]
    assert max(levels) <= 0.05
    assert max(levels) > 0.04  # and spends nearly all of it


def test_threshold_table_first_critical_counts_at_n_100():
    # Bar 80 of 100: stop with at most 1 right of the first 5, at most 4 of 10, 8 of 15.
    assert list(threshold_table(100, RacingSchedule.build(100).looks, 0.05, 0.5)[80][:3]) == [1, 4, 8]


# --------------------------------------------------------------------------------------------------------------
# The race of a step


def test_the_guarantee_for_a_candidate_at_least_as_good_as_every_other_on_a_fixed_training_set():
    # 1000 steps of 8 candidates on 100 examples, incumbent 60 right; one candidate has the highest training total
    # of all (70 right, tied with a sibling), the others 40 to 70. Only the order is random.
    # It must be stopped in at most alpha = 5% of the steps.
    stopped = leaders = 0
    trials = 1000
    for trial in range(trials):
        rng = np.random.default_rng(trial)
        totals = [70, 70, *rng.integers(40, 71, size=6)]
        candidates = {cid: with_total(100, int(t), rng) for cid, t in zip(range(1, 9), totals, strict=True)}
        race = run_step(with_total(100, 60, rng), candidates, seed=trial)
        stopped += race.decision(1).action == "stop"
        leaders += 1 in race.leaders()
    rate = stopped / trials
    assert rate <= 0.05
    # It ran in full as a leader in 617 of the 1000 steps. Testing the waiting candidates again against a raised bar
    # spends more of the level than testing them at the next look only (23 stops then), still within alpha.
    assert (stopped, leaders) == (31, 617)


def test_leaders_raise_the_bar_and_the_weak_stop_against_them():
    # A weak incumbent (20 right): the first look after which leaders are chosen is the third (15 examples).
    rng = np.random.default_rng(5)
    candidates = {1: with_total(100, 90, rng), 2: with_total(100, 50, rng), 3: with_total(100, 45, rng),
                  4: with_total(100, 85, rng)}
    race = run_step(with_total(100, 20, rng), candidates, lead_rule="always", scouts=1)
    assert LEAD_AFTER == 3
    assert race.leaders() == [1, 4]
    assert race.bar == (90, 1)
    assert {cid: race.decision(cid).action for cid in candidates} == {
        1: "complete", 2: "stop", 3: "stop", 4: "complete"}
    for cid in (2, 3):  # well above the incumbent's 20, stopped by the leader's 90
        decision = race.decision(cid)
        assert decision.stopped_by == 1
        assert race.looks(cid)[-1].against == 1 and race.looks(cid)[-1].stop
        assert race.looks(cid)[0].against == 0  # before the leaders, the incumbent was the bar
    # They waited at the third look (15 examples) while the leader ran, and were tested again there against its 90.
    assert [race.decision(cid).examples for cid in (2, 3)] == [15, 15]


def test_a_front_runner_below_the_bars_rate_is_no_leader():
    # The default rule: a front-runner runs in full only when its running rate is at least the bar's.
    rng = np.random.default_rng(5)
    candidates = {1: with_total(100, 90, rng), 2: with_total(100, 50, rng), 3: with_total(100, 45, rng),
                  4: with_total(100, 85, rng)}
    race = run_step(with_total(100, 20, rng), candidates, scouts=1)
    # The 50 and the 45 stop at 15 examples as soon as the leader's 90 is the bar. After 20 examples the 85 has 15
    # right, below the leader's rate of 90 (18 of 20): no second leader, and it is stopped by the 90 at the next
    # look instead of running in full (as it does with lead_rule="always").
    assert race.leaders() == [1]
    assert {cid: (race.decision(cid).action, race.decision(cid).examples) for cid in candidates} == {
        1: ("complete", 100), 2: ("stop", 15), 3: ("stop", 15), 4: ("stop", 25)}
    assert race.decision(4).stopped_by == 1

    # A strong incumbent (80 right) and three proposals well below it: no front-runner is at its rate, so none
    # runs in full; with lead_rule="always" two of them would, for 205 evaluations instead of 65.
    rng = np.random.default_rng(7)
    incumbent = with_total(100, 80, rng)
    candidates = {1: with_total(100, 60, rng), 2: with_total(100, 55, rng), 3: with_total(100, 50, rng)}
    for rule, leaders, examples in (("at_bar", [], [30, 5, 30]), ("always", [1, 3], [100, 5, 100])):
        race = run_step(incumbent, candidates, lead_rule=rule, scouts=1)
        assert race.leaders() == leaders
        assert [race.decision(cid).examples for cid in candidates] == examples
        assert sum(len(race.needed(cid)) for cid in candidates) == 0  # every race is over
    with pytest.raises(ValueError, match="lead_rule must be"):
        run_step(incumbent, candidates, lead_rule="sometimes")


def placed(order: list[int], positions) -> np.ndarray:
    """Scores right exactly at the given positions of the order."""
    scores = np.zeros(len(order))
    for i in positions:
        scores[order[i]] = 1.0
    return scores


def scouting_step() -> tuple[list[int], np.ndarray, dict[int, np.ndarray]]:
    # A weak incumbent (20 of 100) and, after 15 examples: 1 has all 15 right but only 30 in all, 4 has 13 (40 in
    # all), 2 has 12 (86 in all, the best), 3 has 5 (35 in all).
    order = example_order(100, seed=0)
    candidates = {1: placed(order, [*range(15), *range(85, 100)]), 2: placed(order, [*range(12), *range(15, 89)]),
                  3: placed(order, [*range(5), *range(70, 100)]), 4: placed(order, [*range(13), *range(73, 100)])}
    return order, placed(order, range(80, 100)), candidates


def rounds_of(race: StepRace, candidates: dict[int, np.ndarray], order: list[int]) -> list[dict[int, tuple]]:
    """Run the race to its end; each round as candidate -> (first, last + 1) positions in the order."""
    rounds = []
    while asked := race.next_round():
        rounds.append({cid: (order.index(examples[0]), order.index(examples[-1]) + 1)
                       for cid, examples in asked.items()})
        for cid, examples in asked.items():
            for e in examples:
                race.record(cid, e, float(candidates[cid][e]))
    return rounds


def test_scouts_race_ahead_and_the_best_of_them_leads():
    order, incumbent, candidates = scouting_step()
    race = StepRace(incumbent=list(incumbent), entrants=[1, 2, 3, 4], order=order, schedule=RacingSchedule.build(100),
                    incumbent_id=0)
    # After the third look (15) the front-runners within ceil(sqrt(15 / 2)) = 3 right answers of the first, at the
    # bar's rate, race ahead to 30 while 3 waits; at 30 the best of them by right answers (2: 27, 1: 15, 4: 13)
    # leads and runs in full; the others wait again.
    assert rounds_of(race, candidates, order) == [
        {1: (0, 5), 2: (0, 5), 3: (0, 5), 4: (0, 5)}, {1: (5, 10), 2: (5, 10), 3: (5, 10), 4: (5, 10)},
        {1: (10, 15), 2: (10, 15), 3: (10, 15), 4: (10, 15)}, {1: (15, 30), 2: (15, 30), 4: (15, 30)}, {2: (30, 100)}]
    # Its 86 is the bar at once: every waiting candidate is tested again where it stands, and stops.
    assert race.leaders() == [2] and race.bar == (86, 2)
    assert {cid: (race.decision(cid).action, race.decision(cid).examples) for cid in candidates} == {
        1: ("stop", 30), 2: ("complete", 100), 3: ("stop", 15), 4: ("stop", 30)}
    assert [(look.examples, look.better, look.critical, look.stop, look.against) for look in race.looks(1)] == [
        (5, 5, None, False, 0), (10, 10, None, False, 0), (15, 15, None, False, 0), (30, 15, 9, True, 2)]
    assert race.decision(1).mean == 0.5  # its partial mean over the 30 examples it ran
    # The front-runner leading at once (scouts=1) runs the lucky 1 in full: 240 evaluations instead of 175.
    at_once = StepRace(incumbent=list(incumbent), entrants=[1, 2, 3, 4], order=order,
                       schedule=RacingSchedule.build(100), incumbent_id=0, scouts=1)
    rounds = rounds_of(at_once, candidates, order)
    assert at_once.leaders() == [1, 2]
    assert sum(last - first for r in rounds for first, last in r.values()) == 240
    with pytest.raises(ValueError, match="scouts must be a positive integer, got 0"):
        StepRace(incumbent=list(incumbent), entrants=[1], order=order, schedule=RacingSchedule.build(100), scouts=0)


def test_a_resumed_step_replays_decided_scouts_without_running_them():
    order, incumbent, candidates = scouting_step()
    whole = StepRace(incumbent=list(incumbent), entrants=[1, 2, 3, 4], order=order,
                     schedule=RacingSchedule.build(100), incumbent_id=0)
    rounds_of(whole, candidates, order)
    # Resumed with 1 decided (raced out after the 30 it ran as a scout) and 3 (after 15); 2 and 4 had their first 15.
    decided = {cid: ([float(candidates[cid][e]) if order.index(e) < k else None for e in range(100)], k)
               for cid, k in ((1, 30), (3, 15))}
    resumed = StepRace(incumbent=list(incumbent), entrants=[2, 4], order=order, schedule=RacingSchedule.build(100),
                       incumbent_id=0, decided=decided)
    for cid in (2, 4):
        for e in order[:15]:
            resumed.record(cid, e, float(candidates[cid][e]))
    # 1 scouts again on its recorded scores; only 2 and 4 run: to 30, then 2 to the end.
    assert rounds_of(resumed, candidates, order) == [{2: (15, 30), 4: (15, 30)}, {2: (30, 100)}]
    assert {cid: resumed.decision(cid) for cid in (2, 4)} == {cid: whole.decision(cid) for cid in (2, 4)}
    assert resumed.leaders() == [2] and resumed.bar == whole.bar


def test_decisions_do_not_depend_on_the_arrival_order():
    rng = np.random.default_rng(11)
    candidates = {cid: with_total(100, int(t), rng) for cid, t in zip(range(1, 9), rng.integers(30, 90, 8),
                                                                       strict=True)}
    incumbent = with_total(100, 60, rng)
    runs = [run_step(incumbent, candidates, arrival_seed=a) for a in (None, 1, 2)]
    outcome = [[(run.decision(cid), run.looks(cid)) for cid in candidates] for run in runs]
    assert outcome[0] == outcome[1] == outcome[2]
    assert [d.action for d, _ in outcome[0]].count("stop") == 5


def test_a_resumed_step_replays_the_decided_candidates_and_takes_the_same_decisions():
    rng = np.random.default_rng(3)
    candidates = {cid: with_total(60, int(t), rng) for cid, t in zip(range(1, 7), rng.integers(15, 55, 6),
                                                                      strict=True)}
    incumbent = with_total(60, 30, rng)
    whole = run_step(incumbent, candidates)
    decisions = {cid: whole.decision(cid) for cid in candidates}
    assert sorted(d.action for d in decisions.values()) == ["complete"] * 2 + ["stop"] * 4
    # A kill after the decisions of the stopped ones: they are decided (scores up to their stop), the rest pending
    # with the scores they had then (the first 20 examples).
    order = example_order(60, seed=0)
    decided = {}
    for cid, d in decisions.items():
        if d.action == "stop":
            scores = [None] * 60
            for e in order[: d.examples]:
                scores[e] = float(candidates[cid][e])
            decided[cid] = (scores, d.examples)
    pending = [cid for cid in candidates if cid not in decided]
    resumed = StepRace(incumbent=list(incumbent), entrants=pending, order=order, schedule=RacingSchedule.build(60),
                       incumbent_id=0, decided=decided)
    for cid in pending:
        for e in order[:20]:
            resumed.record(cid, e, float(candidates[cid][e]))
    while rounds := resumed.next_round():
        assert set(rounds) <= set(pending)  # a decided candidate never runs again
        for cid, examples in rounds.items():
            for e in examples:
                resumed.record(cid, e, float(candidates[cid][e]))
    assert {cid: resumed.decision(cid) for cid in pending} == {cid: decisions[cid] for cid in pending}
    assert resumed.bar == whole.bar


def test_a_candidate_the_scorer_left_is_withdrawn_and_holds_no_one_back():
    rng = np.random.default_rng(2)
    candidates = {1: with_total(40, 30, rng), 2: with_total(40, 32, rng)}
    order = example_order(40, seed=0)
    race = StepRace(incumbent=list(with_total(40, 20, rng)), entrants=[1, 2], order=order,
                    schedule=RacingSchedule.build(40), incumbent_id=0)
    first = race.next_round()
    assert first == {1: order[:5], 2: order[:5]}
    for e in order[:5]:
        race.record(2, e, float(candidates[2][e]))
    for e in order[:4]:  # candidate 1's fifth example never comes back (an LM failure)
        race.record(1, e, float(candidates[1][e]))
    assert race.next_round() == {2: order[5:7]}
    assert race.decision(1).action == "continue" and race.decision(1).examples == 4  # never stopped nor complete


def test_the_test_is_chosen_by_the_incumbent_scores_and_n():
    order = example_order(40, seed=0)
    schedule = RacingSchedule.build(40)
    assert StepRace(incumbent=[1.0, 0.0] * 20, entrants=[1], order=order, schedule=schedule).test == "threshold"
    assert StepRace(incumbent=[0.5, 0.0] * 20, entrants=[1], order=order, schedule=schedule).test == "sign"
    big = MAX_THRESHOLD_N + 1
    assert StepRace(incumbent=[1.0] * big, entrants=[1], order=example_order(big, seed=0),
                    schedule=RacingSchedule.build(big)).test == "sign"


def test_fractional_candidate_scores_are_rounded_with_seeded_coins():
    # Incumbent 50 of 100 right; a candidate scoring 0.2 everywhere rounds to about 20 right and stops; one
    # scoring 0.9 everywhere runs in full. The same seed gives the same decisions.
    incumbent = with_total(100, 50, np.random.default_rng(0))
    candidates = {1: np.full(100, 0.2), 2: np.full(100, 0.9)}
    first, again = run_step(incumbent, candidates, leaders=0), run_step(incumbent, candidates, leaders=0)
    assert first.decision(1).action == "stop" and first.decision(2).action == "complete"
    assert first.decision(1) == again.decision(1) and first.looks(1) == again.looks(1)
    assert first.decision(1).mean == pytest.approx(0.2)


def test_bad_step_race_inputs():
    order = example_order(20, seed=0)
    schedule = RacingSchedule.build(20)
    with pytest.raises(ValueError, match="must be distinct"):
        StepRace(incumbent=[1.0] * 20, entrants=[1, 1], order=order, schedule=schedule)
    with pytest.raises(ValueError, match="decided candidate 2 has no score"):
        StepRace(incumbent=[1.0] * 20, entrants=[1], order=order, schedule=schedule, decided={2: ([None] * 20, 5)})
    race = StepRace(incumbent=[1.0] * 20, entrants=[1], order=order, schedule=schedule)
    with pytest.raises(ValueError, match="candidate 3 is not racing"):
        race.record(3, 0, 1.0)
