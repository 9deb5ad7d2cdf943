"""Unit tests of dspy_opro.core.meta_prompt beyond the golden vectors: validation and focused behaviours."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dspy_opro.core.meta_prompt import (
    MetaPromptOptions,
    extract_instruction,
    format_score,
    gen_meta_prompt,
    polish_sentence,
)
from dspy_opro.core.templates import GPT_EXEMPLARS_INTRO, GPT_INS_CLOSING, GPT_INS_HEADER, PALM_EXEMPLARS_INTRO

HISTORY = [("Let's solve the problem.", 0.61, -1), ("Let's think step by step.", 0.71, 0)]


def _shown_instructions(prompt: str) -> list[str]:
    """The instructions of the text:/score: block, in prompt order."""
    return [chunk.split("\nscore:\n")[0] for chunk in prompt.split("\ntext:\n")[1:]]


# --------------------------------------------------------------------------------------------------------------
# Rejected options
# --------------------------------------------------------------------------------------------------------------

REJECTED_COMBINATIONS: list[dict[str, Any]] = [
    # Positions that need Q:/A: markers, for both types and with or without exemplars (see the docstring of
    # MetaPromptOptions for why instructions_only is included).
    {"instruction_pos": "A_begin", "include_qa": False},
    {"instruction_pos": "before_Q", "include_qa": False},
    {"instruction_pos": "A_begin", "include_qa": False, "meta_prompt_type": "instructions_only"},
    {"instruction_pos": "before_Q", "include_qa": False, "meta_prompt_type": "instructions_only"},
    {"instruction_pos": "A_begin", "include_qa": False, "optimizer_family": "palm"},
    # instructions_only cannot describe before_Q.
    {"instruction_pos": "before_Q", "include_qa": True, "meta_prompt_type": "instructions_only"},
    # Unknown values.
    {"optimizer_family": "claude"},
    {"optimizer_family": "GPT"},
    {"optimizer_family": None},
    {"instruction_pos": "before_QA"},
    {"instruction_pos": "q_begin"},
    {"meta_prompt_type": "exemplars_only"},
    {"include_qa": "yes"},
]

BAD_BUCKETS: list[Any] = [0, -1, 2.5, 100.0, "100", "inf", None, True, -math.inf, math.nan]
# Accepted bucket counts and how they show HISTORY's scores (0.61 and 0.71).
GOOD_BUCKETS: list[tuple[Any, tuple[str, str]]] = [
    (1, ("1", "1")), (20, ("12", "14")), (100, ("61", "71")), (np.int64(100), ("61", "71")),
    (math.inf, ("0.61", "0.71")), (float("inf"), ("0.61", "0.71")), (np.inf, ("0.61", "0.71")),
    (np.float64("inf"), ("0.61", "0.71")),
]


@pytest.mark.parametrize("options", REJECTED_COMBINATIONS, ids=repr)
@pytest.mark.parametrize("with_exemplars", [False, True])
def test_rejected_combinations_raise(options: dict[str, Any], with_exemplars: bool) -> None:
    with pytest.raises(ValueError, match="allowed|must be one of|must be a bool") as info:
        gen_meta_prompt(HISTORY, [("q", "a")] if with_exemplars else None, **options)
    with pytest.raises(ValueError) as again:
        MetaPromptOptions(**options)
    assert str(again.value) == str(info.value)


@pytest.mark.parametrize("pos", ["before_Q", "A_begin"])
def test_combination_error_names_the_allowed_combinations(pos: str) -> None:
    with pytest.raises(ValueError) as info:
        MetaPromptOptions(instruction_pos=pos, include_qa=False)
    message = str(info.value)
    assert repr(pos) in message and "include_qa=True" in message
    for allowed in ("'Q_begin'", "'Q_end'", "'before_Q'", "'A_begin'"):
        assert allowed in message


@pytest.mark.parametrize(
    ("family", "pos", "include_qa", "prompt_type"),
    [
        (family, pos, include_qa, prompt_type)
        for family in ("gpt", "palm")
        for prompt_type in ("both_instructions_and_exemplars", "instructions_only")
        for pos, include_qa in [("Q_begin", False), ("Q_end", False), ("Q_begin", True), ("Q_end", True)]
        + [("A_begin", True)]
        + ([("before_Q", True)] if prompt_type == "both_instructions_and_exemplars" else [])
    ],
)
def test_accepted_combinations(family: str, pos: str, include_qa: bool, prompt_type: str) -> None:
    MetaPromptOptions(
        optimizer_family=family, instruction_pos=pos, include_qa=include_qa, meta_prompt_type=prompt_type
    )
    prompt = gen_meta_prompt(
        HISTORY,
        [("THE-PROBLEM", "THE-ANSWER")],
        optimizer_family=family,
        instruction_pos=pos,
        include_qa=include_qa,
        meta_prompt_type=prompt_type,
    )
    # Both instructions, in ascending score order; the problem only where the type shows exemplars.
    first, second = (prompt.index(instruction) for instruction, _, _ in HISTORY)
    assert first < second
    shows_exemplars = prompt_type == "both_instructions_and_exemplars"
    assert ("THE-PROBLEM" in prompt, "THE-ANSWER" in prompt) == (shows_exemplars, shows_exemplars)


@pytest.mark.parametrize("buckets", BAD_BUCKETS, ids=repr)
def test_bad_bucket_values_raise(buckets: Any) -> None:
    with pytest.raises(ValueError, match="num_score_buckets"):
        MetaPromptOptions(num_score_buckets=buckets)
    with pytest.raises(ValueError, match="num_score_buckets"):
        gen_meta_prompt(HISTORY, num_score_buckets=buckets)
    with pytest.raises(ValueError, match="num_score_buckets"):
        format_score(0.5, buckets)


@pytest.mark.parametrize(("buckets", "shown"), GOOD_BUCKETS, ids=[repr(b) for b, _ in GOOD_BUCKETS])
def test_good_bucket_values(buckets: Any, shown: tuple[str, str]) -> None:
    MetaPromptOptions(num_score_buckets=buckets)
    prompt = gen_meta_prompt(HISTORY, num_score_buckets=buckets)
    assert [format_score(score, buckets) for _, score, _ in HISTORY] == list(shown)
    assert prompt.count("\nscore:\n") == 2
    assert f"\ntext:\n{HISTORY[0][0]}\nscore:\n{shown[0]}\n\ntext:\n{HISTORY[1][0]}\nscore:\n{shown[1]}\n" in prompt


@pytest.mark.parametrize("value", [-1, 2.5, True, "20", None])
def test_bad_max_num_instructions_raises(value: Any) -> None:
    with pytest.raises(ValueError, match="max_num_instructions"):
        MetaPromptOptions(max_num_instructions=value)


@pytest.mark.parametrize("value", [-0.1, 1.5, 30, math.nan, "0.3", True])
def test_bad_score_threshold_raises(value: Any) -> None:
    with pytest.raises(ValueError, match="score_threshold"):
        MetaPromptOptions(score_threshold=value)


@pytest.mark.parametrize("score", [-0.01, 1.01, 100, math.nan, np.float64("nan"), math.inf, "0.5", None])
@pytest.mark.parametrize("prompt_type", ["both_instructions_and_exemplars", "instructions_only"])
def test_bad_score_raises_naming_the_instruction(score: Any, prompt_type: str) -> None:
    history = [*HISTORY, ("Some odd instruction.", score, 1)]
    with pytest.raises(ValueError, match="Some odd instruction"):
        gen_meta_prompt(history, meta_prompt_type=prompt_type)


def test_bad_score_raises_even_when_it_would_not_be_shown() -> None:
    history = [*HISTORY, ("Hidden by the threshold.", -0.5, 1)]
    with pytest.raises(ValueError, match="Hidden by the threshold"):
        gen_meta_prompt(history, score_threshold=0.3, max_num_instructions=1)


def test_extract_rejects_unknown_options() -> None:
    with pytest.raises(ValueError, match="optimizer_family"):
        extract_instruction("<INS>x</INS>", optimizer_family="claude")
    with pytest.raises(ValueError, match="instruction_pos"):
        extract_instruction("<INS>x</INS>", instruction_pos="before_QA")
    with pytest.raises(ValueError, match="meta_prompt_type"):
        extract_instruction("<INS>x</INS>", meta_prompt_type="other")


# --------------------------------------------------------------------------------------------------------------
# Selection and order
# --------------------------------------------------------------------------------------------------------------


def test_ties_keep_insertion_order() -> None:
    history = [("b", 0.5, 0), ("a", 0.5, 1), ("low", 0.1, 0), ("c", 0.5, 2)]
    assert _shown_instructions(gen_meta_prompt(history)) == ["low", "b", "a", "c"]


def test_truncation_keeps_the_most_recent_of_tied_scores() -> None:
    history = [("first", 0.5, 0), ("second", 0.5, 1), ("third", 0.5, 2)]
    assert _shown_instructions(gen_meta_prompt(history, max_num_instructions=2)) == ["second", "third"]


def test_threshold_at_exactly_the_score_is_kept() -> None:
    history = [("below", 0.29, 0), ("at", 0.3, 0), ("above", 0.31, 0)]
    assert _shown_instructions(gen_meta_prompt(history, score_threshold=0.3)) == ["at", "above"]


@pytest.mark.parametrize("threshold", [0, 0.0, None])
def test_zero_or_none_threshold_keeps_zero_scores(threshold: float | None) -> None:
    history = [("zero", 0.0, 0), ("one", 1.0, 0)]
    assert _shown_instructions(gen_meta_prompt(history, score_threshold=threshold)) == ["zero", "one"]


def test_max_num_instructions_zero_shows_all() -> None:
    history = [(f"instruction {i}", i / 100, i) for i in range(30)]
    assert _shown_instructions(gen_meta_prompt(history, max_num_instructions=0)) == [ins for ins, _, _ in history]
    assert len(_shown_instructions(gen_meta_prompt(history))) == 20


def test_threshold_applies_after_truncation() -> None:
    history = [("a", 0.1, 0), ("b", 0.2, 0), ("c", 0.9, 0)]
    assert _shown_instructions(gen_meta_prompt(history, max_num_instructions=2, score_threshold=0.5)) == ["c"]


def test_history_is_not_deduplicated_and_input_is_not_mutated() -> None:
    history = [("same", 0.5, -1), ("other", 0.7, 0), ("same", 0.5, 1)]
    snapshot = list(history)
    assert _shown_instructions(gen_meta_prompt(history)) == ["same", "same", "other"]
    assert history == snapshot


def test_instructions_only_ignores_threshold_and_limit() -> None:
    history = [("a", 0.1, 0), ("b", 0.9, 0), ("c", 0.5, 0)]
    prompt = gen_meta_prompt(history, meta_prompt_type="instructions_only", score_threshold=0.6, max_num_instructions=1)
    assert prompt.count("<TEXT>") == 3
    assert prompt.index("<TEXT>a") < prompt.index("<TEXT>c") < prompt.index("<TEXT>b")


def test_instructions_only_text_does_not_depend_on_include_qa() -> None:
    for pos in ("Q_begin", "Q_end"):
        with_qa = gen_meta_prompt(HISTORY, meta_prompt_type="instructions_only", instruction_pos=pos, include_qa=True)
        without = gen_meta_prompt(HISTORY, meta_prompt_type="instructions_only", instruction_pos=pos, include_qa=False)
        assert with_qa == without


# --------------------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------------------


def test_exemplars_none_vs_empty() -> None:
    without = gen_meta_prompt(HISTORY, None)
    empty = gen_meta_prompt(HISTORY, [])
    assert GPT_EXEMPLARS_INTRO not in without
    assert without.startswith(GPT_INS_HEADER) and without.endswith("\nscore:\n71\n" + GPT_INS_CLOSING)
    assert empty == without[: -len(GPT_INS_CLOSING)] + "\n\n" + GPT_EXEMPLARS_INTRO + GPT_INS_CLOSING
    assert PALM_EXEMPLARS_INTRO in gen_meta_prompt(HISTORY, [], optimizer_family="palm")


def test_text_with_braces_is_inserted_verbatim() -> None:
    history = [("  Use {braces} and {0} **as is**\n", 0.5, 0)]
    prompt = gen_meta_prompt(history, [("What is {x}?", "{y}")])
    assert "\ntext:\n  Use {braces} and {0} **as is**\n\nscore:\n50\n" in prompt
    assert "\nProblem:\n<INS>\nWhat is {x}?\n\nGround truth answer:\n{y}\n" in prompt


def test_empty_history_and_no_exemplars() -> None:
    assert gen_meta_prompt([]) == GPT_INS_HEADER + GPT_INS_CLOSING


@pytest.mark.parametrize(
    ("score", "buckets", "expected"),
    [
        (0.6130268199233716, math.inf, "0.613"),
        (0.0125, math.inf, "0.012"),
        (0.0375, math.inf, "0.038"),
        (1.0, math.inf, "1.0"),
        (0.0, math.inf, "0.0"),
        (0, math.inf, "0.0"),
        (0.125, 100, "12"),
        (0.675, 100, "68"),
        (0.285, 100, "28"),
        (0.005, 100, "0"),
        (1.0, 100, "100"),
        (0.6130268199233716, 20, "12"),
        (np.float64(0.0125), np.inf, "0.012"),
    ],
)
def test_format_score(score: float, buckets: float, expected: str) -> None:
    assert format_score(score, buckets) == expected


def test_format_score_two_decimals() -> None:
    assert format_score(0.025, math.inf, decimals=2) == "0.02"
    assert format_score(0.075, math.inf, decimals=2) == "0.08"
    assert format_score(0.075, 100, decimals=2) == "8"


@pytest.mark.parametrize("score", [-0.1, 1.1, math.nan])
def test_format_score_rejects_out_of_range(score: float) -> None:
    with pytest.raises(ValueError):
        format_score(score, 100)


# --------------------------------------------------------------------------------------------------------------
# Parsing and normalisation
# --------------------------------------------------------------------------------------------------------------


def test_extract_gpt_tags_by_position() -> None:
    reply = "x <Start>start</Start> <INS>ins</INS>"
    assert extract_instruction(reply, instruction_pos="A_begin") == "start"
    for pos in ("before_Q", "Q_begin", "Q_end"):
        assert extract_instruction(reply, instruction_pos=pos) == "ins"


def test_extract_empty_and_missing() -> None:
    assert extract_instruction("<INS>   </INS>") == ""
    assert extract_instruction("no brackets", optimizer_family="palm") == ""
    assert extract_instruction("[ spaced ]", optimizer_family="palm") == " spaced "
    assert extract_instruction("nothing", meta_prompt_type="instructions_only") is None
    assert extract_instruction("<TEXT></TEXT>", meta_prompt_type="instructions_only") == ""


def test_polish_has_no_second_strip_and_adds_period_only_on_request() -> None:
    assert polish_sentence("** think.**") == " think."
    assert polish_sentence("think") == "Think"
    assert polish_sentence("think", add_ending_punc=True) == "Think."
    assert polish_sentence("****", add_ending_punc=True) == "."  # the authors check emptiness before removing **
    assert polish_sentence("   ", add_ending_punc=True) == ""
