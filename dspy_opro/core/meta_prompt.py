"""The authors' meta-prompt and reply handling, ported byte for byte: build the prompt, read the replies.

This reproduces the text-handling half of the reference implementation of *Large Language Models as Optimizers*
(Yang et al., ICLR 2024): google-deepmind/opro at commit ``e81b2f573ce4e15755c70c2535279d6fb940b4b7``, Copyright 2023
The OPRO Authors, Apache License 2.0 (see the NOTICE file). It was written from a prose description of the authors'
behaviour around their verbatim strings (:mod:`dspy_opro.core.templates`); the golden vectors in ``tests/golden/``,
produced by running the authors' functions, pin the output down character for character.

**The meta-prompt** (:func:`gen_meta_prompt`). The history is sorted ascending by score with a stable sort (ties keep
insertion order, so the more recent of two equal scores is shown lower), the highest ``max_num_instructions`` entries
are kept, entries below the score threshold are dropped, and each remaining one is written as ``text:``/``score:``
lines. Problems from the training set follow (or precede) it, in the layout selected by the optimizer family, the
instruction position and ``include_qa``, and a closing sentence asks for a better instruction. The
``instructions_only`` variant for pre-trained optimizers writes every entry as a ``Precision:`` line.

**A reply** is read by :func:`extract_instruction` (the first ``<INS>``/``<Start>`` tag pair for GPT-style optimizers,
the first square-bracket pair for PaLM-style ones, the first ``<TEXT>`` pair for ``instructions_only``), normalised by
:func:`polish_sentence` and keyed for de-duplication by :func:`instruction_md5`.

Quirks kept, because the golden vectors depend on them: the sentence "The score ranges from 0 to 100." is printed
whatever the bucket count; scores are rounded with numpy's half-to-even rule applied to the scaled value (``0.0125``
shows as ``0.012``) and bucketized with Python's ``round`` of the float product (``0.285`` with 100 buckets shows as
``28``); ``max_num_instructions=0`` means no limit and a threshold of ``0`` (or ``None``) disables filtering;
instructions are inserted without escaping or stripping; the history is not de-duplicated; the PaLM bracket pattern
does not span newlines and stops at the first closing bracket; the GPT tag slicing uses the first closing tag anywhere
in the reply; :func:`polish_sentence` does not strip a second time after removing ``**``. Quirks fixed: the options
are one value (:class:`MetaPromptOptions`) checked once, up front, instead of an ``AssertionError`` halfway through a
run; exemplars are passed as ``(question, answer)`` pairs; :func:`instruction_md5` hashes UTF-8 instead of ASCII,
which gives the authors' digest for every ASCII instruction and no longer crashes on other text.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dspy_opro.checks import is_bool, require_bool, require_choice, require_int, require_number
from dspy_opro.core import templates as t

_ALLOWED_COMBINATIONS = (
    "include_qa=False with instruction_pos 'Q_begin' or 'Q_end'; include_qa=True with 'before_Q', 'Q_begin', "
    "'Q_end' or 'A_begin' ('Q_begin', 'Q_end' or 'A_begin' for meta_prompt_type 'instructions_only')"
)


def _infinite(num_score_buckets: object) -> bool:
    """Whether ``num_score_buckets`` asks for unbucketed scores (``math.inf``, ``np.inf``, ``float('inf')``)."""
    return isinstance(num_score_buckets, float) and num_score_buckets == math.inf


def _check_num_score_buckets(num_score_buckets: object) -> None:
    if _infinite(num_score_buckets) or (isinstance(num_score_buckets, numbers.Integral)
                                        and not is_bool(num_score_buckets) and int(num_score_buckets) >= 1):
        return
    raise ValueError(f"num_score_buckets must be a positive int (scores shown as round(score * n)) or math.inf "
                     f"(scores shown rounded to 3 decimals); got {num_score_buckets!r}")


@dataclass(frozen=True)
class MetaPromptOptions:
    """The meta-prompt's options, checked once when made.

    Decision on ``include_qa``: the authors assert that only ``Q_begin`` and ``Q_end`` are used without ``Q:``/``A:``
    markers, but check it only while rendering exemplars, and their scorer-prompt builder checks it again for every
    instruction it scores, so their default command line (``A_begin`` without ``include_qa``) crashes on the first
    scored instruction (quirk Q1). An optimizer both renders meta-prompts and scores their instructions with the same
    options, so ``before_Q`` and ``A_begin`` are refused with ``include_qa=False`` for both meta-prompt types, before
    any LM call. (The ``instructions_only`` text does not depend on ``include_qa``.)

    Args:
        optimizer_family: ``"gpt"`` or ``"palm"`` wording.
        instruction_pos: ``"before_Q"``, ``"Q_begin"``, ``"Q_end"`` or ``"A_begin"``.
        meta_prompt_type: ``"both_instructions_and_exemplars"`` or ``"instructions_only"``.
        include_qa: Whether problems use the ``Q:``/``A:`` layout.
        score_threshold: Instructions scoring below it (0 to 1) are not shown; ``0`` or ``None`` shows all (Q12).
        max_num_instructions: How many of the best instructions are shown; ``0`` shows all (Q11).
        num_score_buckets: A positive int ``n`` to show ``round(score * n)``, or ``math.inf`` to show the score rounded
            to 3 decimals (2 in ``instructions_only``) as numpy rounds.
        task_description: The task words of the ``instructions_only`` prompt, e.g. ``"grade school math"``.
        instructions_before_exemplars: Put the instructions before the problems (else after).

    Raises:
        ValueError: On an unknown family, position or type, an illegal combination of them, a bucket count that is
            neither a positive int nor infinity, a negative ``max_num_instructions``, or a threshold outside [0, 1].
    """

    optimizer_family: str = "gpt"
    instruction_pos: str = "Q_begin"
    meta_prompt_type: str = "both_instructions_and_exemplars"
    include_qa: bool = False
    score_threshold: float | None = 0.0
    max_num_instructions: int = 20
    num_score_buckets: int | float = 100
    task_description: str = ""
    instructions_before_exemplars: bool = True

    def __post_init__(self) -> None:
        require_choice("optimizer_family", self.optimizer_family, t.OPTIMIZER_FAMILIES)
        require_choice("instruction_pos", self.instruction_pos, t.INSTRUCTION_POSITIONS)
        require_choice("meta_prompt_type", self.meta_prompt_type, t.META_PROMPT_TYPES)
        require_bool("include_qa", self.include_qa)
        if self.meta_prompt_type == "instructions_only" and self.instruction_pos not in t.INSTRUCTIONS_ONLY_POSITIONS:
            raise ValueError(f"meta_prompt_type 'instructions_only' cannot describe instruction_pos "
                             f"{self.instruction_pos!r}; allowed combinations: {_ALLOWED_COMBINATIONS}")
        if not self.include_qa and self.instruction_pos not in t.NO_QA_POSITIONS:
            raise ValueError(f"instruction_pos {self.instruction_pos!r} needs include_qa=True; allowed combinations: "
                             f"{_ALLOWED_COMBINATIONS}")
        _check_num_score_buckets(self.num_score_buckets)
        require_int("max_num_instructions", self.max_num_instructions, minimum=0, meaning=" (0 means no limit)")
        require_number("score_threshold", self.score_threshold, low=0, high=1, allow_none=True)
        if not isinstance(self.task_description, str):
            raise TypeError(f"task_description must be a string; got {self.task_description!r}")

    @property
    def reply_format(self) -> dict[str, str]:
        """The options ``extract_instruction`` reads a reply by."""
        return {"optimizer_family": self.optimizer_family, "instruction_pos": self.instruction_pos,
                "meta_prompt_type": self.meta_prompt_type}


# ---------------------------------------------------------------------------------------------------------------
# Scores


def format_score(score: float, num_score_buckets: int | float, *, decimals: int = 3) -> str:
    """A score as the meta-prompt shows it: ``round(score * n)`` (``0.285`` with 100 gives ``28``), or with
    ``math.inf`` the score rounded as numpy rounds a float64 (``0.0125`` gives ``0.012``; 3 decimals in the main
    meta-prompt, 2 in ``instructions_only``).

    Raises:
        ValueError: On a score outside [0, 1], NaN, or an invalid bucket count.
    """
    _check_num_score_buckets(num_score_buckets)
    require_number("score", score, low=0, high=1)
    if _infinite(num_score_buckets):
        import numpy as np  # here, not at the top: ``import dspy_opro`` stays cheap

        return str(float(np.round(np.float64(score), decimals)))
    return str(round(float(score) * int(num_score_buckets)))


HistoryEntry = tuple[str, float, Any]
"""A checked history entry: instruction, score as a float, and the step (not used for rendering)."""


def _checked_history(history: Sequence[Sequence[object]]) -> list[HistoryEntry]:
    entries: list[HistoryEntry] = []
    for entry in history:
        if len(entry) != 3:
            raise ValueError(f"history entries must be (instruction, score, step) triples; got {entry!r}")
        instruction, score, step = entry
        if not isinstance(instruction, str):
            raise ValueError(f"instruction must be a str; got {instruction!r}")
        try:
            require_number("score", score, low=0, high=1)
        except ValueError as error:
            raise ValueError(f"invalid score for instruction {instruction!r}: {error}") from None
        entries.append((instruction, float(score), step))  # type: ignore[arg-type]  # a checked real number
    return entries


# ---------------------------------------------------------------------------------------------------------------
# The meta-prompt


def _exemplar_block(exemplars: Sequence[tuple[str, str]], options: MetaPromptOptions) -> str:
    """The problems section: an intro line, then a question piece and an answer piece per exemplar, in order."""
    palm = options.optimizer_family == "palm"
    question = t.QUESTION_TEMPLATES[(options.optimizer_family, options.instruction_pos, bool(options.include_qa))]
    answer = t.PALM_ANSWER_TEMPLATE if palm else t.GPT_ANSWER_TEMPLATE
    pieces = [t.PALM_EXEMPLARS_INTRO if palm else t.GPT_EXEMPLARS_INTRO]
    for text, label in exemplars:
        pieces += [question.format(question=text), answer.format(answer=label)]
    return "".join(pieces)


def gen_meta_prompt(history: Sequence[Sequence[object]], exemplars: Sequence[tuple[str, str]] | None = None,
                    options: MetaPromptOptions | None = None, **keywords: Any) -> str:
    """The meta-prompt that asks the optimizer model for a new instruction, as the authors' ``gen_meta_prompt``.

    For ``both_instructions_and_exemplars``: the header, the best scored instructions (lowest first), the problems
    section and the closing request; for ``instructions_only``: a one-line task statement, then every scored
    instruction as a ``Precision:`` line (threshold, limit and exemplars unused).

    Args:
        history: ``(instruction, score, step)`` triples in the order they were scored; scores in [0, 1].
        exemplars: ``(question, answer)`` pairs rendered in order. ``None`` leaves the problems section out; an empty
            sequence still writes its intro line, as the authors do with an empty index list.
        options: The options; or pass them as keywords (``MetaPromptOptions``'s fields).

    Returns:
        The meta-prompt, without a trailing newline.

    Raises:
        ValueError: On invalid options or an invalid history score.
    """
    if options is None:
        options = MetaPromptOptions(**keywords)
    elif keywords:
        raise TypeError(f"pass the options either as options= or as keywords, not both: {sorted(keywords)}")
    entries = sorted(_checked_history(history), key=lambda entry: entry[1])  # stable: ties keep insertion order
    buckets = options.num_score_buckets
    if options.meta_prompt_type == "instructions_only":
        intro = t.INSTRUCTIONS_ONLY_INTRO_TEMPLATE.format(
            instruction_pos_description=t.INSTRUCTION_POS_DESCRIPTIONS[options.instruction_pos].strip(),
            instruction_task_description=options.task_description.strip())
        return intro + "".join(t.INSTRUCTIONS_ONLY_ENTRY_TEMPLATE.format(score=format_score(score, buckets, decimals=2),
                                                                          instruction=instruction)
                               for instruction, score, _ in entries)
    shown = entries[-int(options.max_num_instructions):]  # [-0:] keeps all, as the authors' slice does
    if options.score_threshold:
        shown = [entry for entry in shown if entry[1] >= options.score_threshold]
    gpt_start = options.optimizer_family == "gpt" and options.instruction_pos == "A_begin"
    header = t.PALM_HEADER if options.optimizer_family == "palm" else t.GPT_START_HEADER if gpt_start \
        else t.GPT_INS_HEADER
    old_part = header + "".join(t.INSTRUCTION_SCORE_TEMPLATE.format(
        instruction=instruction, score=format_score(score, buckets)) for instruction, score, _ in shown)
    if exemplars is None:
        prompt = old_part
    else:
        parts = (old_part, _exemplar_block(exemplars, options))
        prompt = t.BLOCK_SEPARATOR.join(parts if options.instructions_before_exemplars else parts[::-1])
    closing = t.PALM_CLOSING if options.optimizer_family == "palm" else t.GPT_START_CLOSING if gpt_start \
        else t.GPT_INS_CLOSING
    return prompt + closing


# ---------------------------------------------------------------------------------------------------------------
# Replies

_PALM_BRACKETS = re.compile(r"\[.*?\]")
_TEXT_TAG_CONTENT = re.compile(re.escape(t.TEXT_TAGS[0]) + "(.*?)" + re.escape(t.TEXT_TAGS[1]), re.DOTALL)


def extract_instruction(reply: str, *, optimizer_family: str = "gpt", instruction_pos: str = "Q_begin",
                        meta_prompt_type: str = "both_instructions_and_exemplars") -> str | None:
    """Take the new instruction out of one optimizer reply, as the authors do.

    * ``instructions_only`` (any family): the content of the first ``<TEXT>...</TEXT>`` pair, unstripped; ``None``
      when there is none, meaning the reply yields no instruction at all.
    * PaLM: the content of the first ``[...]`` on a single line, unstripped; ``""`` when there is none.
    * GPT: the stripped text after the first ``<INS>`` (``<Start>`` for ``A_begin``), or from the start, up to the
      first ``</INS>`` (``</Start>``) anywhere, or to the end. A closing tag before the opening tag gives ``""``; a
      reply without tags gives the whole stripped reply.

    Returns:
        The raw instruction (not yet polished), ``""`` for an empty one, or ``None`` for none.

    Raises:
        ValueError: On an unknown family, position or type.
    """
    require_choice("optimizer_family", optimizer_family, t.OPTIMIZER_FAMILIES)
    require_choice("instruction_pos", instruction_pos, t.INSTRUCTION_POSITIONS)
    require_choice("meta_prompt_type", meta_prompt_type, t.META_PROMPT_TYPES)
    if meta_prompt_type == "instructions_only":
        match = _TEXT_TAG_CONTENT.search(reply)
        return match.group(1) if match else None
    if optimizer_family == "palm":
        found = _PALM_BRACKETS.search(reply)
        return found.group(0)[1:-1] if found else ""
    opening, closing = t.START_TAGS if instruction_pos == "A_begin" else t.INS_TAGS
    start = reply.find(opening)
    start = 0 if start < 0 else start + len(opening)
    end = reply.find(closing)
    return reply[start:len(reply) if end < 0 else end].strip()


def polish_sentence(text: str, *, add_ending_punc: bool = False) -> str:
    """Normalise an instruction as the authors do before de-duplicating and scoring it.

    Strips surrounding whitespace; then, if anything is left, removes every ``**``, upper-cases the first character
    of a string longer than one character and, with ``add_ending_punc`` (off in the optimization loop), appends
    ``"."`` unless the text ends with ``.``, ``?`` or ``!``. There is no second strip: ``"** Think.**"`` becomes
    ``" Think."``.
    """
    polished = text.strip()
    if not polished:
        return polished
    polished = polished.replace("**", "")
    if len(polished) > 1:
        polished = polished[0].upper() + polished[1:]
    if add_ending_punc and not polished.endswith((".", "?", "!")):
        polished += "."
    return polished


def instruction_md5(text: str) -> str:
    """The de-duplication key of an instruction: the md5 hex digest of its UTF-8 bytes.

    For ASCII text this equals the authors' ``md5(text.encode("ascii"))``; other text, on which theirs raises
    ``UnicodeEncodeError``, gets a digest too; so does text with a lone surrogate (hashed as its code unit,
    ``surrogatepass``). No normalisation is applied.
    """
    return hashlib.md5(text.encode("utf-8", "surrogatepass")).hexdigest()


__all__ = ["MetaPromptOptions", "extract_instruction", "format_score", "gen_meta_prompt", "instruction_md5",
           "polish_sentence"]
