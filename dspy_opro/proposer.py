"""One step's optimizer calls: the meta-prompt, sent verbatim, ``num_candidates`` times.

The authors send the meta-prompt as the single user message of a chat completion, eight times per step at
temperature 1.0, one completion per call. Here the calls run in parallel through DSPy's LM (LiteLLM or DSPy's
native client), each with its own seeded ``rollout_id``: DSPy's cache key includes the rollout id, so the eight
identical requests are neither collapsed into one cached answer nor re-bought when a run is repeated with the cache
on, and the seed makes the ids reproducible. (DSPy 3.4 always fans ``n > 1`` out into sequential one-choice
requests, so asking for ``n`` in one request would only serialise the calls.)

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

# Keeps rollout ids of different seeds and steps apart: id = seed * 10**9 + step * 10**4 + sample.
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


def _one_sample(lm: dspy.LM, meta_prompt: str, *, temperature: float, max_tokens: int, rid: int,
                overrides: dict[str, Any]) -> tuple[list[str] | None, str | None, dict[str, ModelUsage]]:
    """One optimizer call with one extra try; returns (outputs or None, last error, usage)."""
    capture = UsageCapture()
    error: str | None = None
    for _attempt in range(2):
        try:
            with capture.active(**overrides):
                outputs = lm(meta_prompt, temperature=temperature, max_tokens=max_tokens, rollout_id=rid)
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
    """Send ``meta_prompt`` ``num_candidates`` times and collect the replies in sample order."""
    from dspy.dsp.utils.settings import thread_local_overrides

    overrides = thread_local_overrides.get().copy()
    proposals = Proposals()
    results: dict[int, tuple[list[str] | None, str | None, dict[str, ModelUsage]]] = {}

    def call(sample: int) -> tuple[list[str] | None, str | None, dict[str, ModelUsage]]:
        token = thread_local_overrides.set(overrides)
        try:
            return _one_sample(lm, meta_prompt, temperature=temperature, max_tokens=max_tokens,
                               rid=rollout_id(seed, step, sample), overrides={})
        finally:
            thread_local_overrides.reset(token)

    workers = max(1, min(num_threads, num_candidates))
    if workers == 1:
        for sample in range(num_candidates):
            results[sample] = call(sample)
    else:
        with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opro-propose") as pool:
            futures = {pool.submit(call, sample): sample for sample in range(num_candidates)}
            for future in cf.as_completed(futures):
                results[futures[future]] = future.result()
    for sample in range(num_candidates):
        outputs, error, usage = results[sample]
        for model, model_usage in usage.items():
            proposals.usage.setdefault(model, ModelUsage()).add(model_usage)
        if outputs is None:
            proposals.failed_calls += 1
            if error:
                proposals.errors.append(error)
            continue
        proposals.replies.extend(_reply_text(output) for output in outputs[:1])
    return proposals
