"""What a run shows the tools DSPy users observe optimizers with, beyond DSPy's own evaluation callbacks.

Each candidate's scoring is a real ``dspy.Evaluate`` call (:mod:`dspy_opro.scoring.engine`), so DSPy's callbacks and
MLflow's autolog see it as they see COPRO's and MIPROv2's evaluations. This module adds the rest:

* where OpenTelemetry is importable, each candidate's scoring is a span (``OPRO candidate 3 (step 0, train)``) with the
  candidate's step, id, predictor and split as attributes, current while its evaluations run, so the program's own
  spans nest under it and it nests under the caller's span around ``compile``; OpenTelemetry is never a dependency;
* MLflow's autolog patches the ``compile`` of the teleprompter classes that exist when it is called; an optimizer
  imported after ``mlflow.dspy.autolog()`` would be missed, so :func:`catch_up_mlflow_autolog` asks autolog again,
  with its own settings, when the optimizer is made; :func:`log_settings_to_mlflow` logs the run's settings as
  parameters of the active MLflow run;
* :func:`import_litellm_announced` says that LiteLLM is being imported before the seconds its first import takes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from dspy_opro.compat import lm_engine

logger = logging.getLogger(__name__)

MLFLOW_FLAVOR = "dspy"
MLFLOW_AUTOLOG_KEYS = ("log_traces", "log_traces_from_compile", "log_traces_from_eval", "log_compiles", "log_evals",
                       "silent")
MLFLOW_PARAM_LIMIT = 6000  # characters MLflow accepts in one parameter value


class CandidateSpans:
    """An OpenTelemetry span per candidate's scoring on a split (nothing without OpenTelemetry): current while each
    of its ``dspy.Evaluate`` calls runs, ended with its outcome."""

    def __init__(self) -> None:
        self._trace: Any = None
        self._context: Any = None
        with contextlib.suppress(ImportError):
            from opentelemetry import context, trace

            self._trace, self._context = trace, context
        self._open: dict[tuple[str, int], Any] = {}

    @contextlib.contextmanager
    def current(self, candidate: Any, split: str) -> Iterator[None]:
        """The candidate's span (opened as a child of the caller's current span), current while the block runs."""
        if self._trace is None:
            yield
            return
        span = self._open.get((split, candidate.id))
        if span is None:
            attributes = {"opro.step": candidate.step, "opro.candidate_id": candidate.id, "opro.split": split,
                          "opro.predictor": candidate.predictor or ""}
            span = self._open[(split, candidate.id)] = self._trace.get_tracer("dspy_opro").start_span(
                f"OPRO candidate {candidate.id} (step {candidate.step}, {split})", attributes=attributes)
        token = self._context.attach(self._trace.set_span_in_context(span))
        try:
            yield
        finally:
            self._context.detach(token)

    def end(self, split: str, candidate_id: int, *, status: str, score: float | None) -> None:
        """End a candidate's span with its outcome."""
        span = self._open.pop((split, candidate_id), None)
        if span is not None:
            span.set_attribute("opro.status", status)
            if score is not None:
                span.set_attribute("opro.score", score)
            span.end()

    def end_all(self) -> None:
        """End the spans a phase left open (it stopped early, or raised)."""
        for span in self._open.values():
            span.end()
        self._open.clear()


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
            continue
        text = json.dumps(value, default=_object_name)
        if isinstance(decoded := json.loads(text), str):  # an object shown by its name
            text = decoded
        shown[name] = text if len(text) <= MLFLOW_PARAM_LIMIT else text[:MLFLOW_PARAM_LIMIT - 3] + "..."
    try:
        mlflow.log_params(shown)
    except Exception as exc:  # a parameter logged before with another value (a compile inside a compile's run)
        logger.warning("Could not log OPRO's settings to MLflow: %s", exc)


def _object_name(value: Any) -> str:
    """How an object that JSON cannot hold (a metric, a model) shows among the logged parameters."""
    model = getattr(value, "model", None)
    return model if isinstance(model, str) else getattr(value, "__qualname__", None) or type(value).__qualname__


def import_litellm_announced(models: Iterable[tuple[str, Any]]) -> bool:
    """Import LiteLLM up front, saying so, when a run model uses it and this process has not imported it yet.

    LiteLLM's first import takes several seconds (more when it fetches its price map); without a word the run would
    seem to hang before its first line. Models on other engines never import it here. Returns whether it did.
    """
    if "litellm" in sys.modules:
        return False
    users = [f"the {role} model {getattr(lm, 'model', '')!r}" for role, lm in models
             if lm is not None and lm_engine(lm) == "litellm"]
    if not users:
        return False
    logger.info("Importing LiteLLM for %s (its first use in this process takes a few seconds)", " and ".join(users))
    importlib.import_module("litellm")
    return True
