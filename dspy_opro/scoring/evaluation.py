"""One evaluation: run a program on one example, score it with the metric, and say what happened.

One evaluation is one program run on one example followed by the metric. It runs on a worker thread of the run (or on
any ``concurrent.futures.Executor``, a Dask cluster included) in the DSPy context the run hands it (task LM, adapter),
with an :class:`~dspy_opro.scoring.usage.EvaluationTracker` for LMs the run's usage meter does not know of.
:func:`run_example` never raises; its outcome says what went wrong (:mod:`dspy_opro.errors` classifies):

* ``ok``: the program answered and the metric scored it (a wrong answer scores 0);
* ``failed``: the program raised something that is not an infrastructure problem (for example the model's output
  could not be parsed); the run scores ``failure_score`` and the error is recorded on the candidate;
* ``infra``: an LM transport or provider failure (rate limit, server error, timeout, connection), or a worker that
  died; retried once, then the example has no score and its candidate is recorded ``unscored``;
* ``fatal``: authentication, billing or configuration errors; the run stops;
* ``metric_error``: the metric raised or returned None, NaN, a string or a value outside [0, 1]; it scores
  ``failure_score``, and is counted against ``max_errors`` as a program error is;
* ``not_a_prediction``: the program returned None or something else than a ``dspy.Prediction``: a bug of the
  program's ``forward`` (a missing ``return``), which no instruction can fix; the run stops.
* ``interrupted``: the program or the metric raised ``KeyboardInterrupt`` itself. Evaluations run on worker
  threads, where Ctrl-C never lands (Python delivers it to the main thread), so this is code asking the run to stop;
  it stops, named as such rather than as an interruption by the user.

``counted`` marks the errors ``max_errors`` counts: the metric's, and the program's own exceptions except an answer
the task model formatted so that DSPy could not parse it (that is the instruction's doing, part of what OPRO scores)
or a prompt too long for the model.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import dspy

from dspy_opro.compat import is_adapter_parse_error, lm_error_kind
from dspy_opro.errors import EmptyResponseError, classify_exception, clean_text, describe_exception
from dspy_opro.scoring.dask_usage import AttemptReporter, UsageChannel
from dspy_opro.scoring.usage import EvaluationTracker, UsageMeter, add_usage
from dspy_opro.state import ModelUsage
from dspy_opro.task.data import NO_REFERENCE_NOTE, render_fields

if TYPE_CHECKING:
    from dspy_opro.core.selection import SelectionPolicy

logger = logging.getLogger(__name__)

SETTLE_SECONDS = 30.0
"""On another process (a Dask worker), how long an evaluation's result waits for LM calls its program started and
left running (a program that raised while calls on threads of its own were in flight): their usage comes back with
the result. In this process the run's meter counts such calls whenever they end."""

Outcome = Literal["ok", "failed", "infra", "fatal", "metric_error", "not_a_prediction", "interrupted"]


@runtime_checkable
class AnchoredMetric(Protocol):
    """A metric that scores a candidate's run against the starting program's run on the same example.

    Label-free OPRO's metric (``dspy_opro.PairwisePreference``) is one. With such a
    metric the run scores the starting program with ``anchor_metric`` instead, whose returned prediction carries
    the run's rendering as ``anchor``; the run keeps each anchor in the record and hands it to ``add_anchor``
    before any candidate runs on that example. Meta-prompts then show no labels, a program failure is judged like
    any other run, and ``selection_policy`` decides what ``compile`` returns.
    """

    judge_model: dspy.BaseLM | None
    """The model that judges (None: the task model); checked before the run and named when it fails."""

    def __call__(self, example: dspy.Example, prediction: Any, trace: Any = None) -> Any:
        """A candidate's run on ``example``, scored against the anchor of that example."""
        ...

    def anchor_metric(self) -> Callable[..., Any]:
        """The metric of the starting program's runs: returns ``dspy.Prediction(score=..., anchor=text)``."""
        ...

    def add_anchor(self, example: dspy.Example, text: str) -> None:
        """Judge later runs on ``example`` against ``text``."""
        ...

    def selection_policy(self) -> SelectionPolicy:
        """How the run selects its result."""
        ...

    def settings(self) -> dict[str, Any]:
        """JSON-able settings the run records and fingerprints."""
        ...


def metric_takes_trace(metric: Callable[..., Any]) -> bool:
    """Whether ``metric`` accepts ``(example, prediction, trace)``; else it must accept ``(example, prediction)``.

    Raises:
        TypeError: The metric cannot be called with an example and a prediction.
    """
    try:
        signature = inspect.signature(metric)
    except (TypeError, ValueError):  # a builtin or extension callable without a signature: call it as DSPy does
        return True
    for arguments in (("example", "prediction", None), ("example", "prediction")):
        try:
            signature.bind(*arguments)
        except TypeError:
            continue
        return len(arguments) == 3
    name = getattr(metric, "__qualname__", type(metric).__name__)
    raise TypeError(
        f"the metric {name}{signature} cannot be called as metric(example, prediction) or "
        "metric(example, prediction, trace); give it the parameters (example, prediction, trace=None)"
    )


def coerce_score(value: Any) -> float:
    """Turn a metric's return value into a float in [0, 1], or raise ValueError saying what was wrong."""
    if isinstance(value, dspy.Prediction) or (hasattr(value, "score") and not isinstance(value, (int, float))):
        value = getattr(value, "score", None)
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if value is None:
        raise ValueError("the metric returned None")
    if isinstance(value, (str, bytes)):  # float("1.0") would take it: a metric returns a number
        raise ValueError(f"the metric returned the string {value!r}, not a number")
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"the metric returned {value!r}, which is not a number") from None
    if math.isnan(score):
        raise ValueError("the metric returned NaN")
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"the metric returned {score}, outside [0, 1]")
    return score


def metric_feedback(value: Any) -> str | None:
    """The textual feedback of a metric that returns ``dspy.Prediction(score=..., feedback=...)``."""
    feedback = getattr(value, "feedback", None)
    return feedback if isinstance(feedback, str) and feedback.strip() else None


def describe_value(value: Any, limit: int = 80) -> str:
    """What a program returned, for an error message: ``None``, or its type and a short repr."""
    if value is None:
        return "None"
    shown = repr(value)
    return f"a {type(value).__name__} ({shown[:limit] + '...' if len(shown) > limit else shown})"


def counts_as_error(exc: BaseException) -> bool:
    """Whether ``max_errors`` counts a program exception: not when the model's answer could not be parsed or the
    prompt did not fit (both follow from the instruction, and OPRO scores them ``failure_score``)."""
    return not is_adapter_parse_error(exc) and lm_error_kind(exc) != "context_window"


def exemplar_answer(prediction: Any, score: float | None, feedback: str | None, label_keys: list[str]) -> str:
    """The answer shown for an example without usable labels (see :mod:`dspy_opro.core.exemplars`).

    The program's output counts when the metric judged it fully right: its fields named like the example's labels,
    or, when none is, all of its fields but a ReAct trajectory.
    """
    if prediction is not None and score is not None and score >= 1.0:
        keys = [key for key in prediction.keys() if key != "trajectory"]
        named = [key for key in keys if key in label_keys]
        values = {key: prediction[key] for key in named or keys}
        if values:
            return render_fields(values)
    if feedback:
        return feedback
    return NO_REFERENCE_NOTE


# ---------------------------------------------------------------------------------------------------------------
# One evaluation


@dataclass
class ExampleJob:
    """Everything one evaluation needs; it travels to the worker (pickled for process-based executors)."""

    candidate_id: int
    index: int
    program: Any
    example: Any
    metric: Callable[..., Any] | None
    failure_score: float
    settings: dict[str, Any]
    split: str = "train"
    answer_fields: list[str] | None = None  # set when the example needs an exemplar answer: the label keys
    keep_trace: bool = False  # record the DSPy trace: handed to the metric, and returned when there is no metric
    metric_takes_trace: bool = True  # call metric(example, prediction, trace); else metric(example, prediction)
    judge_failures: bool = False  # label-free: a run the program failed goes to the metric (the judge) as well
    usage_channel: UsageChannel | None = None  # on a Dask cluster: where each attempt reports its usage as it is paid
    meter: UsageMeter | None = None  # the run's meter; a copy of it when the job was sent to another process


@dataclass
class ExampleResult:
    candidate_id: int
    index: int
    outcome: Outcome
    score: float | None = None
    error: str | None = None
    answer: str | None = None
    usage: dict[str, ModelUsage] = field(default_factory=dict)
    split: str = "train"
    prediction: Any = None
    trace: list[Any] | None = None
    stage: Literal["program", "metric"] = "program"  # where the error (if any) was raised
    model: str | None = None  # the model a fatal or infra error names, when the error says
    anchor: str | None = None  # label-free OPRO: the starting program's run, rendered, that candidates are judged by
    counted: bool = False  # an error max_errors counts (the metric's, or the program's own but for a parse failure)
    attempt: str | None = None  # the id of the Dask attempt that made this result (its usage is in ``usage``)


def run_example(job: ExampleJob, *, transport_retries: int = 1) -> ExampleResult:
    """Run the program on one example and score it; never raises (the outcome says what happened).

    The program's exceptions are classified by :func:`dspy_opro.errors.classify_exception`. So are the metric's: an
    LM error inside the metric (an LLM judge) is retried once when transient and stops the run when fatal, like the
    program's; any other exception of the metric is a ``metric_error``. The result's ``usage`` holds the calls of LMs
    the run's meter does not know of; in another process (a job sent to a Dask worker, with a copy of the meter in
    its LMs), every call it made, and each LM call is reported to the scheduler as it is paid.
    """
    tracker = EvaluationTracker()
    remote = job.meter is not None and job.meter.copied
    reporter = AttemptReporter.on_this_worker(job.usage_channel, lambda: _usage(job, tracker, remote)) if remote \
        else None
    if reporter is not None and job.meter is not None:
        job.meter.on_call = reporter.report
    result = _run_example(job, tracker, transport_retries)
    if remote and job.meter is not None and not job.meter.wait_idle(SETTLE_SECONDS):
        logger.warning("Evaluation of %s example %d: LM calls the program started were still running %g s after "
                       "it ended; their usage is not counted", job.split, job.index, SETTLE_SECONDS)
    result.usage = _usage(job, tracker, remote)
    result.attempt = reporter.attempt if reporter is not None else None
    return result


def _usage(job: ExampleJob, tracker: EvaluationTracker, remote: bool) -> dict[str, ModelUsage]:
    usage = tracker.usage()
    return add_usage(usage, job.meter.total()) if remote and job.meter is not None else usage


def _run_example(job: ExampleJob, tracker: EvaluationTracker, transport_retries: int) -> ExampleResult:
    prediction: Any = None
    trace: list[Any] = []
    program_error: str | None = None
    settings = {**job.settings, "usage_tracker": tracker}
    attempts = 0
    while True:
        attempts += 1
        trace = []
        try:
            with dspy.context(trace=trace, **settings):
                prediction = job.program(**job.example.inputs())
            if isinstance(prediction, dspy.Prediction) and not list(prediction.keys()):
                raise EmptyResponseError("the model returned no choices, so the program produced no outputs")
            break
        except BaseException as exc:  # the program's own failure, classified below (SystemExit and the like too)
            if isinstance(exc, KeyboardInterrupt):
                return ExampleResult(job.candidate_id, job.index, "interrupted", error=describe_exception(exc),
                                     split=job.split)
            kind = classify_exception(exc)
            if kind == "infra" and attempts <= transport_retries:
                logger.debug("Retrying example %d after %s", job.index, describe_exception(exc))
                continue
            if kind == "failed" and job.judge_failures and job.metric is not None:
                # The judge compares the failure with the anchor, as it would any other trajectory.
                prediction, program_error = exc, describe_exception(exc)
                break
            score = job.failure_score if kind == "failed" else None
            answer = NO_REFERENCE_NOTE if job.answer_fields is not None else None
            return ExampleResult(job.candidate_id, job.index, kind, score=score, error=describe_exception(exc),
                                 answer=answer, split=job.split, model=getattr(exc, "model", None),
                                 trace=trace if job.keep_trace and job.metric is None else None,
                                 counted=kind == "failed" and counts_as_error(exc))
    if program_error is None and not isinstance(prediction, dspy.Prediction):
        return ExampleResult(job.candidate_id, job.index, "not_a_prediction",
                             error=f"returned {describe_value(prediction)}", split=job.split)
    if job.metric is None:
        return ExampleResult(job.candidate_id, job.index, "ok", split=job.split, prediction=prediction,
                             trace=trace if job.keep_trace else None)
    attempts = 0
    while True:
        attempts += 1
        try:
            with dspy.context(**settings):
                if job.metric_takes_trace:
                    value = job.metric(job.example, prediction, trace if job.keep_trace else None)
                else:
                    value = job.metric(job.example, prediction)
            score = coerce_score(value)
            break
        except BaseException as exc:  # a paid run is recorded whatever the metric raises
            if isinstance(exc, KeyboardInterrupt):
                return ExampleResult(job.candidate_id, job.index, "interrupted", error=describe_exception(exc),
                                     split=job.split, stage="metric")
            kind = classify_exception(exc)
            if kind == "infra" and attempts <= transport_retries:
                logger.debug("Retrying the metric on example %d after %s", job.index, describe_exception(exc))
                continue
            outcome: Outcome = kind if kind in ("infra", "fatal") else "metric_error"
            # A tolerated metric error scores failure_score, so that its candidate is complete (max_errors).
            return ExampleResult(job.candidate_id, job.index, outcome, error=describe_exception(exc),
                                 score=job.failure_score if outcome == "metric_error" else None, split=job.split,
                                 stage="metric", model=getattr(exc, "model", None), prediction=prediction,
                                 counted=outcome == "metric_error")
    answer = None
    if job.answer_fields is not None:
        shown = None if program_error else prediction
        answer = clean_text(exemplar_answer(shown, score, metric_feedback(value), job.answer_fields))
    anchor = getattr(value, "anchor", None)
    return ExampleResult(job.candidate_id, job.index, "failed" if program_error else "ok", score=score,
                         error=program_error, answer=answer, split=job.split, prediction=prediction,
                         anchor=anchor if isinstance(anchor, str) else None)


__all__ = [
    "AnchoredMetric",
    "ExampleJob",
    "ExampleResult",
    "Outcome",
    "coerce_score",
    "counts_as_error",
    "describe_value",
    "exemplar_answer",
    "metric_feedback",
    "metric_takes_trace",
    "run_example",
]
