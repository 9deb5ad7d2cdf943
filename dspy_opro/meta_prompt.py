"""The OPRO meta-prompt, reply parsing and instruction normalisation, ported byte for byte.

This module reproduces the text-handling half of the reference implementation of *Large Language Models as
Optimizers* (Yang et al., ICLR 2024): google-deepmind/opro at commit
``e81b2f573ce4e15755c70c2535279d6fb940b4b7``, Copyright 2023 The OPRO Authors, licensed under the Apache
License, Version 2.0. The code here was written from a prose description of the authors' behaviour; only the
prompt template strings are carried over verbatim, from ``opro/optimization/opt_utils.py`` (see the NOTICE
file). The golden vectors in ``tests/golden/`` were produced by running the authors' functions and pin the
output down character for character.

What is ported:

* :func:`gen_meta_prompt` is the authors' meta-prompt builder together with its instruction/score block. The
  history is sorted ascending by score with a stable sort (ties keep insertion order, so the more recent of
  two equal scores is shown lower), the highest ``max_num_instructions`` entries are kept, entries below the
  score threshold are dropped, and each remaining one is written as ``text:``/``score:`` lines. Problems from
  the training set follow (or precede) it, in the layout selected by the optimizer family, the instruction
  position and ``include_qa``, and a closing sentence asks for a better instruction. The
  ``instructions_only`` variant for pre-trained optimizers writes every entry as a ``Precision:`` line.
* :func:`extract_instruction` is the reply parsing: the first ``<INS>``/``<Start>`` tag pair for GPT-style
  optimizers, the first square-bracket pair for PaLM-style ones and the first ``<TEXT>`` pair for the
  ``instructions_only`` prompt.
* :func:`polish_sentence` and :func:`instruction_md5` are the normalisation and the de-duplication key.

Quirks kept, because the golden vectors depend on them: the sentence "The score ranges from 0 to 100." is
printed whatever the bucket count; scores are rounded with numpy's half-to-even rule applied to the scaled
value (``0.0125`` shows as ``0.012``) and bucketized with Python's ``round`` of the float product (``0.285``
with 100 buckets shows as ``28``); ``max_num_instructions=0`` means no limit and a threshold of ``0`` (or
``None``) disables filtering; instructions are inserted without escaping or stripping; the history is not
de-duplicated; the PaLM bracket pattern does not span newlines and stops at the first closing bracket; the
GPT tag slicing uses the first closing tag anywhere in the reply; :func:`polish_sentence` does not strip a
second time after removing ``**``.

Quirks fixed: the optimizer family and the task description are explicit arguments instead of being derived
from model and dataset names (so ``gpt-4o`` or a custom dataset work); exemplars are passed as
``(question, answer)`` pairs instead of a dataset plus indices; invalid options raise ``ValueError`` up front
(see :func:`validate_meta_prompt_options`) instead of an ``AssertionError`` halfway through a run; and
:func:`instruction_md5` hashes UTF-8 instead of ASCII, which gives the authors' digest for every ASCII
instruction and no longer crashes on other text.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

__all__ = [
    "BLOCK_SEPARATOR",
    "GPT_ANSWER_TEMPLATE",
    "GPT_EXEMPLARS_INTRO",
    "GPT_INS_CLOSING",
    "GPT_INS_HEADER",
    "GPT_START_CLOSING",
    "GPT_START_HEADER",
    "INSTRUCTION_POSITIONS",
    "INSTRUCTION_POS_DESCRIPTIONS",
    "INSTRUCTION_SCORE_TEMPLATE",
    "INSTRUCTIONS_ONLY_ENTRY_TEMPLATE",
    "INSTRUCTIONS_ONLY_INTRO_TEMPLATE",
    "INSTRUCTIONS_ONLY_POSITIONS",
    "INS_TAGS",
    "META_PROMPT_TYPES",
    "NO_QA_POSITIONS",
    "OPTIMIZER_FAMILIES",
    "PALM_ANSWER_TEMPLATE",
    "PALM_CLOSING",
    "PALM_EXEMPLARS_INTRO",
    "PALM_HEADER",
    "QUESTION_TEMPLATES",
    "START_TAGS",
    "TEXT_TAGS",
    "extract_instruction",
    "format_score",
    "gen_meta_prompt",
    "instruction_md5",
    "polish_sentence",
    "validate_meta_prompt_options",
]

# ---------------------------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------------------------

OPTIMIZER_FAMILIES: Final[tuple[str, ...]] = ("gpt", "palm")
"""Wording families of the meta-prompt: the authors' GPT (``gpt-3.5-turbo``, ``gpt-4``) and PaLM (``text-bison``)."""

INSTRUCTION_POSITIONS: Final[tuple[str, ...]] = ("before_Q", "Q_begin", "Q_end", "A_begin")
"""Where the instruction sits in the scorer prompt."""

NO_QA_POSITIONS: Final[tuple[str, ...]] = ("Q_begin", "Q_end")
"""The positions allowed when ``include_qa`` is false (no ``Q:``/``A:`` markers)."""

INSTRUCTIONS_ONLY_POSITIONS: Final[tuple[str, ...]] = ("Q_begin", "Q_end", "A_begin")
"""The positions the ``instructions_only`` meta-prompt can describe."""

META_PROMPT_TYPES: Final[tuple[str, ...]] = ("both_instructions_and_exemplars", "instructions_only")
"""The two meta-prompt layouts."""

# ---------------------------------------------------------------------------------------------------------------
# Template strings (verbatim from google-deepmind/opro, opro/optimization/opt_utils.py; Apache-2.0)
# ---------------------------------------------------------------------------------------------------------------

GPT_INS_HEADER: Final[str] = (
    "Your task is to generate the instruction <INS>. Below are some previous instructions with their scores. "
    "The score ranges from 0 to 100.\n"
)
"""First line of the GPT meta-prompt for every position except ``A_begin``."""

GPT_START_HEADER: Final[str] = (
    "Your task is to generate the answer starting sentence <Start>. Below are some previous starting sentences "
    "with their scores. The score ranges from 0 to 100.\n"
)
"""First line of the GPT meta-prompt for ``A_begin``."""

PALM_HEADER: Final[str] = (
    "I have some texts along with their corresponding scores. The texts are arranged in ascending order based on "
    "their scores, where higher scores indicate better quality.\n\n"
)
"""First lines of the PaLM meta-prompt (any position)."""

INSTRUCTION_SCORE_TEMPLATE: Final[str] = "\ntext:\n{instruction}\nscore:\n{score}\n"
"""One entry of the instruction/score block."""

GPT_EXEMPLARS_INTRO: Final[str] = "Below are some problems.\n"
"""First line of the GPT problems section."""

PALM_EXEMPLARS_INTRO: Final[str] = (
    "The following exemplars show how to apply your text: you replace <INS> in each input with your text, then "
    "read the input and give an output. We say your output is wrong if your output is different from the given "
    "output, and we say your output is correct if they are the same. When replacing <INS> with an old piece of "
    "text above, we get wrong outputs on the following inputs.\n\n"
)
"""First lines of the PaLM problems section."""

_QA_QUESTION_TEMPLATES: Final[dict[str, str]] = {
    "before_Q": "\ninput:\n<INS>\nQ: {question}\nA:",
    "Q_begin": "\ninput:\nQ: <INS>\n{question}\nA:",
    "Q_end": "\ninput:\nQ: {question}\n<INS>\nA:",
}

QUESTION_TEMPLATES: Final[Mapping[tuple[str, str, bool], str]] = MappingProxyType(
    {
        **{("gpt", pos, True): text for pos, text in _QA_QUESTION_TEMPLATES.items()},
        **{("palm", pos, True): text for pos, text in _QA_QUESTION_TEMPLATES.items()},
        ("gpt", "A_begin", True): "\nQ: {question}\nA: <Start>",
        ("palm", "A_begin", True): "\ninput:\nQ: {question}\nA: <INS>",
        ("gpt", "Q_begin", False): "\nProblem:\n<INS>\n{question}\n",
        ("gpt", "Q_end", False): "\nProblem:\n{question}\n<INS>\n",
        ("palm", "Q_begin", False): "\ninput:\n<INS>\n{question}\n",
        ("palm", "Q_end", False): "\ninput:\n{question}\n<INS>\n",
    }
)
"""Question piece of one problem, keyed by ``(optimizer_family, instruction_pos, include_qa)``."""

GPT_ANSWER_TEMPLATE: Final[str] = "\nGround truth answer:\n{answer}\n"
"""Answer piece of one problem, GPT wording."""

PALM_ANSWER_TEMPLATE: Final[str] = "\noutput:\n{answer}\n"
"""Answer piece of one problem, PaLM wording."""

BLOCK_SEPARATOR: Final[str] = "\n\n"
"""Joins the instruction/score part and the problems section."""

GPT_INS_CLOSING: Final[str] = (
    "\n\nGenerate an instruction that is different from all the instructions <INS> above, and has a higher score "
    "than all the instructions <INS> above. The instruction should begin with <INS> and end with </INS>. The "
    "instruction should be concise, effective, and generally applicable to all problems above."
)
"""Closing request of the GPT meta-prompt for every position except ``A_begin``."""

GPT_START_CLOSING: Final[str] = (
    "\n\nGenerate a starting sentence that is different from all the <Start> sentences above, and has a higher "
    "score than all the <Start> sentences above. The starting sentence should begin with <Start> and end with "
    "</Start>. The starting sentence should be concise, effective, and generally applicable to all QA pairs above."
)
"""Closing request of the GPT meta-prompt for ``A_begin``."""

PALM_CLOSING: Final[str] = (
    "\n\nWrite your new text that is different from the old ones and has a score as high as possible. Write the "
    "text in square brackets."
)
"""Closing request of the PaLM meta-prompt."""

INSTRUCTIONS_ONLY_INTRO_TEMPLATE: Final[str] = (
    "Create a piece of text {instruction_pos_description} to enhance the precision in solving diverse "
    "{instruction_task_description} problems."
)
"""First line of the ``instructions_only`` meta-prompt."""

INSTRUCTIONS_ONLY_ENTRY_TEMPLATE: Final[str] = "\n\nPrecision: {score} <TEXT>{instruction}</TEXT>"
"""One entry of the ``instructions_only`` meta-prompt."""

INSTRUCTION_POS_DESCRIPTIONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "Q_begin": "at the beginning of the question",
        "Q_end": "at the end of the question",
        "A_begin": "at the beginning of the answer",
    }
)
"""How the ``instructions_only`` meta-prompt describes each position."""

INS_TAGS: Final[tuple[str, str]] = ("<INS>", "</INS>")
"""Tags around a GPT instruction (every position except ``A_begin``)."""

START_TAGS: Final[tuple[str, str]] = ("<Start>", "</Start>")
"""Tags around a GPT answer starting sentence (``A_begin``)."""

TEXT_TAGS: Final[tuple[str, str]] = ("<TEXT>", "</TEXT>")
"""Tags around an instruction in the ``instructions_only`` meta-prompt and its replies."""

_PALM_BRACKETS: Final[re.Pattern[str]] = re.compile(r"\[.*?\]")
_TEXT_TAG_CONTENT: Final[re.Pattern[str]] = re.compile(
    re.escape(TEXT_TAGS[0]) + "(.*?)" + re.escape(TEXT_TAGS[1]), re.DOTALL
)
_ENDING_PUNCTUATION: Final[tuple[str, ...]] = (".", "?", "!")

_ALLOWED_COMBINATIONS: Final[str] = (
    "include_qa=False with instruction_pos 'Q_begin' or 'Q_end'; include_qa=True with 'before_Q', 'Q_begin', "
    "'Q_end' or 'A_begin' ('Q_begin', 'Q_end' or 'A_begin' for meta_prompt_type 'instructions_only')"
)

HistoryEntry = tuple[str, float, object]
"""A checked history entry: instruction, score as a float, and the step (not used for rendering)."""

# ---------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------


def _check_choice(name: str, value: object, allowed: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")


def _is_infinite_buckets(num_score_buckets: object) -> bool:
    """Whether ``num_score_buckets`` asks for unbucketed scores (``math.inf``, ``np.inf``, ``float('inf')``)."""
    return isinstance(num_score_buckets, float) and num_score_buckets == math.inf


def _check_num_score_buckets(num_score_buckets: object) -> None:
    """Raise ``ValueError`` unless ``num_score_buckets`` is a positive int or positive infinity."""
    if _is_infinite_buckets(num_score_buckets):
        return
    if isinstance(num_score_buckets, numbers.Integral) and not isinstance(num_score_buckets, bool):
        if num_score_buckets >= 1:
            return
    raise ValueError(
        f"num_score_buckets must be a positive int (scores shown as round(score * n)) or math.inf "
        f"(scores shown rounded to 3 decimals); got {num_score_buckets!r}"
    )


def validate_meta_prompt_options(
    *,
    optimizer_family: str = "gpt",
    instruction_pos: str = "Q_begin",
    meta_prompt_type: str = "both_instructions_and_exemplars",
    include_qa: bool = False,
    num_score_buckets: int | float = 100,
    max_num_instructions: int = 20,
    score_threshold: float | None = 0.0,
) -> None:
    """Check meta-prompt options before any work is done.

    :func:`gen_meta_prompt` calls this; an optimizer can call it in its constructor so that a bad combination
    fails before the first LM call.

    Decision on ``include_qa``: the authors assert that only ``Q_begin`` and ``Q_end`` are used without
    ``Q:``/``A:`` markers, but their meta-prompt builder checks this only while it renders exemplars, and their
    scorer-prompt builder checks it again for every instruction it scores. Their default command line
    (``A_begin`` without ``include_qa``) therefore crashes on the first scored instruction (quirk Q1). Because
    an optimizer both renders meta-prompts and scores their instructions with the same options, this function
    rejects ``before_Q`` and ``A_begin`` with ``include_qa=False`` for both meta-prompt types and whether or
    not exemplars are shown, so the mistake surfaces before any LM call. (The ``instructions_only`` text does
    not depend on ``include_qa``, so passing ``include_qa=True`` there changes nothing in the meta-prompt.)

    Args:
        optimizer_family: ``"gpt"`` or ``"palm"``.
        instruction_pos: ``"before_Q"``, ``"Q_begin"``, ``"Q_end"`` or ``"A_begin"``.
        meta_prompt_type: ``"both_instructions_and_exemplars"`` or ``"instructions_only"``.
        include_qa: Whether prompts use ``Q:``/``A:`` markers.
        num_score_buckets: A positive int, or ``math.inf`` for scores rounded to 3 decimals.
        max_num_instructions: How many of the best instructions to show; ``0`` means all (quirk Q11).
        score_threshold: Minimum score (0 to 1) of a shown instruction; ``0`` or ``None`` disables it (Q12).

    Raises:
        ValueError: On an unknown family, position or type, an illegal combination of them, a bucket count
            that is neither a positive int nor infinity, a negative or non-int ``max_num_instructions``, or a
            threshold outside [0, 1].
    """
    _check_choice("optimizer_family", optimizer_family, OPTIMIZER_FAMILIES)
    _check_choice("instruction_pos", instruction_pos, INSTRUCTION_POSITIONS)
    _check_choice("meta_prompt_type", meta_prompt_type, META_PROMPT_TYPES)
    if not _is_bool(include_qa):
        raise ValueError(f"include_qa must be a bool; got {include_qa!r}")
    if meta_prompt_type == "instructions_only" and instruction_pos not in INSTRUCTIONS_ONLY_POSITIONS:
        raise ValueError(
            f"meta_prompt_type 'instructions_only' cannot describe instruction_pos {instruction_pos!r}; "
            f"allowed combinations: {_ALLOWED_COMBINATIONS}"
        )
    if not include_qa and instruction_pos not in NO_QA_POSITIONS:
        raise ValueError(
            f"instruction_pos {instruction_pos!r} needs include_qa=True; allowed combinations: {_ALLOWED_COMBINATIONS}"
        )
    _check_num_score_buckets(num_score_buckets)
    if (
        not isinstance(max_num_instructions, numbers.Integral)
        or isinstance(max_num_instructions, bool)
        or max_num_instructions < 0
    ):
        raise ValueError(f"max_num_instructions must be an int >= 0 (0 means no limit); got {max_num_instructions!r}")
    if score_threshold is not None and (
        not isinstance(score_threshold, numbers.Real)
        or isinstance(score_threshold, bool)
        or not 0.0 <= float(score_threshold) <= 1.0
    ):
        raise ValueError(f"score_threshold must be a number in [0, 1] (or None); got {score_threshold!r}")


# ---------------------------------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------------------------------


def _is_bool(value: object) -> bool:
    """Whether ``value`` is a Python or numpy bool, without importing numpy (an unimported numpy made no bool)."""
    numpy = sys.modules.get("numpy")
    return isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_))


def _checked_score(score: object) -> float:
    """Return ``score`` as a float, raising ``ValueError`` unless it is a real number in [0, 1]."""
    if _is_bool(score) or not isinstance(score, numbers.Real):
        raise ValueError(f"score must be a number in [0, 1]; got {score!r}")
    value = float(score)
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(f"score must be in [0, 1]; got {score!r}")
    return value


def _numpy_round(score: float, decimals: int) -> float:
    """Round like ``round(np.float64(score), decimals)``: scale, round half to even, unscale."""
    import numpy as np  # here, not at the top: ``import dspy_opro`` stays cheap

    return float(np.round(np.float64(score), decimals))


def _bucketize(score: float, num_buckets: int) -> int:
    """The authors' bucket: Python's half-to-even ``round`` of the float product ``score * num_buckets``."""
    return round(score * int(num_buckets))


def format_score(score: float, num_score_buckets: int | float, *, decimals: int = 3) -> str:
    """Render a score as the meta-prompt shows it.

    Args:
        score: A score in [0, 1].
        num_score_buckets: A positive int ``n`` to show ``round(score * n)`` (``0.285`` with 100 gives ``28``),
            or ``math.inf`` to show the score rounded as numpy rounds a float64 (``0.0125`` gives ``0.012``).
        decimals: Decimals kept with ``math.inf``; 3 in the main meta-prompt, 2 in ``instructions_only``.

    Returns:
        The text inserted after ``score:`` (or ``Precision:``), for example ``"61"`` or ``"0.613"``.

    Raises:
        ValueError: On a score outside [0, 1], NaN, or an invalid bucket count.
    """
    _check_num_score_buckets(num_score_buckets)
    value = _checked_score(score)
    if _is_infinite_buckets(num_score_buckets):
        return str(_numpy_round(value, decimals))
    return str(_bucketize(value, int(num_score_buckets)))


def _checked_history(history: Sequence[Sequence[object]]) -> list[HistoryEntry]:
    """Copy the history as ``(instruction, score, step)`` triples, validating every score.

    Raises:
        ValueError: On a malformed entry or a score outside [0, 1] or NaN; the message names the instruction.
    """
    entries: list[HistoryEntry] = []
    for entry in history:
        if len(entry) != 3:
            raise ValueError(f"history entries must be (instruction, score, step) triples; got {entry!r}")
        instruction, score, step = entry
        if not isinstance(instruction, str):
            raise ValueError(f"instruction must be a str; got {instruction!r}")
        try:
            value = _checked_score(score)
        except ValueError as error:
            raise ValueError(f"invalid score for instruction {instruction!r}: {error}") from None
        entries.append((instruction, value, step))
    return entries


def _sorted_by_score(entries: Sequence[HistoryEntry]) -> list[HistoryEntry]:
    """Sort ascending by score; the sort is stable, so ties keep insertion order."""
    return sorted(entries, key=lambda entry: entry[1])


def _select_entries(
    entries: Sequence[HistoryEntry], score_threshold: float | None, max_num_instructions: int
) -> list[HistoryEntry]:
    """The entries the main meta-prompt shows, lowest score first.

    The highest ``max_num_instructions`` are kept (``0`` keeps all, as the authors' ``[-0:]`` slice does), then
    those below a truthy threshold are dropped.
    """
    kept = _sorted_by_score(entries)[-max_num_instructions:]
    if score_threshold:
        kept = [entry for entry in kept if entry[1] >= score_threshold]
    return kept


def _instruction_score_block(entries: Sequence[HistoryEntry], num_score_buckets: int | float) -> str:
    """Render the ``text:``/``score:`` lines; the instructions are inserted verbatim."""
    return "".join(
        INSTRUCTION_SCORE_TEMPLATE.format(instruction=instruction, score=format_score(score, num_score_buckets))
        for instruction, score, _ in entries
    )


# ---------------------------------------------------------------------------------------------------------------
# Meta-prompt
# ---------------------------------------------------------------------------------------------------------------


def _header(optimizer_family: str, instruction_pos: str) -> str:
    """The opening sentence of the main meta-prompt."""
    if optimizer_family == "palm":
        return PALM_HEADER
    return GPT_START_HEADER if instruction_pos == "A_begin" else GPT_INS_HEADER


def _closing(optimizer_family: str, instruction_pos: str) -> str:
    """The closing request of the main meta-prompt."""
    if optimizer_family == "palm":
        return PALM_CLOSING
    return GPT_START_CLOSING if instruction_pos == "A_begin" else GPT_INS_CLOSING


def _exemplar_block(
    exemplars: Sequence[tuple[str, str]], optimizer_family: str, instruction_pos: str, include_qa: bool
) -> str:
    """The problems section: an intro line, then a question piece and an answer piece per exemplar, in order."""
    intro = PALM_EXEMPLARS_INTRO if optimizer_family == "palm" else GPT_EXEMPLARS_INTRO
    question_template = QUESTION_TEMPLATES[(optimizer_family, instruction_pos, bool(include_qa))]
    answer_template = PALM_ANSWER_TEMPLATE if optimizer_family == "palm" else GPT_ANSWER_TEMPLATE
    pieces = [intro]
    for question, answer in exemplars:
        pieces.append(question_template.format(question=question))
        pieces.append(answer_template.format(answer=answer))
    return "".join(pieces)


def _instructions_only_prompt(
    entries: Sequence[HistoryEntry], instruction_pos: str, num_score_buckets: int | float, task_description: str
) -> str:
    """The meta-prompt for pre-trained optimizers: every entry, lowest score first, as a ``Precision:`` line."""
    intro = INSTRUCTIONS_ONLY_INTRO_TEMPLATE.format(
        instruction_pos_description=INSTRUCTION_POS_DESCRIPTIONS[instruction_pos].strip(),
        instruction_task_description=task_description.strip(),
    )
    lines = (
        INSTRUCTIONS_ONLY_ENTRY_TEMPLATE.format(
            score=format_score(score, num_score_buckets, decimals=2), instruction=instruction
        )
        for instruction, score, _ in _sorted_by_score(entries)
    )
    return intro + "".join(lines)


def gen_meta_prompt(
    history: Sequence[Sequence[object]],
    exemplars: Sequence[tuple[str, str]] | None = None,
    *,
    optimizer_family: str = "gpt",
    instruction_pos: str = "Q_begin",
    meta_prompt_type: str = "both_instructions_and_exemplars",
    include_qa: bool = False,
    score_threshold: float | None = 0.0,
    max_num_instructions: int = 20,
    num_score_buckets: int | float = 100,
    instructions_before_exemplars: bool = True,
    task_description: str = "",
) -> str:
    """Build the meta-prompt that asks the optimizer LM for a new instruction.

    For ``both_instructions_and_exemplars`` the result is the header, the best scored instructions (lowest
    first), the problems section and the closing request; for ``instructions_only`` it is a one-line task
    statement followed by every scored instruction as a ``Precision:`` line (threshold, limit and exemplars
    unused). The text equals the authors' ``gen_meta_prompt`` output character for character.

    Args:
        history: ``(instruction, score, step)`` triples in the order they were scored; scores in [0, 1].
        exemplars: ``(question, answer)`` pairs rendered in order. ``None`` leaves the problems section out; an
            empty sequence still writes its intro line, as the authors do with an empty index list.
        optimizer_family: ``"gpt"`` or ``"palm"`` wording.
        instruction_pos: ``"before_Q"``, ``"Q_begin"``, ``"Q_end"`` or ``"A_begin"``.
        meta_prompt_type: ``"both_instructions_and_exemplars"`` or ``"instructions_only"``.
        include_qa: Whether problems use the ``Q:``/``A:`` layout.
        score_threshold: Instructions scoring below it are not shown; ``0`` or ``None`` shows all.
        max_num_instructions: How many of the best instructions are shown; ``0`` shows all.
        num_score_buckets: A positive int ``n`` to show ``round(score * n)``, or ``math.inf`` to show the score
            rounded to 3 decimals (2 in ``instructions_only``) as numpy rounds.
        instructions_before_exemplars: Put the instructions before the problems (else after).
        task_description: The task words of the ``instructions_only`` prompt, for example
            ``"grade school math"``.

    Returns:
        The meta-prompt, without a trailing newline.

    Raises:
        ValueError: On invalid options (see :func:`validate_meta_prompt_options`) or an invalid history score.
    """
    validate_meta_prompt_options(
        optimizer_family=optimizer_family,
        instruction_pos=instruction_pos,
        meta_prompt_type=meta_prompt_type,
        include_qa=include_qa,
        num_score_buckets=num_score_buckets,
        max_num_instructions=max_num_instructions,
        score_threshold=score_threshold,
    )
    entries = _checked_history(history)
    if meta_prompt_type == "instructions_only":
        return _instructions_only_prompt(entries, instruction_pos, num_score_buckets, task_description)
    shown = _select_entries(entries, score_threshold, int(max_num_instructions))
    old_part = _header(optimizer_family, instruction_pos) + _instruction_score_block(shown, num_score_buckets)
    if exemplars is None:
        prompt = old_part
    else:
        exemplar_part = _exemplar_block(exemplars, optimizer_family, instruction_pos, include_qa)
        parts = (old_part, exemplar_part) if instructions_before_exemplars else (exemplar_part, old_part)
        prompt = BLOCK_SEPARATOR.join(parts)
    return prompt + _closing(optimizer_family, instruction_pos)


# ---------------------------------------------------------------------------------------------------------------
# Reply parsing and normalisation
# ---------------------------------------------------------------------------------------------------------------


def _slice_between_tags(reply: str, opening: str, closing: str) -> str:
    """The authors' tag slicing: after the first opening tag (or from 0) up to the first closing tag anywhere.

    A closing tag before the opening tag gives an empty slice. The result is stripped.
    """
    start = reply.find(opening)
    start = 0 if start < 0 else start + len(opening)
    end = reply.find(closing)
    end = len(reply) if end < 0 else end
    return reply[start:end].strip()


def _first_square_brackets(reply: str) -> str:
    """The text inside the first ``[...]`` on one line (shortest match, not stripped), or ``""``."""
    match = _PALM_BRACKETS.search(reply)
    return match.group(0)[1:-1] if match else ""


def _first_text_tag(reply: str) -> str | None:
    """The text inside the first ``<TEXT>...</TEXT>`` pair (may span lines, not stripped), or ``None``."""
    match = _TEXT_TAG_CONTENT.search(reply)
    return match.group(1) if match else None


def extract_instruction(
    reply: str,
    *,
    optimizer_family: str = "gpt",
    instruction_pos: str = "Q_begin",
    meta_prompt_type: str = "both_instructions_and_exemplars",
) -> str | None:
    """Take the new instruction out of one optimizer reply, as the authors do.

    * ``instructions_only`` (any family): the content of the first ``<TEXT>...</TEXT>`` pair, unstripped;
      ``None`` when there is none, meaning the reply yields no instruction at all.
    * PaLM: the content of the first ``[...]`` on a single line, unstripped; ``""`` when there is none.
    * GPT: the stripped text after the first ``<INS>`` (``<Start>`` for ``A_begin``), or from the start, up
      to the first ``</INS>`` (``</Start>``) anywhere, or to the end. A closing tag before the opening tag
      gives ``""``; a reply without tags gives the whole stripped reply.

    Args:
        reply: One completion of the optimizer LM.
        optimizer_family: ``"gpt"`` or ``"palm"``.
        instruction_pos: The instruction position; ``"A_begin"`` selects the ``<Start>`` tags for GPT.
        meta_prompt_type: ``"both_instructions_and_exemplars"`` or ``"instructions_only"``.

    Returns:
        The raw instruction (not yet polished), ``""`` for an empty one, or ``None`` for none.

    Raises:
        ValueError: On an unknown family, position or type.
    """
    _check_choice("optimizer_family", optimizer_family, OPTIMIZER_FAMILIES)
    _check_choice("instruction_pos", instruction_pos, INSTRUCTION_POSITIONS)
    _check_choice("meta_prompt_type", meta_prompt_type, META_PROMPT_TYPES)
    if meta_prompt_type == "instructions_only":
        return _first_text_tag(reply)
    if optimizer_family == "palm":
        return _first_square_brackets(reply)
    opening, closing = START_TAGS if instruction_pos == "A_begin" else INS_TAGS
    return _slice_between_tags(reply, opening, closing)


def polish_sentence(text: str, *, add_ending_punc: bool = False) -> str:
    """Normalise an instruction as the authors do before de-duplicating and scoring it.

    Strips surrounding whitespace; then, if anything is left, removes every ``**``, upper-cases the first
    character of a string longer than one character and, with ``add_ending_punc``, appends ``"."`` unless the
    text ends with ``.``, ``?`` or ``!``. There is no second strip: ``"** Think.**"`` becomes ``" Think."``.

    Args:
        text: The extracted instruction.
        add_ending_punc: Append a period when the text lacks ending punctuation (off in the optimization loop).

    Returns:
        The polished instruction.
    """
    polished = text.strip()
    if not polished:
        return polished
    polished = polished.replace("**", "")
    if len(polished) > 1:
        polished = polished[0].upper() + polished[1:]
    if add_ending_punc and not polished.endswith(_ENDING_PUNCTUATION):
        polished += "."
    return polished


def instruction_md5(text: str) -> str:
    """The de-duplication key of an instruction: the md5 hex digest of its UTF-8 bytes.

    For ASCII text this equals the authors' ``md5(text.encode("ascii"))``; other text, on which theirs raises
    ``UnicodeEncodeError``, gets a digest too; so does text with a lone surrogate, which UTF-8 cannot encode
    (it is hashed as its surrogate code unit, ``surrogatepass``). No normalisation is applied.

    Args:
        text: The polished instruction.

    Returns:
        32 lowercase hexadecimal characters.
    """
    return hashlib.md5(text.encode("utf-8", "surrogatepass")).hexdigest()
