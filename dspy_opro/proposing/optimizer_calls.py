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
single-choice requests from then on.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from dataclasses import dataclass, field
from typing import Any

import dspy

from dspy_opro.compat import current_context, lm_engine, run_in_context
from dspy_opro.errors import EmptyResponseError, classify_exception, clean_text, describe_exception, fatal_lm_error
from dspy_opro.record.state import ModelUsage
from dspy_opro.scoring.usage import UsageCapture

logger = logging.getLogger(__name__)

# Keeps rollout ids of different seeds and steps apart: id = seed * 10**9 + (step + 1) * 10**4 + sample.
_SEED_SPAN = 10**9
_STEP_SPAN = 10**4


def rollout_id(seed: int, step: int, sample: int) -> int:
    """The reproducible rollout id of one optimizer sample."""
    return seed * _SEED_SPAN + (step + 1) * _STEP_SPAN + sample


@dataclass
class Proposals:
    """What one step's optimizer calls returned."""

    replies: list[str] = field(default_factory=list)  # in sample order, failed samples left out
    failed_calls: int = 0
    errors: list[str] = field(default_factory=list)  # the last error of each failed call
    usage: dict[str, ModelUsage] = field(default_factory=dict)


_N_PROVIDERS = ("openai", "azure")  # LiteLLM providers that take n and return n choices in one response


def honours_n(lm: Any, ignores_n: set[str] | None = None) -> bool:
    """Whether one request can ask ``lm`` for several completions (billing the prompt once).

    Args:
        lm: The optimizer model.
        ignores_n: Models this run has seen answer an ``n`` request with fewer choices.
    """
    if not isinstance(lm, dspy.LM) or lm_engine(lm) != "litellm":
        return False
    if ignores_n and lm.model in ignores_n:
        return False
    provider = lm.model.split("/", 1)[0] if "/" in lm.model else "openai"
    return provider in _N_PROVIDERS


def _one_call(lm: dspy.BaseLM, meta_prompt: str, n: int, temperature: float, max_tokens: int,
              rid: int) -> tuple[list[str] | None, str | None, dict[str, ModelUsage]]:
    """One optimizer call with one extra try; returns (outputs or None, last error, usage)."""
    capture = UsageCapture()
    error: str | None = None
    extra = {"n": n} if n > 1 else {}
    for attempt in range(1, 3):
        try:
            with capture.active():
                outputs = lm(meta_prompt, temperature=temperature, max_tokens=max_tokens, rollout_id=rid, **extra)
            if not outputs:
                raise EmptyResponseError("the optimizer model answered with no choices")
            return outputs, None, capture.result()
        except Exception as exc:
            if classify_exception(exc) == "fatal":
                raise fatal_lm_error("optimizer", getattr(lm, "model", repr(lm)), exc) from exc
            error = describe_exception(exc)
            logger.warning("Optimizer call (rollout %d, try %d of 2) failed: %s", rid, attempt, error)
    return None, error, capture.result()


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
) -> Proposals:
    """Ask for ``num_candidates`` completions of ``meta_prompt`` and collect the replies in sample order.

    Args:
        ignores_n: The run's set of models known to ignore ``n``; a model found doing so is added to it.
    """
    context = current_context()  # worker threads make the calls under the caller's DSPy settings
    proposals = Proposals()

    def call(sample: int, n: int) -> tuple[list[str] | None, str | None, dict[str, ModelUsage]]:
        return run_in_context(context, _one_call, lm, meta_prompt, n, temperature, max_tokens,
                              rollout_id(seed, step, sample))

    def collect(samples: list[int], n: int) -> list[list[str] | None]:
        """Run one call per sample (in parallel), account for them, return their outputs in sample order."""
        results: dict[int, tuple[list[str] | None, str | None, dict[str, ModelUsage]]] = {}
        workers = max(1, min(num_threads, len(samples)))
        if workers == 1:
            for sample in samples:
                results[sample] = call(sample, n)
        else:
            with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opro-propose") as pool:
                futures = {pool.submit(call, sample, n): sample for sample in samples}
                for future in cf.as_completed(futures):
                    results[futures[future]] = future.result()
        outputs_in_order = []
        for sample in samples:
            outputs, error, usage = results[sample]
            for model, model_usage in usage.items():
                proposals.usage.setdefault(model, ModelUsage()).add(model_usage)
            if outputs is None:
                proposals.failed_calls += 1
                if error:
                    proposals.errors.append(error)
            outputs_in_order.append(outputs)
        return outputs_in_order

    if num_candidates > 1 and honours_n(lm, ignores_n):
        (outputs,) = collect([0], num_candidates)
        if outputs is not None:
            proposals.replies.extend(_reply_text(output) for output in outputs[:num_candidates])
            if len(outputs) < num_candidates:
                model = getattr(lm, "model", repr(lm))
                if ignores_n is not None:
                    ignores_n.add(model)
                logger.warning("The optimizer model %r answered a request for %d choices with %d: it does not honour "
                               "n. Asking for the other %d with single-choice requests, and from now on for all.",
                               model, num_candidates, len(outputs), num_candidates - len(outputs))
                missing = list(range(len(outputs), num_candidates))
                for extra in collect(missing, 1):
                    if extra is not None:
                        proposals.replies.extend(_reply_text(output) for output in extra[:1])
        return proposals
    for outputs in collect(list(range(num_candidates)), 1):
        if outputs is not None:
            proposals.replies.extend(_reply_text(output) for output in outputs[:1])
    return proposals
