"""What a run shows the tools DSPy users observe optimizers with: DSPy's callbacks, OpenTelemetry and MLflow.

Every scored candidate is reported to DSPy's evaluation callbacks (``on_evaluate_start``/``on_evaluate_end``) as a
``dspy.Evaluate`` call on the candidate's program would be, with an ``EvaluationResult`` of its score on DSPy's 0-100
scale: MLflow's autolog (``mlflow.dspy.autolog(log_compiles=True, log_evals=True)``) then makes one nested run per
scored candidate with its score, and the score history as a metric of the compile's run, as it does for COPRO and
MIPROv2. The report comes after the candidate's scoring, in the thread that owns the run, so that MLflow's run stack
is never shared between threads.

Where OpenTelemetry is importable, each candidate's scoring is a span (``OPRO candidate 3 (step 0, train)``) with
the candidate's step, id, predictor and split as attributes; every evaluation of the candidate runs in a copy of the
caller's ``contextvars`` context in which that span is current, so the program's own spans nest under it and it
nests under the caller's span around ``compile``. OpenTelemetry is never a dependency: it is imported only when a run
starts, and without it there are no spans.

MLflow's autolog patches the ``compile`` of the teleprompter classes that exist when it is called; an optimizer built
after ``mlflow.dspy.autolog()`` but defined by an import that came later (``import dspy_opro`` after ``autolog()``)
would be missed, so :func:`catch_up_mlflow_autolog` asks autolog again, with its own settings, when the optimizer is
made. :func:`log_settings_to_mlflow` logs the run's settings as parameters of the active MLflow run.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import dspy

from dspy_opro.compat import with_callbacks

logger = logging.getLogger(__name__)

TRAIN_METRIC_KEY = "eval"  # MLflow's default key: the compile run's score history, as for COPRO
VAL_METRIC_KEY = "eval_val"
MLFLOW_FLAVOR = "dspy"
MLFLOW_AUTOLOG_KEYS = ("log_traces", "log_traces_from_compile", "log_traces_from_eval", "log_compiles", "log_evals",
                       "silent")
MLFLOW_PARAM_LIMIT = 6000  # characters MLflow accepts in one parameter value


class CandidateEvaluation(dspy.Evaluate):
    """A ``dspy.Evaluate`` whose call reports a scoring that already happened, so DSPy's evaluation callbacks see
    each scored candidate as they see an evaluation by ``dspy.Evaluate``.

    Args:
        devset: The examples the candidates were scored on.
        metric: The run's metric.
    """

    def __init__(self, *, devset: Sequence[dspy.Example], metric: Callable[..., Any]):
        super().__init__(devset=list(devset), metric=metric, display_progress=False, display_table=False)

    @with_callbacks
    def __call__(  # type: ignore[override]
        self,
        program: dspy.Module,
        *,
        devset: Sequence[dspy.Example] | None = None,
        callback_metadata: dict[str, Any] | None = None,
        result: Any = None,
    ) -> Any:
        return result


def evaluation_result(examples: Sequence[dspy.Example], scores: Sequence[float | None]) -> Any:
    """The ``dspy.EvaluationResult`` of one candidate: its mean on DSPy's 0-100 scale (as ``dspy.Evaluate`` gives),
    and a ``(example, prediction, score)`` row per example scored (the predictions are not kept: empty)."""
    from dspy.evaluate.evaluate import EvaluationResult

    rows: list[tuple[Any, Any, Any]] = [(example, dspy.Prediction(), score)
                                        for example, score in zip(examples, scores, strict=False) if score is not None]
    mean = sum(score for *_, score in rows) / len(rows) if rows else 0.0
    return EvaluationResult(score=round(100 * mean, 2), results=rows)


class CandidateReports:
    """Reports each scored candidate to DSPy's evaluation callbacks (a no-op without callbacks).

    Args:
        trainset: The training examples.
        valset: The validation examples.
        metric: The run's metric.
    """

    def __init__(self, *, trainset: Sequence[dspy.Example], valset: Sequence[dspy.Example],
                 metric: Callable[..., Any]):
        self._examples = {"train": list(trainset), "val": list(valset)}
        self._evaluate = {split: CandidateEvaluation(devset=examples, metric=metric)
                          for split, examples in self._examples.items()}

    def report(self, program: Callable[[], dspy.Module], *, split: str, scores: Sequence[float | None]) -> None:
        """Report one candidate's finished scoring on ``split`` (``"train"`` or ``"val"``); ``program`` makes the
        candidate's program (only when there are callbacks to see it)."""
        if not dspy.settings.get("callbacks"):
            return
        examples = self._examples[split]
        key = TRAIN_METRIC_KEY if split == "train" else VAL_METRIC_KEY
        self._evaluate[split](program(), devset=examples, callback_metadata={"metric_key": key},
                              result=evaluation_result(examples, scores))


class CandidateSpans:
    """An OpenTelemetry span per candidate's scoring, current in the context its evaluations run in.

    Without OpenTelemetry (``opentelemetry-api`` not importable) nothing is traced and :meth:`context_for` is a plain
    copy of the caller's context.
    """

    def __init__(self) -> None:
        try:
            from opentelemetry import context as otel_context
            from opentelemetry import trace
        except ImportError:
            self._trace: Any = None
            self._context: Any = None
        else:
            self._trace, self._context = trace, otel_context
        self._spans: dict[tuple[str, int], Any] = {}

    @property
    def enabled(self) -> bool:
        return self._trace is not None

    def start(self, candidates: Iterable[Any], split: str) -> None:
        """Open a span for each candidate of a scoring phase, as a child of the caller's current span."""
        if self._trace is None:
            return
        tracer = self._trace.get_tracer("dspy_opro")
        for candidate in candidates:
            attributes = {"opro.step": candidate.step, "opro.candidate_id": candidate.id, "opro.split": split,
                          "opro.predictor": candidate.predictor or ""}
            name = f"OPRO candidate {candidate.id} (step {candidate.step}, {split})"
            self._spans[(split, candidate.id)] = tracer.start_span(name, attributes=attributes)

    def context_for(self, split: str, candidate_id: int) -> contextvars.Context:
        """A copy of the calling thread's context, with the candidate's span current where there is one."""
        context = contextvars.copy_context()
        span = self._spans.get((split, candidate_id))
        if span is not None:
            context.run(self._context.attach, self._trace.set_span_in_context(span))
        return context

    def end(self, split: str, candidate_id: int, *, status: str, score: float | None) -> None:
        """Close a candidate's span with its outcome."""
        span = self._spans.pop((split, candidate_id), None)
        if span is None:
            return
        span.set_attribute("opro.status", status)
        if score is not None:
            span.set_attribute("opro.score", score)
        span.end()

    def end_all(self) -> None:
        """Close the spans a phase left open (it stopped early, or raised)."""
        for span in self._spans.values():
            span.end()
        self._spans.clear()


def _mlflow_autolog_enabled() -> bool:
    if "mlflow.dspy" not in sys.modules:  # autolog was never called: nothing to catch up with
        return False
    from mlflow.utils.autologging_utils import autologging_is_disabled

    return not autologging_is_disabled(MLFLOW_FLAVOR)


def catch_up_mlflow_autolog(cls: type, plain_compile: Any) -> None:
    """Patch ``cls.compile`` for MLflow's DSPy autolog if autolog is on but missed the class (it was imported after
    ``autolog()``), by asking autolog again with the settings it was given."""
    if cls.__dict__.get("compile") is not plain_compile or not _mlflow_autolog_enabled():
        return
    from mlflow.dspy import autolog
    from mlflow.utils.autologging_utils import get_autologging_config

    settings = {key: get_autologging_config(MLFLOW_FLAVOR, key) for key in MLFLOW_AUTOLOG_KEYS}
    autolog(**{key: value for key, value in settings.items() if value is not None})
    logger.debug("MLflow's DSPy autolog was enabled before dspy_opro was imported; %s.compile is now patched",
                 cls.__name__)


def log_settings_to_mlflow(params: dict[str, Any]) -> None:
    """Log the run's settings as parameters of the active MLflow run, where autolog logs compiles."""
    if not _mlflow_autolog_enabled():
        return
    import mlflow
    from mlflow.utils.autologging_utils import get_autologging_config

    if not get_autologging_config(MLFLOW_FLAVOR, "log_compiles") or mlflow.active_run() is None:
        return
    shown: dict[str, Any] = {}
    for name, value in params.items():
        if value is None or isinstance(value, (bool, int, float, str)):
            shown[name] = "None" if value is None else value
        else:
            text = json.dumps(value, default=_object_name)
            decoded = json.loads(text)
            if isinstance(decoded, str):  # an object shown by its name
                text = decoded
            shown[name] = text if len(text) <= MLFLOW_PARAM_LIMIT else text[:MLFLOW_PARAM_LIMIT - 3] + "..."
    try:
        mlflow.log_params(shown)
    except Exception as exc:  # a parameter logged before with another value (a compile inside a compile's run)
        logger.warning("Could not log OPRO's settings to MLflow: %s", exc)


def _object_name(value: Any) -> str:
    """How an object that JSON cannot hold (a metric, a model) shows among the logged parameters."""
    model = getattr(value, "model", None)
    if isinstance(model, str):
        return model
    return getattr(value, "__qualname__", None) or type(value).__qualname__


__all__ = ["CandidateEvaluation", "CandidateReports", "CandidateSpans", "catch_up_mlflow_autolog",
           "evaluation_result", "log_settings_to_mlflow"]
