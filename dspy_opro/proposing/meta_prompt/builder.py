"""The meta-prompt builder: option checks, score formatting, history selection and :func:`gen_meta_prompt`.

This is the authors' meta-prompt builder (google-deepmind/opro, Apache-2.0; see :mod:`dspy_opro.proposing.meta_prompt`),
rewritten from a prose description of its behaviour around the verbatim strings of
:mod:`dspy_opro.proposing.meta_prompt.templates`. The history is sorted ascending by score with a stable sort (ties keep
insertion order, so the more recent of two equal scores is shown lower), the highest ``max_num_instructions``
entries are kept, entries below the score threshold are dropped, and each remaining one is written as
``text:``/``score:`` lines. Problems from the training set follow (or precede) it, in the layout selected by the
optimizer family, the instruction position and ``include_qa``, and a closing sentence asks for a better
instruction. The ``instructions_only`` variant for pre-trained optimizers writes every entry as a ``Precision:``
line. The golden vectors in ``tests/golden/`` pin the output down character for character.

Quirks kept, because the golden vectors depend on them: the sentence "The score ranges from 0 to 100." is printed
whatever the bucket count; scores are rounded with numpy's half-to-even rule applied to the scaled value
(``0.0125`` shows as ``0.012``) and bucketized with Python's ``round`` of the float product (``0.285`` with 100
buckets shows as ``28``); ``max_num_instructions=0`` means no limit and a threshold of ``0`` (or ``None``)
disables filtering; instructions are inserted without escaping or stripping; the history is not de-duplicated.
Quirks fixed: the optimizer family and the task description are explicit arguments, exemplars are passed as
``(question, answer)`` pairs, and invalid options raise ``ValueError`` up front (see
:func:`validate_meta_prompt_options`) instead of an ``AssertionError`` halfway through a run.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Final

from dspy_opro.checks import is_bool, require_bool, require_choice, require_int, require_number
from dspy_opro.proposing.meta_prompt.templates import (
    BLOCK_SEPARATOR,
    GPT_ANSWER_TEMPLATE,
    GPT_EXEMPLARS_INTRO,
    GPT_INS_CLOSING,
    GPT_INS_HEADER,
    GPT_START_CLOSING,
    GPT_START_HEADER,
    INSTRUCTION_POS_DESCRIPTIONS,
    INSTRUCTION_POSITIONS,
    INSTRUCTION_SCORE_TEMPLATE,
    INSTRUCTIONS_ONLY_ENTRY_TEMPLATE,
    INSTRUCTIONS_ONLY_INTRO_TEMPLATE,
    INSTRUCTIONS_ONLY_POSITIONS,
    META_PROMPT_TYPES,
    NO_QA_POSITIONS,
    OPTIMIZER_FAMILIES,
    PALM_ANSWER_TEMPLATE,
    PALM_CLOSING,
    PALM_EXEMPLARS_INTRO,
    PALM_HEADER,
    QUESTION_TEMPLATES,
)

__all__ = ["HistoryEntry", "format_score", "gen_meta_prompt", "validate_meta_prompt_options"]

_ALLOWED_COMBINATIONS: Final[str] = (
    "include_qa=False with instruction_pos 'Q_begin' or 'Q_end'; include_qa=True with 'before_Q', 'Q_begin', "
    "'Q_end' or 'A_begin' ('Q_begin', 'Q_end' or 'A_begin' for meta_prompt_type 'instructions_only')"
)

HistoryEntry = tuple[str, float, object]
"""A checked history entry: instruction, score as a float, and the step (not used for rendering)."""

# ---------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------


def _is_infinite_buckets(num_score_buckets: object) -> bool:
    """Whether ``num_score_buckets`` asks for unbucketed scores (``math.inf``, ``np.inf``, ``float('inf')``)."""
    return isinstance(num_score_buckets, float) and num_score_buckets == math.inf


def _check_num_score_buckets(num_score_buckets: object) -> None:
    """Raise ``ValueError`` unless ``num_score_buckets`` is a positive int or positive infinity."""
    if _is_infinite_buckets(num_score_buckets):
        return
    if isinstance(num_score_buckets, numbers.Integral) and not is_bool(num_score_buckets):
        if int(num_score_buckets) >= 1:
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
    require_choice("optimizer_family", optimizer_family, OPTIMIZER_FAMILIES)
    require_choice("instruction_pos", instruction_pos, INSTRUCTION_POSITIONS)
    require_choice("meta_prompt_type", meta_prompt_type, META_PROMPT_TYPES)
    require_bool("include_qa", include_qa)
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
    require_int("max_num_instructions", max_num_instructions, minimum=0, meaning=" (0 means no limit)")
    require_number("score_threshold", score_threshold, low=0, high=1, allow_none=True)


# ---------------------------------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------------------------------


def _checked_score(score: object) -> float:
    """Return ``score`` as a float, raising ``ValueError`` unless it is a real number in [0, 1] (not NaN)."""
    require_number("score", score, low=0, high=1)
    return float(score)  # type: ignore[arg-type]  # require_number admitted only real numbers


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
        ValueError: On invalid options (see ``validate_meta_prompt_options``) or an invalid history score.
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
