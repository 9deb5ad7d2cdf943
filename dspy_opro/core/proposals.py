"""One step's proposals: the optimizer calls, then what becomes of each reply (triage).

**The calls.** The authors send the meta-prompt as the single user message of a chat completion, ``num_candidates``
times per step at temperature 1.0, one completion per call. Where the provider honours OpenAI's ``n``
(:func:`honours_n`: an OpenAI-compatible model reached through LiteLLM), one request asks for all of them and the
prompt is billed once. Elsewhere the calls run in parallel, each with its own seeded ``rollout_id``: it is part of
DSPy's cache key, so identical requests are neither collapsed into one cached answer nor bought again when a run is
repeated with the cache on. A call that fails after DSPy's own retries, or answers with no choices, is tried once more
and then dropped; a fatal error (authentication, billing, an unknown model) stops the run. A provider that answers an
``n`` request with fewer choices, or refuses it (an HTTP 400 naming ``n``, as ``llama-server`` does above its slot
count), gets the missing samples as single-choice requests, and is asked one choice at a time from then on (recorded,
so a resumed run never sends it an ``n`` request again). With ``max_cost``, no request is sent whose worst case (the
meta-prompt's tokens plus ``n x max_tokens``, at the model's prices) does not fit in what is left. Each request's
replies go to the run's journal as the request returns, and a step resumed after a kill asks only for the samples it
had not received.

**Triage.** The authors' loop extracts one instruction from each reply, polishes it, drops it when its md5 was
generated before (earlier in the step or in an earlier step; every instruction seen counts, skipped ones included),
and skips the survivors that fail their filters. :func:`triage_replies` does the same in sample order and says, per
reply, what happened and why; :func:`step_candidates` turns the verdicts into the step's reply records and new
candidates. A reply that opens the tag its instruction is taken from and never closes it is marked ``unclosed``: the
authors' extraction of it is kept byte for byte. The differences from the authors' filters (empty instructions
skipped, the 500-character limit opt-in, no gsm8k digit filter) are listed on the fidelity page.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import dspy

from dspy_opro.compat import lm_engine
from dspy_opro.core import templates as t
from dspy_opro.core.meta_prompt import MetaPromptOptions, extract_instruction, instruction_md5, polish_sentence
from dspy_opro.errors import (
    EmptyResponseError,
    classify_exception,
    clean_text,
    describe_exception,
    fatal_lm_error,
    rejects_n,
)
from dspy_opro.scoring.usage import token_prices
from dspy_opro.state import START_ID, Candidate, CandidateStatus, ModelUsage, Reply, RunState, Step

logger = logging.getLogger(__name__)

UsageTaker = Callable[[], dict[str, ModelUsage]]
"""Returns what the run's models were billed since it was last called (the run's usage meter)."""
ReplyLog = Callable[[int, list[str], dict[str, ModelUsage]], None]
"""Journals one request's replies (its choices, the first being the given sample) with what the request cost."""


def rollout_id(seed: int, step: int, sample: int) -> int:
    """The reproducible rollout id of one optimizer sample: ``seed * 10**9 + (step + 1) * 10**4 + sample``."""
    return seed * 10**9 + (step + 1) * 10**4 + sample


def honours_n(lm: Any, ignores_n: Collection[str] | None = None) -> bool:
    """Whether one request can ask ``lm`` for several completions: a ``dspy.LM`` on LiteLLM whose provider is
    ``openai`` or ``azure`` (no provider counts as ``openai``) and that this run has not seen ignore ``n``."""
    if not isinstance(lm, dspy.LM) or lm_engine(lm) != "litellm" or (ignores_n and lm.model in ignores_n):
        return False
    return (lm.model.split("/", 1)[0] if "/" in lm.model else "openai") in ("openai", "azure")


def prompt_token_bound(lm: Any, text: str) -> int:
    """An upper bound on the prompt tokens of ``text`` sent as one user message: LiteLLM's own count for the model
    with a tenth more and the chat template's tokens, else the UTF-8 length (a byte-level BPE token holds a byte)."""
    if isinstance(lm, dspy.LM) and lm_engine(lm) == "litellm":
        try:
            import litellm

            return int(litellm.token_counter(model=lm.model, messages=[{"role": "user", "content": text}]) * 1.1) + 16
        except Exception:  # a model LiteLLM cannot count: the byte bound
            pass
    return len(text.encode("utf-8")) + 16


def reply_text(output: Any) -> str:
    """One choice's text, cleaned of lone surrogates; a choice with ``"content": null`` (a refusal, a tool call) is
    empty, so that it is triaged as an empty reply, not proposed as the instruction ``"None"``."""
    if isinstance(output, dict):
        output = output.get("text")
    if output is None:
        return ""
    return clean_text(output if isinstance(output, str) else str(output))


def usage_undercount(outputs: list[Any], usage: dict[str, ModelUsage]) -> str | None:
    """What is wrong with a request's usage when it counts fewer completion tokens than its choices hold words.

    A tokenizer that splits at whitespace first never puts two words in one token; a provider below that counted only
    some choices (``llama-server`` counts the first one when ``n > 1``).
    """
    paid = [u for u in usage.values() if u.calls > u.cache_hits]
    reported, words = sum(u.completion_tokens for u in paid), sum(len(reply_text(o).split()) for o in outputs)
    if len(outputs) < 2 or not paid or reported >= words:
        return None
    return (f"its usage counted {reported} completion tokens for {len(outputs)} choices that hold at least {words} "
            "(a server that counts only the first choice, as llama-server does with n > 1): the recorded optimizer "
            "tokens and cost are too low")


@dataclass
class Proposals:
    """What one step's optimizer calls returned."""

    by_sample: dict[int, str] = field(default_factory=dict)  # the replies by sample (received ones too), in order
    failed_calls: int = 0
    errors: list[str] = field(default_factory=list)  # the last error of each failed call
    usage: dict[str, ModelUsage] = field(default_factory=dict)
    single_choice: str | None = None  # why the model is to be asked one choice at a time (found in this step)
    skipped_calls: int = 0  # proposals not asked for: their worst-case cost did not fit in max_cost
    skip_reason: str | None = None
    usage_undercount: str | None = None

    @property
    def replies(self) -> list[str]:
        return list(self.by_sample.values())


class _StepCalls:
    """The optimizer requests of one step, within the money left under ``max_cost``."""

    def __init__(self, lm: dspy.BaseLM, meta_prompt: str, *, step: int, seed: int, temperature: float,
                 max_tokens: int, num_threads: int, cost_left: float | None, take_usage: UsageTaker,
                 reply_log: ReplyLog | None):
        self.lm, self.meta_prompt, self.step, self.seed = lm, meta_prompt, step, seed
        self.temperature, self.max_tokens, self.num_threads = temperature, max_tokens, num_threads
        self.take_usage, self.reply_log = take_usage, reply_log
        self.model = getattr(lm, "model", repr(lm))
        self.prices = token_prices(self.model) if cost_left is not None else None
        self.left = cost_left if self.prices is not None else None  # a model without a price is not limited
        self.prompt_tokens = prompt_token_bound(lm, meta_prompt) if self.prices is not None else 0
        # DSPy's client retries a failed request num_retries times inside one call (an unreadable 200 too), each
        # billed: one call can cost that many requests.
        retries = getattr(lm, "num_retries", 0)
        self.requests_per_call = 1 + (retries if isinstance(retries, int) and retries > 0 else 0)
        self.lock = threading.Lock()
        self.proposals = Proposals()

    def request_bound(self, n: int) -> float:
        """The most one request for ``n`` choices can cost (0 without a price)."""
        if self.prices is None:
            return 0.0
        return self.prompt_tokens * self.prices[0] + n * self.max_tokens * self.prices[1]

    def bound(self, n: int) -> float:
        """The most one call for ``n`` choices can cost, the client's own retries included."""
        return self.requests_per_call * self.request_bound(n)

    def _reserve(self, amount: float) -> bool:
        with self.lock:
            if self.left is not None and amount > self.left:
                return False
            if self.left is not None:
                self.left -= amount
            return True

    def skip(self, count: int, n: int) -> None:
        """Record ``count`` proposals not asked for because a request for ``n`` choices did not fit."""
        left = self.left if self.left is not None else 0.0
        why = (f"max_cost: an optimizer request for {n} choice{'s' if n > 1 else ''} could cost up to "
               f"${self.bound(n):.6f} ({self.prompt_tokens} prompt tokens at most, {n} x max_tokens={self.max_tokens} "
               f"completion tokens), more than the ${left:.6f} left")
        self.proposals.skipped_calls += count
        self.proposals.skip_reason = why
        logger.warning("Step %d: %d optimizer proposals not asked for: %s", self.step, count, why)

    def call(self, sample: int, n: int) -> tuple[list[Any] | None, str | None, Literal["ok", "failed", "refused",
                                                                                       "over_budget"]]:
        """One request (tried twice), its replies journaled as it returns: ``(outputs, error, how it ended)``."""
        error = None
        extra = {"n": n} if n > 1 else {}
        for attempt in (1, 2):
            if not self._reserve(self.bound(n)):
                return None, error, "over_budget"
            try:
                outputs = self.lm(self.meta_prompt, temperature=self.temperature, max_tokens=self.max_tokens,
                                  rollout_id=rollout_id(self.seed, self.step, sample), **extra)
                if not outputs:
                    raise EmptyResponseError("the optimizer model answered with no choices")
            except Exception as exc:
                if classify_exception(exc) == "fatal":
                    raise fatal_lm_error("optimizer", self.model, exc) from exc
                error = describe_exception(exc)
                if n > 1 and rejects_n(exc):
                    with self.lock:
                        if self.left is not None:
                            self.left += self.bound(n)  # refused before generating anything
                    return None, error, "refused"
                logger.warning("Optimizer call (sample %d of step %d, try %d of 2) failed: %s", sample, self.step,
                               attempt, error)
                continue
            with self.lock:  # one request at a time takes its usage and writes the journal
                usage = self.take_usage()
                for name, model_usage in usage.items():
                    self.proposals.usage.setdefault(name, ModelUsage()).add(model_usage)
                if self.left is not None:  # the reservation becomes what was billed since the last take
                    self.left += self.bound(n) - sum(u.cost for u in usage.values())
                if self.reply_log is not None:
                    self.reply_log(sample, [reply_text(o) for o in outputs[:n]], usage)
                if n > 1:
                    self.proposals.usage_undercount = usage_undercount(list(outputs), usage)
            return list(outputs), None, "ok"
        return None, error, "failed"

    def single_choices(self, samples: list[int]) -> None:
        """One single-choice request per sample, in parallel (in the caller's context), in sample order."""
        workers = max(1, min(self.num_threads, len(samples)))
        if workers == 1:
            results = [self.call(sample, 1) for sample in samples]
        else:
            context = contextvars.copy_context()
            with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opro-propose") as pool:
                results = list(pool.map(lambda s: context.copy().run(self.call, s, 1), samples))
        over = 0
        for sample, (outputs, error, how) in zip(samples, results, strict=True):
            if outputs is not None:
                self.proposals.by_sample[sample] = reply_text(outputs[0])
            elif how == "over_budget" and error is None:
                over += 1  # never sent
            else:
                self.proposals.failed_calls += 1
                self.proposals.errors += [error] if error else []
        if over:
            self.skip(over, 1)

    def one_at_a_time(self, why: str, samples: list[int], ignores_n: set[str] | None) -> None:
        if ignores_n is not None:
            ignores_n.add(self.model)
        self.proposals.single_choice = why
        self.single_choices(samples)

    def n_request(self, n: int, ignores_n: set[str] | None) -> None:
        """One request for ``n`` choices (as many as fit in ``max_cost``), then single choices for what is missing."""
        if self.left is not None and self.prices is not None and self.bound(n) > self.left:
            per_choice = self.max_tokens * self.prices[1]
            room = self.left / self.requests_per_call - self.request_bound(0)
            fits = max(0, min(n, int(room // per_choice) if per_choice > 0 else n))
            self.skip(n - fits, n)
            n = fits
        if n == 0:
            return
        outputs, error, how = self.call(0, n)
        if how == "refused":
            logger.warning("The optimizer model %r refused a request for %d choices (%s). Asking for them with "
                           "single-choice requests, and from now on for all (recorded in the run record).",
                           self.model, n, error)
            self.one_at_a_time(f"it refused a request for {n} choices: {error}", list(range(n)), ignores_n)
        elif outputs is None:
            if how == "over_budget" and error is None:
                self.skip(n, n)
            else:
                self.proposals.failed_calls += 1
                self.proposals.errors += [error] if error else []
        else:
            if self.proposals.usage_undercount is not None:
                logger.warning("The optimizer model %r: %s.", self.model, self.proposals.usage_undercount)
            self.proposals.by_sample.update((s, reply_text(o)) for s, o in enumerate(outputs[:n]))
            if n > 1 and len(outputs) < n:
                logger.warning("The optimizer model %r answered a request for %d choices with %d: it does not honour "
                               "n. Asking for the other %d with single-choice requests, and from now on for all.",
                               self.model, n, len(outputs), n - len(outputs))
                self.one_at_a_time(f"it answered a request for {n} choices with {len(outputs)}",
                                   list(range(len(outputs), n)), ignores_n)


def propose(lm: dspy.BaseLM, meta_prompt: str, *, num_candidates: int, step: int, seed: int, temperature: float,
            max_tokens: int, num_threads: int, take_usage: UsageTaker, ignores_n: set[str] | None = None,
            cost_left: float | None = None, received: Mapping[int, str] | None = None,
            reply_log: ReplyLog | None = None) -> Proposals:
    """Ask for ``num_candidates`` completions of ``meta_prompt``; the replies come back in sample order.

    Args:
        take_usage: What the run's models were billed since the last call (each request takes its own, as it
            returns).
        ignores_n: The run's set of models to ask one choice at a time; a model found ignoring or refusing ``n`` is
            added (and named, with why, in the result's ``single_choice``).
        cost_left: USD left under ``max_cost`` (None: no limit).
        received: Replies already received for this step, by sample (a run killed during its optimizer calls): only
            the other samples are asked for, one choice each, as the killed run was asking.
        reply_log: Journals each request's replies as it returns, with its usage.
    """
    calls = _StepCalls(lm, meta_prompt, step=step, seed=seed, temperature=temperature, max_tokens=max_tokens,
                       num_threads=num_threads, cost_left=cost_left, take_usage=take_usage, reply_log=reply_log)
    kept = {sample: text for sample, text in (received or {}).items() if 0 <= sample < num_candidates}
    calls.proposals.by_sample.update(kept)
    if kept:
        calls.single_choices([sample for sample in range(num_candidates) if sample not in kept])
    elif num_candidates > 1 and honours_n(lm, ignores_n):
        calls.n_request(num_candidates, ignores_n)
    else:
        calls.single_choices(list(range(num_candidates)))
    calls.proposals.by_sample = dict(sorted(calls.proposals.by_sample.items()))
    return calls.proposals


# ---------------------------------------------------------------------------------------------------------------
# Triage

Fate = Literal["new", "unclosed", "duplicate", "no_instruction", "empty", "too_long", "contains_ins"]


@dataclass(frozen=True)
class Verdict:
    """What became of one reply: the extracted and polished ``instruction`` (None when the reply held none), its
    ``md5``, why a non-empty reply is not scored (``reason``), and whether its tag never closed (``unclosed``)."""

    text: str
    instruction: str | None
    fate: Fate
    md5: str | None = None
    reason: str | None = None
    unclosed: bool = False


def is_unclosed(reply: str, options: MetaPromptOptions) -> bool:
    """Whether ``reply`` opens the tag its instruction is taken from and never closes it (``<TEXT>`` for
    ``instructions_only``, a ``[`` with no ``]`` after it on its line for PaLM, ``<Start>`` for GPT with ``A_begin``,
    else ``<INS>``). A reply without the opening tag is not unclosed (the authors use it whole)."""
    if options.meta_prompt_type == "instructions_only":
        opening, closing = t.TEXT_TAGS
        return opening in reply and closing not in reply[reply.find(opening):]
    if options.optimizer_family == "palm":
        return "[" in reply and not any("]" in line[line.find("["):] for line in reply.splitlines() if "[" in line)
    opening, closing = t.START_TAGS if options.instruction_pos == "A_begin" else t.INS_TAGS
    return opening in reply and closing not in reply


def skip_reason(instruction: str, *, max_instruction_chars: int | None) -> tuple[Fate, str | None]:
    """The filters' verdict on one polished, not yet seen instruction: ``("new", None)`` when it is to be scored."""
    if not instruction:
        return "empty", "empty instruction"
    if max_instruction_chars is not None and len(instruction) > max_instruction_chars:
        return "too_long", f"{len(instruction)} characters > max_instruction_chars={max_instruction_chars}"
    if "INS" in instruction:  # the authors' filter against leftover <INS> tags (case-sensitive, as theirs)
        return "contains_ins", "contains 'INS' (a leftover tag)"
    return "new", None


def triage_replies(replies: Sequence[str], seen_md5s: Iterable[str], options: MetaPromptOptions, *,
                   max_instruction_chars: int | None) -> list[Verdict]:
    """Extract, polish, de-duplicate and filter one step's replies, in sample order.

    Args:
        replies: The optimizer's replies, in sample order.
        seen_md5s: md5s of the instructions generated before (not modified; each new instruction's md5 counts as
            seen for the later replies).
        options: The meta-prompt's options (which reply format to parse).
        max_instruction_chars: The length limit, or None.
    """
    seen = set(seen_md5s)
    verdicts: list[Verdict] = []
    for text in replies:
        extracted = extract_instruction(text, **options.reply_format)
        unclosed = is_unclosed(text, options)
        if extracted is None:
            verdicts.append(Verdict(text, None, "no_instruction", unclosed=unclosed))
            continue
        instruction = polish_sentence(extracted)
        md5 = instruction_md5(instruction)
        if md5 in seen:
            verdicts.append(Verdict(text, instruction, "duplicate", md5, unclosed=unclosed))
            continue
        seen.add(md5)  # registered whether or not it passes the filters, as the authors do
        fate, reason = skip_reason(instruction, max_instruction_chars=max_instruction_chars)
        verdicts.append(Verdict(text, instruction, "unclosed" if fate == "new" and unclosed else fate, md5, reason,
                                unclosed))
    return verdicts


def step_candidates(record: Step, replies: Sequence[str], state: RunState, options: MetaPromptOptions, *,
                    max_instruction_chars: int | None) -> tuple[list[Reply], list[Candidate]]:
    """A step's replies triaged against the record: the step's reply records and its new candidates.

    The md5s seen are the step's predictor's instructions so far (the start's and every candidate's, initial ones
    included; a duplicate names the first of equal md5s). A new instruction becomes a candidate with the best
    candidate's instructions and this one for the step's predictor, pending unless a filter skipped it. ``state`` is
    not changed: the new candidates' ids follow its last one.
    """
    predictor = record.predictor
    start = state.candidates[START_ID]
    seen = {instruction_md5(start.instructions[predictor]): START_ID}
    for candidate in state.candidates:
        if candidate.predictor == predictor:
            seen.setdefault(candidate.md5, candidate.id)
    best = state.best() or start
    records: list[Reply] = []
    new: list[Candidate] = []
    for verdict in triage_replies(replies, seen, options, max_instruction_chars=max_instruction_chars):
        if verdict.instruction is None or verdict.md5 is None or verdict.fate == "duplicate":
            records.append(Reply(text=verdict.text, instruction=verdict.instruction, fate=verdict.fate,
                                 unclosed=verdict.unclosed, candidate_id=seen.get(verdict.md5 or "")))
            continue
        candidate = Candidate(
            id=len(state.candidates) + len(new), step=record.step, predictor=predictor,
            instruction=verdict.instruction, instructions={**best.instructions, predictor: verdict.instruction},
            md5=verdict.md5, reason=verdict.reason, scores=[] if verdict.reason else [None] * state.train_size,
            status=CandidateStatus.SKIPPED if verdict.reason else CandidateStatus.PENDING)
        new.append(candidate)
        seen[verdict.md5] = candidate.id
        records.append(Reply(text=verdict.text, instruction=verdict.instruction, fate=verdict.fate,
                             unclosed=verdict.unclosed, candidate_id=candidate.id))
    return records, new


__all__ = ["Proposals", "Verdict", "honours_n", "is_unclosed", "propose", "rollout_id", "skip_reason",
           "step_candidates", "triage_replies"]
