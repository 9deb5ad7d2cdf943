"""Every use of DSPy's internals, in one place, for every DSPy 3.x from 3.1.

dspy-opro runs on DSPy's public API wherever it can: ``dspy.Evaluate``, ``dspy.context``, an LM's ``callbacks``,
``dspy.LM``. What it needs beyond that is reached here and nowhere else, and
``tests/test_compat.py`` has a test per access, run on each DSPy release CI installs, so that an upgrade that moves one
breaks one test that names it rather than the optimizer in many places:

* the module paths of names DSPy does not export at its top level: ``BaseCallback`` and ``with_callbacks`` (a
  ``dspy.Evaluate`` subclass reports its calls as ``dspy.Evaluate`` does), ``EvaluationResult``, DSPy's logging
  stream and format;
* what an LM error is: DSPy 3.3 and later raise their own ``LMError`` family (:func:`lm_error_kind` reads it);
  DSPy 3.1 and 3.2 let LiteLLM's exceptions through, which are read by class;
* DSPy's copy of LiteLLM's price map (``dspy.clients.model_metadata``, DSPy 3.4), else LiteLLM's own map;
* the text ``dspy.ReAct`` and ``dspy.ReActV2`` add to a predictor's instructions (:data:`AGENT_PROTOCOL_MARKERS`);
* one of MLflow's: it keeps its active runs per thread, so a ``dspy.Evaluate`` call on another thread would not nest
  its autologged run under the compile's (:func:`sharing_mlflow_runs`).

DSPy 3.0 is not supported: it ignores an input field's ``default`` (which ``instruction_pos="Q_end"`` needs), and its
parallel executor fails every task, silently, while a usage tracker is active.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import dspy
from dspy.evaluate.evaluate import EvaluationResult
from dspy.utils import exceptions as _dspy_exceptions
from dspy.utils.callback import BaseCallback, with_callbacks
from dspy.utils.exceptions import AdapterParseError
from dspy.utils.logging_utils import DSPY_LOGGING_STREAM, LOGGING_DATETIME_FORMAT, LOGGING_LINE_FORMAT

DSPY_VERSION = tuple(int(part) for part in dspy.__version__.split(".")[:2] if part.isdigit())

# The searchable head of a predictor's instructions ends where a DSPy agent module's protocol begins: dspy.ReAct
# appends it after a blank line, dspy.ReActV2 (DSPy 3.3 and later) after a newline. OPRO keeps the protocol verbatim.
AGENT_PROTOCOL_MARKERS = ("You are an Agent. In each episode, you will be given the fields",
                          "You are an Agent. Use the supplied tools to produce")

LMErrorKind = Literal["fatal", "infra", "context_window"]

# DSPy 3.3 and later: its own exception family.
_FATAL = tuple(getattr(_dspy_exceptions, name) for name in (
    "LMAuthError", "LMBillingError", "LMConfigurationError", "LMUnsupportedFeatureError", "LMUnsupportedModelError")
    if hasattr(_dspy_exceptions, name))
_UNEXPECTED = tuple(getattr(_dspy_exceptions, name) for name in ("LMUnexpectedError",)
                    if hasattr(_dspy_exceptions, name))
_PROVIDER = getattr(_dspy_exceptions, "LMProviderError", None)
_CONTEXT_WINDOW = getattr(_dspy_exceptions, "ContextWindowExceededError", None)  # DSPy 3.2 and later
_is_retryable = getattr(_dspy_exceptions, "is_retryable_lm_error", None)

# DSPy 3.1 and 3.2: LiteLLM's exceptions, by class name (LiteLLM is not imported to look).
_LITELLM_FATAL = ("AuthenticationError", "PermissionDeniedError", "NotFoundError", "BudgetExceededError")
_LITELLM_INFRA = ("RateLimitError", "ServiceUnavailableError", "InternalServerError", "BadGatewayError", "Timeout",
                  "APIConnectionError", "APIResponseValidationError")


def lm_error_kind(exc: BaseException) -> LMErrorKind | None:
    """What an exception raised by an LM call is: ``"fatal"`` (no retry can help: authentication, permission, billing,
    an unknown model, configuration), ``"infra"`` (transport or provider: rate limit, server error, timeout,
    connection, an unreadable reply), ``"context_window"`` (the prompt is too long), or None (not an LM error)."""
    if _CONTEXT_WINDOW is not None and isinstance(exc, _CONTEXT_WINDOW):
        return "context_window"
    if isinstance(exc, _FATAL):
        return "fatal"
    if (_is_retryable is not None and isinstance(exc, Exception) and _is_retryable(exc)) \
            or isinstance(exc, _UNEXPECTED) or (_PROVIDER is not None and type(exc) is _PROVIDER):
        return "infra"
    if not type(exc).__module__.startswith("litellm"):
        return None
    name = type(exc).__name__
    if name == "ContextWindowExceededError":
        return "context_window"
    status = getattr(exc, "status_code", None)
    if name in _LITELLM_FATAL or (name == "APIError" and status in (401, 402, 403)):
        return "fatal"
    if name in _LITELLM_INFRA or (name == "APIError" and (status is None or status >= 500)):
        return "infra"
    return None


def is_adapter_parse_error(exc: BaseException) -> bool:
    """Whether DSPy could not parse the model's answer into the signature's fields."""
    return isinstance(exc, AdapterParseError)


def input_keys(example: dspy.Example) -> list[str]:
    """The example's input field names; empty when ``with_inputs`` was never called."""
    try:
        return list(example.inputs().keys())
    except ValueError:  # DSPy raises when the inputs were never set
        return []


def lm_engine(lm: Any) -> Any:
    """The engine a ``dspy.LM`` uses: ``"litellm"`` before DSPy 3.4 (its only one), else the one it was built with
    (``"auto"``, ``"litellm"``, ``"lm15"`` or an engine object)."""
    if not isinstance(lm, dspy.LM):
        return None
    return getattr(lm, "engine", "litellm")


def price_map_entry(model: str) -> dict[str, Any]:
    """The entry of a model (``provider/name`` or a bare name) in LiteLLM's price map, or ``{}``.

    DSPy 3.4 prices its own calls from its copy (``dspy.clients.model_metadata``), read without importing LiteLLM;
    before, LiteLLM's ``model_cost`` (LiteLLM is imported with ``dspy`` there). ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps
    LiteLLM's meaning.
    """
    try:
        from dspy.clients.model_metadata import _load, model_info
    except ImportError:  # DSPy before 3.4
        import litellm

        table: dict[str, Any] = litellm.model_cost
        entry = table.get(model) or table.get(model.partition("/")[2])
        return dict(entry) if isinstance(entry, dict) else {}
    provider, _, name = model.partition("/")
    if name:
        info = model_info(provider, name)
        if info:
            return dict(info)
    entry = _load().get(model)
    return dict(entry) if isinstance(entry, dict) else {}


_LIBRARY_DIRS = tuple(str(Path(str(module.__file__)).resolve().parent) + os.sep
                      for module in (dspy, sys.modules[__name__.rpartition(".")[0]]))


def user_stacklevel() -> int:
    """The ``stacklevel`` of a warning issued by the caller that points at the first line outside dspy-opro and DSPy
    (DSPy wraps ``compile`` in callback handlers, so a fixed number would point into DSPy)."""
    frame: FrameType | None = sys._getframe(1)  # the function that calls warnings.warn: stacklevel 1
    level = 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_LIBRARY_DIRS):
        frame = frame.f_back
        level += 1
    return level


def dspy_logging_stream() -> Any:
    """The stream DSPy's log handlers write to (it forwards to ``sys.stderr`` unless ``dspy.disable_logging()``)."""
    return DSPY_LOGGING_STREAM


def logging_configured(logger: logging.Logger) -> bool:
    """Whether the process configured logging for ``logger``: a handler of its own, or one on the root logger."""
    return bool(logger.handlers or logging.getLogger().handlers)


@contextmanager
def logging_through_dspy(package: str) -> Iterator[None]:
    """While the block runs, send ``package``'s INFO lines through DSPy's logging stream, as DSPy's own loggers are.

    Only where nobody configured logging (neither ``package``'s logger nor the root logger has a handler): then the
    lines look like DSPy's and ``dspy.disable_logging()`` silences them. A user's configuration is left alone, and
    everything changed is restored when the block ends; nothing is configured at import.
    """
    logger = logging.getLogger(package)
    if logging_configured(logger):
        yield
        return
    handler = logging.StreamHandler(DSPY_LOGGING_STREAM)
    handler.setFormatter(logging.Formatter(fmt=LOGGING_LINE_FORMAT, datefmt=LOGGING_DATETIME_FORMAT))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    if level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def sharing_mlflow_runs() -> Callable[[], AbstractContextManager[None]]:
    """A context manager that gives the thread it runs on this thread's active MLflow runs while it lasts (MLflow's
    ``_active_run_stack`` is thread-local), so that DSPy's autolog nests the runs it starts there under the compile's.
    A no-op when MLflow is not imported or no run is active."""
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is None or not fluent._active_run_stack.get():
        return nullcontext
    stack = list(fluent._active_run_stack.get())

    @contextmanager
    def shared() -> Iterator[None]:
        own = fluent._active_run_stack.get()
        saved, own[:] = list(own), stack
        try:
            yield
        finally:
            own[:] = saved

    return shared


def mlflow_traces_by_latest_run() -> bool:
    """Whether MLflow's DSPy autolog records traces during this compile (``log_traces`` and
    ``log_traces_from_compile``). MLflow then gives a trace to the latest run started in any thread
    (``_get_latest_active_run``), so candidates evaluated at once would get each other's traces."""
    if "mlflow.dspy" not in sys.modules:
        return False
    try:
        from mlflow.dspy.callback import MlflowCallback
        from mlflow.utils.autologging_utils import get_autologging_config

        if not any(isinstance(callback, MlflowCallback) for callback in dspy.settings.get("callbacks") or []):
            return False
        return bool(get_autologging_config("dspy", "log_traces", False)
                    and get_autologging_config("dspy", "log_traces_from_compile", False))
    except Exception:  # another MLflow than the one this was written against: evaluate at once, as without it
        return False


__all__ = [
    "AGENT_PROTOCOL_MARKERS",
    "DSPY_VERSION",
    "BaseCallback",
    "EvaluationResult",
    "dspy_logging_stream",
    "input_keys",
    "is_adapter_parse_error",
    "lm_engine",
    "lm_error_kind",
    "logging_configured",
    "logging_through_dspy",
    "mlflow_traces_by_latest_run",
    "price_map_entry",
    "sharing_mlflow_runs",
    "user_stacklevel",
    "with_callbacks",
]
