"""Scoring candidates: which evaluations to run, and what each candidate's scoring came to.

:class:`CandidateScorer` scores a group of candidates on the training or validation split. It reads the run record
but never writes it: :meth:`CandidateScorer.score` returns a :class:`ScoringPhase`, an iterable of events the step
loop records as they arrive: every finished evaluation (:class:`~dspy_opro.scoring.evaluation.ExampleResult`) and,
once a candidate's scoring on the split has ended, a :class:`CandidateOutcome` that says what it came to:

* ``scored``: every example has a score; its mean is the candidate's score;
* ``unscored``: infrastructure failures (after a retry) left examples without a score;
* ``cut_short``: a budget stopped the phase first;
* ``raced_out``: its scoring policy stopped it early (racing, :mod:`dspy_opro.extensions.racing`).

Which examples run, and in which rounds, is a :class:`ScoringPolicy`'s decision. The paper's (:class:`FullScoring`)
runs every missing example of every candidate at once. A policy may instead run the candidates block by block and
stop some (racing): a round is run to its end before the next is planned, so which evaluations run depends on the
scores alone, never on the thread count or the order results arrive in.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import dspy

from dspy_opro.record.state import START_ID, Candidate, CandidateStatus, RaceRecord, Split, mean_score
from dspy_opro.scoring.evaluation import ExampleJob, ExampleResult
from dspy_opro.scoring.evaluator import Budget, Evaluator
from dspy_opro.task.data import RunData
from dspy_opro.task.programs import with_instructions

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# The scoring policy: which examples run in which round


@dataclass(frozen=True)
class PlanDecision:
    """What a scoring plan decided about one candidate.

    Attributes:
        stopped: The plan stopped it before every example was scored (``raced_out``).
        mean: Its mean over the examples the decision rests on (the partial mean when stopped).
        reason: The decision in words (``"raced out after 30 of 100"``), when stopped.
        race: The race's record, kept on the candidate.
    """

    stopped: bool
    mean: float | None = None
    reason: str | None = None
    race: RaceRecord | None = None


class ScoringPlan(Protocol):
    """One phase's schedule over a group of candidates on the training split."""

    def next_round(self) -> dict[int, list[int]]:
        """Candidate id -> the training indices it runs in the next round; empty when the phase is over."""
        ...

    def record(self, candidate_id: int, index: int, score: float) -> None:
        """One score of one candidate (in any order; recorded scores are replayed at the start)."""
        ...

    def decision(self, candidate_id: int) -> PlanDecision | None:
        """The plan's decision about a candidate, once it has one; None while it runs as the paper's would."""
        ...


class ScoringPolicy(Protocol):
    """Makes the plan of each training phase of a step's new candidates (the start and validation are always
    scored in full)."""

    def plan(self, candidates: Sequence[Candidate], baseline: Candidate,
             decided: Sequence[Candidate] = ()) -> ScoringPlan:
        """The plan for ``candidates``, whose recorded scores it replays, against ``baseline`` (the best candidate
        at the start of their step); ``decided`` are the step's candidates already scored or raced out."""
        ...


class FullScoring:
    """The paper's policy: every missing example of every candidate, in one round."""

    def plan(self, candidates: Sequence[Candidate], baseline: Candidate | None = None,
             decided: Sequence[Candidate] = ()) -> ScoringPlan:
        return _OneRound({c.id: [i for i, value in enumerate(c.scores) if value is None] for c in candidates})


class _OneRound:
    def __init__(self, rounds: dict[int, list[int]]):
        self._rounds: dict[int, list[int]] | None = rounds

    def next_round(self) -> dict[int, list[int]]:
        rounds, self._rounds = self._rounds or {}, None
        return rounds

    def record(self, candidate_id: int, index: int, score: float) -> None:
        pass

    def decision(self, candidate_id: int) -> PlanDecision | None:
        return None


# ---------------------------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True)
class CandidateOutcome:
    """A candidate whose scoring on a split ended: what the run records on it.

    Attributes:
        candidate_id: The candidate.
        split: ``"train"`` or ``"val"``.
        status: Training only: its new status (``scored``, ``unscored``, ``cut_short`` or ``raced_out``).
        score: The training mean (partial when raced out), or the validation mean; None when incomplete.
        reason: Why it is not ``scored``.
        race: The race record, where a policy raced it.
        infra_errors: The infrastructure failures that left examples without a score.
    """

    candidate_id: int
    split: Split
    status: CandidateStatus | None
    score: float | None
    reason: str | None = None
    race: RaceRecord | None = None
    infra_errors: tuple[str, ...] = ()


ScoringEvent = ExampleResult | CandidateOutcome


# ---------------------------------------------------------------------------------------------------------------
# Jobs


@dataclass
class EvaluationSetup:
    """What every evaluation of a run shares, and how the job of one (candidate, example) is built.

    Attributes:
        data: The run's examples.
        base: The program as given; a candidate's program is a copy with its instructions.
        instruction_pos: Where the instructions sit in the program (:mod:`dspy_opro.task.placement`).
        metric: The run's metric.
        metric_takes_trace: Whether it takes a third ``trace`` argument.
        settings: The DSPy settings every evaluation runs under (task LM, adapter).
        failure_score: The score of a run whose program raised.
        anchor_metric: Label-free OPRO: the metric the starting program's runs are scored by (it keeps each run
            as the anchor of its example); None otherwise.
    """

    data: RunData
    base: dspy.Module
    instruction_pos: str
    metric: Any
    metric_takes_trace: bool
    settings: dict[str, Any]
    failure_score: float
    anchor_metric: Any = None

    def program(self, candidate: Candidate) -> dspy.Module:
        """The program ``candidate`` runs: a copy of the program as given with the candidate's instructions."""
        return with_instructions(self.base, candidate.instructions, instruction_pos=self.instruction_pos)

    def jobs(self, candidate: Candidate, split: Split, indices: Sequence[int]) -> Iterator[ExampleJob]:
        examples = self.data.examples(split)
        program = self.program(candidate)
        anchored = self.anchor_metric is not None
        anchor = anchored and candidate.id == START_ID  # its runs are the anchors: they show no answer
        for i in indices:
            yield ExampleJob(
                candidate_id=candidate.id, index=i, program=program, example=examples[i],
                metric=self.anchor_metric if anchor else self.metric, failure_score=self.failure_score,
                settings=self.settings, split=split,
                answer_fields=None if anchor else self.data.answer_fields(i, split), keep_trace=anchored,
                metric_takes_trace=self.metric_takes_trace, judge_failures=anchored)


# ---------------------------------------------------------------------------------------------------------------
# The scorer


class ScoringPhase:
    """The events of one scoring phase, in the order they happen; ``stop_reason`` is set once consumed.

    ``stop_reason`` is the budget's reason when it stopped the phase early (the candidates it cut short are in the
    events), else None.
    """

    def __init__(self, events: Generator[ScoringEvent, None, str | None]):
        self._events = events
        self.stop_reason: str | None = None

    def __iter__(self) -> Iterator[ScoringEvent]:
        self.stop_reason = yield from self._events


class CandidateScorer:
    """Decides which evaluations a group of candidates needs and what each candidate's scoring came to.

    Args:
        setup: Builds the jobs.
        evaluator: Runs them.
        budget: Stops a phase once spent.
        policy: The scoring policy of a step's new candidates (:class:`FullScoring` unless racing).
    """

    def __init__(self, *, setup: EvaluationSetup, evaluator: Evaluator, budget: Budget,
                 policy: ScoringPolicy | None = None):
        self.setup, self.evaluator, self.budget = setup, evaluator, budget
        self.policy: ScoringPolicy = policy or FullScoring()

    def score(self, candidates: Sequence[Candidate], split: Split, *, baseline: Candidate | None = None,
              decided: Sequence[Candidate] = ()) -> ScoringPhase:
        """Score ``candidates`` on every example of ``split`` they have no score for.

        Args:
            candidates: The candidates; their recorded scores are read, never written.
            split: ``"train"`` or ``"val"``.
            baseline: The best candidate at the start of the candidates' step: training phases with one are planned
                by the scoring policy (the start and a baseline itself are always scored in full).
            decided: The step's candidates already scored or raced out, which the policy may race against.
        """
        return ScoringPhase(self._events(list(candidates), split, baseline, list(decided)))

    def _events(self, candidates: list[Candidate], split: Split, baseline: Candidate | None,
                decided: list[Candidate]) -> Generator[ScoringEvent, None, str | None]:
        n = len(self.setup.data.examples(split))
        scores = {c.id: list(_scores_of(c, split, n)) for c in candidates}
        infra: dict[int, list[str]] = {c.id: [] for c in candidates}
        raced = [c for c in candidates if baseline is not None and split == "train" and c.id not in
                 (START_ID, baseline.id)]
        plans: list[tuple[ScoringPlan, set[int]]] = []
        if raced:
            plans.append((self.policy.plan(raced, baseline, decided), {c.id for c in raced}))  # type: ignore[arg-type]
        rest = [c for c in candidates if c not in raced]
        if rest:
            plans.append((_OneRound({c.id: _missing(scores[c.id]) for c in rest}), {c.id for c in rest}))
        plan_of = {cid: plan for plan, ids in plans for cid in ids}
        by_id = {c.id: c for c in candidates}
        open_ids = [c.id for c in candidates]
        for cid in list(open_ids):  # decided by their recorded scores already (a resumed race), or nothing to run
            outcome = self._decided(by_id[cid], split, scores[cid], plan_of[cid])
            if outcome is not None:
                open_ids.remove(cid)
                yield outcome
        stop_reason: str | None = None
        while stop_reason is None and open_ids:
            round_jobs: list[tuple[Candidate, list[int]]] = []
            for plan, ids in plans:
                for cid, indices in plan.next_round().items():
                    todo = [i for i in indices if scores[cid][i] is None]
                    if cid in ids and cid in open_ids and not infra[cid] and todo:
                        round_jobs.append((by_id[cid], todo))
            if not round_jobs:
                break
            batch = self.evaluator.run(
                (job for candidate, indices in round_jobs for job in self.setup.jobs(candidate, split, indices)),
                self.budget)
            for result in batch:
                yield result
                cid = result.candidate_id
                if result.outcome == "infra":
                    infra[cid].append(result.error or "unknown error")
                if result.score is None:
                    continue
                scores[cid][result.index] = result.score
                if cid not in open_ids:
                    continue  # a result past its candidate's stop: paid and recorded, the decision stands
                plan = plan_of[cid]
                plan.record(cid, result.index, result.score)
                for other in [o for o in open_ids if plan_of[o] is plan]:  # a look may stop any candidate it races
                    decision = plan.decision(other)
                    if decision is not None and decision.stopped:
                        open_ids.remove(other)
                        yield CandidateOutcome(other, split, CandidateStatus.RACED_OUT, decision.mean,
                                               decision.reason, decision.race)
            stop_reason = batch.stop_reason
        for cid in open_ids:
            yield self._ended(cid, split, scores[cid], plan_of[cid], infra[cid], stop_reason)
        return stop_reason

    def _decided(self, candidate: Candidate, split: Split, scores: list[float | None],
                 plan: ScoringPlan) -> CandidateOutcome | None:
        decision = plan.decision(candidate.id)
        if decision is not None and decision.stopped:
            return CandidateOutcome(candidate.id, split, CandidateStatus.RACED_OUT, decision.mean, decision.reason,
                                    decision.race)
        if _missing(scores):
            return None
        return self._ended(candidate.id, split, scores, plan, [], None)

    @staticmethod
    def _ended(cid: int, split: Split, scores: list[float | None], plan: ScoringPlan, infra: list[str],
               stop_reason: str | None) -> CandidateOutcome:
        complete = not _missing(scores)
        if split == "val":
            return CandidateOutcome(cid, split, None, mean_score(scores) if complete else None,
                                    infra_errors=tuple(infra))
        decision = plan.decision(cid)
        race = decision.race if decision is not None else None
        if complete:
            return CandidateOutcome(cid, split, CandidateStatus.SCORED, mean_score(scores), race=race)
        if stop_reason is not None:
            return CandidateOutcome(cid, split, CandidateStatus.CUT_SHORT, None, f"cut short: {stop_reason}", race)
        if infra:
            reason = f"LM failures on {len(infra)} examples after a retry; last: {infra[-1]}"
            return CandidateOutcome(cid, split, CandidateStatus.UNSCORED, None, reason, race, tuple(infra))
        # A plan that ended its rounds with examples left (it should not): left for the next compile to finish.
        return CandidateOutcome(cid, split, CandidateStatus.CUT_SHORT, None, "cut short: the scoring plan ended", race)


def _scores_of(candidate: Candidate, split: Split, n: int) -> list[float | None]:
    if split == "train":
        return candidate.scores
    return candidate.val_scores if candidate.val_scores is not None else [None] * n


def _missing(scores: list[float | None]) -> list[int]:
    return [i for i, value in enumerate(scores) if value is None]


__all__ = [
    "CandidateOutcome",
    "CandidateScorer",
    "EvaluationSetup",
    "FullScoring",
    "PlanDecision",
    "ScoringEvent",
    "ScoringPhase",
    "ScoringPlan",
    "ScoringPolicy",
]
