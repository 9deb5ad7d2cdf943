"""The OPRO meta-prompt, reply parsing and instruction normalisation, ported byte for byte.

This package reproduces the text-handling half of the reference implementation of *Large Language Models as
Optimizers* (Yang et al., ICLR 2024): google-deepmind/opro at commit ``e81b2f573ce4e15755c70c2535279d6fb940b4b7``,
Copyright 2023 The OPRO Authors, licensed under the Apache License, Version 2.0. The code here was written from a
prose description of the authors' behaviour; only the prompt template strings are carried over verbatim, from
``opro/optimization/opt_utils.py`` (see the NOTICE file). The golden vectors in ``tests/golden/`` were produced by
running the authors' functions and pin the output down character for character.

One job per module:

* :mod:`~dspy_opro.proposing.meta_prompt.templates`: the authors' strings and the option values they are keyed by;
* :mod:`~dspy_opro.proposing.meta_prompt.builder`: option checks, score formatting, history selection and
  :func:`gen_meta_prompt`;
* :mod:`~dspy_opro.proposing.meta_prompt.replies`: :func:`extract_instruction`, :func:`polish_sentence` and
  :func:`instruction_md5`.

Every public name is re-exported here, so ``from dspy_opro.proposing.meta_prompt import gen_meta_prompt`` is the import
to use.
"""

from __future__ import annotations

from dspy_opro.proposing.meta_prompt.builder import format_score, gen_meta_prompt, validate_meta_prompt_options
from dspy_opro.proposing.meta_prompt.replies import extract_instruction, instruction_md5, polish_sentence
from dspy_opro.proposing.meta_prompt.templates import (
    BLOCK_SEPARATOR,
    GPT_ANSWER_TEMPLATE,
    GPT_EXEMPLARS_INTRO,
    GPT_INS_CLOSING,
    GPT_INS_HEADER,
    GPT_START_CLOSING,
    GPT_START_HEADER,
    INS_TAGS,
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
    START_TAGS,
    TEXT_TAGS,
)

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
