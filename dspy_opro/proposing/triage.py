"""Reply triage: what becomes of each optimizer reply, decided by a pure function.

After every step the authors' loop extracts one instruction from each reply, polishes it, drops it when its md5
was generated before (earlier in the step or in an earlier step; the check registers every instruction it sees,
skipped ones included), and skips the survivors that fail their filters. :func:`triage_replies` does the same in
sample order and says, per reply, what happened and why. It holds no state of the run: the caller passes the md5s
it has seen. :func:`step_candidates` turns a step's verdicts into the step's reply records and new candidates
without changing the record; the loop adds them. The differences from the authors' filters (empty
instructions skipped, the 500-character limit opt-in, no gsm8k digit filter) are listed on the fidelity page.

A reply that opens the tag the instruction is taken from (``<INS>``, ``<Start>``, ``[``, ``<TEXT>``) and never closes
it is marked ``unclosed`` (:func:`is_unclosed`): a very small model writes most of its replies so. The authors'
extraction of it is kept byte for byte (for GPT-style tags the rest of the reply, which is scored as they would;
for ``[`` an empty instruction; for ``<TEXT>`` none), and the fate says so: a reply that would be ``"new"`` is
``"unclosed"`` instead, and every verdict carries ``unclosed``. ``max_instruction_chars`` skips the long ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from dspy_opro.proposing.meta_prompt import (
    INS_TAGS,
    START_TAGS,
    TEXT_TAGS,
    extract_instruction,
    instruction_md5,
    polish_sentence,
)
from dspy_opro.record.state import START_ID, Candidate, CandidateStatus, Reply, RunState, Step

Fate = Literal["new", "unclosed", "duplicate", "no_instruction", "empty", "too_long", "contains_ins"]


@dataclass(frozen=True)
class Verdict:
    """What became of one reply.

    ``instruction`` is the extracted and polished text (None when the reply held none); ``md5`` its digest;
    ``reason`` says why a non-empty reply is not scored (None for ``"new"``, ``"unclosed"`` and ``"duplicate"``);
    ``unclosed`` whether the reply opened its tag and never closed it.
    """

    text: str
    instruction: str | None
    fate: Fate
    md5: str | None = None
    reason: str | None = None
    unclosed: bool = False


def is_unclosed(reply: str, *, optimizer_family: str, instruction_pos: str, meta_prompt_type: str) -> bool:
    """Whether ``reply`` opens the tag its instruction is taken from and never closes it.

    The tags are the authors' extraction's (:func:`~dspy_opro.proposing.meta_prompt.extract_instruction`):
    ``<TEXT>`` for ``instructions_only``, a ``[`` with no ``]`` after it on its line for PaLM, ``<Start>`` for GPT
    with ``A_begin``, else ``<INS>``. A reply without the opening tag is not unclosed (the authors use it whole).
    """
    if meta_prompt_type == "instructions_only":
        opening, closing = TEXT_TAGS
        return opening in reply and closing not in reply[reply.find(opening):]
    if optimizer_family == "palm":
        return "[" in reply and not any("]" in line[line.find("["):] for line in reply.splitlines() if "[" in line)
    opening, closing = START_TAGS if instruction_pos == "A_begin" else INS_TAGS
    return opening in reply and closing not in reply


def skip_reason(instruction: str, *, max_instruction_chars: int | None) -> tuple[Fate, str | None]:
    """The filter verdict on one polished, not yet seen instruction: ``("new", None)`` when it is to be scored.

    Args:
        instruction: The polished instruction.
        max_instruction_chars: The length limit, or None for none (the authors use 500).
    """
    if not instruction:
        return "empty", "empty instruction"
    if max_instruction_chars is not None and len(instruction) > max_instruction_chars:
        return "too_long", f"{len(instruction)} characters > max_instruction_chars={max_instruction_chars}"
    if "INS" in instruction:  # the authors' filter against leftover <INS> tags (case-sensitive, as theirs)
        return "contains_ins", "contains 'INS' (a leftover tag)"
    return "new", None


def triage_replies(
    replies: Sequence[str],
    seen_md5s: Iterable[str],
    *,
    optimizer_family: str,
    instruction_pos: str,
    meta_prompt_type: str,
    max_instruction_chars: int | None,
) -> list[Verdict]:
    """Extract, polish, de-duplicate and filter one step's replies, in sample order.

    Args:
        replies: The optimizer's replies, in sample order.
        seen_md5s: md5s of the instructions generated before (the run also passes its starting instructions').
            Not modified; each new instruction's md5 counts as seen for the later replies of the same call.
        optimizer_family: ``"gpt"`` or ``"palm"`` (which reply format to parse).
        instruction_pos: The meta-prompt's position (``"A_begin"`` parses ``<Start>`` tags).
        meta_prompt_type: ``"instructions_only"`` parses ``<TEXT>`` tags.
        max_instruction_chars: The length limit, or None.

    Returns:
        One verdict per reply, in order.
    """
    seen = set(seen_md5s)
    verdicts: list[Verdict] = []
    for text in replies:
        extracted = extract_instruction(text, optimizer_family=optimizer_family, instruction_pos=instruction_pos,
                                        meta_prompt_type=meta_prompt_type)
        unclosed = is_unclosed(text, optimizer_family=optimizer_family, instruction_pos=instruction_pos,
                               meta_prompt_type=meta_prompt_type)
        if extracted is None:
            verdicts.append(Verdict(text=text, instruction=None, fate="no_instruction", unclosed=unclosed))
            continue
        instruction = polish_sentence(extracted)
        md5 = instruction_md5(instruction)
        if md5 in seen:
            verdicts.append(Verdict(text=text, instruction=instruction, fate="duplicate", md5=md5, unclosed=unclosed))
            continue
        seen.add(md5)  # registered whether or not it passes the filters, as the authors do
        fate, reason = skip_reason(instruction, max_instruction_chars=max_instruction_chars)
        if fate == "new" and unclosed:
            fate = "unclosed"
        verdicts.append(Verdict(text=text, instruction=instruction, fate=fate, md5=md5, reason=reason,
                                unclosed=unclosed))
    return verdicts


def step_candidates(
    record: Step,
    replies: Sequence[str],
    state: RunState,
    *,
    n_train: int,
    optimizer_family: str,
    instruction_pos: str,
    meta_prompt_type: str,
    max_instruction_chars: int | None,
) -> tuple[list[Reply], list[Candidate]]:
    """A step's replies triaged against the record: the step's reply records and its new candidates.

    The md5s seen are the step's predictor's instructions so far (the start's and every candidate's, initial
    instructions included; the first of equal md5s is the one a duplicate names). A new instruction becomes a
    candidate with the best candidate's instructions and this one for the step's predictor, pending (to be scored)
    unless a filter skipped it. Nothing in ``state`` changes: the new candidates' ids follow its last one.

    Args:
        record: The step (its number and predictor).
        replies: The optimizer's replies, in sample order.
        state: The run record, read only.
        n_train: Training examples (a pending candidate gets one empty score per example).
        optimizer_family: As :func:`triage_replies`.
        instruction_pos: As :func:`triage_replies`.
        meta_prompt_type: As :func:`triage_replies`.
        max_instruction_chars: As :func:`triage_replies`.
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
    for verdict in triage_replies(replies, seen, optimizer_family=optimizer_family, instruction_pos=instruction_pos,
                                  meta_prompt_type=meta_prompt_type, max_instruction_chars=max_instruction_chars):
        text, instruction, fate, reason = verdict.text, verdict.instruction, verdict.fate, verdict.reason
        if instruction is None or verdict.md5 is None or fate == "duplicate":
            records.append(Reply(text=text, instruction=instruction, fate=fate, unclosed=verdict.unclosed,
                                 candidate_id=seen.get(verdict.md5) if verdict.md5 else None))
            continue
        status = CandidateStatus.SKIPPED if fate not in ("new", "unclosed") else CandidateStatus.PENDING
        candidate = Candidate(id=len(state.candidates) + len(new), step=record.step, predictor=predictor,
                              instruction=instruction, instructions={**best.instructions, predictor: instruction},
                              md5=verdict.md5, status=status, reason=reason,
                              scores=[] if reason else [None] * n_train)
        new.append(candidate)
        seen[verdict.md5] = candidate.id
        records.append(Reply(text=text, instruction=instruction, fate=fate, unclosed=verdict.unclosed,
                             candidate_id=candidate.id))
    return records, new


__all__ = ["Verdict", "is_unclosed", "skip_reason", "step_candidates", "triage_replies"]
