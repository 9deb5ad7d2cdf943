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
  hits are not). The same entries count the calls, cache hits included. A paid call without such a cost is priced
  by its tokens from the LiteLLM price map DSPy ships (without importing LiteLLM); a model without a price counts in
  ``unpriced_calls`` and its cost is reported as unknown;
* only a program that fans out to threads of its own gets a DSPy callback, which tells a failed program's LM calls
  still in flight (see :class:`UsageCapture`);
* a 200 reply whose body is not UTF-8, or is not JSON as a whole, reaches DSPy as a server error, but the body
  travels in the exception's ``UnicodeDecodeError`` or ``JSONDecodeError``: :meth:`UsageCapture.count_unreadable_reply`
  reads the ``usage`` object from it, so its tokens count. A body cut short before its ``usage`` shows the client
  no usage, and LiteLLM's own retries inside one LM call are not seen either: neither is counted.

:func:`roll_up` adds a run's usage to the caller's ``dspy.track_usage()`` tracker.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import dspy

from dspy_opro.compat import BaseCallback, UsageTracker, price_map_entry
from dspy_opro.record.state import ModelUsage

logger = logging.getLogger(__name__)


class _SharedTracker(UsageTracker):
    """DSPy's usage tracker, thread-safe, shared (not copied) with the worker threads of DSPy's parallel executor.

    It keeps each usage dict it is given (DSPy skips the tracker on cache hits), so the history sink can tell a
    paid call's history entry by identity. DSPy's ``ParallelExecutor`` deep-copies the tracker in every worker task
    it starts, before the task's first LM call: ``on_fork`` hears of it then.
    """

    def __init__(self, on_fork: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._on_fork = on_fork
        self.paid: dict[str, list[dict[str, Any]]] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedTracker:
        if self._on_fork is not None:
            self._on_fork()
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
    """Stands in DSPy's ``caller_modules`` to receive the history entry of every LM call: calls and their costs.

    DSPy records a history entry for every LM call that returned, cache hits included, and hands it to every module
    in ``caller_modules`` (unless history is disabled), on whichever thread the call ran.
    """

    class _Entries(list):
        def __init__(self, sink: _HistorySink) -> None:
            super().__init__()
            self._sink = sink

        def append(self, entry: Any) -> None:  # nothing is stored: DSPy's history size limit never applies
            self._sink.receive(entry)

    def __init__(self, tracker: _SharedTracker, after: Callable[[], None] | None = None) -> None:
        self._tracker = tracker
        self._after = after  # called once a call is counted, on the thread that made it
        self._lock = threading.Lock()
        self.costs: dict[int, float] = {}  # id of a paid usage dict -> the cost of its call
        self.calls: dict[str, int] = {}  # model -> LM calls that returned (cache hits included)
        self.history = self._Entries(self)

    def receive(self, entry: Any) -> None:
        if not isinstance(entry, dict):
            return
        model = entry.get("model")
        usage, cost = entry.get("usage"), entry.get("cost")
        paid = isinstance(cost, (int, float)) and bool(usage) and self._tracker.is_paid(usage)
        with self._lock:
            if isinstance(model, str):
                self.calls[model] = self.calls.get(model, 0) + 1
            if paid and isinstance(cost, (int, float)):
                self.costs[id(usage)] = float(cost)
        if self._after is not None:
            self._after()


class LMCallCounter(BaseCallback):
    """Counts LM calls: started (retries included), finished without error per model (cache hits included), and
    the calls still in flight.

    Thread-safe: DSPy hands the same callbacks to every thread a program fans out to.
    """

    def __init__(self, after: Callable[[], None] | None = None) -> None:
        self._idle = threading.Condition()
        self._after = after  # called once a call ended, on the thread that made it
        self._models: dict[str, str] = {}  # calls in flight: call id -> model
        self.started = 0
        self.calls: dict[str, int] = {}

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        with self._idle:
            self.started += 1
            self._models[call_id] = getattr(instance, "model", "unknown")

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        with self._idle:
            model = self._models.pop(call_id, "unknown")
            if exception is None:
                self.calls[model] = self.calls.get(model, 0) + 1
            if not self._models:
                self._idle.notify_all()
        if self._after is not None:
            self._after()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no call is in flight (at most ``timeout`` seconds); whether that happened."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._models, timeout=timeout)


_PRICES: dict[str, tuple[float, float] | None] = {}
_PRICES_LOCK = threading.Lock()


def token_prices(model: str) -> tuple[float, float] | None:
    """USD per prompt and per completion token from the LiteLLM price map DSPy ships, or None without a price.

    The map is DSPy's copy (``dspy.clients.model_metadata``, the one DSPy prices its own calls from), so pricing a
    model never imports LiteLLM: a run whose models are custom engines or ``DummyLM`` does not load it.
    """
    if model in _PRICES:  # written once per model, under the lock; a dict read needs none
        return _PRICES[model]
    try:
        entry = price_map_entry(model)
        prompt, completion = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
        price: tuple[float, float] | None = None
        if isinstance(prompt, (int, float)) and isinstance(completion, (int, float)) and (prompt or completion):
            price = (float(prompt), float(completion))
    except Exception:
        price = None
    with _PRICES_LOCK:
        _PRICES[model] = price
    return price


def _tokens(entry: dict[str, Any], key: str) -> int:
    value = entry.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _history_reaches_callers() -> bool:
    """Whether DSPy hands every LM call's history entry to the modules in ``caller_modules`` (it does by default)."""
    return not dspy.settings.get("disable_history") and dspy.settings.get("max_history_size") != 0


class UsageCapture:
    """Captures the LM usage of the code run inside :meth:`active`, per model, on every thread it fans out to.

    Nothing runs on DSPy's callback path while the code runs on one thread: calls, cache hits and costs come from
    the LM history entries (the sink) and the tokens from the usage tracker. Only LM calls still in flight need a
    callback (:class:`LMCallCounter`), and only once the code has forked: when DSPy's parallel executor starts a
    task (it copies the tracker then), the counter joins the callbacks list this capture's contexts share, so every
    later LM call on any thread is seen starting and ending. A program that never forks keeps DSPy's fast path
    (a callback in the settings costs more than half of a local evaluation); one that does pays the callback path
    from its first fork on. The user's own callbacks stay in force throughout.
    """

    on_call: Callable[[], None] | None = None
    """Called after each LM call the capture counted, on the thread that made it, before the program goes on (a
    Dask worker reports the attempt's usage so far: :mod:`dspy_opro.scoring.dask_usage`)."""

    def __init__(self) -> None:
        self._tracker = _SharedTracker(on_fork=self._watch_in_flight)
        self._sink = _HistorySink(self._tracker, after=self._call_counted)
        self._lock = threading.Lock()
        self._callbacks: list[Any] | None = None  # the one callbacks list of every context of this capture
        self._counter: LMCallCounter | None = None

    def _watch_in_flight(self) -> None:
        """Count LM calls in flight from now on (idempotent, thread-safe)."""
        with self._lock:
            if self._counter is not None:
                return
            if self._callbacks is None:
                self._callbacks = list(dspy.settings.get("callbacks") or [])
            # The counter reports a call only where no history entry does (with DSPy's history turned off).
            self._counter = LMCallCounter(after=None if _history_reaches_callers() else self._call_counted)
            self._callbacks.append(self._counter)  # in place: the contexts already entered see it

    def active(self, **overrides: Any) -> Any:
        """A ``dspy.context`` that records into this capture (``overrides`` are further settings)."""
        if self._callbacks is None:
            with self._lock:
                if self._callbacks is None:
                    self._callbacks = list(dspy.settings.get("callbacks") or [])
            if not _history_reaches_callers():  # no history entries to count calls from: count them as they end
                self._watch_in_flight()
        callers = [self._sink, *(dspy.settings.get("caller_modules") or [])]
        return dspy.context(usage_tracker=self._tracker, callbacks=self._callbacks, caller_modules=callers,
                            **overrides)

    def count_unreadable_reply(self, exc: BaseException, model: str | None) -> bool:
        """Count the usage a failed LM call's reply carried when the client read its body but could not decode it
        (a 200 reply that is not UTF-8, or not JSON as a whole); whether there was one."""
        usage = unreadable_reply_usage(exc)
        if usage is None or not model:
            return False
        self._tracker.add_usage(model, usage)
        self._call_counted()
        return True

    def _call_counted(self) -> None:
        if self.on_call is not None:
            self.on_call()

    def result(self, *, settle: float = 0.0) -> dict[str, ModelUsage]:
        """The usage captured so far, per model.

        Args:
            settle: Seconds to wait, at most, for LM calls still in flight on threads the code started: a program
                that raised while its own worker threads were still calling the LM has paid for those calls too.
                A program that never forked has none.
        """
        counter = self._counter
        if settle > 0 and counter is not None and not counter.wait_idle(settle):
            logger.warning("LM calls of a failed program were still running after %.0f s; their usage is not "
                           "counted", settle)
        tracker, sink = self._tracker, self._sink
        with tracker._lock:
            paid_by_model = {model: list(entries) for model, entries in tracker.paid.items()}
            all_by_model = {model: list(entries) for model, entries in tracker.usage_data.items()}
        with sink._lock:
            calls_by_model = dict(sink.calls)
            costs = dict(sink.costs)
        counted = dict(counter.calls) if counter is not None else {}
        usage: dict[str, ModelUsage] = {}
        for model in {**all_by_model, **calls_by_model, **counted}:
            paid, entries = paid_by_model.get(model, []), all_by_model.get(model, [])
            prompt = completion = cached = 0
            for entry in entries:  # what the tracker holds: also entries a nested dspy.track_usage() rolled up
                prompt += _tokens(entry, "prompt_tokens")
                completion += _tokens(entry, "completion_tokens")
                details = entry.get("prompt_tokens_details")
                cached += _tokens(details, "cached_tokens") if isinstance(details, dict) else 0
            cost, priced_prompt, priced_completion, unpriced = 0.0, prompt, completion, max(len(entries) - len(paid), 0)
            for entry in paid:
                call_cost = costs.get(id(entry))
                if call_cost is None:
                    unpriced += 1
                    continue
                cost += call_cost
                priced_prompt -= _tokens(entry, "prompt_tokens")
                priced_completion -= _tokens(entry, "completion_tokens")
            # Calls without a cost of their own: from the price map, or unknown.
            price = token_prices(model) if unpriced else None
            if price is not None:
                cost += priced_prompt * price[0] + priced_completion * price[1]
                unpriced = 0
            calls = max(calls_by_model.get(model, 0), counted.get(model, 0), len(entries))
            usage[model] = ModelUsage(calls=calls, cache_hits=calls - len(entries), prompt_tokens=prompt,
                                      completion_tokens=completion, cached_tokens=cached, cost=cost,
                                      unpriced_calls=unpriced)
        return usage


def unreadable_reply_usage(exc: BaseException) -> dict[str, Any] | None:
    """The ``usage`` object of a 200 reply the client received but could not read, from the body its exception
    chain holds: the bytes of a ``UnicodeDecodeError`` (a body that is not UTF-8), or the text of a
    ``JSONDecodeError`` (a body that is not JSON as a whole, whose ``usage`` object is). None when there is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UnicodeDecodeError) and isinstance(current.object, (bytes, bytearray)):
            return _usage_in(bytes(current.object).decode("utf-8", errors="replace"))
        if isinstance(current, json.JSONDecodeError) and isinstance(current.doc, str):
            return _usage_in(current.doc)
        current = current.__cause__ or current.__context__
    return None


_USAGE_KEY = re.compile(r'"usage"\s*:\s*(?=\{)')


def _usage_in(body: str) -> dict[str, Any] | None:
    """The ``usage`` object of a reply body: the whole body parsed, else the first ``"usage": {...}`` that parses
    on its own (a body broken elsewhere)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        usage = parsed.get("usage")
        return dict(usage) if isinstance(usage, dict) else None
    for match in _USAGE_KEY.finditer(body):
        try:
            usage, _ = json.JSONDecoder().raw_decode(body, match.end())
        except ValueError:
            continue
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            return usage
    return None


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


__all__ = ["LMCallCounter", "UsageCapture", "roll_up", "token_prices", "unreadable_reply_usage"]
