"""Racing: stop scoring a candidate instruction once it is clearly below the bar.

OPRO scores every proposal on the whole training set, although most of a step's proposals score well below the
best. Racing scores a step's new candidates together, block by block, in one seeded order of the training examples
(:func:`example_order`, the same for every candidate, so every comparison is paired), and stops a candidate as soon
as an exact sequential test says that its training mean is below the *bar*: at first the training mean of the best
candidate at the start of the step (the *incumbent*). :class:`StepRace` is the race of one step's candidates and
:class:`RacingPolicy` the scoring policy that runs it; no LM call is made here.

**Looks and lockstep.** Decisions (*looks*, a :class:`RacingSchedule`) are taken after ``max(5, ceil(n / 20))``
examples, then every ``ceil(n / 20)``, none at ``n`` (a candidate that reaches ``n`` is fully scored), each once
every candidate still racing has run the examples up to it, so every decision rests on the same first examples.
A candidate the test finds below the bar is stopped (``raced_out``) with its partial mean.

**Leaders.** The incumbent is often weak early in a run, when most of a step's proposals beat it. So after the
third look a leader is found and run in full, and after the fourth look another: once a leader is fully scored,
its training total becomes the bar if it is higher. A lead goes to a front-runner (most right answers so far,
ties: the lowest id) only when its running rate of right answers is at least the bar's rate: a leader below the
bar cannot raise it, and running it in full would pay for examples the test would mostly have spared. The
front-runner after a few looks is often a weaker candidate with a lucky start, so when the race is close (up to
four front-runners within ``ceil(sqrt(k / 2))`` right answers of the first, one standard deviation of the
difference of two counts) they race ahead as *scouts* to twice the examples, the better half by right answers
again to twice that, until one is left, which leads. While a leader or the scouts run, the others wait where they
stand; when the bar rises they are tested again at once, at every look they have passed.

**The threshold test** (:func:`threshold_table`; binary incumbent scores and ``n <= 500``). A candidate with ``T``
right answers among the ``n`` examples, visited in a uniformly random order, has a hypergeometric number of right
answers among its first ``k``. For the bar ``t``, a dynamic programme over that walk at ``T = t`` gives each look's
critical count: the largest whose probability of being reached without an earlier stop fits the level spent so
far. Each bar's counts are then lowered to the smallest of any higher bar's, so they never decrease when the bar
rises. Fractional scores of a candidate are rounded to 0 or 1 with a seeded coin (``P(1) = score``).
**Guarantee:** for any fixed training set, a candidate whose training total is at least every bar of its race is
stopped with probability at most ``alpha`` over the order; exact, no i.i.d. assumption. Every stop (at a look,
after a raise, after scouting) finds its right answers among its first ``k_j`` examples at or below look ``j``'s
count for the bar of the moment, which is at most the count for its own total: so, whatever chose the bars and
when, the stop lies in the event that the walk at its own total crosses the table, of probability at most ``alpha``.

**The sign test** (:class:`SequentialSignTest`; an incumbent scored fractionally, or ``n > 500``; no leaders). On
example ``i`` the difference ``D_i = s_a(i) - s_b(i)`` becomes a sign ``T_i`` in ``{-1, 0, +1}`` with
``E[T_i | D_i] = D_i`` (``sign(D_i)`` with probability ``|D_i|``, else 0); among the non-zero signs the share of
``-1`` is at most ``1/2`` exactly when ``E[s_a] >= E[s_b]``. Given the numbers of non-zero signs at the looks, the
count of ``-1`` signs is a binomial walk, and a dynamic programme at share ``1/2`` gives the smallest critical
count at each look whose exact crossing probability, without an earlier crossing, fits the level spent so far.
**Guarantee:** if the examples are independent draws under which ``E[s_a] >= E[s_b]``, the test rejects with
probability at most ``alpha`` (the rejection region is an upper set, so share ``1/2`` is the worst case; stopping
early only removes chances to reject), for any number of ties.

Both tests spend ``alpha * (k_j / k_last) ** power`` by look ``j``; racing's ``power = 0.5`` spends more of the
level early than linear spending. Results may arrive in any order (from any number of threads): a race buffers
them and decides only once every example a decision rests on is in, so the decisions depend on the scores alone.
A candidate decided in an earlier compile of the same run (``decided``) takes part through the same logic on its
recorded scores and never runs an example again, so a resumed step takes the decisions an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from dspy_opro.scoring.scorer import PlanDecision
from dspy_opro.state import Candidate, CandidateStatus, RaceLook, RaceRecord

logger = logging.getLogger(__name__)

DEFAULT_ALPHA = 0.05
MIN_FIRST_LOOK = 5
LOOKS_PER_RUN = 20  # one look every n / 20 examples
MAX_THRESHOLD_N = 500  # the threshold test's table is (n + 1) x (n + 1); larger training sets use the sign test
SPENDING_POWER = 0.5  # the level spent by look j: alpha * (k_j / k_last) ** 0.5
LEADERS = 2  # leaders per step, run in full early to raise the bar
LEAD_AFTER = 3  # the first leader is chosen after the third look
SCOUTS = 4  # front-runners racing ahead for each lead

LeadRule = Literal["always", "at_bar"]


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer (the number of training examples), got {n!r}")


def check_alpha(alpha: float) -> None:
    """Raise ``ValueError`` unless the racing level ``alpha`` is a number in ``(0, 1)``."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or math.isnan(alpha) or not 0.0 < alpha < 1.0:
        raise ValueError(f"Racing(alpha=...) must be a number in (0, 1), for example 0.05, got {alpha!r}")


def example_order(n: int, *, seed: int) -> list[int]:
    """The permutation of ``range(n)`` in which every race visits the training examples, fixed by the seed."""
    _check_n(n)
    return [int(i) for i in np.random.default_rng([int(seed), 0x0A11CE]).permutation(n)]


@dataclass(frozen=True)
class RacingSchedule:
    """When a race takes decisions: after ``looks[0]``, ``looks[1]``, ... of its ``n`` examples (strictly
    increasing counts in ``[1, n)``; none when ``n`` is too small to race)."""

    n: int
    looks: tuple[int, ...]

    @classmethod
    def build(cls, n: int, *, min_examples: int | None = None, block_size: int | None = None) -> RacingSchedule:
        """A first look after ``min_examples`` examples (default ``max(5, ceil(n / 20))``), then one every
        ``block_size`` (default ``ceil(n / 20)``), stopping before ``n``; ``ValueError`` unless all are positive."""
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


# One decision of a test after ``examples`` (``k_j``) examples: the counts of ``-1`` signs (``worse``: the candidate
# lost) and ``+1`` signs (``better``), the ``critical`` count of ``-1`` signs at or above which it is stopped (``None``:
# none possible), the cumulative level ``spent`` up to this look (exact, at share ``1/2``), whether it stopped the
# candidate, and the id of the instruction compared with (``against``), where named. The record keeps it as it is.
Look = RaceLook


class SequentialSignTest:
    """An exact group-sequential one-sided sign test with power-family level spending over planned looks.

    Feed it the looks in order with :meth:`look`. The critical values depend only on the numbers of non-zero signs
    seen, never on their direction, which keeps the level exact; so the test of ``a`` against ``b`` and the test of
    ``b`` against ``a`` share their critical values.

    ``alpha`` is the overall level, ``looks`` the planned example counts (:class:`RacingSchedule`) and ``power``
    the spending exponent: ``alpha * (k_j / k_last) ** power`` is spent by look ``j`` (1: linear).
    """

    def __init__(self, *, alpha: float, looks: Sequence[int], power: float = 1.0) -> None:
        check_alpha(alpha)
        if isinstance(power, bool) or not isinstance(power, (int, float)) or not power > 0.0:
            raise ValueError(f"power must be a positive number (1: linear spending), got {power!r}")
        self.alpha, self.looks, self.power = float(alpha), tuple(looks), float(power)
        self._mass = np.ones(1)  # P(count of -1 signs = x and not rejected yet), at share 1/2
        self._nonzero, self._spent, self._index = 0, 0.0, 0  # non-zero signs, level spent, looks taken

    def look(self, *, examples: int, worse: int, better: int) -> Look:
        """Take the next planned look with the cumulative counts of ``-1`` and ``+1`` signs; ``stop`` is True when
        the candidate is significantly worse. ``ValueError`` on a look out of order or counts that shrink."""
        nonzero = worse + better
        if worse < 0 or better < 0 or nonzero < self._nonzero or nonzero > examples:
            raise ValueError(f"counts worse={worse}, better={better} at {examples} examples are not cumulative")
        if self._index >= len(self.looks) or examples != self.looks[self._index]:
            raise ValueError(f"look at {examples} examples is not the next planned look of {self.looks}")
        self._mass = np.convolve(self._mass, binomial_half_pmf(nonzero - self._nonzero))
        self._nonzero = nonzero
        budget = self.alpha * (examples / self.looks[-1]) ** self.power - self._spent
        # tails[c] = P(count >= c); the smallest c whose tail fits the budget is the critical value.
        tails = np.cumsum(self._mass[::-1])[::-1]
        fitting = np.flatnonzero(tails <= budget)
        # 0 fits only when no mass is left; a count of 0 never stops a candidate.
        critical = (int(fitting[0]) or None) if fitting.size else None
        if critical is not None:
            self._spent += float(tails[critical])
            self._mass[critical:] = 0.0
        self._index += 1
        return Look(examples=examples, worse=worse, better=better, critical=critical, spent=self._spent,
                    stop=critical is not None and worse >= critical)


@functools.lru_cache(maxsize=16)
def threshold_table(n: int, looks: tuple[int, ...], alpha: float, power: float = 1.0) -> np.ndarray:
    """The threshold test's critical counts, an integer array of shape ``(n + 1, len(looks))``.

    Row ``t`` holds, per look, the most right answers at which a candidate is stopped when the bar is ``t``
    (``-1``: no stop possible): the exact critical count at total ``t``, replaced by the smallest one of any higher
    bar, so that the counts never decrease with the bar and a race may raise its bar between looks. ``power`` is
    the spending exponent.
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


@dataclass(frozen=True)
class Decision:
    """Where a race stands: ``"continue"`` (keep scoring), ``"stop"`` (raced out, by ``stopped_by``) or
    ``"complete"`` (all ``n`` scored), resting on the first ``examples`` of the order, with the candidate's
    ``mean`` over them (its partial mean when stopped; ``None`` before any look)."""

    action: Literal["continue", "stop", "complete"]
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


@dataclass
class _Entrant:
    scores: dict[int, float]
    coins: np.ndarray
    decided: int | None = None  # decided in an earlier compile: the examples it raced (n: ran in full); else None
    sign: SequentialSignTest | None = None  # its paired sign test against the incumbent, when that is the test
    prefix: int = 0  # the first `prefix` examples of the order are in
    position: int = 0  # the examples the race has asked of it and taken decisions on
    stopped_at: int | None = None
    stopped_by: int | None = None
    withdrawn: bool = False
    scout_to: int | None = None  # running ahead to this many examples, in a tournament for the lead
    leader: bool = False
    looks: list[Look] = dataclasses.field(default_factory=list)


class StepRace:
    """The race of one step's candidates: stopped when clearly below the bar, the leaders run in full.

    Args:
        incumbent: The incumbent's score on every training example (indexed by example), each in ``[0, 1]``.
        entrants: The ids of the step's candidates that race now, in the ``order`` of :func:`example_order`, with
            the looks of ``schedule``; ``seed`` seeds the rounding of fractional scores.
        test: ``"threshold"``, ``"sign"``, or ``"auto"``: the threshold test when the incumbent's scores are all
            0 or 1 and ``n <= MAX_THRESHOLD_N``, else the sign test.
        leaders: How many leaders run in full early to raise the bar (threshold test only), the first after look
            ``lead_after`` (from 1), the next after the next looks; each with up to ``scouts`` scouts (1: the
            front-runner leads at once). ``power`` is the tests' spending exponent (1: linear).
        decided: Candidates of the same step decided in an earlier compile, by id: their recorded scores (``None``
            where not run) and the examples they raced (where they stopped, or ``n``), taken as they were then.
        lead_rule: When a front-runner leads: ``"at_bar"`` (the default) only when its running rate of right
            answers is at least the bar's rate (``right / k >= bar / n``), else no leader at that look; ``"always"``
            every time (0.3.0 before issue 24's second round, kept for the benchmarks' comparison).
    """

    def __init__(self, *, incumbent: Sequence[float], entrants: Sequence[int], order: Sequence[int],
                 schedule: RacingSchedule, alpha: float = DEFAULT_ALPHA, seed: int = 0, incumbent_id: int = -1,
                 test: Literal["auto", "threshold", "sign"] = "auto", leaders: int = LEADERS,
                 lead_after: int = LEAD_AFTER, scouts: int = SCOUTS, power: float = SPENDING_POWER,
                 decided: Mapping[int, tuple[Sequence[float | None], int]] | None = None,
                 lead_rule: LeadRule = "at_bar") -> None:
        check_alpha(alpha)
        n = len(order)
        if schedule.n != n or len(incumbent) != n or sorted(order) != list(range(n)):
            raise ValueError(f"order ({n} examples), schedule (n={schedule.n}) and incumbent scores ({len(incumbent)}) "
                             "must cover the same training set; build them from the same n")
        decided = dict(decided or {})
        if len(set(entrants)) != len(entrants) or set(entrants) & set(decided) or incumbent_id in entrants:
            raise ValueError(f"candidate ids must be distinct: entrants {list(entrants)}, decided {sorted(decided)}, "
                             f"incumbent {incumbent_id}")
        if lead_rule not in ("always", "at_bar"):
            raise ValueError(f"lead_rule must be 'always' or 'at_bar', got {lead_rule!r}")
        if isinstance(scouts, bool) or not isinstance(scouts, int) or scouts < 1:
            raise ValueError(f"scouts must be a positive integer, got {scouts!r}")
        self._incumbent = [_check_score(v, f"incumbent score of example {i}") for i, v in enumerate(incumbent)]
        if test == "auto":
            binary = all(v in (0.0, 1.0) for v in self._incumbent)
            test = "threshold" if binary and n <= MAX_THRESHOLD_N else "sign"
        self.test: Literal["threshold", "sign"] = "threshold" if test == "threshold" else "sign"
        self._order = list(order)
        self._position = {example: p for p, example in enumerate(self._order)}
        self._looks = schedule.looks
        self._alpha, self._power = float(alpha), float(power)
        self._lead_at = set(range(lead_after - 1, lead_after - 1 + leaders)) if self.test == "threshold" else set()
        self._scouts_per_lead = scouts
        self._lead_rule: LeadRule = lead_rule
        self._scouts: list[int] = []  # the running tournament's scouts
        self._bar = math.ceil(sum(self._incumbent) - 1e-9)
        self._bar_id = incumbent_id
        self._bars_applied: set[int] = set()
        self._entrants: dict[int, _Entrant] = {}
        for cid in [*entrants, *sorted(decided)]:
            scores: dict[int, float] = {}
            raced_to = None
            if cid in decided:
                recorded, raced_to = decided[cid]
                known = {i: _check_score(v, f"score of example {i}") for i, v in enumerate(recorded) if v is not None}
                if len(recorded) != n or any(e not in known for e in self._order[:raced_to]):
                    raise ValueError(f"decided candidate {cid} has no score on some of the {raced_to} examples it "
                                     "raced")
                scores = {e: known[e] for e in self._order[:raced_to]}
            sign = SequentialSignTest(alpha=alpha, looks=self._looks, power=power) if self.test == "sign" else None
            self._entrants[cid] = _Entrant(scores=scores, coins=np.random.default_rng([int(seed), int(cid), 0x5160])
                                           .random(n), decided=raced_to, sign=sign)
        self._next_look = 0  # index into the looks
        self._asked: dict[int, list[int]] = {}
        self._advance()

    @property
    def n(self) -> int:
        return len(self._order)

    @property
    def bar(self) -> tuple[int, int]:
        """The current bar: the training total a candidate must reach, and the id of the candidate it comes from."""
        return self._bar, self._bar_id

    def _racing(self, cid: int) -> bool:
        """Taking looks: neither stopped, withdrawn, a leader nor a scout."""
        e = self._entrants[cid]
        return not (e.stopped_at is not None or e.withdrawn or e.leader or e.scout_to is not None)

    def needed(self, cid: int) -> list[int]:
        """The examples candidate ``cid`` runs next: up to the next look (a leader, and everyone after the last
        look: all the rest; a scout: up to its mark); nothing while a leader or the scouts run."""
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
            upto = self._looks[self._next_look] if self._next_look < len(self._looks) else self.n
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
        """Buffer one result of a racing candidate and take every decision it completes (``ValueError`` on an
        unknown candidate or example, a repeated example, or a score outside ``[0, 1]``)."""
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
            if self._raise_bar():  # those still racing waited at their last look: tested again at each look passed
                for cid in sorted(self._entrants):
                    if self._racing(cid):
                        self._stop_below(cid, self._passed(cid))
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
        """A decided candidate asked beyond what it raced stops there, as it did then (if the race has changed)."""
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
        for cid, e in sorted(self._entrants.items()):
            if e.leader and not e.withdrawn and e.stopped_at is None and cid not in self._bars_applied:
                self._bars_applied.add(cid)
                total = math.ceil(sum(e.scores.values()) - 1e-9)
                if total > self._bar:
                    self._bar, self._bar_id, raised = total, cid, True
        return raised

    def _stop_below(self, cid: int, indexes: Sequence[int]) -> bool:
        """Test ``cid`` against the bar at the looks (latest first); the first stop is recorded and ends it there."""
        entrant = self._entrants[cid]
        for index in sorted(indexes, reverse=True):
            look = self._threshold_look(cid, index)
            if not look.stop:
                continue
            if entrant.decided == self.n:
                return False  # ran in full in an earlier compile: never decided again
            entrant.looks.append(look)
            entrant.stopped_at, entrant.stopped_by = entrant.position, self._bar_id
            logger.debug("Candidate %d raced out after %d of %d examples: %s", cid, entrant.position, self.n, look)
            return True
        return False

    def _threshold_look(self, cid: int, index: int) -> Look:
        k = self._looks[index]
        right = self._right(cid, k)
        critical = int(threshold_table(self.n, self._looks, self._alpha, self._power)[self._bar, index])
        return Look(examples=k, worse=k - right, better=right, critical=k - critical if critical >= 0 else None,
                    spent=self._alpha * (k / self._looks[-1]) ** self._power, stop=right <= critical,
                    against=self._bar_id)

    def _passed(self, cid: int) -> list[int]:
        """The indexes of the looks candidate ``cid`` has run the examples of."""
        return [index for index, k in enumerate(self._looks) if k <= self._entrants[cid].position]

    def _take_look(self, index: int, k: int, racing: list[int]) -> None:
        for cid in racing:
            entrant = self._entrants[cid]
            entrant.position = max(entrant.position, k)
            if entrant.sign is None:  # the threshold test
                if not self._stop_below(cid, [index]):  # not stopped (a candidate run in full never is)
                    entrant.looks.append(self._threshold_look(cid, index).model_copy(update={"stop": False}))
                continue
            signs = [d for e in self._order[:k]  # the paired signs against the incumbent, from the candidate's side
                     if (d := entrant.scores[e] - self._incumbent[e]) != 0.0 and entrant.coins[e] < abs(d)]
            look = entrant.sign.look(examples=k, worse=sum(d < 0.0 for d in signs), better=sum(d > 0.0 for d in signs))
            look = look.model_copy(update={"against": self._bar_id})
            entrant.looks.append(look)
            if look.stop and entrant.decided != self.n:
                entrant.stopped_at, entrant.stopped_by = k, self._bar_id
                logger.debug("Candidate %d raced out after %d of %d examples: %s", cid, k, self.n, look)
        if index in self._lead_at:
            self._start_lead(k, [cid for cid in racing if self._entrants[cid].stopped_at is None])

    def _start_lead(self, k: int, contenders: list[int]) -> None:
        """The front-runners after ``k`` examples (ties: the lowest id) at the bar's rate race ahead as scouts, or
        the first of them leads at once (one scout, or no look left to race ahead to)."""
        eligible = [cid for cid in self._ranked(contenders, k)
                    if self._lead_rule == "always" or self._at_bar_rate(cid, k)]
        if eligible:  # only a close race needs scouts: those within one standard deviation of the first
            first = self._right(eligible[0], k)
            eligible = [cid for cid in eligible if self._right(cid, k) >= first - math.ceil(math.sqrt(k / 2))]
        mark = self._scout_mark(k)
        chosen = eligible[: self._scouts_per_lead if mark is not None else 1]
        if not chosen:
            return
        if len(chosen) == 1:
            self._entrants[chosen[0]].leader = True
            logger.debug("Candidate %d leads after %d examples and runs in full", chosen[0], k)
            return
        self._scouts = chosen
        for cid in chosen:
            self._entrants[cid].scout_to = mark
        logger.debug("Candidates %s race ahead to %d examples for the lead", chosen, mark)

    def _right(self, cid: int, k: int) -> int:
        """Right answers among the first ``k`` examples, fractional scores rounded with the seeded coins."""
        entrant = self._entrants[cid]
        return sum(entrant.coins[e] < entrant.scores[e] for e in self._order[:k])

    def _ranked(self, cids: Sequence[int], k: int) -> list[int]:
        """``cids`` by right answers among the first ``k`` examples, most first (ties: the lowest id)."""
        return sorted(cids, key=lambda cid: (-self._right(cid, k), cid))

    def _at_bar_rate(self, cid: int, k: int) -> bool:
        return self._right(cid, k) * self.n >= self._bar * k

    def _scout_mark(self, k: int) -> int | None:
        """Where scouts chosen after ``k`` run to: the first look at ``2 * k`` or more, else the last; None: none."""
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
            if self._lead_rule == "always" or self._at_bar_rate(ahead[0], k):
                self._entrants[ahead[0]].leader = True
                logger.debug("Candidate %d leads after %d examples and runs in full", ahead[0], k)
            behind = [cid for cid in ranked if not self._entrants[cid].leader]
        else:
            self._scouts = ahead
            for cid in ahead:
                self._entrants[cid].scout_to = mark
        for cid in behind:  # scouts exist only in the threshold test
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


class RacingPolicy:
    """The scoring policy of ``racing``: a step's new candidates race the bar, the leaders run in full early, at
    the level ``alpha`` (checked by :class:`dspy_opro.extensions.Racing`) and the run's seed."""

    def __init__(self, *, alpha: float, seed: int):
        self.alpha, self.seed = alpha, seed

    def plan(self, candidates: Sequence[Candidate], baseline: Candidate,
             decided: Sequence[Candidate] = ()) -> RacingPlan:
        return RacingPlan(candidates, baseline, decided=decided, alpha=self.alpha, seed=self.seed)


class RacingPlan:
    """The race of one phase: a :class:`StepRace` of the candidates to score, with the step's decided ones."""

    def __init__(self, candidates: Sequence[Candidate], baseline: Candidate, *, decided: Sequence[Candidate] = (),
                 alpha: float, seed: int, schedule: RacingSchedule | None = None, **race_options: Any):
        n = len(baseline.scores)
        baseline_scores = [score for score in baseline.scores if score is not None]
        if len(baseline_scores) != n:
            raise ValueError(f"candidate {baseline.id} is not scored on every training example, so it cannot be raced")
        ids = {c.id for c in candidates} | {baseline.id}
        frozen: dict[int, tuple[Sequence[float | None], int]] = {}
        for c in decided:  # where each decided candidate raced to: its stop, or n (None: not decided by a race)
            race = c.race if c.status == CandidateStatus.RACED_OUT else None
            raced_to = n if c.status == CandidateStatus.SCORED else race.stopped_at if race is not None else None
            if c.id not in ids and raced_to is not None:
                frozen[c.id] = (c.scores, raced_to)
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
                            looks=[look.model_copy() for look in self._race.looks(candidate_id)],
                            stopped_at=decision.examples if stopped else None, stopped_by=decision.stopped_by)
        return PlanDecision(stopped=stopped, mean=decision.mean, reason=decision.reason, race=record)
