"""Reply parsing and instruction normalisation: extract the instruction, polish it, key it for de-duplication.

The authors' handling of one optimizer reply (google-deepmind/opro, Apache-2.0; see
:mod:`dspy_opro.proposing.meta_prompt`), rewritten from a prose description: take the instruction out of the reply (the
first ``<INS>``/``<Start>`` tag pair for GPT-style optimizers, the first square-bracket pair for PaLM-style ones, the
first ``<TEXT>`` pair for the ``instructions_only`` prompt), normalise it, and key it for de-duplication. Quirks kept:
the PaLM bracket pattern does not span newlines and stops at the first closing bracket; the GPT tag slicing uses the
first closing tag anywhere in the reply; :func:`polish_sentence` does not strip a second time after removing ``**``.
Quirk fixed:
:func:`instruction_md5` hashes UTF-8 instead of ASCII, which gives the authors' digest for every ASCII instruction
and no longer crashes on other text.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from dspy_opro.checks import require_choice
from dspy_opro.proposing.meta_prompt.templates import (
    INS_TAGS,
    INSTRUCTION_POSITIONS,
    META_PROMPT_TYPES,
    OPTIMIZER_FAMILIES,
    START_TAGS,
    TEXT_TAGS,
)

__all__ = ["extract_instruction", "instruction_md5", "polish_sentence"]

_PALM_BRACKETS: Final[re.Pattern[str]] = re.compile(r"\[.*?\]")
_TEXT_TAG_CONTENT: Final[re.Pattern[str]] = re.compile(
    re.escape(TEXT_TAGS[0]) + "(.*?)" + re.escape(TEXT_TAGS[1]), re.DOTALL
)
_ENDING_PUNCTUATION: Final[tuple[str, ...]] = (".", "?", "!")


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
    require_choice("optimizer_family", optimizer_family, OPTIMIZER_FAMILIES)
    require_choice("instruction_pos", instruction_pos, INSTRUCTION_POSITIONS)
    require_choice("meta_prompt_type", meta_prompt_type, META_PROMPT_TYPES)
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
