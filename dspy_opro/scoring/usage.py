"""Tokens and cost of a run's LM calls, counted where each call happens, on whatever thread makes it.

:class:`UsageMeter` is a DSPy callback (``BaseCallback``) placed in the ``callbacks`` of the run's own LM objects
(``dspy.LM(..., callbacks=[...])``, public API): the task model, the optimizer model, the label-free judge and the
LM of any predictor that has its own. DSPy calls an LM's callbacks around every call of that LM, on the thread that
makes it, so a program's calls on threads it starts itself (``dspy.Parallel``, a ``ThreadPoolExecutor``, a bare
``threading.Thread`` using the LM of ``dspy.configure``) are seen like the run's own. Around each call the meter puts
a one-call usage tracker in the call's DSPy context (``dspy.context(usage_tracker=...)``), where DSPy adds what the
provider reported as billed (a cache hit adds nothing; DSPy 3.4 also adds the usage of an attempt that failed), so
the meter learns each call's tokens from DSPy itself; the cost is those tokens at the prices of the LiteLLM price map
DSPy ships (cached prompt tokens at the cached price), read without importing LiteLLM. A model without a price makes
the cost "unknown" (``unpriced_calls``) rather than $0; a billed reply whose ``usage`` is missing or cannot be true
(negative counts) has its tokens estimated from the text sent and received (``estimated_calls``), said once per model,
so that ``max_cost`` still bounds the run. A 200 reply whose body
is not UTF-8 or not JSON reaches DSPy as a server error with the body in its exception:
:func:`unreadable_reply_usage` reads the ``usage`` from it, so its tokens count too.

An LM the run does not know of (one a metric builds for an LLM judge) is counted by an :class:`EvaluationTracker`
put in each evaluation's context: DSPy adds its calls there, and only there, since a metered call's own tracker
takes the place of the evaluation's while it runs. Calls of such an LM on threads the metric or program start
themselves are not seen.

The run reads the meter with :meth:`UsageMeter.take` (what was billed since the last read, per model) each time it
journals an evaluation or an optimizer reply, so the journal holds every call once. :func:`roll_up` adds a run's
usage to the caller's ``dspy.track_usage()``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import dspy

from dspy_opro.compat import BaseCallback, price_map_entry
from dspy_opro.state import ModelUsage

logger = logging.getLogger(__name__)

_PRICES: dict[str, tuple[float, float, float] | None] = {}
_PRICES_LOCK = threading.Lock()


def token_prices(model: str) -> tuple[float, float, float] | None:
    """USD per prompt, completion and cached prompt token from the LiteLLM price map DSPy ships, or None."""
    if model in _PRICES:  # written once per model, under the lock; a dict read needs none
        return _PRICES[model]
    try:
        entry = price_map_entry(model)
        prompt, completion = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
        cached = entry.get("cache_read_input_token_cost", prompt)
        price = None
        if isinstance(prompt, (int, float)) and isinstance(completion, (int, float)) and (prompt or completion):
            price = (float(prompt), float(completion), float(cached if isinstance(cached, (int, float)) else prompt))
    except Exception:
        price = None
    with _PRICES_LOCK:
        _PRICES[model] = price
    return price


def _count(entry: dict[str, Any], key: str) -> int | None:
    """A token count of a reported usage: 0 when absent, None when it cannot be true (negative, not a number)."""
    value = entry.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**53:
        return None
    return int(value)


def billed_tokens(entry: dict[str, Any]) -> tuple[int, int, int] | None:
    """``(prompt, completion, cached)`` tokens of one reported usage; None when it says nothing usable of what was
    billed (no counts, or counts that cannot be true: negative, not numbers, more cached than prompt tokens)."""
    details = entry.get("prompt_tokens_details")  # a dict, or LiteLLM's object before DSPy 3.3
    prompt, completion = _count(entry, "prompt_tokens"), _count(entry, "completion_tokens")
    cached = _count(details, "cached_tokens") if isinstance(details, dict) else \
        _count({"cached_tokens": getattr(details, "cached_tokens", None)}, "cached_tokens")
    if prompt is None or completion is None or cached is None or not (prompt or completion) or cached > prompt:
        return None
    return prompt, completion, cached


def usage_of(model: str, entries: Iterable[dict[str, Any]], *, calls: int, cache_hits: int = 0) -> ModelUsage:
    """The usage of ``calls`` LM calls of ``model`` whose billed usage DSPy reported as ``entries``, priced.

    An entry that says nothing usable (:func:`billed_tokens`) makes the cost unknown (``unpriced_calls``)."""
    usage = ModelUsage(calls=calls, cache_hits=cache_hits)
    for entry in entries:
        tokens = billed_tokens(entry)
        if tokens is None:
            usage.unpriced_calls += 1  # billed, but the reply said nothing usable of what: its cost is unknown
            continue
        add_priced(usage, model, *tokens)
    return usage


def add_priced(usage: ModelUsage, model: str, prompt: int, completion: int, cached: int = 0) -> None:
    """Add one call's tokens to ``usage`` with their cost at the model's prices (unknown: ``unpriced_calls``)."""
    usage.prompt_tokens += prompt
    usage.completion_tokens += completion
    usage.cached_tokens += cached
    price = token_prices(model)
    if price is not None:
        usage.cost += (prompt - cached) * price[0] + cached * price[2] + completion * price[1]
    else:
        usage.unpriced_calls += 1


def estimated_usage(model: str, inputs: dict[str, Any], outputs: Any) -> ModelUsage:
    """One call's usage estimated from the text it sent (``inputs`` of DSPy's LM callback) and received: LiteLLM's
    token count for the model where it has one, else a token per four characters; marked ``estimated_calls``."""
    sent = inputs.get("messages") or [{"role": "user", "content": str(inputs.get("prompt") or "")}]
    texts = [o.get("text") if isinstance(o, dict) else o for o in (outputs if isinstance(outputs, list) else [])]
    received = "".join(text for text in texts if isinstance(text, str))
    usage = ModelUsage(calls=1, estimated_calls=1)
    add_priced(usage, model, _tokens(model, messages=sent), _tokens(model, text=received))
    return usage


def _tokens(model: str, *, messages: Any = None, text: str | None = None) -> int:
    try:
        import litellm

        return int(litellm.token_counter(model=model, messages=messages, text=text))
    except Exception:  # a model LiteLLM cannot count, or content it cannot read
        shown = text if text is not None else json.dumps(messages, default=str)
        return (len(shown) + 3) // 4


def add_usage(total: dict[str, ModelUsage], extra: dict[str, ModelUsage]) -> dict[str, ModelUsage]:
    """``total`` with ``extra`` added, per model (in place; returned for convenience)."""
    for model, entry in extra.items():
        if model in total:
            total[model].add(entry)
        else:
            total[model] = entry.model_copy()  # a model of its own: never the caller's object
    return total


class _Sink(dict):  # type: ignore[type-arg]
    """``usage_data`` of the trackers below: a nested ``dspy.track_usage()`` rolls its entries up into it on exit
    (DSPy 3.4), and they are dropped, since the meter or the evaluation's tracker counted them as they came."""

    def __missing__(self, key: str) -> list[Any]:
        return []


class _CallTracker:
    """The usage tracker of one LM call: keeps what DSPy adds, and hands it on to the tracker it stands in for."""

    def __init__(self, outer: Any):
        self.entries: list[dict[str, Any]] = []
        self.outer = outer
        self.usage_data = _Sink()

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        self.entries.append(dict(usage_entry or {}))
        if self.outer is not None and not isinstance(self.outer, EvaluationTracker):
            self.outer.add_usage(lm, usage_entry)  # a module's own track_usage() (prediction.get_lm_usage())


class EvaluationTracker:
    """The usage tracker of one evaluation: the calls of LMs the meter does not know of, per model."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, list[dict[str, Any]]] = {}
        self.usage_data = _Sink()

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        with self._lock:
            self._entries.setdefault(lm, []).append(dict(usage_entry or {}))

    def __deepcopy__(self, memo: dict[int, Any]) -> EvaluationTracker:  # DSPy's executors copy a tracker per task
        copied = EvaluationTracker()
        with self._lock:
            copied._entries = {model: [dict(entry) for entry in entries] for model, entries in self._entries.items()}
        return copied

    def usage(self) -> dict[str, ModelUsage]:
        with self._lock:
            return {model: usage_of(model, entries, calls=len(entries)) for model, entries in self._entries.items()}


class UsageMeter(BaseCallback):
    """Counts every call of the LMs it is attached to (:meth:`attached`), wherever it happens; thread-safe.

    Attributes:
        on_call: Called after each counted call, on the thread that made it (a Dask worker reports its attempt's
            usage so far then: :mod:`dspy_opro.scoring.dask_usage`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified as each metered call ends
        self._open: dict[str, tuple[str, Any, _CallTracker, dict[str, Any]]] = {}
        self._estimated_models: set[str] = set()  # models whose unusable usage was already said
        self._pending: dict[str, ModelUsage] = {}
        self._total: dict[str, ModelUsage] = {}
        self._lms: weakref.WeakSet[Any] = weakref.WeakSet()
        self.on_call: Any = None
        self.copied = False  # a copy sent with a job to another process (a Dask worker)

    def __getstate__(self) -> dict[str, Any]:  # a copy in a Dask job starts empty, on its worker
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.copied = True

    def __deepcopy__(self, memo: dict[int, Any]) -> UsageMeter:
        return self  # an LM copied with the program (a candidate's predictor) still reports here

    def attach(self, lms: Iterable[Any]) -> None:
        """Meter these LMs (each once; None and objects without ``callbacks`` are passed over)."""
        for lm in lms:
            callbacks = getattr(lm, "callbacks", None)
            if isinstance(callbacks, list) and not any(c is self for c in callbacks):
                callbacks.append(self)
                self._lms.add(lm)

    def detach(self) -> None:
        """Leave every LM as it was."""
        for lm in list(self._lms):
            lm.callbacks[:] = [c for c in lm.callbacks if c is not self]
        self._lms.clear()

    @contextlib.contextmanager
    def attached(self, lms: Iterable[Any]) -> Iterator[UsageMeter]:
        self.attach(lms)
        try:
            yield self
        finally:
            self.detach()

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        with self._lock:
            if call_id in self._open:  # the LM is also in dspy.settings.callbacks: counted once
                return
        tracker = _CallTracker(dspy.settings.get("usage_tracker"))
        context = dspy.context(usage_tracker=tracker)
        context.__enter__()  # left in on_lm_end, on this thread, in this context
        with self._lock:
            self._open[call_id] = (getattr(instance, "model", "unknown"), context, tracker, inputs)

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        try:
            self._count(call_id, outputs, exception)
        finally:
            with self._idle:
                self._idle.notify_all()

    def _count(self, call_id: str, outputs: Any, exception: BaseException | None) -> None:
        with self._lock:
            opened = self._open.pop(call_id, None)
        if opened is None:
            return
        model, context, tracker, inputs = opened
        context.__exit__(None, None, None)
        entries = tracker.entries
        if exception is not None and not entries:
            body = unreadable_reply_usage(exception)
            entries = [body] if body is not None else []
        if exception is not None and not entries:
            return  # refused or lost before anything was billed
        usable = [entry for entry in entries if billed_tokens(entry) is not None]
        if entries and not usable and exception is None:  # billed, but the reply says nothing usable of what
            usage = estimated_usage(model, inputs, outputs)
            self._say_estimated(model, entries)
        else:
            usage = usage_of(model, usable or entries, calls=1, cache_hits=int(not entries))
        with self._lock:
            add_usage(self._pending, {model: usage})
            add_usage(self._total, {model: usage})
        if self.on_call is not None:
            self.on_call()

    def _say_estimated(self, model: str, entries: list[dict[str, Any]]) -> None:
        with self._lock:
            if model in self._estimated_models:
                return
            self._estimated_models.add(model)
        logger.warning("The model %r answered without a usage that can be true (%s): the tokens of such replies are "
                       "estimated from the text sent and received, and the cost is marked estimated "
                       "(estimated_calls in the run record). Said once per model", model,
                       json.dumps(entries[0], default=str)[:200] if entries[0] else "no usage")

    def take(self) -> dict[str, ModelUsage]:
        """What the metered LMs were billed since the last ``take``, per model."""
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def total(self) -> dict[str, ModelUsage]:
        """Everything metered so far, per model (copies)."""
        with self._lock:
            return {model: usage.model_copy() for model, usage in self._total.items()}

    def in_flight(self) -> int:
        with self._lock:
            return len(self._open)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no metered call is in flight (at most ``timeout`` seconds); whether none is."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._open, timeout=timeout)


def unreadable_reply_usage(exc: BaseException) -> dict[str, Any] | None:
    """The ``usage`` object of a 200 reply the client received but could not read, from the body its exception
    chain holds: the bytes of a ``UnicodeDecodeError`` or the text of a ``JSONDecodeError``; None when there is none."""
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
    """The ``usage`` object of a reply body: the whole body parsed, else the first ``"usage": {...}`` that parses on
    its own (a body broken elsewhere)."""
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


def roll_up(tracker: Any, per_model: dict[str, ModelUsage]) -> None:
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


__all__ = ["EvaluationTracker", "UsageMeter", "add_usage", "roll_up", "token_prices", "unreadable_reply_usage",
           "usage_of"]
