"""Every use of DSPy's internals, in one place.

dspy-opro runs on DSPy's public API wherever it can. A few things it needs have no public face in DSPy 3.4: the
per-thread settings overrides that ``dspy.context`` writes (evaluation workers must adopt the caller's LM, adapter
and callbacks), the id of the active callback call (so tracing nests the program runs under ``compile``), the usage
tracker class and the LM exception types, DSPy's copy of LiteLLM's price map, and DSPy's logging stream. Each is
reached here and nowhere else, and ``tests/test_compat.py`` has a test per access, so that a DSPy upgrade that
moves one breaks one test that names it rather than the optimizer in many places. ``with_callbacks`` (the decorator
that reports a call to DSPy's callbacks) lets a scored candidate report as a ``dspy.Evaluate`` call does.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import dspy
from dspy.dsp.utils.settings import thread_local_overrides
from dspy.dsp.utils.utils import dotdict
from dspy.utils.callback import BaseCallback, with_callbacks
from dspy.utils.callback_context import ACTIVE_CALL_ID
from dspy.utils.exceptions import (
    AdapterParseError,
    ContextWindowExceededError,
    LMAuthError,
    LMBillingError,
    LMConfigurationError,
    LMProviderError,
    LMUnexpectedError,
    LMUnsupportedFeatureError,
    LMUnsupportedModelError,
    is_retryable_lm_error,
)
from dspy.utils.logging_utils import DSPY_LOGGING_STREAM, LOGGING_DATETIME_FORMAT, LOGGING_LINE_FORMAT
from dspy.utils.usage_tracker import UsageTracker

T = TypeVar("T")


def current_context() -> tuple[dict[str, Any], Any]:
    """The calling thread's DSPy settings overrides and active callback call id, to hand to a worker thread."""
    return thread_local_overrides.get().copy(), ACTIVE_CALL_ID.get()


def run_in_context(context: tuple[dict[str, Any], Any], function: Callable[..., T], *args: Any) -> T:
    """Run ``function(*args)`` in this (worker) thread under the context :func:`current_context` took.

    The overrides are merged over the worker's own, as DSPy's own parallel executor does, and the call id makes
    callbacks and tracing nest the work under the caller's call.
    """
    overrides, call_id = context
    token = thread_local_overrides.set(dotdict({**thread_local_overrides.get(), **overrides}))
    call_token = ACTIVE_CALL_ID.set(call_id)
    try:
        return function(*args)
    finally:
        ACTIVE_CALL_ID.reset(call_token)
        thread_local_overrides.reset(token)


def input_keys(example: dspy.Example) -> list[str]:
    """The example's input field names; empty when ``with_inputs`` was never called."""
    try:
        return list(example.inputs().keys())
    except ValueError:  # DSPy raises when the inputs were never set
        return []


def lm_engine(lm: Any) -> Any:
    """The engine a ``dspy.LM`` was built with (``"auto"``, ``"litellm"``, ``"lm15"`` or an engine object)."""
    return getattr(lm, "engine", None)


def price_map_entry(model: str) -> dict[str, Any]:
    """The entry of a model (``provider/name`` or a bare name) in the LiteLLM price map DSPy ships, or ``{}``.

    DSPy prices its own calls from this copy (``dspy.clients.model_metadata``); reading it does not import LiteLLM.
    ``LITELLM_LOCAL_MODEL_COST_MAP`` and ``LITELLM_MODEL_COST_MAP_URL`` keep LiteLLM's meaning.
    """
    from dspy.clients.model_metadata import _load, model_info

    provider, _, name = model.partition("/")
    if name:
        info = model_info(provider, name)
        if info:
            return info
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


__all__ = [
    "ACTIVE_CALL_ID",
    "AdapterParseError",
    "BaseCallback",
    "ContextWindowExceededError",
    "LMAuthError",
    "LMBillingError",
    "LMConfigurationError",
    "LMProviderError",
    "LMUnexpectedError",
    "LMUnsupportedFeatureError",
    "LMUnsupportedModelError",
    "UsageTracker",
    "logging_through_dspy",
    "current_context",
    "dspy_logging_stream",
    "input_keys",
    "is_retryable_lm_error",
    "lm_engine",
    "price_map_entry",
    "run_in_context",
    "user_stacklevel",
    "with_callbacks",
]
