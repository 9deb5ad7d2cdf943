"""The authors' meta-prompt strings and the option values they are keyed by, verbatim.

The template strings below are carried over verbatim from the reference implementation of *Large Language Models as
Optimizers* (Yang et al., ICLR 2024): google-deepmind/opro at commit ``e81b2f573ce4e15755c70c2535279d6fb940b4b7``,
``opro/optimization/opt_utils.py``, Copyright 2023 The OPRO Authors, licensed under the Apache License, Version 2.0 (see
the NOTICE file). Nothing here computes anything: :mod:`dspy_opro.core.meta_prompt` assembles these pieces
and parses the optimizer's answers with the tags defined here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

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
