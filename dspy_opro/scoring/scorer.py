"""Scoring candidates: which evaluations to run, in which rounds, and what each candidate's scoring came to.

:meth:`CandidateScorer.score` scores a group of candidates on the training or validation split. Each round gives
every candidate still open the examples it needs as one ``dspy.Evaluate`` call
(:class:`~dspy_opro.scoring.engine.CandidateEvaluate`); the round's calls run at once, sharing ``num_threads``
evaluations in flight, so that a round of eight candidates on a small training split keeps every thread busy, as
racing's blocks need (DSPy's optimizers evaluate one candidate after another). Every finished evaluation is
recorded as it arrives (the ``record_result`` of the run), and once a candidate's scoring on the split has ended, a
:class:`CandidateOutcome` says what it came to:

* ``scored``: every example has a score; its mean is the candidate's score;
* ``unscored``: infrastructure failures (after a retry) left examples without a score;
* ``cut_short``: a budget stopped the phase first;
* ``raced_out``: its scoring policy stopped it early (racing, :mod:`dspy_opro.extensions.racing`).

Which examples run in which round is a :class:`ScoringPolicy`'s decision. The paper's (:class:`FullScoring`) runs
every missing example of every candidate in one round. A policy may instead run the candidates block by block and
stop some (racing): a round is run to its end before the next is planned, so which evaluations run depends on the
scores alone, never on the thread count or the order results arrive in.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import dspy

from dspy_opro.compat import mlflow_traces_by_latest_run
from dspy_opro.scoring.engine import Budget, CandidateEvaluate, RoundSlots, Runner
from dspy_opro.scoring.evaluation import ExampleJob, ExampleResult
from dspy_opro.scoring.usage import UsageMeter
from dspy_opro.state import START_ID, Candidate, CandidateStatus, RaceRecord, Split, mean_score
from dspy_opro.task.data import RunData
from dspy_opro.task.programs import predictor_map, with_instructions

logger = logging.getLogger(__name__)

METRIC_KEYS = {"train": "eval", "val": "eval_val"}  # MLflow's keys: each split's score history on the compile's run


@dataclass(frozen=True)
class PlanDecision:
    """What a scoring plan decided about one candidate: ``stopped`` before every example was scored (raced out),
    with its mean over the examples the decision rests on, the decision in words, and the race's record."""

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
    """Makes the plan of each training phase of a step's new candidates (the start and validation are always scored
    in full)."""

    def plan(self, candidates: Sequence[Candidate], baseline: Candidate,
             decided: Sequence[Candidate] = ()) -> ScoringPlan:
        """The plan for ``candidates``, whose recorded scores it replays, against ``baseline`` (the best candidate at
        the start of their step); ``decided`` are the step's candidates already scored or raced out."""
        ...


class _OneRound:
    """The paper's plan: every missing example of every candidate, in one round."""

    def __init__(self, rounds: dict[int, list[int]]):
        self._rounds: dict[int, list[int]] | None = rounds

    def next_round(self) -> dict[int, list[int]]:
        rounds, self._rounds = self._rounds or {}, None
        return rounds

    def record(self, candidate_id: int, index: int, score: float) -> None:
        pass

    def decision(self, candidate_id: int) -> PlanDecision | None:
        return None


class FullScoring:
    """The paper's policy: every missing example of every candidate, in one round."""

    def plan(self, candidates: Sequence[Candidate], baseline: Candidate | None = None,
             decided: Sequence[Candidate] = ()) -> ScoringPlan:
        return _OneRound({c.id: _missing(c.scores) for c in candidates})


@dataclass(frozen=True)
class CandidateOutcome:
    """A candidate whose scoring on a split ended: its new status (training only), its mean (partial when raced out,
    None when incomplete), why it is not ``scored``, the race record, and the infrastructure failures it met."""

    candidate_id: int
    split: Split
    status: CandidateStatus | None
    score: float | None
    reason: str | None = None
    race: RaceRecord | None = None
    infra_errors: tuple[str, ...] = ()


@dataclass
class EvaluationSetup:
    """What every evaluation of a run shares, and how the job of one (candidate, example) is built.

    Attributes:
        data: The run's examples.
        base: The program as given; a candidate's program is a copy with its instructions.
        instruction_pos: Where the instructions sit in the program (:mod:`dspy_opro.task.placement`).
        metric: The run's metric, and whether it takes a third ``trace`` argument.
        settings: The DSPy settings every evaluation runs under (task LM, adapter).
        failure_score: The score of a run whose program raised.
        meter: The run's usage meter (the LMs of each candidate's predictors are attached to it).
        anchor_metric: Label-free OPRO: the metric the starting program's runs are scored by; None otherwise.
    """

    data: RunData
    base: dspy.Module
    instruction_pos: str
    metric: Any
    metric_takes_trace: bool
    settings: dict[str, Any]
    failure_score: float
    meter: UsageMeter | None = None
    anchor_metric: Any = None

    def program(self, candidate: Candidate) -> dspy.Module:
        """The program ``candidate`` runs: a copy of the program as given with the candidate's instructions."""
        return with_instructions(self.base, candidate.instructions, instruction_pos=self.instruction_pos)

    def job_maker(self, candidate: Candidate, program: dspy.Module, split: Split) -> Callable[[int], ExampleJob]:
        """Makes the job of one example of ``split`` for ``candidate`` running ``program``."""
        examples = self.data.examples(split)
        anchored = self.anchor_metric is not None
        anchor = anchored and candidate.id == START_ID  # its runs are the anchors: they show no answer
        if self.meter is not None:
            self.meter.attach(getattr(p, "lm", None) for p in predictor_map(program).values())

        def job(index: int) -> ExampleJob:
            return ExampleJob(
                candidate_id=candidate.id, index=index, program=program, example=examples[index],
                metric=self.anchor_metric if anchor else self.metric, failure_score=self.failure_score,
                settings=self.settings, split=split, keep_trace=anchored, metric_takes_trace=self.metric_takes_trace,
                answer_fields=None if anchor else self.data.answer_fields(index, split), judge_failures=anchored,
                meter=self.meter)

        return job


class ScoringRecorder(Protocol):
    """The run's side of a scoring phase: it records each finished evaluation and each candidate's outcome."""

    def record_result(self, result: ExampleResult) -> None: ...

    def record_outcome(self, outcome: CandidateOutcome) -> None: ...

    def span(self, candidate: Candidate, split: Split) -> contextlib.AbstractContextManager[Any]: ...


class CandidateScorer:
    """Runs the evaluations a group of candidates needs, round by round, and says what each candidate's came to.

    Args:
        setup: Builds the programs and jobs.
        runner: Runs the jobs.
        budget: Stops a phase once spent.
        recorder: Records what happens.
        num_threads: Evaluations in flight.
        display_progress: DSPy's progress bar per evaluation call.
        policy: The scoring policy of a step's new candidates (:class:`FullScoring` unless racing).
    """

    def __init__(self, *, setup: EvaluationSetup, runner: Runner, budget: Budget, recorder: ScoringRecorder,
                 num_threads: int, display_progress: bool, policy: ScoringPolicy | None = None):
        self.setup, self.runner, self.budget, self.recorder = setup, runner, budget, recorder
        self.num_threads, self.display_progress = num_threads, display_progress
        self.policy: ScoringPolicy = policy or FullScoring()

    def score(self, candidates: Sequence[Candidate], split: Split, *, baseline: Candidate | None = None,
              decided: Sequence[Candidate] = ()) -> str | None:
        """Score ``candidates`` on every example of ``split`` they have no score for; the budget's reason when it
        stopped the phase early (the candidates it cut short are recorded so), else None.

        Args:
            candidates: The candidates (their recorded scores are read, and written through the recorder).
            split: ``"train"`` or ``"val"``.
            baseline: The best candidate at the start of the candidates' step: training phases with one are planned
                by the scoring policy (the start and a baseline itself are always scored in full).
            decided: The step's candidates already scored or raced out, which the policy may race against.
        """
        candidates = list(candidates)
        raced = [c for c in candidates if baseline is not None and split == "train" and c.id not in
                 (START_ID, baseline.id)]
        rest = [c for c in candidates if c not in raced]
        plans: list[ScoringPlan] = []
        plan_of: dict[int, ScoringPlan] = {}
        if raced:
            assert baseline is not None
            plans.append(self.policy.plan(raced, baseline, decided))
            plan_of.update((c.id, plans[-1]) for c in raced)
        if rest:
            plans.append(_OneRound({c.id: _missing(_scores_of(c, split)) for c in rest}))
            plan_of.update((c.id, plans[-1]) for c in rest)
        infra: dict[int, list[str]] = {c.id: [] for c in candidates}
        open_ids = []
        for candidate in candidates:  # decided by their recorded scores already (a resumed race), or nothing to run
            outcome = self._decided(candidate, split, plan_of[candidate.id])
            if outcome is None:
                open_ids.append(candidate.id)
            else:
                self.recorder.record_outcome(outcome)
        by_id = {c.id: c for c in candidates}
        stop_reason: str | None = None
        while stop_reason is None and open_ids:
            work = [(by_id[cid], indices) for plan in plans for cid, indices in plan.next_round().items()
                    if cid in open_ids and not infra[cid]]
            work = [(c, [i for i in indices if _scores_of(c, split)[i] is None]) for c, indices in work]
            work = [(c, indices) for c, indices in work if indices]
            if not work:
                break
            slots = RoundSlots(self.runner.places(self.num_threads))  # the round's evaluations in flight, together
            started = [threading.Event() for _ in work]
            reasons = self.runner.concurrently(
                [functools.partial(self._evaluate, c, split, indices, plan_of[c.id], infra, (slots, rank), began)
                 for rank, ((c, indices), began) in enumerate(zip(work, started, strict=True))],
                started=started, halt=self.budget.halt, one_at_a_time=mlflow_traces_by_latest_run())
            stop_reason = next((r for r in reasons if r is not None), None)
            for other in list(open_ids):  # a look may stop any candidate it races
                decision = plan_of[other].decision(other)
                if decision is not None and decision.stopped:
                    open_ids.remove(other)
                    self.recorder.record_outcome(CandidateOutcome(other, split, CandidateStatus.RACED_OUT,
                                                                  decision.mean, decision.reason, decision.race))
        for cid in open_ids:
            self.recorder.record_outcome(self._ended(by_id[cid], split, plan_of[cid], infra[cid], stop_reason))
        return stop_reason

    def _evaluate(self, candidate: Candidate, split: Split, indices: list[int], plan: ScoringPlan,
                  infra: dict[int, list[str]], slots: tuple[RoundSlots, int],
                  started: threading.Event) -> str | None:
        """One ``dspy.Evaluate`` call: ``candidate``'s program on the examples ``indices``; the budget's reason when
        it stopped the call."""
        program = self.setup.program(candidate)
        examples = self.setup.data.examples(split)

        def record(result: ExampleResult) -> None:
            self.recorder.record_result(result)
            if result.outcome == "infra":
                infra[candidate.id].append(result.error or "unknown error")
            elif result.score is not None:
                plan.record(candidate.id, result.index, result.score)

        evaluate = CandidateEvaluate(devset=[(i, examples[i]) for i in indices],
                                     jobs=self.setup.job_maker(candidate, program, split), runner=self.runner,
                                     budget=self.budget, record=record,
                                     num_threads=self.runner.places(self.num_threads),
                                     display_progress=self.display_progress and shows_bars(),
                                     failure_score=self.setup.failure_score, slots=slots,
                                     started=started)
        with self.recorder.span(candidate, split):
            evaluate(program, callback_metadata={"metric_key": METRIC_KEYS[split]})
        return evaluate.stop_reason

    @classmethod
    def _decided(cls, candidate: Candidate, split: Split, plan: ScoringPlan) -> CandidateOutcome | None:
        decision = plan.decision(candidate.id)
        if decision is not None and decision.stopped:
            return CandidateOutcome(candidate.id, split, CandidateStatus.RACED_OUT, decision.mean, decision.reason,
                                    decision.race)
        if _missing(_scores_of(candidate, split)):
            return None
        return cls._ended(candidate, split, plan, [], None)

    @staticmethod
    def _ended(candidate: Candidate, split: Split, plan: ScoringPlan, infra: list[str],
               stop_reason: str | None) -> CandidateOutcome:
        scores = _scores_of(candidate, split)
        complete = not _missing(scores)
        if split == "val":
            return CandidateOutcome(candidate.id, split, None, mean_score(scores) if complete else None,
                                    infra_errors=tuple(infra))
        decision = plan.decision(candidate.id)
        race = decision.race if decision is not None else None
        if complete:
            return CandidateOutcome(candidate.id, split, CandidateStatus.SCORED, mean_score(scores), race=race)
        if stop_reason is not None:
            return CandidateOutcome(candidate.id, split, CandidateStatus.CUT_SHORT, None, f"cut short: {stop_reason}",
                                    race)
        if infra:
            reason = f"LM failures on {len(infra)} examples after a retry; last: {infra[-1]}"
            return CandidateOutcome(candidate.id, split, CandidateStatus.UNSCORED, None, reason, race, tuple(infra))
        # A plan that ended its rounds with examples left (it should not): left for the next compile to finish.
        return CandidateOutcome(candidate.id, split, CandidateStatus.CUT_SHORT, None,
                                "cut short: the scoring plan ended", race)


def shows_bars() -> bool:
    """Whether DSPy's bars, which it writes to stdout, are seen: on a terminal or in a notebook, not in a file."""
    try:
        return sys.stdout.isatty() or "ipykernel" in sys.modules
    except (AttributeError, ValueError):  # a stream without isatty, or closed
        return False


def _scores_of(candidate: Candidate, split: Split) -> list[float | None]:
    if split == "train":
        return candidate.scores
    assert candidate.val_scores is not None, "a validation phase gives its candidates empty val_scores first"
    return candidate.val_scores


def _missing(scores: list[float | None]) -> list[int]:
    return [i for i, value in enumerate(scores) if value is None]


__all__ = ["CandidateOutcome", "CandidateScorer", "EvaluationSetup", "FullScoring", "PlanDecision", "ScoringPlan",
           "ScoringPolicy", "ScoringRecorder"]

