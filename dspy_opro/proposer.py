"""One step's optimizer calls: the meta-prompt, sent verbatim, for ``num_candidates`` completions.

The authors send the meta-prompt as the single user message of a chat completion, eight times per step at
temperature 1.0, one completion per call. Where the provider honours OpenAI's ``n`` (an OpenAI-compatible model
reached through LiteLLM, which passes ``n`` on), one request asks for all the completions: the prompt is billed
once instead of eight times. Elsewhere (DSPy's native engine fans ``n`` out into sequential one-choice requests)
the calls run in parallel, each with its own seeded ``rollout_id``. DSPy's cache key includes the rollout id, so
the identical requests are neither collapsed into one cached answer nor re-bought when a run is repeated with the
cache on, and the seed makes the ids reproducible.

A call that still fails after DSPy's own retries is tried once more and then dropped, so a step can yield fewer
replies than asked; authentication, billing and configuration errors stop the run at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from dataclasses import dataclass, field
from typing import Any

import dspy

from dspy_opro.scoring import FatalLMError, UsageCapture, classify_exception
from dspy_opro.state import ModelUsage

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
    errors: list[str] = field(default_factory=list)
    usage: dict[str, ModelUsage] = field(default_factory=dict)


_N_PROVIDERS = ("openai", "azure")  # LiteLLM providers that take n and return n choices in one response


def honours_n(lm: Any) -> bool:
    """Whether one request can ask ``lm`` for several completions (billing the prompt once)."""
    if not isinstance(lm, dspy.LM) or getattr(lm, "_engine_spec", None) != "litellm":
        return False
    provider = lm.model.split("/", 1)[0] if "/" in lm.model else "openai"
    return provider in _N_PROVIDERS


def _one_call(lm: dspy.LM, meta_prompt: str, *, n: int, temperature: float, max_tokens: int,
              rid: int) -> tuple[list[str] | None, str | None, dict[str, ModelUsage]]:
    """One optimizer call with one extra try; returns (outputs or None, last error, usage)."""
    capture = UsageCapture()
    error: str | None = None
    extra = {"n": n} if n > 1 else {}
    for _attempt in range(2):
        try:
            with capture.active():
                outputs = lm(meta_prompt, temperature=temperature, max_tokens=max_tokens, rollout_id=rid, **extra)
            return outputs, None, capture.result()
        except Exception as exc:
            if classify_exception(exc) == "fatal":
                raise FatalLMError(
                    f"the optimizer model {lm.model!r} refused the request: {type(exc).__name__}: {exc}. "
                    "Check its API key, billing and model name."
                ) from exc
            error = f"{type(exc).__name__}: {exc}"
            logger.debug("Optimizer call (rollout %d) failed: %s", rid, error)
    return None, error, capture.result()


def _reply_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        return str(output.get("text") or "")
    return str(output)


def propose(
    lm: dspy.LM,
    meta_prompt: str,
    *,
    num_candidates: int,
    step: int,
    seed: int,
    temperature: float,
    max_tokens: int,
    num_threads: int,
) -> Proposals:
    """Ask for ``num_candidates`` completions of ``meta_prompt`` and collect the replies in sample order."""
    from dspy.dsp.utils.settings import thread_local_overrides

    overrides = thread_local_overrides.get().copy()
    # (n per call, number of calls): one call for all samples where the provider honours n.
    per_call, calls = (num_candidates, 1) if num_candidates > 1 and honours_n(lm) else (1, num_candidates)
    results: dict[int, tuple[list[str] | None, str | None, dict[str, ModelUsage]]] = {}

    def call(sample: int) -> tuple[list[str] | None, str | None, dict[str, ModelUsage]]:
        token = thread_local_overrides.set(overrides)
        try:
            return _one_call(lm, meta_prompt, n=per_call, temperature=temperature, max_tokens=max_tokens,
                             rid=rollout_id(seed, step, sample))
        finally:
            thread_local_overrides.reset(token)

    workers = max(1, min(num_threads, calls))
    if workers == 1:
        for sample in range(calls):
            results[sample] = call(sample)
    else:
        with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opro-propose") as pool:
            futures = {pool.submit(call, sample): sample for sample in range(calls)}
            for future in cf.as_completed(futures):
                results[futures[future]] = future.result()
    proposals = Proposals()
    for sample in range(calls):
        outputs, error, usage = results[sample]
        for model, model_usage in usage.items():
            proposals.usage.setdefault(model, ModelUsage()).add(model_usage)
        if outputs is None:
            proposals.failed_calls += 1
            if error:
                proposals.errors.append(error)
            continue
        proposals.replies.extend(_reply_text(output) for output in outputs[:per_call])
    return proposals
