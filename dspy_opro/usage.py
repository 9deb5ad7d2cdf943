"""Tokens and cost of LM calls, per model, exact under any threading.

:class:`UsageCapture` records what the code run inside :meth:`UsageCapture.active` paid for: one evaluation (the
program and its metric) or one optimizer call. It works through DSPy's own hooks, so it also sees calls made on
other threads by the program itself:

* the usage tracker is DSPy's (``dspy.context(usage_tracker=...)``); DSPy's ``ParallelExecutor`` (behind
  ``dspy.Parallel`` and ``Module.batch``) deep-copies the tracker into each worker thread and drops the copy, which
  loses every token spent there. Our tracker's deep copy is the tracker itself, behind a lock, so workers add to it;
* the cost of a call is the one DSPy records in the LM history entry of that call (LiteLLM's own per-response cost,
  cached-token discounts included, or DSPy's estimate for its native clients). A history sink placed in DSPy's
  ``caller_modules`` receives those entries; an entry counts when its ``usage`` is one the tracker was given (cache
  hits are not). A paid call without such a cost is priced from LiteLLM's price map by its tokens; a model without
  a price counts in ``unpriced_calls`` and its cost is reported as unknown.

:func:`roll_up` adds a run's usage to the caller's ``dspy.track_usage()`` tracker.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import dspy

from dspy_opro.compat import BaseCallback, UsageTracker
from dspy_opro.state import ModelUsage

logger = logging.getLogger(__name__)


class _SharedTracker(UsageTracker):
    """DSPy's usage tracker, thread-safe, shared (not copied) with the worker threads of DSPy's parallel executor.

    It keeps each usage dict it is given (DSPy skips the tracker on cache hits), so the history sink can tell a
    paid call's history entry by identity.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.paid: dict[str, list[dict[str, Any]]] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedTracker:
        return self  # DSPy's ParallelExecutor copies the tracker per thread and drops the copy: share it instead

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        with self._lock:
            super().add_usage(lm, usage_entry)
            self.paid.setdefault(lm, []).append(usage_entry)

    def is_paid(self, usage_entry: Any) -> bool:
        with self._lock:
            return any(entry is usage_entry for entries in self.paid.values() for entry in entries)

    def get_total_tokens(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return super().get_total_tokens()


class _HistorySink:
    """Stands in DSPy's ``caller_modules`` to receive the history entry of every LM call: their costs."""

    class _Entries(list):
        def __init__(self, sink: _HistorySink) -> None:
            super().__init__()
            self._sink = sink

        def append(self, entry: Any) -> None:  # nothing is stored: DSPy's history size limit never applies
            self._sink.receive(entry)

    def __init__(self, tracker: _SharedTracker) -> None:
        self._tracker = tracker
        self._lock = threading.Lock()
        self.costs: dict[int, float] = {}  # id of a paid usage dict -> the cost of its call
        self.history = self._Entries(self)

    def receive(self, entry: Any) -> None:
        if not isinstance(entry, dict):
            return
        usage, cost = entry.get("usage"), entry.get("cost")
        if usage and isinstance(cost, (int, float)) and self._tracker.is_paid(usage):
            with self._lock:
                self.costs[id(usage)] = float(cost)


class LMCallCounter(BaseCallback):
    """Counts LM calls: started (retries included), finished without error per model (cache hits included), and
    the calls still in flight.

    Thread-safe: DSPy hands the same callbacks to every thread a program fans out to.
    """

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._models: dict[str, str] = {}  # calls in flight: call id -> model
        self.started = 0
        self.calls: dict[str, int] = {}

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        with self._idle:
            self.started += 1
            self._models[call_id] = getattr(instance, "model", "unknown")

    def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        with self._idle:
            model = self._models.pop(call_id, "unknown")
            if exception is None:
                self.calls[model] = self.calls.get(model, 0) + 1
            if not self._models:
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no call is in flight (at most ``timeout`` seconds); whether that happened."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._models, timeout=timeout)


_PRICES: dict[str, tuple[float, float] | None] = {}
_PRICES_LOCK = threading.Lock()


def token_prices(model: str) -> tuple[float, float] | None:
    """USD per prompt and per completion token from LiteLLM's price map, or None when the model has no price."""
    with _PRICES_LOCK:
        if model in _PRICES:
            return _PRICES[model]
    try:
        import litellm

        prompt, completion = litellm.cost_per_token(model=model, prompt_tokens=1_000_000, completion_tokens=1_000_000)
        price: tuple[float, float] | None = (prompt / 1_000_000, completion / 1_000_000)
        if price == (0.0, 0.0):
            price = None
    except Exception:
        price = None
    with _PRICES_LOCK:
        _PRICES[model] = price
    return price


def _tokens(entry: dict[str, Any], key: str) -> int:
    value = entry.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


class UsageCapture:
    """Captures the LM usage of the code run inside :meth:`active`, per model, on every thread it fans out to."""

    def __init__(self) -> None:
        self._tracker = _SharedTracker()
        self._sink = _HistorySink(self._tracker)
        self._counter = LMCallCounter()

    def active(self, **overrides: Any) -> Any:
        """A ``dspy.context`` that records into this capture (``overrides`` are further settings)."""
        callbacks = [*dspy.settings.get("callbacks", []), self._counter]
        callers = [self._sink, *(dspy.settings.get("caller_modules") or [])]
        return dspy.context(usage_tracker=self._tracker, callbacks=callbacks, caller_modules=callers, **overrides)

    def result(self, *, settle: float = 0.0) -> dict[str, ModelUsage]:
        """The usage captured so far, per model.

        Args:
            settle: Seconds to wait, at most, for LM calls still in flight on threads the code started: a program
                that raised while its own worker threads were still calling the LM has paid for those calls too.
        """
        if settle > 0 and not self._counter.wait_idle(settle):
            logger.warning("LM calls of a failed program were still running after %.0f s; their usage is not "
                           "counted", settle)
        usage: dict[str, ModelUsage] = {}
        with self._tracker._lock:
            paid_by_model = {model: list(entries) for model, entries in self._tracker.paid.items()}
            all_by_model = {model: list(entries) for model, entries in self._tracker.usage_data.items()}
        for model in set(all_by_model) | set(self._counter.calls):
            paid, entries = paid_by_model.get(model, []), all_by_model.get(model, [])
            record = ModelUsage()
            for entry in entries:  # what the tracker holds: also entries a nested dspy.track_usage() rolled up
                record.prompt_tokens += _tokens(entry, "prompt_tokens")
                record.completion_tokens += _tokens(entry, "completion_tokens")
                details = entry.get("prompt_tokens_details") or {}
                record.cached_tokens += _tokens(details, "cached_tokens") if isinstance(details, dict) else 0
            price = token_prices(model)
            priced_prompt, priced_completion = record.prompt_tokens, record.completion_tokens
            for entry in paid:
                cost = self._sink.costs.get(id(entry))
                if cost is not None:
                    record.cost += cost
                    priced_prompt -= _tokens(entry, "prompt_tokens")
                    priced_completion -= _tokens(entry, "completion_tokens")
            # Calls without a cost of their own: from the price map, or unknown.
            unpriced = max(len(entries) - len(paid), 0) + sum(id(entry) not in self._sink.costs for entry in paid)
            if unpriced and price is not None:
                record.cost += priced_prompt * price[0] + priced_completion * price[1]
            elif unpriced:
                record.unpriced_calls = unpriced
            record.calls = max(self._counter.calls.get(model, 0), len(entries))
            record.cache_hits = record.calls - len(entries)
            usage[model] = record
        return usage


def roll_up(tracker: UsageTracker | None, per_model: dict[str, ModelUsage]) -> None:
    """Add usage to a caller's ``dspy.track_usage()`` tracker (one entry per model), if there is one."""
    if tracker is None:
        return
    for model, usage in per_model.items():
        if usage.calls - usage.cache_hits <= 0:
            continue
        entry: dict[str, Any] = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                                 "total_tokens": usage.prompt_tokens + usage.completion_tokens}
        if usage.cached_tokens:
            entry["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
        tracker.add_usage(model, entry)


__all__ = ["LMCallCounter", "UsageCapture", "roll_up", "token_prices"]
