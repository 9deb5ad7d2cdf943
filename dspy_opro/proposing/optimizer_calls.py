"""One step's optimizer calls: the meta-prompt, sent verbatim, for ``num_candidates`` completions.

The authors send the meta-prompt as the single user message of a chat completion, eight times per step at
temperature 1.0, one completion per call. Where the provider honours OpenAI's ``n`` (an OpenAI-compatible model
reached through LiteLLM, which passes ``n`` on), one request asks for all the completions: the prompt is billed
once instead of eight times. Elsewhere (DSPy's native engine fans ``n`` out into sequential one-choice requests)
the calls run in parallel, each with its own seeded ``rollout_id``. DSPy's cache key includes the rollout id, so
the identical requests are neither collapsed into one cached answer nor re-bought when a run is repeated with the
cache on, and the seed makes the ids reproducible.

A call that still fails after DSPy's own retries, or that answers with no choices at all, is logged at WARNING,
tried once more and then dropped, so a step can yield fewer replies than asked; authentication, permission,
billing, unknown-model and configuration errors stop the run at once with :class:`FatalLMError` naming the model.
A provider that answers an ``n`` request with fewer choices (some OpenAI-compatible servers ignore ``n``) gets the
missing ones asked as single-choice requests with their own seeded rollout ids, so each step still gets
``num_candidates`` proposals; the run remembers that the model ignores ``n`` (logged once) and asks it with
single-choice requests from then on. A server that refuses the ``n`` request itself (HTTP 400 naming ``n``, as
llama.cpp's ``llama-server`` does above its slot count) is treated the same way: the request is not tried again,
all the proposals are asked as single-choice requests, and the model is named in :attr:`Proposals.single_choice`
so the run records it and a resumed run never sends the ``n`` request again.

With ``max_cost``, no optimizer request is sent whose worst case does not fit in what is left of the budget: before
each try, its cost is bounded by the meta-prompt's tokens at the model's input price plus ``n x max_tokens`` at its
output price (:func:`request_cost_bound`), and the bound is reserved from the money left. An ``n`` request that
does not fit asks for the largest ``n`` that does; single-choice requests that do not fit are not sent. What was
not sent is counted in :attr:`Proposals.skipped_calls` with the reason, logged at WARNING.

Each request's replies are handed, as the request returns, to a ``reply_log`` (:class:`ReplyLog`: the run's journal)
with what the request cost. A step resumed after a kill passes the replies already ``received`` by sample: only the
other samples are asked for, as single-choice requests with the rollout ids they had (an ``n`` request journals all
its choices at once, so a step with some replies but not all was asking one choice at a time), and the result holds
all of them in sample order, with the usage of the new requests only.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import dspy

from dspy_opro.compat import current_context, lm_engine, run_in_context
from dspy_opro.errors import (
    EmptyResponseError,
    classify_exception,
    clean_text,
    describe_exception,
    fatal_lm_error,
    rejects_n,
)
from dspy_opro.record.state import ModelUsage
from dspy_opro.scoring.usage import UsageCapture, token_prices

logger = logging.getLogger(__name__)

# Keeps rollout ids of different seeds and steps apart: id = seed * 10**9 + (step + 1) * 10**4 + sample.
_SEED_SPAN = 10**9
_STEP_SPAN = 10**4


def rollout_id(seed: int, step: int, sample: int) -> int:
    """The reproducible rollout id of one optimizer sample."""
    return seed * _SEED_SPAN + (step + 1) * _STEP_SPAN + sample


class ReplyLog(Protocol):
    """Records each optimizer request's replies as they arrive (the run journals them)."""

    def record(self, sample: int, replies: list[str], usage: dict[str, ModelUsage]) -> None:
        """One request's replies: its choices, the first being ``sample``; ``usage`` is what the request cost."""


@dataclass
class Proposals:
    """What one step's optimizer calls returned."""

    replies: list[str] = field(default_factory=list)  # in sample order (received ones too), failed samples left out
    by_sample: dict[int, str] = field(default_factory=dict)  # the same replies by sample number
    failed_calls: int = 0
    errors: list[str] = field(default_factory=list)  # the last error of each failed call
    usage: dict[str, ModelUsage] = field(default_factory=dict)
    single_choice: str | None = None  # why the model is to be asked one choice at a time (found in this step)
    skipped_calls: int = 0  # proposals not asked for because their worst-case cost did not fit in max_cost
    skip_reason: str | None = None
    answered_calls: int = 0  # requests that returned at least one choice
    usage_undercount: str | None = None  # the provider's usage counted fewer completion tokens than it served


def usage_undercount(outputs: list[Any], usage: dict[str, ModelUsage]) -> str | None:
    """What is wrong with the usage of a request answered with several choices, when it counts too few tokens.

    A tokenizer that splits at whitespace first (GPT's byte-level BPE, SentencePiece) never puts two words in one
    token, so the choices hold at least as many tokens as words. A provider whose ``usage.completion_tokens`` is
    below that counted only some choices (``llama-server`` counts the first one when ``n > 1``).
    """
    paid = [u for u in usage.values() if u.calls > u.cache_hits]
    if len(outputs) < 2 or not paid:
        return None
    reported = sum(u.completion_tokens for u in paid)
    words = sum(len(_reply_text(output).split()) for output in outputs)
    if reported >= words:
        return None
    return (f"its usage counted {reported} completion tokens for {len(outputs)} choices that hold at least {words} "
            "(a server that counts only the first choice, as llama-server does with n > 1): the recorded optimizer "
            "tokens and cost are too low")


def prompt_token_bound(lm: Any, text: str) -> int:
    """An upper bound on the prompt tokens of ``text`` sent as one user message.

    A byte-level BPE token holds at least one byte, so the UTF-8 length bounds any such tokenizer; a model on
    LiteLLM is counted with LiteLLM's own tokenizer for it (tiktoken for OpenAI models), with a tenth more and the
    chat template's tokens as the margin, which is tighter and still above what providers bill.
    """
    if isinstance(lm, dspy.LM) and lm_engine(lm) == "litellm":
        try:
            import litellm

            counted = litellm.token_counter(model=lm.model, messages=[{"role": "user", "content": text}])
            return int(counted * 1.1) + 16
        except Exception:  # a model LiteLLM cannot count: the byte bound
            pass
    return len(text.encode("utf-8")) + 16


def request_cost_bound(prices: tuple[float, float], prompt_tokens: int, *, n: int, max_tokens: int) -> float:
    """The most one optimizer request can cost: its prompt at the input price, ``n x max_tokens`` at the output's."""
    prompt_price, completion_price = prices
    return prompt_tokens * prompt_price + n * max_tokens * completion_price


class CostReserve:
    """The money left under ``max_cost`` for one step's optimizer requests; each try reserves its bound first.

    Thread-safe: single-choice requests run in parallel. A request the provider refused before any generation
    (a 400) gives its reservation back.

    Args:
        left: USD left under ``max_cost`` (None: no limit).
    """

    def __init__(self, left: float | None):
        self.left = left
        self._lock = threading.Lock()

    def take(self, amount: float) -> bool:
        if self.left is None:
            return True
        with self._lock:
            if amount > self.left:
                return False
            self.left -= amount
            return True

    def give_back(self, amount: float) -> None:
        if self.left is not None:
            with self._lock:
                self.left += amount


_N_PROVIDERS = ("openai", "azure")  # LiteLLM providers that take n and return n choices in one response


def honours_n(lm: Any, ignores_n: Collection[str] | None = None) -> bool:
    """Whether one request can ask ``lm`` for several completions (billing the prompt once).

    Args:
        lm: The optimizer model.
        ignores_n: Models this run (or the run it resumes: ``RunState.optimizer_single_choice``) has seen answer an
            ``n`` request with fewer choices, or refuse it.
    """
    if not isinstance(lm, dspy.LM) or lm_engine(lm) != "litellm":
        return False
    if ignores_n and lm.model in ignores_n:
        return False
    provider = lm.model.split("/", 1)[0] if "/" in lm.model else "openai"
    return provider in _N_PROVIDERS


@dataclass
class _CallResult:
    outputs: list[str] | None
    error: str | None
    usage: dict[str, ModelUsage]
    n_refused: bool = False  # the provider refused the request's n (a 400 naming n): ask single choices instead
    over_budget: bool = False  # not sent (or not tried again): its worst case did not fit in max_cost


def _one_call(lm: dspy.BaseLM, meta_prompt: str, n: int, temperature: float, max_tokens: int, rid: int,
              reserve: CostReserve, bound: float) -> _CallResult:
    """One optimizer call with one extra try, each try paid from ``reserve`` at most ``bound`` first."""
    capture = UsageCapture()
    error: str | None = None
    extra = {"n": n} if n > 1 else {}
    for attempt in range(1, 3):
        if not reserve.take(bound):
            return _CallResult(None, error, capture.result(), over_budget=True)
        try:
            with capture.active():
                outputs = lm(meta_prompt, temperature=temperature, max_tokens=max_tokens, rollout_id=rid, **extra)
            if not outputs:
                raise EmptyResponseError("the optimizer model answered with no choices")
            return _CallResult(outputs, None, capture.result())
        except Exception as exc:
            if classify_exception(exc) == "fatal":
                raise fatal_lm_error("optimizer", getattr(lm, "model", repr(lm)), exc) from exc
            error = describe_exception(exc)
            if n > 1 and rejects_n(exc):
                reserve.give_back(bound)  # refused before generating anything
                return _CallResult(None, error, capture.result(), n_refused=True)
            logger.warning("Optimizer call (rollout %d, try %d of 2) failed: %s", rid, attempt, error)
    return _CallResult(None, error, capture.result())


def _reply_text(output: Any) -> str:
    if isinstance(output, str):
        return clean_text(output)
    if isinstance(output, dict):
        return clean_text(str(output.get("text") or ""))
    return clean_text(str(output))


def propose(
    lm: dspy.BaseLM,
    meta_prompt: str,
    *,
    num_candidates: int,
    step: int,
    seed: int,
    temperature: float,
    max_tokens: int,
    num_threads: int,
    ignores_n: set[str] | None = None,
    cost_left: float | None = None,
    received: Mapping[int, str] | None = None,
    reply_log: ReplyLog | None = None,
) -> Proposals:
    """Ask for ``num_candidates`` completions of ``meta_prompt`` and collect the replies in sample order.

    Args:
        ignores_n: The run's set of models to ask one choice at a time; a model found ignoring or refusing ``n``
            is added to it (and named, with why, in the result's ``single_choice``).
        cost_left: USD left under ``max_cost`` (None: no limit). No request is sent whose worst-case cost
            (:func:`request_cost_bound`) does not fit; a model without a known price is not limited.
        received: Replies already received for this step, by sample (a run killed during its optimizer calls):
            only the other samples are asked for, and the result holds these too (their usage is not counted again).
        reply_log: Records each request's replies as the request returns, with its usage.
    """
    context = current_context()  # worker threads make the calls under the caller's DSPy settings
    proposals = Proposals()
    by_sample = {sample: text for sample, text in (received or {}).items() if 0 <= sample < num_candidates}
    model = getattr(lm, "model", repr(lm))
    prices = token_prices(model) if cost_left is not None else None
    reserve = CostReserve(cost_left if prices is not None else None)
    prompt_tokens = prompt_token_bound(lm, meta_prompt) if prices is not None else 0

    def bound(n: int) -> float:
        return request_cost_bound(prices, prompt_tokens, n=n, max_tokens=max_tokens) if prices is not None else 0.0

    def call(sample: int, n: int) -> _CallResult:
        return run_in_context(context, _one_call, lm, meta_prompt, n, temperature, max_tokens,
                              rollout_id(seed, step, sample), reserve, bound(n))

    def skip(count: int, why: str) -> None:
        proposals.skipped_calls += count
        proposals.skip_reason = why
        logger.warning("Step %d: %d optimizer proposals not asked for: %s", step, count, why)

    def over_budget_reason(n: int) -> str:
        left = reserve.left if reserve.left is not None else 0.0
        return (f"max_cost: an optimizer request for {n} choice{'s' if n > 1 else ''} could cost up to "
                f"${bound(n):.6f} ({prompt_tokens} prompt tokens at most, {n} x max_tokens={max_tokens} completion "
                f"tokens), more than the ${left:.6f} left")

    def arrived(sample: int, result: _CallResult, n: int) -> _CallResult:
        """Journal a request's replies as it returns (on this thread: the journal is written by one thread)."""
        if reply_log is not None and result.outputs is not None:
            reply_log.record(sample, [_reply_text(output) for output in result.outputs[:n]], result.usage)
        return result

    def collect(samples: list[int], n: int) -> list[_CallResult]:
        """Run one call per sample (in parallel), account for them, return their results in sample order."""
        results: dict[int, _CallResult] = {}
        workers = max(1, min(num_threads, len(samples)))
        if workers == 1:
            for sample in samples:
                results[sample] = arrived(sample, call(sample, n), n)
        else:
            with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opro-propose") as pool:
                futures = {pool.submit(call, sample, n): sample for sample in samples}
                for future in cf.as_completed(futures):
                    results[futures[future]] = arrived(futures[future], future.result(), n)
        in_order = [results[sample] for sample in samples]
        over = 0
        for result in in_order:
            for name, model_usage in result.usage.items():
                proposals.usage.setdefault(name, ModelUsage()).add(model_usage)
            if result.outputs is not None:
                proposals.answered_calls += 1
            elif result.over_budget and result.error is None:
                over += 1  # never sent
            elif not result.n_refused:
                proposals.failed_calls += 1
                if result.error:
                    proposals.errors.append(result.error)
        if over:
            skip(over * n, over_budget_reason(n))
        return in_order

    def single_choices(samples: list[int]) -> None:
        for sample, result in zip(samples, collect(samples, 1), strict=True):
            if result.outputs is not None:
                by_sample[sample] = _reply_text(result.outputs[0])

    def ask_one_at_a_time(why: str, samples: list[int]) -> None:
        if ignores_n is not None:
            ignores_n.add(model)
        proposals.single_choice = why
        single_choices(samples)

    def n_request(n: int) -> None:
        if reserve.left is not None and bound(n) > reserve.left:
            room = reserve.left - bound(0)
            fits = max(0, min(n, math.floor(room / (max_tokens * prices[1])) if prices and prices[1] > 0 else n))
            skip(n - fits, over_budget_reason(n))
            n = fits
        if n == 0:
            return
        (result,) = collect([0], n)
        if result.n_refused:
            why = f"it refused a request for {n} choices: {result.error}"
            logger.warning("The optimizer model %r refused a request for %d choices (%s). Asking for them with "
                           "single-choice requests, and from now on for all (recorded in the run record).",
                           model, n, result.error)
            ask_one_at_a_time(why, list(range(n)))
        elif result.outputs is not None:
            outputs = result.outputs
            proposals.usage_undercount = usage_undercount(outputs, result.usage)
            if proposals.usage_undercount is not None:
                logger.warning("The optimizer model %r: %s.", model, proposals.usage_undercount)
            by_sample.update((sample, _reply_text(output)) for sample, output in enumerate(outputs[:n]))
            if n > 1 and len(outputs) < n:
                why = f"it answered a request for {n} choices with {len(outputs)}"
                logger.warning("The optimizer model %r answered a request for %d choices with %d: it does not honour "
                               "n. Asking for the other %d with single-choice requests, and from now on for all.",
                               model, n, len(outputs), n - len(outputs))
                ask_one_at_a_time(why, list(range(len(outputs), n)))

    if by_sample:  # a resumed step: the samples not yet received, one choice each, as the killed run was asking
        single_choices([sample for sample in range(num_candidates) if sample not in by_sample])
    elif num_candidates > 1 and honours_n(lm, ignores_n):
        n_request(num_candidates)
    else:
        single_choices(list(range(num_candidates)))
    proposals.by_sample = dict(sorted(by_sample.items()))
    proposals.replies = list(proposals.by_sample.values())
    return proposals
