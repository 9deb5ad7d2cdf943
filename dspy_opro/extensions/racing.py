"""Racing: stop scoring a candidate instruction once it is clearly below the bar.

OPRO scores every proposal on the whole training set, although most of a step's proposals score well below the
best. Racing scores a step's new candidates together, block by block, in one seeded order of the training examples
(:func:`~dspy_opro.extensions.racing_stats.example_order`), and stops a candidate as soon as an exact sequential
test says that its training mean is below the *bar*: at first the training mean of the best candidate at the
start of the step (the *incumbent*). This module holds the decision logic only: :class:`StepRace`, the race of one
step's candidates, and the scoring policy that runs it (:class:`RacingPolicy`); it makes no LM call and knows
nothing of the run loop. The statistics are in :mod:`dspy_opro.extensions.racing_stats`.

**Lockstep.** Every candidate still racing runs the examples up to the next look; a look is taken once all of
them are in, so every decision rests on the same first examples. A candidate the test finds below the bar is
stopped (``raced_out``) with its partial mean.

**Leaders.** The incumbent is often weak early in a run, when most of a step's proposals beat it. So after the
third look a leader is found and run in full, and after the fourth look another: once a leader is fully scored,
its training total becomes the bar if it is higher. A lead goes to a front-runner (most right answers so far,
ties: the lowest id) only when its running rate of right answers is at least the bar's rate: a leader below the
bar cannot raise it, and running it in full would pay for examples the test would mostly have spared. The
front-runner after a few looks is often a weaker candidate with a lucky start, so when the race is close (up to
four front-runners within ``ceil(sqrt(k / 2))`` right answers of the first, one standard deviation of the
difference of two counts) they race ahead as *scouts* to twice the examples, the better half by right answers
again to twice that, until one is left, which leads. While a leader or the scouts run, the others wait where they
stand; when the bar rises they are tested again at once, at every look they have passed, without running an
example more.

**The test.** For binary scores (and ``n <= 500``) the threshold test of
:func:`~dspy_opro.extensions.racing_stats.threshold_table`: an exact test, over the random order, that the
candidate's training total reaches the bar; fractional scores of a candidate are rounded to 0 or 1 with a seeded
coin (``P(1) = score``). With an incumbent scored fractionally (label-free OPRO, partial-credit metrics) or a
larger training set, the paired sign test against the incumbent
(:class:`~dspy_opro.extensions.racing_stats.SequentialSignTest`), without leaders. Both spend the level as
``alpha * (k / k_last) ** 0.5``, more of it at the early looks than linear spending would.

**Guarantee.** Threshold test: for any fixed training set, a candidate whose training total is at least every bar
of its race (the incumbent's and the leaders' it raced) is stopped with probability at most ``alpha`` over the
order; no i.i.d. assumption. Every stop (at a look, after a raise, after scouting) finds the candidate's right
answers among its first ``k_j`` examples at or below look ``j``'s critical count for the bar of the moment, which
is at most the count for the candidate's own total (the table is monotone in the bar): so, whatever chose the bars
and when, the stop lies in the event that the walk at its own total crosses the table, of probability at most
``alpha``. Sign test: if the examples are independent draws under which the candidate's
expected score is at least the incumbent's, it is stopped with probability at most ``alpha``.

A stopped candidate keeps its partial mean over the examples it ran (``"raced out after k of n"``); only fully
scored candidates can be returned. Results may arrive in any order (from any number of threads): a race buffers
them and takes a decision only once every example it rests on is in (every racing candidate's up to the look, the
scouts' up to their mark, the leader's all), so the decisions depend on the scores alone, never on the arrival
order or the thread count. A candidate decided in an earlier compile of the same run (``decided``) takes part
through the same logic on its recorded scores and never runs an example again, so a resumed step takes the
decisions an uninterrupted one would have.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from dspy_opro.extensions.racing_stats import (
    DEFAULT_ALPHA,
    MAX_THRESHOLD_N,
    Look,
    RacingSchedule,
    SequentialSignTest,
    binomial_half_pmf,
    check_alpha,
    example_order,
    threshold_table,
)
from dspy_opro.record.state import Candidate, CandidateStatus, RaceLook, RaceRecord
from dspy_opro.scoring.scorer import PlanDecision

logger = logging.getLogger(__name__)

SPENDING_POWER = 0.5  # the level spent by look j: alpha * (k_j / k_last) ** 0.5
LEADERS = 2  # leaders per step, run in full early to raise the bar
LEAD_AFTER = 3  # the first leader is chosen after the third look
SCOUTS = 4  # front-runners racing ahead for each lead

LeadRule = Literal["always", "second_at_bar", "at_bar"]

Action = Literal["continue", "stop", "complete"]


@dataclass(frozen=True)
class Decision:
    """Where a race stands.

    Attributes:
        action: ``"continue"`` (keep scoring), ``"stop"`` (raced out) or ``"complete"`` (all ``n`` scored).
        examples: Examples the decision rests on (the first ``examples`` of the order).
        n: The number of training examples.
        mean: The candidate's mean over those examples (its partial mean when stopped); ``None`` before any look.
        stopped_by: The id of the instruction it lost to, when stopped.
    """

    action: Action
    examples: int
    n: int
    mean: float | None
    stopped_by: int | None = None

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


class _SignPair:
    """A candidate's paired sign test against the incumbent, counted from the candidate's side."""

    def __init__(self, *, test: SequentialSignTest, coins: np.ndarray) -> None:
        self.test, self.coins = test, coins
        self.counted = 0
        self.worse = 0
        self.better = 0

    def count(self, order: Sequence[int], upto: int, scores: Mapping[int, float], best: Sequence[float]) -> None:
        for example in order[self.counted : upto]:
            diff = scores[example] - best[example]
            if diff != 0.0 and self.coins[example] < abs(diff):
                if diff < 0.0:
                    self.worse += 1
                else:
                    self.better += 1
        self.counted = upto


@dataclass
class _Entrant:
    scores: dict[int, float]
    coins: np.ndarray
    decided: int | None = None  # decided in an earlier compile: the examples it raced (n: ran in full); else None
    prefix: int = 0  # the first `prefix` examples of the order are in
    position: int = 0  # the examples the race has asked of it and taken decisions on
    stopped_at: int | None = None
    stopped_by: int | None = None
    withdrawn: bool = False
    scout_to: int | None = None  # running ahead to this many examples, in a tournament for the lead
    leader: bool = False
    sign: _SignPair | None = None
    looks: list[Look] = dataclasses.field(default_factory=list)

    def right(self, order: Sequence[int], upto: int) -> int:
        """Right answers among the first ``upto`` examples, fractional scores rounded with the seeded coins."""
        return sum(self.coins[e] < self.scores[e] for e in order[:upto])


def _is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


class StepRace:
    """The race of one step's candidates: stopped when clearly below the bar, the leaders run in full.

    Args:
        incumbent: The incumbent's score on every training example (indexed by example), each in ``[0, 1]``.
        entrants: The ids of the step's candidates that race now.
        order: The shared example order (:func:`example_order`).
        schedule: The looks (:class:`RacingSchedule`) for ``len(order)`` examples.
        alpha: The level: the bound on the probability of stopping a candidate at least as good as every bar.
        seed: The run's seed, for the rounding of fractional scores.
        incumbent_id: The incumbent's id (kept on the looks).
        test: ``"threshold"``, ``"sign"``, or ``"auto"``: the threshold test when the incumbent's scores are all
            0 or 1 and ``n <= MAX_THRESHOLD_N``, else the sign test.
        leaders: How many leaders run in full early to raise the bar (threshold test only).
        lead_after: The look (counted from 1) after which the first leader is chosen; the next ones after the
            following looks.
        scouts: How many front-runners race ahead for each lead (1: the front-runner leads at once). They run to
            twice the examples of the look that chose them, waiting for each other; the better half by right
            answers goes on to twice that again, until one is left, which leads.
        power: The spending exponent of the tests (1: linear).
        decided: Candidates of the same step decided in an earlier compile, by id: their recorded scores (``None``
            where not run) and the examples they raced (where they stopped, or ``n``). They take part with those
            scores, as they did then, and never run an example again.
        lead_rule: When a front-runner leads: ``"at_bar"`` (the default) only when its running rate of right
            answers is at least the bar's rate (``right / k >= bar / n``), else no leader at that look;
            ``"second_at_bar"`` the first leader always and the second under that condition; ``"always"`` every
            time (0.3.0 before issue 24's second round, kept for the benchmarks' comparison).
    """

    def __init__(
        self,
        *,
        incumbent: Sequence[float],
        entrants: Sequence[int],
        order: Sequence[int],
        schedule: RacingSchedule,
        alpha: float = DEFAULT_ALPHA,
        seed: int = 0,
        incumbent_id: int = -1,
        test: Literal["auto", "threshold", "sign"] = "auto",
        leaders: int = LEADERS,
        lead_after: int = LEAD_AFTER,
        scouts: int = SCOUTS,
        power: float = SPENDING_POWER,
        decided: Mapping[int, tuple[Sequence[float | None], int]] | None = None,
        lead_rule: LeadRule = "at_bar",
    ) -> None:
        check_alpha(alpha)
        n = len(order)
        if schedule.n != n or len(incumbent) != n or sorted(order) != list(range(n)):
            raise ValueError(
                f"order ({n} examples), schedule (n={schedule.n}) and incumbent scores ({len(incumbent)}) must cover "
                "the same training set; build them from the same n"
            )
        decided = dict(decided or {})
        if len(set(entrants)) != len(entrants) or set(entrants) & set(decided) or incumbent_id in entrants:
            raise ValueError(f"candidate ids must be distinct: entrants {list(entrants)}, decided {sorted(decided)}, "
                             f"incumbent {incumbent_id}")
        if lead_rule not in ("always", "second_at_bar", "at_bar"):
            raise ValueError(f"lead_rule must be 'always', 'second_at_bar' or 'at_bar', got {lead_rule!r}")
        if isinstance(scouts, bool) or not isinstance(scouts, int) or scouts < 1:
            raise ValueError(f"scouts must be a positive integer, got {scouts!r}")
        self._incumbent = [_check_score(v, f"incumbent score of example {i}") for i, v in enumerate(incumbent)]
        if test == "auto":
            test = "threshold" if _is_binary(self._incumbent) and n <= MAX_THRESHOLD_N else "sign"
        self.test: Literal["threshold", "sign"] = "threshold" if test == "threshold" else "sign"
        self._order = list(order)
        self._position = {example: p for p, example in enumerate(self._order)}
        self._looks = schedule.looks
        self._alpha, self._power = float(alpha), float(power)
        self._lead_at = set(range(lead_after - 1, lead_after - 1 + leaders)) if self.test == "threshold" else set()
        self._scouts_per_lead = scouts
        self._lead_rule: LeadRule = lead_rule
        self._leads = 0  # leads started (a tournament of scouts or a leader at once)
        self._scouts: list[int] = []  # the running tournament's scouts
        self._bar = math.ceil(sum(self._incumbent) - 1e-9)
        self._bar_id = incumbent_id
        self._bars_applied: set[int] = set()

        def coins(cid: int) -> np.ndarray:
            return np.random.default_rng([int(seed), int(cid), 0x5160]).random(n)

        self._entrants: dict[int, _Entrant] = {}
        for cid in entrants:
            entrant = _Entrant(scores={}, coins=coins(cid))
            if self.test == "sign":
                entrant.sign = _SignPair(test=SequentialSignTest(alpha=alpha, looks=self._looks, power=power),
                                         coins=entrant.coins)
            self._entrants[cid] = entrant
        for cid, (scores, raced_to) in sorted(decided.items()):
            known = {i: _check_score(v, f"score of example {i}") for i, v in enumerate(scores) if v is not None}
            if len(scores) != n or any(e not in known for e in self._order[:raced_to]):
                raise ValueError(f"decided candidate {cid} has no score on some of the {raced_to} examples it raced")
            entrant = _Entrant(scores={e: known[e] for e in self._order[:raced_to]}, coins=coins(cid),
                               decided=raced_to)
            if self.test == "sign":
                entrant.sign = _SignPair(test=SequentialSignTest(alpha=alpha, looks=self._looks, power=power),
                                         coins=entrant.coins)
            self._entrants[cid] = entrant
        self._next_look = 0  # index into the looks
        self._asked: dict[int, list[int]] = {}
        self._advance()

    @property
    def n(self) -> int:
        """The number of training examples."""
        return len(self._order)

    @property
    def bar(self) -> tuple[int, int]:
        """The current bar: the training total a candidate must reach, and the id of the candidate it comes from."""
        return self._bar, self._bar_id

    def _racing(self, cid: int) -> bool:
        """Taking looks: neither stopped, withdrawn, a leader nor a scout."""
        entrant = self._entrants[cid]
        return not (entrant.stopped_at is not None or entrant.withdrawn or entrant.leader
                    or entrant.scout_to is not None)

    def _upto(self) -> int:
        return self._looks[self._next_look] if self._next_look < len(self._looks) else self.n

    def needed(self, cid: int) -> list[int]:
        """The examples candidate ``cid`` runs next: up to the next look (a leader: all the rest; a scout: up to
        its mark; everyone after the last look: all the rest); nothing while a leader or the scouts run."""
        entrant = self._entrants[cid]
        if entrant.decided is not None or entrant.withdrawn or entrant.stopped_at is not None:
            return []
        if entrant.leader:
            upto = self.n
        elif entrant.scout_to is not None:
            upto = entrant.scout_to
        elif self._running_ahead():
            return []  # the leader's total may stop this candidate where it stands: no example before it is in
        else:
            upto = self._upto()
        return [e for e in self._order[:upto] if e not in entrant.scores]

    def next_round(self) -> dict[int, list[int]]:
        """Every racing candidate's next examples; a candidate asked for examples it never got is withdrawn (the
        scorer left it: LM failures or a budget) and no longer holds the others back."""
        for cid, asked in self._asked.items():
            entrant = self._entrants[cid]
            if entrant.stopped_at is None and any(e not in entrant.scores for e in asked):
                entrant.withdrawn = True
                logger.debug("Candidate %d left the race unscored after %d examples", cid, entrant.prefix)
        self._advance()
        self._asked = {cid: needed for cid in self._entrants if (needed := self.needed(cid))}
        return dict(self._asked)

    def record(self, cid: int, example: int, score: float) -> None:
        """Buffer one result of a racing candidate and take every decision it completes.

        Raises:
            ValueError: On an unknown candidate or example, a repeated example, or a score outside ``[0, 1]``.
        """
        entrant = self._entrants.get(cid)
        if entrant is None or entrant.decided is not None:
            raise ValueError(f"candidate {cid} is not racing in this step")
        if example not in self._position:
            raise ValueError(f"example {example!r} is not one of the {self.n} training examples")
        if example in entrant.scores:
            raise ValueError(f"example {example} was recorded twice")
        entrant.scores[example] = _check_score(score, f"score of example {example}")
        self._advance()

    # -- the decisions -------------------------------------------------------------------------------------------

    def _advance(self) -> None:
        for entrant in self._entrants.values():
            while entrant.prefix < self.n and self._order[entrant.prefix] in entrant.scores:
                entrant.prefix += 1
        while not self._running_ahead():  # a leader's full score may raise the bar before any further look
            if self._scouts:
                self._narrow_scouts()
                continue
            if self._raise_bar():
                self._retest()
            if self._next_look >= len(self._looks):
                return
            k = self._looks[self._next_look]
            for cid in sorted(self._entrants):
                if self._racing(cid):
                    self._hold_decided(cid, k)
            racing = [cid for cid in sorted(self._entrants) if self._racing(cid)]
            if any(self._entrants[cid].prefix < k for cid in racing):
                return
            self._take_look(self._next_look, k, racing)
            self._next_look += 1

    def _hold_decided(self, cid: int, upto: int) -> None:
        """A decided candidate never runs again: asked beyond what it raced, it stops there, as it did then (only
        reached if the race has changed since it was decided)."""
        entrant = self._entrants[cid]
        if entrant.decided is not None and entrant.prefix < upto and entrant.stopped_at is None:
            entrant.scout_to, entrant.leader = None, False
            entrant.stopped_at, entrant.stopped_by = entrant.decided, self._bar_id

    def _running_ahead(self) -> bool:
        """A leader, or a scout, has examples still to come."""
        for cid in sorted(self._entrants):
            entrant = self._entrants[cid]
            if entrant.withdrawn or entrant.stopped_at is not None:
                continue
            mark = self.n if entrant.leader else entrant.scout_to
            if mark is not None:
                self._hold_decided(cid, mark)
                if entrant.stopped_at is None and entrant.prefix < mark:
                    return True
        return False

    def _raise_bar(self) -> bool:
        """Make the highest training total of the fully scored leaders the bar; whether it rose."""
        raised = False
        for cid in sorted(cid for cid, e in self._entrants.items() if e.leader and not e.withdrawn):
            entrant = self._entrants[cid]
            if cid in self._bars_applied or entrant.stopped_at is not None:
                continue
            self._bars_applied.add(cid)
            total = math.ceil(sum(entrant.scores.values()) - 1e-9)
            if total > self._bar:
                self._bar, self._bar_id = total, cid
                raised = True
        return raised

    def _stop_below(self, cid: int, indexes: Sequence[int]) -> bool:
        """The threshold test of candidate ``cid`` at the given looks (the latest first) against the current bar;
        the first that finds it below the bar stops it after the examples it has run, and is recorded."""
        entrant = self._entrants[cid]
        for index in sorted(indexes, reverse=True):
            look = self._threshold_look(cid, index)
            if not look.stop:
                continue
            if entrant.decided == self.n:
                return False  # ran in full in an earlier compile: never decided again
            entrant.looks.append(look)
            entrant.stopped_at, entrant.stopped_by = entrant.position, self._bar_id
            logger.debug("Candidate %d raced out after %d of %d examples: %s", cid, entrant.position, self.n,
                         entrant.looks[-1])
            return True
        return False

    def _threshold_look(self, cid: int, index: int) -> Look:
        """The threshold test of candidate ``cid`` at look ``index`` against the current bar."""
        k = self._looks[index]
        right = self._right(cid, k)
        critical = int(threshold_table(self.n, self._looks, self._alpha, self._power)[self._bar, index])
        return Look(examples=k, worse=k - right, better=right, critical=k - critical if critical >= 0 else None,
                    spent=self._alpha * (k / self._looks[-1]) ** self._power, stop=right <= critical,
                    against=self._bar_id)

    def _passed(self, cid: int) -> list[int]:
        """The indexes of the looks candidate ``cid`` has run the examples of."""
        return [index for index, k in enumerate(self._looks) if k <= self._entrants[cid].position]

    def _retest(self) -> None:
        """Test every candidate still racing again, at each look it has passed, against the bar just raised.

        No example is run for it: the candidates waited at their last look while the leader ran. The counts are
        monotone in the bar, so a stop here is a crossing of the table at the candidate's own total whenever that
        total is at least the bar, and the guarantee holds as for a stop at a look.
        """
        if self.test != "threshold":
            return
        for cid in sorted(self._entrants):
            if self._racing(cid):
                self._stop_below(cid, self._passed(cid))

    def _take_look(self, index: int, k: int, racing: list[int]) -> None:
        for cid in racing:
            entrant = self._entrants[cid]
            entrant.position = max(entrant.position, k)
            if self.test == "threshold":
                if not self._stop_below(cid, [index]):  # not stopped (a candidate run in full never is)
                    entrant.looks.append(dataclasses.replace(self._threshold_look(cid, index), stop=False))
                continue
            assert entrant.sign is not None
            entrant.sign.count(self._order, k, entrant.scores, self._incumbent)
            look = entrant.sign.test.look(examples=k, worse=entrant.sign.worse, better=entrant.sign.better)
            look = dataclasses.replace(look, against=self._bar_id)
            entrant.looks.append(look)
            if look.stop and entrant.decided != self.n:
                entrant.stopped_at, entrant.stopped_by = k, self._bar_id
                logger.debug("Candidate %d raced out after %d of %d examples: %s", cid, k, self.n, look)
        if index in self._lead_at:
            self._start_lead(k, [cid for cid in racing if self._entrants[cid].stopped_at is None])

    def _start_lead(self, k: int, contenders: list[int]) -> None:
        """The front-runners after ``k`` examples (ties: the lowest id) at the bar's rate race ahead as scouts, or
        the first of them leads at once (one scout, or no look left to race ahead to)."""
        conditional = self._conditional_lead(self._leads + 1)
        # A conditional leader runs ahead only when its running rate is at least the bar's.
        eligible = [cid for cid in self._ranked(contenders, k) if not conditional or self._at_bar_rate(cid, k)]
        if eligible:  # only a close race needs scouts: those within one standard deviation of the first
            first = self._right(eligible[0], k)
            eligible = [cid for cid in eligible if self._right(cid, k) >= first - math.ceil(math.sqrt(k / 2))]
        mark = self._scout_mark(k)
        chosen = eligible[: self._scouts_per_lead if mark is not None else 1]
        if not chosen:
            return
        self._leads += 1
        if len(chosen) == 1:
            self._entrants[chosen[0]].leader = True
            logger.debug("Candidate %d leads after %d examples and runs in full", chosen[0], k)
            return
        self._scouts = chosen
        for cid in chosen:
            self._entrants[cid].scout_to = mark
        logger.debug("Candidates %s race ahead to %d examples for the lead", chosen, mark)

    def _right(self, cid: int, k: int) -> int:
        return self._entrants[cid].right(self._order, k)

    def _ranked(self, cids: Sequence[int], k: int) -> list[int]:
        """``cids`` by right answers among the first ``k`` examples, most first (ties: the lowest id)."""
        return sorted(cids, key=lambda cid: (-self._right(cid, k), cid))

    def _at_bar_rate(self, cid: int, k: int) -> bool:
        """Whether candidate ``cid``'s rate of right answers over the first ``k`` examples is at least the bar's."""
        return self._right(cid, k) * self.n >= self._bar * k

    def _conditional_lead(self, lead: int) -> bool:
        """Whether the ``lead``-th lead (from 1) goes only to a front-runner at the bar's rate."""
        return self._lead_rule == "at_bar" or (self._lead_rule == "second_at_bar" and lead >= 2)

    def _scout_mark(self, k: int) -> int | None:
        """Where scouts chosen after ``k`` examples run to: the first look at twice ``k`` or beyond, else the last
        look after ``k``; ``None`` when no look is left."""
        later = [look for look in self._looks if look > k]
        return next((look for look in later if look >= 2 * k), later[-1]) if later else None

    def _narrow_scouts(self) -> None:
        """All scouts are at their mark: the better half by right answers goes on, the others race again from
        there (tested at once against the bar); the last one left leads, if still at the bar's rate."""
        alive = [cid for cid in self._scouts
                 if not self._entrants[cid].withdrawn and self._entrants[cid].stopped_at is None]
        self._scouts = []
        if not alive:
            return
        k = self._entrants[alive[0]].scout_to
        assert k is not None
        for cid in alive:
            entrant = self._entrants[cid]
            entrant.scout_to, entrant.position = None, max(entrant.position, k)  # a scout may have been ahead
        ranked = self._ranked(alive, k)
        ahead = ranked[: max(1, len(ranked) // 2)]
        behind = ranked[len(ahead):]
        mark = self._scout_mark(k)
        if len(ahead) == 1 or mark is None:
            if not self._conditional_lead(self._leads) or self._at_bar_rate(ahead[0], k):
                self._entrants[ahead[0]].leader = True
                logger.debug("Candidate %d leads after %d examples and runs in full", ahead[0], k)
            behind = [cid for cid in ranked if not self._entrants[cid].leader]
        else:
            self._scouts = ahead
            for cid in ahead:
                self._entrants[cid].scout_to = mark
        for cid in behind:
            if self.test == "threshold":
                self._stop_below(cid, self._passed(cid))

    # -- what the race says --------------------------------------------------------------------------------------

    def decision(self, cid: int) -> Decision:
        """Where candidate ``cid``'s race stands."""
        entrant = self._entrants[cid]
        if entrant.stopped_at is not None and entrant.decided is None:
            k = entrant.stopped_at
            return Decision(action="stop", examples=k, n=self.n,
                            mean=sum(entrant.scores[e] for e in self._order[:k]) / k, stopped_by=entrant.stopped_by)
        if not entrant.withdrawn and entrant.prefix == self.n and (
                entrant.leader or self._next_look >= len(self._looks)):
            return Decision(action="complete", examples=self.n, n=self.n,
                            mean=sum(entrant.scores.values()) / self.n)
        last_look = self._looks[self._next_look - 1] if self._next_look else 0
        taken = min(max(entrant.position, last_look), entrant.prefix)
        mean = sum(entrant.scores[e] for e in self._order[:taken]) / taken if taken else None
        return Decision(action="continue", examples=taken, n=self.n, mean=mean)

    def looks(self, cid: int) -> list[Look]:
        """Candidate ``cid``'s looks, each against the bar of its time."""
        return list(self._entrants[cid].looks)

    def leaders(self) -> list[int]:
        """The candidates chosen to run in full early."""
        return sorted(cid for cid, e in self._entrants.items() if e.leader)


class Race:
    """One candidate's race against a fixed best, fed results in any order (a :class:`StepRace` of one, no leader).

    Args:
        best_scores: The best's score on every training example (indexed by example), each in ``[0, 1]``.
        order: The shared example order (:func:`example_order`).
        schedule: The looks (:class:`RacingSchedule`) for ``len(order)`` examples.
        alpha: The level of the test.
        seed: The run's seed, for the rounding of fractional differences.
        stream: A number distinguishing this candidate (for example its id), for the same purpose.
        power: The spending exponent (1: linear).
        test: ``"sign"`` (the paired sign test), ``"threshold"`` (the best's training total as the bar) or ``"auto"``.
    """

    def __init__(self, *, best_scores: Sequence[float], order: Sequence[int], schedule: RacingSchedule,
                 alpha: float = DEFAULT_ALPHA, seed: int = 0, stream: int = 0, power: float = SPENDING_POWER,
                 test: Literal["auto", "threshold", "sign"] = "sign") -> None:
        self._stream = stream
        self._race = StepRace(incumbent=best_scores, entrants=[stream], order=order, schedule=schedule, alpha=alpha,
                              seed=seed, incumbent_id=-1 if stream != -1 else -2, test=test, power=power)

    @property
    def n(self) -> int:
        """The number of training examples."""
        return self._race.n

    @property
    def decision(self) -> Decision:
        """Where the race stands."""
        return self._race.decision(self._stream)

    @property
    def looks(self) -> list[Look]:
        """Every look taken."""
        return self._race.looks(self._stream)

    def needed(self) -> list[int]:
        """The examples, in order, to score up to the next look (all remaining ones after the last look)."""
        return self._race.needed(self._stream)

    def record(self, example: int, score: float) -> Decision:
        """Buffer one result and take every look it completes; results after a stop are ignored.

        Raises:
            ValueError: On an unknown or repeated example, or a score outside ``[0, 1]``.
        """
        if self.decision.action == "continue":
            self._race.record(self._stream, example, score)
        return self.decision


# ---------------------------------------------------------------------------------------------------------------
# The scoring policy


class RacingPolicy:
    """The scoring policy of ``racing``: a step's new candidates race the bar, the leaders run in full early.

    Args:
        alpha: The level.
        seed: The run's seed (the example order and the rounding of fractional scores).
    """

    def __init__(self, *, alpha: float, seed: int):
        check_alpha(alpha)
        self.alpha, self.seed = alpha, seed

    def plan(self, candidates: Sequence[Candidate], baseline: Candidate,
             decided: Sequence[Candidate] = ()) -> RacingPlan:
        n = len(baseline.scores)
        return RacingPlan(candidates, baseline, decided=decided, alpha=self.alpha, seed=self.seed,
                          schedule=RacingSchedule.build(n))


def _raced_to(candidate: Candidate, n: int) -> int | None:
    """Where a decided candidate raced to (its stop, or n), or None for one not decided by a race."""
    if candidate.status == CandidateStatus.SCORED:
        return n
    if candidate.status == CandidateStatus.RACED_OUT and candidate.race is not None:
        return candidate.race.stopped_at
    return None


class RacingPlan:
    """The race of one phase: a :class:`StepRace` of the candidates to score, with the step's decided ones."""

    def __init__(self, candidates: Sequence[Candidate], baseline: Candidate, *, decided: Sequence[Candidate] = (),
                 alpha: float, seed: int, schedule: RacingSchedule | None = None, **race_options: Any):
        n = len(baseline.scores)
        baseline_scores = [score for score in baseline.scores if score is not None]
        if len(baseline_scores) != n:
            raise ValueError(f"candidate {baseline.id} is not scored on every training example, so it cannot be raced")
        ids = {c.id for c in candidates}
        frozen = {c.id: (c.scores, raced_to) for c in decided
                  if c.id not in ids and c.id != baseline.id and (raced_to := _raced_to(c, n)) is not None}
        self._against = baseline.id
        self._race = StepRace(incumbent=baseline_scores, entrants=[c.id for c in candidates],
                              order=example_order(n, seed=seed), schedule=schedule or RacingSchedule.build(n),
                              alpha=alpha, seed=seed, incumbent_id=baseline.id, decided=frozen, **race_options)
        for candidate in candidates:  # a race's decisions do not depend on arrival order
            for index, value in enumerate(candidate.scores):
                if value is not None and self._race.decision(candidate.id).action == "continue":
                    self._race.record(candidate.id, index, value)

    def next_round(self) -> dict[int, list[int]]:
        return self._race.next_round()

    def record(self, candidate_id: int, index: int, score: float) -> None:
        if self._race.decision(candidate_id).action == "continue":
            self._race.record(candidate_id, index, score)

    def decision(self, candidate_id: int) -> PlanDecision | None:
        decision = self._race.decision(candidate_id)
        if decision.action == "continue":
            return None
        stopped = decision.action == "stop"
        record = RaceRecord(against=self._against, examples=decision.examples, n=decision.n,
                            looks=[RaceLook(**dataclasses.asdict(look)) for look in self._race.looks(candidate_id)],
                            stopped_at=decision.examples if stopped else None, stopped_by=decision.stopped_by)
        return PlanDecision(stopped=stopped, mean=decision.mean, reason=decision.reason, race=record)


__all__ = [
    "DEFAULT_ALPHA",
    "Decision",
    "Look",
    "Race",
    "RacingPlan",
    "RacingPolicy",
    "RacingSchedule",
    "SequentialSignTest",
    "StepRace",
    "binomial_half_pmf",
    "check_alpha",
    "example_order",
    "threshold_table",
]
