"""Recording what a scoring phase returns: the run record's side of every finished evaluation and candidate.

:class:`~dspy_opro.scoring.scorer.CandidateScorer` reads the record and never writes it; it returns the events of a
scoring phase, and :class:`ScoringEventRecorder` writes each one into the record as it arrives, on the main thread:

- a finished evaluation (:class:`~dspy_opro.scoring.evaluation.ExampleResult`): its usage (the record's and the
  caller's ``dspy.track_usage()``), the run's one count of evaluations, the journal line that makes it survive a
  kill, then the candidate's score. An error of the program or the metric is tolerated up to ``max_errors`` per
  compile (scored ``failure_score``, logged, recorded); past it, and on a fatal LM error or a program that returns
  no prediction, it raises the error type that names the fix (the loop saves what was paid for first);
- a candidate whose scoring on a split ended (:class:`~dspy_opro.scoring.scorer.CandidateOutcome`): its status
  and mean, one WARNING for its program errors, its span ended and, when it was scored on every example, one report
  to DSPy's evaluation callbacks (MLflow's autolog makes a nested run of it).

The step loop (:mod:`dspy_opro.run`) owns one of these per compile; nothing else writes the record's candidates.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from dspy_opro.config import Models
from dspy_opro.errors import FatalLMError, MetricError, ProgramError
from dspy_opro.record.observers import CandidateReports, CandidateSpans
from dspy_opro.record.progress import Progress
from dspy_opro.record.recorder import RunRecorder
from dspy_opro.record.state import Candidate, CandidateStatus, ModelUsage, RunState, Split, record_result
from dspy_opro.scoring.evaluation import AnchoredMetric, ExampleResult
from dspy_opro.scoring.scorer import CandidateOutcome, EvaluationSetup, ScoringEvent
from dspy_opro.scoring.usage import roll_up
from dspy_opro.task.data import RunData

logger = logging.getLogger(__name__)


@dataclass
class ScoringEventRecorder:
    """Writes a scoring phase's events into the run record (one per compile, used on the main thread).

    Args:
        state: The run record.
        recorder: Its files: each finished evaluation is journaled through it.
        data: The checked examples (to name an example in an error).
        setup: What every evaluation needs (the program with a candidate's instructions, for the callbacks).
        models: The run's models by role (``task``, ``judge``; to name the model an error came from).
        max_errors: Program and metric errors tolerated per compile (None: no limit).
        failure_score: What a tolerated error scores (for the log line).
        anchored: Label-free OPRO's metric, which learns each anchor as it is recorded; None otherwise.
        progress: The progress bar.
        spans: The candidates' OpenTelemetry spans.
        reports: The candidates' reports to DSPy's evaluation callbacks.
        caller_tracker: The caller's ``dspy.track_usage()`` tracker, if any.
    """

    state: RunState
    recorder: RunRecorder
    data: RunData
    setup: EvaluationSetup
    models: Models
    max_errors: int | None
    failure_score: float
    anchored: AnchoredMetric | None
    progress: Progress
    spans: CandidateSpans
    reports: CandidateReports
    caller_tracker: Any = None
    errors_this_compile: int = 0  # the errors max_errors counts, in this compile
    _warned: set[tuple[str, int]] = field(default_factory=set)  # (split, candidate id) whose errors were logged

    def record(self, event: ScoringEvent) -> None:
        """One event of a scoring phase, as it arrives."""
        if isinstance(event, CandidateOutcome):
            self.record_outcome(event)
        else:
            self.record_result(event)

    def record_usage(self, role: Literal["optimizer", "task"], usage: dict[str, ModelUsage]) -> None:
        """What a role's calls cost, in the record and in the caller's ``dspy.track_usage()``."""
        self.state.usage.record(role, usage)
        roll_up(self.caller_tracker, usage)

    def record_result(self, result: ExampleResult) -> None:
        """One finished evaluation: its usage, the run's count, the journal, then the candidate.

        A fatal LM error or a broken metric stops the run here (the loop saves what was paid for).
        """
        state = self.state
        candidate = state.candidates[result.candidate_id]
        self.record_usage("task", result.usage)
        if result.outcome == "fatal":
            role, model = self._failing_model(result)
            raise FatalLMError(f"the {role} {model!r} failed in a way no retry can fix on "
                               f"{self._describe_failure(result)}. Check its API key (or environment variable), "
                               "permissions, billing and model name.")
        state.metric_calls += 1  # the one count of evaluations that ran (a fatal one did not)
        if result.outcome == "not_a_prediction":
            name = type(self.setup.base).__name__
            raise ProgramError(
                f"the program {name} {result.error} on {self._describe_failure(result, error=False)}, not a "
                f"dspy.Prediction: no instruction can fix that. Make {name}.forward return the prediction of its "
                "last predictor (e.g. `return self.predict(question=question)`) or dspy.Prediction(answer=...).")
        if result.counted:
            self._count_error(result)
        self.progress.advance()
        if result.anchor is not None and self.anchored is not None:
            state.anchors[f"{result.split}:{result.index}"] = result.anchor
            self.anchored.add_anchor(self.data.examples(split_of(result.split))[result.index], result.anchor)
        # A tolerated metric error is recorded as a program error is: it scored failure_score, the error is kept.
        outcome = "failed" if result.outcome == "metric_error" else result.outcome
        error = f"metric: {result.error}" if result.outcome == "metric_error" else result.error
        self.recorder.journal(candidate, index=result.index, split=result.split, outcome=outcome,
                              score=result.score, error=error, answer=result.answer, usage=result.usage,
                              anchor=result.anchor, count=state.metric_calls)
        record_result(candidate, index=result.index, split=result.split, outcome=outcome, score=result.score,
                      error=error, answer=result.answer)

    def keep_finished(self, results: Iterable[ExampleResult]) -> None:
        """Record the evaluations that finished while the run was stopping (never consumed), so none is bought
        again; a result that cannot be recorded is left for the next compile to run again."""
        for result in results:
            candidate = self.state.candidates[result.candidate_id]
            scores = candidate.scores if result.split == "train" else candidate.val_scores
            if result.outcome not in ("ok", "failed", "infra") or not scores or scores[result.index] is not None:
                continue
            try:
                self.record_result(result)
            except Exception as exc:  # never hide the error that stopped the run
                logger.warning("Could not record a finished evaluation while stopping: %s", exc)

    def record_outcome(self, outcome: CandidateOutcome) -> None:
        """A candidate whose scoring on a split ended: its status and mean, or why it has none."""
        candidate = self.state.candidates[outcome.candidate_id]
        self._warn_program_errors(candidate, outcome.split)
        self._observe(candidate, outcome)
        if outcome.split == "val":
            candidate.val_score = outcome.score
        else:
            assert outcome.status is not None
            candidate.status, candidate.score, candidate.reason = outcome.status, outcome.score, outcome.reason
            if outcome.race is not None:
                candidate.race = outcome.race
            candidate.failed.sort()
            if outcome.status == CandidateStatus.RACED_OUT:
                logger.info("Candidate %d %s (partial mean %.1f)", candidate.id, candidate.reason,
                            100 * (candidate.score or 0.0))
            elif outcome.status == CandidateStatus.UNSCORED:
                logger.info("Candidate %d unscored: %s", candidate.id, candidate.reason)
        self.show_best()

    def show_best(self) -> None:
        """The best training and validation scores so far, on the progress bar."""
        best = self.state.best()
        val = [c.val_score for c in self.state.candidates if c.val_score is not None]
        self.progress.set_best(best.score if best is not None else None, max(val, default=None))

    def _count_error(self, result: ExampleResult) -> None:
        """One error ``max_errors`` counts: logged and recorded; past the limit the run stops (the loop saves)."""
        state, limit = self.state, self.max_errors
        self.errors_this_compile += 1
        state.tolerated_errors += 1
        where = "metric" if result.outcome == "metric_error" else "program"
        if limit is not None and self.errors_this_compile > limit:
            state.tolerated_errors -= 1  # this one is not tolerated: it stops the run
            if where == "metric":
                raise MetricError(
                    f"the metric failed on {self._describe_failure(result)}, error {self.errors_this_compile} of this "
                    f"compile, more than max_errors={limit}. Fix the metric: it must return a float in [0, 1], a bool, "
                    "or dspy.Prediction(score=..., feedback=...); then compile again with the same log_dir.")
            raise ProgramError(
                f"the program raised on {self._describe_failure(result)}, error {self.errors_this_compile} of this "
                f"compile, more than max_errors={limit}. Fix the program (call it on that example to see the "
                "traceback), or raise max_errors; then compile again with the same log_dir.")
        logger.warning("Tolerated %s error %d of max_errors=%s (scored failure_score=%g) on %s", where,
                       self.errors_this_compile, limit, self.failure_score, self._describe_failure(result))

    def _observe(self, candidate: Candidate, outcome: CandidateOutcome) -> None:
        """End the candidate's span; report a candidate scored on every example to DSPy's evaluation callbacks."""
        if outcome.status is not None:
            status = CandidateStatus(outcome.status).value
        else:  # a validation scoring: complete or not
            status = "scored" if outcome.score is not None else "unscored"
        self.spans.end(outcome.split, candidate.id, status=status, score=outcome.score)
        if outcome.score is None or (outcome.split == "train" and outcome.status != CandidateStatus.SCORED):
            return
        scores = candidate.val_scores if outcome.split == "val" else candidate.scores
        self.reports.report(lambda: self.setup.program(candidate), split=outcome.split, scores=scores or [])

    def _failing_model(self, result: ExampleResult) -> tuple[str, str]:
        """Which model a fatal error came from: the task model, the label-free judge, or the metric's own LM."""
        if result.stage == "program":
            return "task model", getattr(self.models.task, "model", repr(self.models.task))
        if self.anchored is not None:
            judge = self.models.judge or self.models.task
            return "judge model", getattr(judge, "model", repr(judge))
        return "model inside the metric", result.model or "unknown"

    def _describe_failure(self, result: ExampleResult, *, error: bool = True) -> str:
        """A one-line description of a stopping failure that names the example (and the error)."""
        example = self.data.examples(split_of(result.split))[result.index]
        shown = repr({key: example[key] for key in example.inputs().keys()})
        if len(shown) > 200:
            shown = shown[:200] + "..."
        split = "training" if result.split == "train" else "validation"
        return f"{split} example {result.index} ({shown})" + (f": {result.error}" if error else "")

    def _warn_program_errors(self, candidate: Candidate, split: Split) -> None:
        """One WARNING per candidate and split whose program raised: how often, and the first error."""
        errors = [e for e in candidate.errors if e.split == split]
        if not errors or (split, candidate.id) in self._warned:
            return
        self._warned.add((split, candidate.id))
        first = errors[0]
        logger.warning("Candidate %d: the program raised on %d %s evaluations (%d distinct errors); first, on "
                       "example %d: %s", candidate.id, sum(e.count for e in errors),
                       "training" if split == "train" else "validation", len(errors), first.example, first.error)


def split_of(name: str) -> Split:
    """A recorded split name as the record's ``Split``."""
    return "val" if name == "val" else "train"


__all__ = ["ScoringEventRecorder", "split_of"]
